"""Text -> model inputs, through the Rust ``tokenizers`` library.

A checkpoint folder provides its tokenizer in one of two ways:

- ``tokenizer.json`` (every recent Hugging Face checkpoint): loaded as is; the
  padding and truncation settings stored in it are replaced by ours.
- ``vocab.txt`` only (old BERT folders): a WordPiece tokenizer is built with BERT's
  normalisation (clean text, CJK characters split, lower-casing and accent stripping
  as ``tokenizer_config.json``'s ``do_lower_case`` / ``strip_accents`` say), BERT's
  pre-tokenisation (whitespace and punctuation) and ``[CLS] A [SEP] (B [SEP])``
  post-processing, the same pipeline as transformers' ``BertTokenizer``.

:class:`Tokenizer` returns int64 ``input_ids`` / ``attention_mask`` /
``token_type_ids`` tensors, padded on the right to the longest sequence of the batch
and truncated to ``max_length`` (longest-first for sentence pairs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
import torch

__all__ = ["Tokenizer", "TokenizerError", "model_max_length"]

#: Families whose position ids start after the padding index (RoBERTa style), so
#: ``max_position_embeddings`` overstates the usable length by ``pad_token_id + 1``.
_OFFSET_POSITION_FAMILIES = {"roberta", "xlm-roberta", "camembert"}

#: transformers writes this (int(1e30)) as ``model_max_length`` when it is unknown.
_UNSET_MAX_LENGTH = 10**9

_BERT_SPECIALS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}

TextInput = Union[str, tuple[str, str]]  # noqa: UP007 (a runtime alias)


class TokenizerError(ValueError):
    """The checkpoint folder has no usable tokenizer."""


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_str(value) -> str | None:
    # special_tokens_map.json holds either "[CLS]" or {"content": "[CLS]", ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def model_max_length(path: str | Path) -> int | None:
    """The longest input the checkpoint accepts (tokens), or ``None`` if unknown.

    The smaller of the model's position table (less the RoBERTa offset) and the
    tokenizer's ``model_max_length``.
    """
    path = Path(path)
    limits = []
    config = _read_json(path / "config.json")
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        if config.get("model_type") in _OFFSET_POSITION_FAMILIES:
            pad = config.get("pad_token_id")
            positions -= (1 if pad is None else int(pad)) + 1
        limits.append(positions)
    tok_max = _read_json(path / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, (int, float)) and 0 < tok_max < _UNSET_MAX_LENGTH:
        limits.append(int(tok_max))
    return min(limits) if limits else None


def _wordpiece_from_vocab(path: Path):
    """A BERT WordPiece tokenizer built from ``vocab.txt`` (+ tokenizer_config.json)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    vocab: dict[str, int] = {}
    with open(path / "vocab.txt", encoding="utf-8") as f:
        for index, line in enumerate(f):
            token = line.rstrip("\n")
            # A duplicated line keeps its last index, as in transformers' load_vocab.
            vocab[token] = index
    cfg = _read_json(path / "tokenizer_config.json")
    specials_map = _read_json(path / "special_tokens_map.json")
    specials = {}
    for key, default in _BERT_SPECIALS.items():
        specials[key] = _token_str(specials_map.get(key)) or _token_str(cfg.get(key)) or default
    missing = [tok for key, tok in specials.items() if key != "mask_token" and tok not in vocab]
    if missing:
        raise TokenizerError(f"{path / 'vocab.txt'} lacks the special tokens {missing}")

    lower = cfg.get("do_lower_case", True)  # BertTokenizer's default
    strip_accents = cfg.get("strip_accents")  # None: follow lower-casing, as BERT does
    tok = RustTokenizer(
        models.WordPiece(vocab, unk_token=specials["unk_token"], max_input_chars_per_word=100)
    )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(cfg.get("tokenize_chinese_chars", True)),
        strip_accents=strip_accents,
        lowercase=bool(lower),
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = specials["cls_token"], specials["sep_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    # Special tokens written in the text stay whole, as in transformers.
    tok.add_special_tokens([t for t in specials.values() if t in vocab])
    return tok, specials["pad_token"]


@dataclass
class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer``; see the module docstring."""

    backend: object  # tokenizers.Tokenizer
    pad_token_id: int
    max_length: int | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, max_length: int | None = None) -> Tokenizer:
        """Load from a checkpoint folder; ``max_length`` defaults to the model's limit."""
        from tokenizers import Tokenizer as RustTokenizer

        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"{path} is not a directory")
        if (path / "tokenizer.json").is_file():
            try:
                tok = RustTokenizer.from_file(str(path / "tokenizer.json"))
            except Exception as exc:  # the Rust side raises a bare Exception
                raise TokenizerError(f"cannot read {path / 'tokenizer.json'}: {exc}") from exc
            cfg = _read_json(path / "tokenizer_config.json")
            smap = _read_json(path / "special_tokens_map.json")
            pad_token = _token_str(smap.get("pad_token")) or _token_str(cfg.get("pad_token"))
        elif (path / "vocab.txt").is_file():
            tok, pad_token = _wordpiece_from_vocab(path)
        else:
            raise TokenizerError(
                f"{path} has no tokenizer: expected tokenizer.json or (for BERT) vocab.txt"
            )
        pad_id = tok.token_to_id(pad_token) if pad_token else None
        if pad_id is None:
            pad_id = _read_json(path / "config.json").get("pad_token_id")
        if pad_id is None:
            pad_id = 0
        tok.no_padding()
        tok.no_truncation()
        limit = model_max_length(path)
        if max_length is None:
            max_length = limit
        elif limit is not None and max_length > limit:
            raise ValueError(f"max_length={max_length} exceeds the model's limit of {limit} tokens")
        return cls(tok, int(pad_id), max_length)

    # ------------------------------------------------------------ tokenising
    def tokenize(
        self, texts: Sequence[TextInput], max_length: int | None = None
    ) -> list[tuple[list[int], list[int]]]:
        """``(ids, type_ids)`` per text (or ``(a, b)`` pair), truncated, unpadded."""
        max_length = max_length or self.max_length
        if max_length:
            self.backend.enable_truncation(int(max_length), strategy="longest_first")
        else:
            self.backend.no_truncation()
        inputs = [tuple(t) if isinstance(t, (tuple, list)) else t for t in texts]
        encodings = self.backend.encode_batch(inputs, add_special_tokens=True)
        return [(e.ids, e.type_ids) for e in encodings]

    def collate(self, items: Sequence[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        """Right-pad tokenised items into int64 ``[B, S]`` tensors."""
        batch = len(items)
        seq = max((len(ids) for ids, _ in items), default=0)
        input_ids = np.full((batch, seq), self.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((batch, seq), dtype=np.int64)
        token_type_ids = np.zeros((batch, seq), dtype=np.int64)
        for row, (ids, type_ids) in enumerate(items):
            n = len(ids)
            input_ids[row, :n] = ids
            attention_mask[row, :n] = 1
            token_type_ids[row, :n] = type_ids
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "token_type_ids": torch.from_numpy(token_type_ids),
        }

    def __call__(
        self,
        texts: str | Sequence[str],
        text_pairs: str | Sequence[str] | None = None,
        max_length: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """Tokenise, truncate and pad a batch (or one text / one pair)."""
        if isinstance(texts, str):
            texts = [texts]
            if isinstance(text_pairs, str):
                text_pairs = [text_pairs]
        if text_pairs is not None:
            if len(text_pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text pairs")
            inputs: list[TextInput] = list(zip(texts, text_pairs))
        else:
            inputs = list(texts)
        return self.collate(self.tokenize(inputs, max_length))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)
