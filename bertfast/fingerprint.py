"""Content fingerprints of a checkpoint folder: what ``bertfast encode --resume`` checks.

A resumed run must compute its vectors with the same model as the run it continues.
The checkpoint's path says nothing about that (a folder can be overwritten in place,
``model.safetensors`` replaced by a fine-tuned one), so a run records, for every file
bertfast reads from the folder, its size and the SHA-256 of its bytes:

- ``config.json`` and the weight files ``checkpoint.find_weight_files`` picks (one
  ``model.safetensors``, the shards an index names, or the ``.bin`` files);
- the tokenizer files (``tokenizer.json``, ``vocab.txt``, ``tokenizer_config.json``,
  ``special_tokens_map.json``);
- the sentence-transformers files that decide pooling, normalisation and length
  (``modules.json``, ``sentence_bert_config.json``, ``1_Pooling/config.json``); what
  they decide is also recorded as settings, so a pooling module elsewhere in the
  folder is covered either way.

A whole hash, not a sample: a fine-tuned checkpoint of the same architecture has the
same sizes and the same safetensors header, and an edit to one tensor must be seen.
Its cost is one pass over the files at SHA-256's speed, about 2 GB/s per core on CPUs
with SHA extensions (timings: ``benchmarks/results/<machine>/notes.md``). Hashing in a
thread beside the model load was tried and gained nothing: the load keeps both cores
busy.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["checkpoint_files", "checkpoint_fingerprint", "FINGERPRINT_PREFIX"]

#: Keys of the fingerprint: ``"checkpoint file <relative name>"``.
FINGERPRINT_PREFIX = "checkpoint file "

_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
_SENTENCE_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json")
_BLOCK = 1 << 22


def checkpoint_files(folder: str | os.PathLike) -> list[str]:
    """The files of ``folder`` that bertfast reads, as names relative to it, sorted.

    Weight files are the ones the loader would read (``CheckpointError`` when there
    are none, as at load); the other names are listed where they exist."""
    from .checkpoint import find_weight_files

    root = os.fspath(folder)
    _, weights = find_weight_files(root)
    names = {os.path.relpath(path, root) for path in weights}
    for name in ("config.json", *_TOKENIZER_FILES, *_SENTENCE_FILES):
        if os.path.isfile(os.path.join(root, name)):
            names.add(name)
    return sorted(names)


def _digest(path: str) -> str:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            size += len(block)
    return f"{size} bytes, sha256 {h.hexdigest()}"


def checkpoint_fingerprint(folder: str | os.PathLike) -> dict[str, str]:
    """``{"checkpoint file <name>": "<size> bytes, sha256 <hex>"}`` for every file of
    :func:`checkpoint_files`."""
    root = Path(folder)
    return {FINGERPRINT_PREFIX + name: _digest(str(root / name)) for name in checkpoint_files(root)}
