"""Whole CPU forwards with one native call per encoder layer against op by op.

``cpu.encoder_layer`` runs a layer's seven ops in one call to ``bertfast._C`` where
every GEMM of the layer is on the C++ GEMM (a loaded model, up to
``cpu_weights.SMALL_ROWS`` tokens); ``cpu.FUSED_LAYER = False`` runs the same
kernels one Python call each. With ``--quantize int8`` the model's linear layers are
int8 and the layer call is ``quant.encoder_layer`` (``_C.cpu.encoder_layer_int8``,
any row count, attention in fp32: ``BERTFAST_CPU_INT8_ATTENTION=fp32`` where the CPU
has native bf16). Both are timed here on the same model and inputs,
alternating round by round in one process; medians of the rounds' medians, and
the ratio (only ratios inside one run mean anything on a shared machine). The
outputs are checked equal first. Usage::

    python benchmarks/experiments/layer_call.py [--model minilm|bert-base|FOLDER] \
        [--shapes 1x16,1x128] [--quantize int8]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import bertfast
from bertfast import presets
from bertfast.bench.timing import measure
from bertfast.ops import cpu as cpu_ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm", help="minilm, a preset name, or a folder")
    ap.add_argument("--shapes", default="1x16,1x64,1x128,4x32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=0.3, help="per variant per round")
    ap.add_argument("--quantize", choices=["int8"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = presets.resolve(args.model)
    model = bertfast.from_pretrained(folder, backend="cpu", quantize=args.quantize)
    kind = args.quantize or "fp32"
    print(f"{folder} ({kind}): {args.threads} threads, ms per forward, ", end="")
    print(f"median of {args.rounds} rounds")
    print(f"{'shape':>7s} {'per layer':>10s} {'per op':>9s} {'per op / per layer':>19s}")
    for shape in args.shapes.split(","):
        B, S = (int(v) for v in shape.split("x"))
        ids = torch.randint(1000, model.config.vocab_size, (B, S))
        mask = torch.ones(B, S, dtype=torch.int64)

        def run(ids=ids, mask=mask):
            with torch.inference_mode():
                return model(ids, attention_mask=mask).last_hidden_state

        res = {True: [], False: []}
        outs = {}
        for fused in (True, False):
            cpu_ops.FUSED_LAYER = fused
            outs[fused] = run()
        if not torch.equal(outs[True], outs[False]):
            raise SystemExit(f"{shape}: the two paths differ")
        for r in range(args.rounds):
            for fused in (True, False) if r % 2 == 0 else (False, True):
                cpu_ops.FUSED_LAYER = fused
                stats = measure(run, "cpu", warmup=1, max_rounds=10**6, budget_s=args.seconds)
                res[fused].append(stats.median * 1e3)
        cpu_ops.FUSED_LAYER = True
        a, b = statistics.median(res[True]), statistics.median(res[False])
        print(f"{shape:>7s} {a:10.3f} {b:9.3f} {b / a:19.3f}")


if __name__ == "__main__":
    main()
