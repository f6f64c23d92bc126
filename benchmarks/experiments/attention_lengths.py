"""The CPU attention alone (``attention_varlen``, MiniLM's 12 heads x 32), one thread,
at sequence lengths from 16 to 256: milliseconds per call (the minimum over the
repetitions: robust on a shared machine) and billions of scores a second (each score
is one exp of the softmax). ``--library`` loads a build of ``bertfast._C`` given as a
file (``torch.ops.load_library``) instead of the installed one, so two builds can be
compared in alternating processes::

    python benchmarks/experiments/attention_lengths.py [--dtype bf16] [--lengths 256,64,16]
    for lib in /tmp/before.so /tmp/after.so; do \\
        python benchmarks/experiments/attention_lengths.py --library $lib; done

Each length runs 4096 tokens (4096 / L sequences of L tokens) of random Q, K, V.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--lengths", default="256,128,64,32,16")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=1.5, help="per length")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--library", help="a bertfast _C build to load instead of the installed one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.library:
        torch.ops.load_library(args.library)
    else:
        import bertfast.ops.native  # noqa: F401  (registers torch.ops.bertfast_cpu)
    attention = torch.ops.bertfast_cpu.attention_varlen
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    hidden = args.heads * args.head_dim
    cells = []
    for L in (int(x) for x in args.lengths.split(",")):
        lengths = [L] * max(1, 4096 // L)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        qkv = torch.randn(sum(lengths), 3 * hidden).to(dtype)
        call = (qkv, cu, L, args.heads, args.head_dim**-0.5)
        attention(*call)
        times, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            t = time.perf_counter()
            attention(*call)
            times.append(time.perf_counter() - t)
        best = min(times)
        scores = args.heads * len(lengths) * L * L
        cells.append(f"L={L}: {best * 1e3:.3f} ms {scores / best / 1e9:.2f} Gscore/s")
    print(args.library or "installed", "|", " | ".join(cells))


if __name__ == "__main__":
    main()
