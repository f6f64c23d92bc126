"""LangChain: bertfast as a ``langchain_core.embeddings.Embeddings``.

>>> from bertfast.integrations.langchain import BertfastEmbeddings
>>> emb = BertfastEmbeddings()                       # the default checkpoint
>>> vectors = emb.embed_documents(["first text", "second text"])
>>> query = emb.embed_query("what is the first text about?")

``pip install bertfast[langchain]`` (``langchain-core``). Documents get the
checkpoint's ``"document"`` prompt and queries its ``"query"`` prompt (see
:mod:`bertfast.integrations._shared`); the async methods are LangChain's own (the
sync call in an executor thread).
"""

from __future__ import annotations

from pathlib import Path

import torch

try:
    from langchain_core.embeddings import Embeddings
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bertfast.integrations.langchain needs langchain-core: pip install 'bertfast[langchain]'"
    ) from exc

from ..embedder import Embedder
from . import _shared


class BertfastEmbeddings(Embeddings):
    """LangChain embeddings on bertfast.

    ``model``: a checkpoint folder, a loaded :class:`bertfast.Embedder`, or None (the
    default checkpoint). ``device``, ``dtype``, ``backend``, ``max_length``,
    ``quantize``: as :meth:`bertfast.Embedder.from_pretrained`. ``batch_size``: texts
    per model batch. ``normalize``: None follows the checkpoint (its sentence-
    transformers ``Normalize`` module), True / False force it. ``query_prompt`` /
    ``query_prompt_name`` and ``document_prompt`` / ``document_prompt_name``: the text
    prepended to queries / documents, or the name of one of the checkpoint's prompts
    (default: ``"query"`` / ``"document"``).
    """

    def __init__(
        self,
        model: str | Path | Embedder | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        backend: str = "auto",
        max_length: int | None = None,
        quantize: str | None = None,
        batch_size: int = 32,
        normalize: bool | None = None,
        query_prompt: str | None = None,
        query_prompt_name: str | None = None,
        document_prompt: str | None = None,
        document_prompt_name: str | None = None,
    ):
        self.batch_size = _shared.check_batch_size(batch_size)
        self.normalize = normalize
        self.embedder = _shared.load_embedder(
            model,
            device=device,
            dtype=dtype,
            backend=backend,
            max_length=max_length,
            quantize=quantize,
        )
        self._query = _shared.prompt_kwargs(self.embedder, "query", query_prompt, query_prompt_name)
        self._document = _shared.prompt_kwargs(
            self.embedder, "document", document_prompt, document_prompt_name
        )

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One vector (a list of floats) per text, in order."""
        return _shared.encode(self.embedder, texts, self._document, self.batch_size, self.normalize)

    def embed_query(self, text: str) -> list[float]:
        """The vector of one query."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, not {type(text).__name__}")
        return _shared.encode(self.embedder, [text], self._query, self.batch_size, self.normalize)[
            0
        ]

    def __repr__(self) -> str:
        return f"BertfastEmbeddings({self.embedder!r}, batch_size={self.batch_size})"
