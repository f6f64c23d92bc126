"""A tiny random-weight BERT checkpoint with a word-level vocabulary, for the
streaming / Ray tests: encoding is fast, texts are real words (few [UNK]s), and the
model is a real bertfast Embedder checkpoint (config.json, weights, vocab.txt)."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

from . import models

#: 101 tokens (models.VOCAB): specials, letters and continuation letters, words.
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "hello",
    "world",
    "dog",
    "run",
    "quick",
    "brown",
    "fox",
    "lazy",
    "jump",
    "over",
    "an",
    "is",
    "of",
    "and",
    "to",
    "in",
    "it",
    "for",
    "was",
    "with",
    "as",
    "at",
    "by",
    "be",
    "this",
    "from",
    "or",
    "fast",
    "slow",
    "text",
    "vector",
]


def vocab():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = specials + list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    tokens += list(".,!?") + ["##ing", "##ed", "##ly", "##er"]
    tokens += WORDS[: models.VOCAB - len(tokens)]
    assert len(tokens) == models.VOCAB and len(set(tokens)) == len(tokens)
    return tokens


#: ``micro``: 1 layer, hidden 32 (the 200k-line streaming tests); ``small``: the
#: 3-layer, hidden-96 BERT of tests/models.py.
SIZES = {
    "micro": dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64),
    "small": {},
}


def make_checkpoint(folder, seed: int = 0, max_positions: int = 64, size: str = "small") -> Path:
    """Save a random BERT (``SIZES[size]``) with a WordPiece vocab.txt to ``folder``."""
    folder = Path(folder)
    model = models.build("bert", seed=seed, max_position_embeddings=max_positions, **SIZES[size])
    models.save(model, str(folder))
    (folder / "vocab.txt").write_text("\n".join(vocab()) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


def corpus(n: int, seed: int = 0, min_words: int = 1, max_words: int = 12):
    """``n`` random short sentences of vocabulary words (some repeated, some empty-ish)."""
    rng = random.Random(seed)
    words = [w for w in vocab() if w.isalpha() and len(w) > 1] + ["runs", "jumped"]
    out = []
    for _ in range(n):
        k = rng.randint(min_words, max_words)
        out.append(" ".join(rng.choice(words) for _ in range(k)) + rng.choice(["", ".", "!"]))
    return out
