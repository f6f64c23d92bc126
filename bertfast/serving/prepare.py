"""Request body -> tokenised request: the work each server does before the model, meant
to run in worker threads, off the event loop and off the model's thread.

:class:`Preparer` parses and validates a body (:func:`~bertfast.serving.protocol.parse_embed`),
prepends the checkpoint's default prompt as :meth:`bertfast.Embedder.encode` does, and
tokenises the texts with the embedder's own tokenizer rules (:class:`bertfast.tokenizer.Tokenizer`:
truncation to the model's limit; a very long text is cut before it is tokenised, so a
5 MB text costs what a few thousand characters cost). A request that does not truncate
is tokenised once, to ``limit + 1`` tokens: a text that reaches ``limit + 1`` is over
the limit (a 413 naming it), any other is whole, exactly as truncation to ``limit``
would leave it.

The Rust tokenizer keeps its truncation setting in the object, so every thread gets its
own copy (made on the thread's first request); the ``tokenizers`` library releases the
GIL while it encodes, so threads tokenise in parallel with each other and the model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..text import TextError
from ..tokenizer import Tokenizer
from . import protocol
from .protocol import EmbedRequest, Limits, RequestError

__all__ = ["Prepared", "Preparer"]


@dataclass
class Prepared:
    """A request ready for the model: ``items`` holds ``(ids, type_ids)`` per text (as
    :meth:`Tokenizer.tokenize` returns them), ``tokens`` their total length."""

    request: EmbedRequest
    items: list[tuple[list[int], list[int]]]
    tokens: int

    def __len__(self) -> int:
        return len(self.items)


class Preparer:
    """Parses, validates and tokenises requests for ``embedder`` (a
    :class:`bertfast.Embedder`) under ``limits``; ``auto_truncate``: truncate when a
    request does not say (``/v1/embeddings`` never says). Thread-safe."""

    def __init__(self, embedder, limits: Limits, *, auto_truncate: bool = False):
        self.limits = limits
        self.auto_truncate = bool(auto_truncate)
        self.dim = int(embedder.dim)
        self.limit = embedder.max_length
        name = embedder.default_prompt_name
        self.prompt = embedder.prompts.get(name, "") if name else ""
        self._source = embedder.tokenizer
        self._local = threading.local()

    def tokenizer(self) -> Tokenizer:
        """This thread's copy of the embedder's tokenizer."""
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            from tokenizers import Tokenizer as RustTokenizer

            source = self._source
            backend = RustTokenizer.from_str(source.backend.to_str())
            backend.no_padding()
            tok = Tokenizer(backend, source.pad_token_id, source.max_length)
            self._local.tokenizer = tok
        return tok

    def parse(self, route: str, body: bytes) -> EmbedRequest:
        return protocol.parse_embed(
            route, body, self.limits, dim=self.dim, auto_truncate=self.auto_truncate
        )

    def tokenize(self, request: EmbedRequest) -> Prepared:
        """``request``'s texts tokenised as :meth:`bertfast.Embedder.encode` would (its
        default prompt first); a text over the token limit without truncation is a 413
        naming it (:func:`protocol.too_long`)."""
        texts = request.texts
        if self.prompt:
            texts = [self.prompt + text for text in texts]
        tok, limit = self.tokenizer(), self.limit
        try:
            if limit is None or request.truncate:
                items = tok.tokenize(texts)
            else:
                items = tok.tokenize(texts, max_length=limit + 1)
                for i, (ids, _) in enumerate(items):
                    if len(ids) > limit:
                        count = tok.count([texts[i]], at_most=limit)[0]
                        raise protocol.too_long(request, i, count, limit)
        except TextError as exc:  # protocol's check finds these first; kept as a guard
            name = "inputs" if request.route == protocol.TEI else "input"
            raise RequestError(422, f"'{name}[{exc.index}]' {exc.reason}", "Tokenizer") from None
        return Prepared(request, items, sum(len(ids) for ids, _ in items))

    def prepare(self, route: str, body: bytes) -> Prepared:
        """:meth:`parse` then :meth:`tokenize`: one call for a worker thread."""
        return self.tokenize(self.parse(route, body))
