"""One short query at a time through ``Embedder.encode`` (what a search box or a
served request runs), with the encoder in one native call and with one call per
layer (``cpu.FUSED_FORWARD``), alternating every ``--block`` queries in one process.

Prints the median wall time per query of each, their ratio, and the median time of
the native forward itself (``cpu.encoder_forward``) so the time outside it shows.
Only ratios inside one run mean anything on a shared machine. Usage::

    python benchmarks/experiments/lone_query.py [--model minilm|FOLDER] [--quantize int8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import bertfast
from bertfast import presets
from bertfast.bench.serving import make_queries
from bertfast.ops import cpu as cpu_ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm", help="minilm, a preset name, or a folder")
    ap.add_argument("--quantize", choices=["int8"], default=None)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--block", type=int, default=10, help="queries per switch")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    emb = bertfast.Embedder.from_pretrained(presets.resolve(args.model), quantize=args.quantize)
    queries = make_queries(args.queries + 100)
    for q in queries[:100]:
        emb.encode([q])
    native, real = [], cpu_ops.encoder_forward

    def timed(*a, **k):
        t = time.perf_counter()
        out = real(*a, **k)
        native.append(time.perf_counter() - t)
        return out

    cpu_ops.encoder_forward = timed
    res = {True: [], False: []}
    try:
        for i, q in enumerate(queries[100:]):
            one_call = (i // args.block) % 2 == 0
            cpu_ops.FUSED_FORWARD = one_call
            t = time.perf_counter()
            emb.encode([q])
            res[one_call].append(time.perf_counter() - t)
    finally:
        cpu_ops.FUSED_FORWARD, cpu_ops.encoder_forward = True, real
    one, per = (statistics.median(res[v]) * 1e3 for v in (True, False))
    kind = args.quantize or "fp32"
    print(f"{args.model} ({kind}), {args.threads} threads, {args.queries} queries, ms per query")
    print(f"one call {one:.3f}  per layer {per:.3f}  per layer / one call {per / one:.3f}")
    if native:
        inside = statistics.median(native) * 1e3
        print(f"native forward {inside:.3f}, outside it (one call) {one - inside:.3f}")


if __name__ == "__main__":
    main()
