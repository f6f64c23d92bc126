"""Where packing the weight per call stops mattering, for the CPU GEMM's fp32 linears.

For each (M, N, K) of a model's linear layers this times, in one process and
interleaved (so a noisy neighbour slows all three alike), medians of ``--repeat``
rounds:

- ``prepacked``: the C++ GEMM on a weight packed once (what a cache gives);
- ``pack+gemm``: packing the weight then the GEMM, every call (no cache);
- ``F.linear``: torch's GEMM (MKL / oneDNN) on the row-major weight.

Only ratios inside one run mean anything on a shared machine. Usage::

    python benchmarks/experiments/pack_crossover.py [--hidden 384 --ffn 1536] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bertfast import _C

K_ = _C.cpu


def _pack(w):
    return K_.linear_pack(w, True)


def _gemm(x, packed, b, N, K):
    return K_.linear_packed(x, packed, b, N, None, True)


def _time(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--stat",
        choices=["median", "min"],
        default="median",
        help="min: the least disturbed round (a loaded machine)",
    )
    ap.add_argument("--rows", default="16,32,64,128,256,512,1024,4096")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    H, Fd = args.hidden, args.ffn
    shapes = {"qkv": (3 * H, H), "attn_out": (H, H), "ffn_in": (Fd, H), "ffn_out": (H, Fd)}
    print(f"threads={args.threads}  times in us per call, {args.stat} of {args.repeat} rounds")
    print(
        f"{'layer':9s} {'M':>5s} {'prepacked':>10s} {'pack+gemm':>10s} {'F.linear':>10s} "
        f"{'pack/prepacked':>15s} {'F.linear/pack+gemm':>19s}"
    )
    for M in [int(m) for m in args.rows.split(",")]:
        for name, (N, K) in shapes.items():
            w, b, x = torch.randn(N, K), torch.randn(N), torch.randn(M, K)
            packed = _pack(w)
            inner = max(1, int(2e8 // (2 * M * N * K)))
            fns = {
                "prepacked": lambda x=x, packed=packed, b=b, N=N, K=K: _gemm(x, packed, b, N, K),
                "pack+gemm": lambda x=x, w=w, b=b, N=N, K=K: _gemm(x, _pack(w), b, N, K),
                "F.linear": lambda x=x, w=w, b=b: F.linear(x, w, b),
            }
            for fn in fns.values():
                fn()
            res = {k: [] for k in fns}
            for _ in range(args.repeat):
                for k, fn in fns.items():
                    res[k].append(_time(fn, inner))
            pick = min if args.stat == "min" else statistics.median
            med = {k: pick(v) * 1e6 for k, v in res.items()}
            print(
                f"{name:9s} {M:5d} {med['prepacked']:10.1f} {med['pack+gemm']:10.1f} "
                f"{med['F.linear']:10.1f} {med['pack+gemm'] / med['prepacked']:15.3f} "
                f"{med['F.linear'] / med['pack+gemm']:19.3f}"
            )


if __name__ == "__main__":
    main()
