"""What a benchmark runs: model dimensions and FLOP counts, sequence lengths, batches.

FLOP convention (used everywhere in the suite): *useful* FLOPs, counted on real
tokens only. A padded baseline that spends work on padding gets no credit for it, so
GFLOP/s of two providers on the same batch compare exactly like their speeds. The
padded count is reported beside it where it differs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "ModelDims",
    "encoder_flops",
    "ragged_lengths",
    "padding_lengths",
    "Batch",
    "make_batch",
    "parse_shape",
]


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    layers: int
    heads: int
    intermediate: int

    @classmethod
    def from_config(cls, cfg) -> ModelDims:
        get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        return cls(
            int(get("hidden_size")),
            int(get("num_hidden_layers")),
            int(get("num_attention_heads")),
            int(get("intermediate_size")),
        )

    @classmethod
    def from_path(cls, path: str) -> ModelDims:
        with open(os.path.join(path, "config.json")) as f:
            return cls.from_config(json.load(f))


def encoder_flops(dims: ModelDims, lengths: Sequence[int]) -> int:
    """FLOPs of one encoder forward over sequences of the given lengths.

    Per layer and token: QKV (``2*3H^2``), output projection (``2*H^2``) and the FFN
    (``2*2*H*I``) GEMMs; per layer and sequence of length ``L``: ``Q K^T`` and ``P V``,
    ``4*L^2*H``. Embeddings, LayerNorm, softmax and GELU are memory-bound and not
    counted. Pass real lengths for useful FLOPs, ``[S] * B`` for a padded batch.
    """
    H, I = dims.hidden, dims.intermediate
    tokens = sum(int(n) for n in lengths)
    per_layer = 2 * tokens * (4 * H * H + 2 * H * I) + sum(4 * int(n) ** 2 * H for n in lengths)
    return dims.layers * per_layer


# ---------------------------------------------------------------- lengths
def ragged_lengths(
    batch: int, mean: float, max_len: int, min_len: int = 8, sigma: float = 0.6, seed: int = 0
) -> list[int]:
    """Sequence lengths for a ragged batch, as a tokenizer with ``padding=True`` sees them.

    Sentence and passage lengths in tokens are right-skewed and close to log-normal;
    ``sigma=0.6`` matches the spread of typical sentence-embedding corpora (most
    sentences within 0.5x-2x of the median). ``mu`` is set so the unclipped mean is
    ``mean``; draws are clipped to ``[min_len, max_len]``. Deterministic per seed.
    """
    g = torch.Generator().manual_seed(seed)
    mu = math.log(mean) - sigma**2 / 2
    draws = torch.empty(batch, dtype=torch.float64).log_normal_(mu, sigma, generator=g)
    return [int(min(max(round(x), min_len), max_len)) for x in draws.tolist()]


def padding_lengths(batch: int, seq: int, padding: float, seed: int = 0) -> list[int]:
    """Lengths for a ``batch x seq`` padded batch whose padding fraction is ~``padding``.

    Row 0 is full (so the padded shape is exactly ``seq``); the others are drawn
    uniformly around the mean that gives the asked fraction.
    """
    if padding <= 0:
        return [seq] * batch
    g = torch.Generator().manual_seed(seed)
    target = (1.0 - padding) * seq * batch
    rest = max(target - seq, batch - 1) / max(batch - 1, 1)
    u = torch.rand(max(batch - 1, 0), generator=g, dtype=torch.float64) - 0.5
    others = [int(min(max(round(rest * (1 + 0.8 * x)), 1), seq)) for x in u.tolist()]
    return [seq] + others


# ---------------------------------------------------------------- batches
@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, S] int64
    attention_mask: torch.Tensor  # [B, S] int64, 1 = real token
    token_type_ids: torch.Tensor  # [B, S] int64
    lengths: list[int]

    @property
    def shape(self):
        return tuple(self.input_ids.shape)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding_fraction(self) -> float:
        B, S = self.shape
        return 1.0 - self.real_tokens / max(B * S, 1)

    def to(self, device) -> Batch:
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.token_type_ids.to(device),
            list(self.lengths),
        )


def make_batch(
    lengths: Sequence[int], vocab_size: int, seq: int | None = None, seed: int = 0, device="cpu"
) -> Batch:
    """A right-padded batch: ``[CLS] random tokens [SEP]`` per row, zeros after."""
    lengths = [int(n) for n in lengths]
    S = int(seq or max(lengths))
    B = len(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000 if vocab_size > 2000 else 3, vocab_size, (B, S), generator=g)
    pos = torch.arange(S)[None, :]
    lens = torch.tensor(lengths)[:, None]
    mask = (pos < lens).long()
    ids = ids * mask
    if vocab_size > 2000:  # BERT vocab: [CLS]=101, [SEP]=102
        ids[:, 0] = 101
        ids.scatter_(1, (lens - 1).clamp(min=0), 102)
    tt = torch.zeros_like(ids)
    return Batch(ids, mask, tt, lengths).to(device)


def parse_shape(text: str) -> tuple[str, list[int]]:
    """``BxS`` (full batch) or ``rBxMEANxMAX`` (ragged, log-normal lengths) ->
    (label, lengths); a ValueError saying what is expected otherwise."""
    ragged = text.startswith("r")
    parts = (text[1:] if ragged else text).split("x")
    if len(parts) != (3 if ragged else 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"--shapes: {text!r} is neither BxS nor rBxMEANxMAX with positive "
            f"integers (e.g. 8x128 or r32x64x128)"
        )
    if ragged:
        b, mean, mx = (int(v) for v in parts)
        if mean > mx:
            raise ValueError(f"--shapes: {text!r} has a mean length above its maximum")
        return text, ragged_lengths(b, mean, mx)
    b, s = (int(v) for v in parts)
    return text, [s] * b
