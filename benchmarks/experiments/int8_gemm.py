"""int8 GEMM (bertfast._C.cpu.qlinear: per-row quantization + int8 GEMM + fp32
epilogue, per micro-kernel) vs fp32 F.linear and bertfast's fp32 GEMM on the encoder
shapes of MiniLM (384) and BERT-base (768), at 16 / 128 / 4096 rows.

    python benchmarks/experiments/int8_gemm.py [--threads 2] [--stat min|median]

Prints milliseconds per call (min by default: robust on a shared machine) for each
micro-kernel this CPU runs (amx, vnni, avx2), and the best int8 / F.linear ratio.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from bertfast import _C
from bertfast.ops.cpu import int8 as quant

SHAPES = [(384, 1152), (384, 1536), (1536, 384), (768, 2304), (3072, 768)]  # (K, N)
ROWS = [16, 128, 4096]


def _time_ms(fn, reps, stat):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * (min(times) if stat == "min" else statistics.median(times))


def _isas():
    out = []
    for isa in ("amx", "vnni", "avx2"):
        try:
            out.append(_C.cpu.int8_isa(isa))
        except ValueError:
            pass
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stat", default="min", choices=("min", "median"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    isas = _isas()
    print(f"threads={args.threads}, {args.stat} ms per call")
    head = ["M", "K", "N", "F.linear", "bf-fp32"] + isas + ["best x F.lin"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    P = functools.partial
    for K, N in SHAPES:
        w = torch.randn(N, K) / K**0.5
        b = torch.randn(N)
        qw = quant.QuantizedWeight.of(w)
        packed = _C.cpu.linear_pack(w, True)
        for M in ROWS:
            x = torch.randn(M, K)
            reps = 100 if M <= 128 else 10
            t_lin = _time_ms(P(F.linear, x, w, b), reps, args.stat)
            t_own = _time_ms(P(_C.cpu.linear_packed, x, packed, b, N, None, True), reps, args.stat)
            t_q = [
                _time_ms(
                    P(_C.cpu.qlinear, x, qw._packed, qw._colsum, qw._scale, b, None, isa),
                    reps,
                    args.stat,
                )
                for isa in isas
            ]
            cells = [M, K, N, f"{t_lin:.3f}", f"{t_own:.3f}"] + [f"{t:.3f}" for t in t_q]
            cells.append(f"{t_lin / min(t_q):.2f}")
            print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
