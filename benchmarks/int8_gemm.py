"""int8 GEMM (bertfast._C.cpu.qlinear: per-row quantization + VNNI/AVX2 GEMM + fp32
epilogue) vs fp32 F.linear and bertfast's fp32 GEMM on the encoder shapes of
MiniLM (384) and BERT-base (768), at 16 / 128 / 4096 rows.

    python benchmarks/int8_gemm.py [--threads 2] [--isa auto|vnni|avx2]

Prints median milliseconds per call (one process, nothing else should run).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from bertfast import _C
from bertfast.ops import quant

SHAPES = [(384, 1152), (384, 1536), (1536, 384), (768, 2304), (3072, 768)]  # (K, N)
ROWS = [16, 128, 4096]


def _median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default="auto")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    isa = _C.cpu.int8_isa(args.isa)
    print(f"threads={args.threads} int8 isa={isa}")
    print(f"{'M':>5} {'K':>5} {'N':>5} {'F.linear':>9} {'bf fp32':>9} {'int8':>9} {'x F.lin':>8}")
    for K, N in SHAPES:
        w = torch.randn(N, K) / K**0.5
        b = torch.randn(N)
        qw = quant.QuantizedWeight.of(w)
        packed = _C.cpu.linear_pack(w, True)
        for M in ROWS:
            x = torch.randn(M, K)
            reps = 200 if M <= 128 else 10
            P = functools.partial
            t_lin = _median_ms(P(F.linear, x, w, b), reps)
            t_own = _median_ms(P(_C.cpu.linear_packed, x, packed, b, N, None, True), reps)
            qargs = (x, qw._packed, qw._colsum, qw._scale, b, None, args.isa)
            t_q = _median_ms(P(_C.cpu.qlinear, *qargs), reps)
            print(
                f"{M:>5} {K:>5} {N:>5} {t_lin:>9.3f} {t_own:>9.3f} {t_q:>9.3f} {t_lin / t_q:>7.2f}x"
            )


if __name__ == "__main__":
    main()
