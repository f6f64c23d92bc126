"""The GEMMs of a whole forward at few rows: the C++ GEMM vs oneDNN, weights streamed.

A forward multiplies by every linear weight once, so at few rows each weight comes
from L3 or memory, not from a cache warmed by the call before (a model's weights:
MiniLM 42 MB, BERT-base 340 MB). This times, for one model's widths and depth, the
four GEMMs of every layer in forward order on distinct random weights held in
oneDNN's blocked layout (what ``from_pretrained`` keeps, ``cpu_weights.PackedWeight``):

- ``cpp``: the C++ GEMM reading those panels in place (``linear_packed``), which is
  what ``cpu_weights.packed_for_call`` picks up to ``SMALL_ROWS`` rows;
- ``onednn``: torch's oneDNN inner product on the same buffers;
- ``cpp-hot``: the C++ GEMM on the first layer's weights only, repeated (weights in
  cache: the arithmetic's own speed, the floor for ``cpp``).

Interleaved round by round in one process, medians; only ratios inside one run mean
anything on a shared machine. Usage::

    python benchmarks/experiments/few_rows_stream.py --model minilm|bert-base [--rows 1,16,64,128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bertfast import _C
from bertfast.ops.cpu import weights as cpu_weights

MODELS = {"minilm": (384, 1536, 6), "bert-base": (768, 3072, 12)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="minilm")
    ap.add_argument("--rows", default="1,4,16,32,64,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if not cpu_weights.ONEDNN:
        raise SystemExit("this torch has no oneDNN: nothing to compare")
    torch.set_num_threads(args.threads)
    H, F, layers = MODELS[args.model]
    shapes = [(3 * H, H), (H, H), (F, H), (H, F)]  # (N, K): qkv, attn_out, ffn_in, ffn_out
    weights = [[cpu_weights.PackedWeight.of(torch.randn(N, K) * 0.05) for N, K in shapes]]
    weights += [
        [cpu_weights.PackedWeight.of(torch.randn(N, K) * 0.05) for N, K in shapes]
        for _ in range(layers - 1)
    ]
    if any(w._panels is None for L in weights for w in L):
        raise SystemExit("oneDNN's weight layout here is not 64-wide panels: no C++ route")
    biases = [torch.randn(N) for N, _ in shapes]
    print(
        f"{args.model}: {layers} layers x 4 GEMMs, {args.threads} threads, "
        f"ms per forward's GEMMs, median of {args.rounds} rounds"
    )
    print(f"{'rows':>5s} {'cpp':>9s} {'onednn':>9s} {'cpp-hot':>9s} {'onednn/cpp':>11s}")
    for M in (int(r) for r in args.rows.split(",")):
        xs = [torch.randn(M, K) for _, K in shapes]

        def run(stack, onednn=False, xs=xs):
            for L in stack:
                for j, w in enumerate(L):
                    if onednn:
                        torch.ops.mkldnn._linear_pointwise(
                            xs[j], w._packed, biases[j], "none", [], ""
                        )
                    else:
                        _C.cpu.linear_packed(xs[j], w._panels, biases[j], w.shape[0], None, True)

        fns = {
            "cpp": lambda: run(weights),
            "onednn": lambda: run(weights, onednn=True),
            "cpp-hot": lambda: run(weights[:1] * layers),
        }
        res = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                fn()
                t0 = time.perf_counter()
                inner = 5
                for _ in range(inner):
                    fn()
                res[k].append((time.perf_counter() - t0) / inner * 1e3)
        med = {k: statistics.median(v) for k, v in res.items()}
        print(
            f"{M:5d} {med['cpp']:9.3f} {med['onednn']:9.3f} {med['cpp-hot']:9.3f} "
            f"{med['onednn'] / med['cpp']:11.2f}"
        )


if __name__ == "__main__":
    main()
