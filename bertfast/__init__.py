"""bertfast: a fast runtime for BERT-family text encoders.

Public API (imported lazily so ``import bertfast`` stays cheap):

- ``from_pretrained(path, device="cpu", dtype=torch.float32, backend="auto", head=None,
  cuda_graphs=None)``
- ``optimize(hf_model, backend="auto", dtype=None, fallback=True, cuda_graphs=None,
  padded_positions="zeros")``
- ``Embedder.from_pretrained(path=None, device="cpu", dtype=torch.float32,
  backend="auto", max_length=None)`` and ``default_checkpoint()``
- ``backends()`` and ``build_info()``
- ``EncoderConfig``
- ``CheckpointError`` (the one error for a checkpoint that cannot be loaded, a
  ``ValueError``) and ``BackendError`` (a backend that cannot run the input)

README.md documents each of them; docs/design.md explains how they are built.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "from_pretrained": "bertfast.model",
    "BertfastModel": "bertfast.model",
    "EncoderConfig": "bertfast.config",
    "Embedder": "bertfast.embedder",
    "default_checkpoint": "bertfast.embedder",
    "optimize": "bertfast.dropin",
    "backends": "bertfast.info",
    "build_info": "bertfast.info",
    "BackendError": "bertfast.ops.dispatch",
    "CheckpointError": "bertfast.validate",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bertfast' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
