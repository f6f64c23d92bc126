"""bf16 forwards of few tokens with the C++ bf16 GEMM's panels and without them.

With ``cpu_weights.BF16_PANELS`` (AMX machines) a bf16 model reads oneDNN's weight
buffer as the C++ bf16 GEMM's panels and runs up to ``BF16_SMALL_ROWS`` tokens on it,
the embeddings and every layer in one native call ("panels"); without them every GEMM
is oneDNN's, op by op from Python ("oneDNN"). Both models are loaded from the same
folder in one process (the second with ``BF16_PANELS`` off) and timed in rotating
rounds on the same inputs; medians of the rounds' medians and their ratio (only ratios
inside one run mean anything on a shared machine). ``--gemms`` also times each
distinct GEMM of the model alone, C++ (``_C.cpu.blinear``) against oneDNN
(``mkldnn._linear_pointwise`` on the prepacked weight), hot caches. ``--limits
64,128`` instead times the model with the panels under each value of
``cpu_weights.BF16_SMALL_ROWS`` (the row limit of the C++ bf16 GEMM), alternating
round by round: the A/B that set the limit. Usage::

    python benchmarks/experiments/bf16_few_rows.py [--model minilm|bert-base|FOLDER] \
        [--shapes 1x16,1x64] [--gemms] [--limits 64,128]
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch

import bertfast
from bertfast import presets
from bertfast.bench.timing import measure
from bertfast.ops.cpu import weights as cpu_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm", help="minilm, a preset name, or a folder")
    ap.add_argument("--shapes", default="1x1,1x16,1x32,1x64,4x16,2x64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=0.3, help="per variant per round")
    ap.add_argument("--gemms", action="store_true", help="also time each GEMM alone")
    ap.add_argument("--limits", help="A/B of cpu_weights.BF16_SMALL_ROWS values, e.g. 64,128")
    args = ap.parse_args()
    if not cpu_weights.BF16_PANELS:
        raise SystemExit("the C++ bf16 GEMM runs on AMX only; this CPU (or OS) has none")
    torch.set_num_threads(args.threads)
    folder = presets.resolve(args.model)
    if args.limits:
        _limits(folder, [int(v) for v in args.limits.split(",")], args)
        return
    models = {"panels": bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)}
    cpu_weights.BF16_PANELS = False  # read at load: oneDNN's form without panels
    models["oneDNN"] = bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)
    cpu_weights.BF16_PANELS = True
    print(f"{folder} (bf16): {args.threads} threads, ms per forward, median of {args.rounds}")
    print(f"{'shape':>7s} {'panels':>9s} {'oneDNN':>9s}  oneDNN / panels  max |diff|")
    for shape in args.shapes.split(","):
        B, S = (int(v) for v in shape.split("x"))
        ids = torch.randint(1000, models["panels"].config.vocab_size, (B, S))
        runs = {}
        for name, model in models.items():

            def run(model=model, ids=ids):
                with torch.inference_mode():
                    return model(ids).last_hidden_state

            runs[name] = run
        diff = (runs["panels"]().float() - runs["oneDNN"]().float()).abs().max().item()
        med = _rotate(runs, args)
        ratio = med["oneDNN"] / med["panels"]
        print(f"{shape:>7s} {med['panels']:9.3f} {med['oneDNN']:9.3f}  {ratio:15.2f}  {diff:.3g}")
    if args.gemms:
        _gemms(models["panels"], args)


def _rotate(runs: dict, args) -> dict:
    """Each of ``runs`` (name -> callable) timed in ``args.rounds`` rounds, the order
    rotating round by round; the median of each one's round medians, in ms."""
    res = {name: [] for name in runs}
    order = list(runs)
    for r in range(args.rounds):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            stats = measure(runs[name], "cpu", warmup=1, max_rounds=10**6, budget_s=args.seconds)
            res[name].append(stats.median * 1e3)
    return {name: statistics.median(v) for name, v in res.items()}


def _limits(folder, limits: list[int], args) -> None:
    """One bf16 model, timed under each ``BF16_SMALL_ROWS`` in ``limits``, rotating."""
    model = bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)
    default = cpu_weights.BF16_SMALL_ROWS
    print(f"{folder} (bf16): {args.threads} threads, ms per forward, median of {args.rounds}")
    print(f"{'shape':>7s} " + " ".join(f"{f'limit {v}':>10s}" for v in limits), end="")
    print("  " + " ".join(f"{limits[0]} / {v}" for v in limits[1:]))
    for shape in args.shapes.split(","):
        B, S = (int(v) for v in shape.split("x"))
        ids = torch.randint(1000, model.config.vocab_size, (B, S))

        def run(limit, ids=ids):
            cpu_weights.BF16_SMALL_ROWS = limit
            with torch.inference_mode():
                return model(ids).last_hidden_state

        med = _rotate({v: functools.partial(run, v) for v in limits}, args)
        cpu_weights.BF16_SMALL_ROWS = default
        ratios = " ".join(
            f"{med[limits[0]] / med[v]:>{len(f'{limits[0]} / {v}')}.2f}" for v in limits[1:]
        )
        print(f"{shape:>7s} " + " ".join(f"{med[v]:10.3f}" for v in limits) + "  " + ratios)


def _gemms(model, args) -> None:
    """Each distinct GEMM shape of the model's first layer, C++ bf16 GEMM vs oneDNN."""
    from bertfast import _C

    mk = torch.ops.mkldnn
    L = model.layers._modules[str(model.config.layer_schedule()[0])]
    print(f"\nper GEMM (us, median of {args.rounds} rounds, hot caches): C++ / oneDNN")
    weights = [L._modules[n].weight for n in ("qkv", "attn_out", "ffn_in", "ffn_out")]
    print(f"{'rows':>5s} " + " ".join(f"{f'{w.shape[0]}x{w.shape[1]}':>15s}" for w in weights))
    for M in (1, 16, 32, 64, 96, 128, 256):
        cells = []
        for w in weights:
            N, K = w.shape
            x = torch.randn(M, K).bfloat16()
            dense = w.dense()
            own, onednn = _C.cpu.bgemm_pack(dense), mk._reorder_linear_weight(dense, None)
            fns = {
                "c++": lambda x=x, own=own, N=N: _C.cpu.blinear(x, own, None, N, None, None),
                "onednn": lambda x=x, p=onednn: mk._linear_pointwise(x, p, None, "none", [], ""),
            }
            res = {k: [] for k in fns}
            for _ in range(args.rounds):
                for k, fn in fns.items():
                    stats = measure(fn, "cpu", warmup=2, max_rounds=10**6, budget_s=0.05)
                    res[k].append(stats.median * 1e6)
            cells.append(
                f"{statistics.median(res['c++']):6.0f} / {statistics.median(res['onednn']):6.0f}"
            )
        print(f"{M:5d} " + " ".join(f"{c:>15s}" for c in cells))


if __name__ == "__main__":
    main()
