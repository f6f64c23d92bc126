"""LlamaIndex: bertfast as a ``llama_index.core.embeddings.BaseEmbedding``.

>>> from bertfast.integrations.llamaindex import BertfastEmbedding
>>> from llama_index.core import Settings
>>> Settings.embed_model = BertfastEmbedding()      # the default checkpoint

``pip install bertfast[llamaindex]`` (``llama-index-core``). Texts (documents) get
the checkpoint's ``"document"`` prompt and queries its ``"query"`` prompt (see
:mod:`bertfast.integrations._shared`); ``embed_batch_size`` is the model batch.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

try:
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.embeddings import BaseEmbedding
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bertfast.integrations.llamaindex needs llama-index-core: "
        "pip install 'bertfast[llamaindex]'"
    ) from exc

from ..embedder import Embedder
from . import _shared


class BertfastEmbedding(BaseEmbedding):
    """LlamaIndex embeddings on bertfast.

    ``model``: a checkpoint folder, a loaded :class:`bertfast.Embedder`, or None (the
    default checkpoint). ``device``, ``dtype``, ``backend``, ``max_length``,
    ``quantize``: as :meth:`bertfast.Embedder.from_pretrained`. ``embed_batch_size``:
    texts per model batch (LlamaIndex's own field). ``normalize``: None follows the
    checkpoint, True / False force it. ``query_prompt`` / ``query_prompt_name`` and
    ``text_prompt`` / ``text_prompt_name``: the text prepended to queries / texts, or
    the name of one of the checkpoint's prompts (default: ``"query"`` /
    ``"document"``). Other keyword arguments go to ``BaseEmbedding`` (e.g.
    ``callback_manager``).
    """

    _embedder: Any = PrivateAttr()
    _normalize: Any = PrivateAttr()
    _query: Any = PrivateAttr()
    _text: Any = PrivateAttr()

    def __init__(
        self,
        model: str | Path | Embedder | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        backend: str = "auto",
        max_length: int | None = None,
        quantize: str | None = None,
        embed_batch_size: int = 32,
        normalize: bool | None = None,
        query_prompt: str | None = None,
        query_prompt_name: str | None = None,
        text_prompt: str | None = None,
        text_prompt_name: str | None = None,
        model_name: str | None = None,
        **kwargs: Any,
    ):
        _shared.check_batch_size(embed_batch_size)
        embedder = _shared.load_embedder(
            model,
            device=device,
            dtype=dtype,
            backend=backend,
            max_length=max_length,
            quantize=quantize,
        )
        if model_name is None:
            model_name = Path(str(model)).name if isinstance(model, (str, Path)) else "bertfast"
        super().__init__(model_name=model_name, embed_batch_size=embed_batch_size, **kwargs)
        self._embedder = embedder
        self._normalize = normalize
        self._query = _shared.prompt_kwargs(embedder, "query", query_prompt, query_prompt_name)
        self._text = _shared.prompt_kwargs(
            embedder, "document", text_prompt, text_prompt_name, param="text"
        )

    @classmethod
    def class_name(cls) -> str:
        return "BertfastEmbedding"

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    def _encode(self, texts: list[str], prompt: dict[str, Any]) -> list[list[float]]:
        return _shared.encode(self._embedder, texts, prompt, self.embed_batch_size, self._normalize)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._encode([query], self._query)[0]

    # async: the same call in a worker thread, so the event loop keeps running
    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._encode([text], self._text)[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._encode(texts, self._text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        # one batched call (the base class would embed text by text)
        return await asyncio.to_thread(self._get_text_embeddings, texts)
