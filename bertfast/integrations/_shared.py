"""What the framework adapters share: loading the :class:`~bertfast.Embedder` and
encoding queries and documents with the checkpoint's prompts.

Queries are encoded with the prompt named ``"query"`` and documents with the prompt
named ``"document"``, as sentence-transformers' ``encode_query`` / ``encode_document``
do (a checkpoint without such prompts has them empty: the text is encoded as it is).
A prompt string or another prompt name can be given per side.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..embedder import Embedder
from ..validate import short_repr

SIDES = ("query", "document")


def load_embedder(
    model: str | Path | Embedder | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    backend: str = "auto",
    max_length: int | None = None,
    quantize: str | None = None,
) -> Embedder:
    """``model``: a loaded :class:`Embedder` (used as it is; the other arguments must
    then be left at their defaults), a checkpoint folder, or None (the default
    checkpoint, ``bertfast[demo]``)."""
    if isinstance(model, Embedder):
        given = {
            "device": str(device) != "cpu",
            "dtype": dtype not in (torch.float32, "float32"),
            "backend": backend != "auto",
            "max_length": max_length is not None,
            "quantize": quantize is not None,
        }
        clash = [name for name, set_ in given.items() if set_]
        if clash:
            raise ValueError(
                f"model is an already loaded Embedder: {', '.join(clash)} cannot change it; "
                "pass a checkpoint folder instead, or load the Embedder with them"
            )
        return model
    if model is not None and not isinstance(model, (str, Path)):
        raise TypeError(
            "model must be a checkpoint folder (str or Path), a bertfast.Embedder or None, "
            f"not {type(model).__name__}"
        )
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"dtype must be a torch dtype or its name, not {short_repr(dtype)}")
        dtype = resolved
    return Embedder.from_pretrained(
        model, device=device, dtype=dtype, backend=backend, max_length=max_length, quantize=quantize
    )


def prompt_kwargs(
    embedder: Embedder,
    side: str,
    prompt: str | None,
    prompt_name: str | None,
    param: str | None = None,
) -> dict[str, Any]:
    """``encode``'s prompt arguments for one side (``"query"`` or ``"document"``):
    ``prompt`` if given, else ``prompt_name`` (default: the side's own name), checked
    against the checkpoint's prompts now rather than at the first call. ``param``: the
    adapter's name for the side in its argument names (default: ``side``)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    param = param or side
    if prompt is not None:
        if prompt_name is not None:
            raise ValueError(f"give {param}_prompt or {param}_prompt_name, not both")
        if not isinstance(prompt, str):
            raise TypeError(f"{param}_prompt must be a string, not {type(prompt).__name__}")
        return {"prompt": prompt}
    name = side if prompt_name is None else prompt_name
    if not isinstance(name, str) or name not in embedder.prompts:
        raise ValueError(
            f"unknown {param}_prompt_name {short_repr(name)}; this checkpoint's prompts: "
            f"{', '.join(map(repr, embedder.prompts))}"
        )
    return {"prompt_name": name}


def check_batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    return batch_size


def encode(
    embedder: Embedder,
    texts: Sequence[str],
    prompt: dict[str, Any],
    batch_size: int,
    normalize: bool | None,
) -> list[list[float]]:
    """Vectors as lists of Python floats, in input order (an empty list: none)."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string (embed it as a query)")
    texts = list(texts)
    if not texts:
        return []
    return embedder.encode(
        texts,
        batch_size=batch_size,
        normalize=normalize,
        convert_to="list",
        show_progress=False,
        **prompt,
    )
