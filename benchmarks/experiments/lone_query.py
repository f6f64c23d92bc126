"""One short query at a time through ``Embedder.encode`` (what a search box or a
served request runs), two ways alternating every ``--block`` queries in one process:

- ``--compare forward`` (default): the encoder in one native call and with one call
  per layer (``cpu.FUSED_FORWARD``);
- ``--compare host``: the Embedder's ids checked and laid out on the host
  (``BertfastModel._encode_packed_host``, what it runs) and as tensors through
  ``encode_packed`` (what it ran before);
- ``--compare pool``: pooling and normalising in one native call
  (``CpuEncoder.pool``) and in torch (``pool_packed``, ``F.normalize``).

Prints the median wall time per query of each, their ratio, and the median time of
the native forward itself (``cpu.encoder_forward``) so the time outside it shows.
Only ratios inside one run mean anything on a shared machine. Usage::

    python benchmarks/experiments/lone_query.py [--model minilm|FOLDER] [--quantize int8] \
        [--compare forward|host|pool]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import bertfast
from bertfast import presets
from bertfast.bench.serving import make_queries
from bertfast.bench.timing import call_times
from bertfast.embedder import pool_packed
from bertfast.ops import cpu as cpu_ops
from bertfast.ops.cpu.encoder import CpuEncoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm", help="minilm, a preset name, or a folder")
    ap.add_argument("--quantize", choices=["int8"], default=None)
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--block", type=int, default=10, help="queries per switch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare", choices=["forward", "host", "pool"], default="forward")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    emb = bertfast.Embedder.from_pretrained(presets.resolve(args.model), quantize=args.quantize)
    queries = make_queries(args.queries + 100)
    for q in queries[:100]:
        emb.encode([q])
    host_path = emb.embed_tokenized
    model = emb.model

    def tensor_path(items, normalize=False):  # encode_packed on tensors, as before
        lengths = [len(ids) for ids, _ in items]
        ids = torch.tensor([i for row, _ in items for i in row], dtype=torch.int64)
        types = torch.tensor([t for _, row in items for t in row], dtype=torch.int64)
        with torch.inference_mode():
            hidden, info = model.encode_packed(ids, lengths, types)
            vectors = pool_packed(hidden, info, emb.pooling)
            return F.normalize(vectors, p=2.0, dim=-1) if normalize else vectors

    native_pool = CpuEncoder.pool

    def switch(first: bool) -> None:
        if args.compare == "forward":
            cpu_ops.FUSED_FORWARD = first
        elif args.compare == "host":
            emb.embed_tokenized = host_path if first else tensor_path
        else:  # a runner that does not pool: the Embedder pools in torch
            CpuEncoder.pool = native_pool if first else (lambda *a, **k: None)

    res = {True: [], False: []}
    try:
        # the native forward's own time (cpu_encoder calls cpu.encoder_forward by name)
        with call_times(cpu_ops, "encoder_forward") as native:
            for i, q in enumerate(queries[100:]):
                first = (i // args.block) % 2 == 0
                switch(first)
                t = time.perf_counter()
                emb.encode([q])
                res[first].append(time.perf_counter() - t)
    finally:
        cpu_ops.FUSED_FORWARD = True
        emb.embed_tokenized, CpuEncoder.pool = host_path, native_pool
    a, b = (statistics.median(res[v]) * 1e3 for v in (True, False))
    names = {
        "forward": ("one call", "per layer"),
        "host": ("host lists", "tensors"),
        "pool": ("native pool", "torch pool"),
    }[args.compare]
    kind = args.quantize or "fp32"
    print(f"{args.model} ({kind}), {args.threads} threads, {args.queries} queries, ms per query")
    print(f"{names[0]} {a:.3f}  {names[1]} {b:.3f}  {names[1]} / {names[0]} {b / a:.3f}")
    if native:
        inside = statistics.median(native) * 1e3
        print(f"native forward {inside:.3f}, outside it ({names[0]}) {a - inside:.3f}")


if __name__ == "__main__":
    main()
