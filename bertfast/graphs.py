"""CUDA graphs for small batches: capture the encoder once per shape bucket, replay.

At batch 1..32 the GPU encoder is bound by kernel-launch latency, not arithmetic;
replaying a captured CUDA graph removes the per-kernel CPU cost. Graphs need static
shapes, so a captured encoder runs the *padded* layout of a bucket
``[batch_bucket, seq_bucket]`` (attention with a key-padding mask instead of
``cu_seqlens``): the caller's ids, mask, token types and positions are copied into
the bucket's static buffers (the unused corner has mask 0 and id 0), the graph is
replayed on the current stream, and the real rows are read back out. Padding waste
is bounded by the bucket ratio (at most 2x), which at these sizes costs less than
the launches saved; larger batches run the padding-free eager path.

- One graph per bucket, captured on first use and kept (no recapture in steady
  state; ``captures`` counts them). All graphs share one memory pool.
- Inputs are validated by the model *before* replay (ids, shapes, ranges).
- Replays are ordered on the caller's current stream, like any other kernel, so
  other CUDA work of the caller is not disturbed.
- ``capture=False`` runs the same static-shape function without a graph: that is how
  the bucketing and the static encoder are tested on machines without a GPU.

Turned on by ``from_pretrained(..., cuda_graphs=True)`` (default: on for CUDA
devices; ``BERTFAST_CUDA_GRAPHS=0`` turns it off globally).
"""

from __future__ import annotations

import bisect
import os
import threading

import torch

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
SEQ_BUCKETS = (16, 32, 64, 128, 256, 512)
#: Largest bucket (tokens) worth a graph; beyond it launches are a small share.
MAX_BUCKET_TOKENS = 8192


def graphs_enabled(requested, device: torch.device) -> bool:
    """Resolve the ``cuda_graphs`` option: True/False, or None for the default."""
    if os.environ.get("BERTFAST_CUDA_GRAPHS", "").strip() in ("0", "false", "off"):
        return False
    if requested is None:
        return device.type == "cuda"
    if requested and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA device, the model is on {device}")
    return bool(requested)


def bucket(batch: int, seqlen: int, max_seq: int) -> tuple[int, int] | None:
    """Smallest (batch, seq) bucket holding the input, or None if it is too large."""
    bi = bisect.bisect_left(BATCH_BUCKETS, batch)
    si = bisect.bisect_left(SEQ_BUCKETS, seqlen)
    if bi == len(BATCH_BUCKETS) or si == len(SEQ_BUCKETS):
        return None
    b, s = BATCH_BUCKETS[bi], min(SEQ_BUCKETS[si], max_seq)
    if s < seqlen or b * s > MAX_BUCKET_TOKENS:
        return None
    return b, s


class _Entry:
    def __init__(self, model, b: int, s: int, capture: bool, pool):
        dev = model.device
        self.ids = torch.zeros(b, s, dtype=torch.long, device=dev)
        self.mask = torch.zeros(b, s, dtype=torch.int32, device=dev)
        self.pos = torch.zeros(b, s, dtype=torch.long, device=dev)
        self.types = (
            torch.zeros(b, s, dtype=torch.long, device=dev)
            if model.config.has_token_types
            else None
        )
        self.model = model
        self.graph = None
        self.out = None
        if capture:
            # Warm up on a side stream (lazy inits, autotuning) before capturing.
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run()
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.out = self._run()

    def _run(self) -> torch.Tensor:
        return self.model.encode_static(self.ids, self.mask, self.types, self.pos)

    def __call__(self, ids, mask, types, pos) -> torch.Tensor:
        B, S = ids.shape
        for dst, src in ((self.ids, ids), (self.mask, mask), (self.pos, pos), (self.types, types)):
            if dst is None:
                continue
            dst.zero_()
            dst[:B, :S].copy_(src)
        if self.graph is None:
            out = self._run()
        else:
            self.graph.replay()
            out = self.out
        return out[:B, :S].clone()  # the static output is overwritten by the next replay


class GraphCache:
    """Captured encoders of one model, by bucket."""

    def __init__(self, model, capture: bool = True):
        self.model = model
        self.capture = capture
        self.entries: dict[tuple[int, int], _Entry] = {}
        self.captures = 0
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._lock = threading.Lock()

    def run(self, ids, mask, types, pos) -> torch.Tensor | None:
        """``[B, S, H]`` last hidden state (zeros at padded positions), or None when
        the input has no bucket (the caller then runs the eager path)."""
        if self.capture and torch.cuda.is_current_stream_capturing():
            return None  # the caller is capturing its own graph: stay eager inside it
        key = bucket(ids.shape[0], ids.shape[1], self.model.config.max_position_embeddings)
        if key is None:
            return None
        with self._lock:
            entry = self.entries.get(key)
            if entry is None:
                entry = _Entry(self.model, key[0], key[1], self.capture, self._pool)
                self.entries[key] = entry
                self.captures += 1
            return entry(ids, mask, types, pos)
