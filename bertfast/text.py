"""Checks on input texts, shared by every way text comes in (``Embedder.encode``, the
tokenizer, ``bertfast encode``'s JSONL / Parquet / CSV rows, the server).

:func:`text_problem` says in one line why a ``str`` cannot be tokenised, or returns
``None``. The Rust ``tokenizers`` library takes every Python ``str`` except one that
holds a surrogate code point (U+D800-U+DFFF): a surrogate is half of a UTF-16 pair,
not a character, and such a string has no UTF-8 form (found by trying every code
point: NUL, U+FFFE/U+FFFF, private-use and unassigned code points and strings of
millions of characters all tokenise). Python makes such strings from
``json.loads('"\\ud800"')``, ``bytes.decode(..., "surrogateescape")`` or a UTF-16
pair written as two ``\\u`` escapes.

:class:`TextError` is the ``ValueError`` that names the offending text
(``texts[3] holds a lone surrogate ...``).
"""

from __future__ import annotations

__all__ = ["TextError", "text_problem"]

#: A longer text is encoded in slices this long, so the check allocates little.
_SLICE = 1 << 20


def text_problem(text: str) -> str | None:
    """Why ``text`` (a ``str``) cannot be tokenised, in one line, or ``None``.

    The reason reads after the text's name: ``f"texts[{i}] {reason}"``, e.g.
    ``holds a lone surrogate (U+D800 at character 4), which is not text``.

    Fast on good text: an ASCII string is accepted without looking at its characters
    (CPython keeps that flag), any other is encoded to UTF-8 (about 1.5 GB/s; 0.06 ms
    for 2,000 sentences), a long one a megabyte at a time; the exception gives the
    position.
    """
    if text.isascii():
        return None
    start = 0
    try:
        for start in range(0, len(text), _SLICE):
            text[start : start + _SLICE].encode("utf-8")
    except UnicodeEncodeError as exc:
        at = start + exc.start
        code = ord(text[at])
        following = ord(text[at + 1]) if at + 1 < len(text) else None
        if code <= 0xDBFF and following is not None and 0xDC00 <= following <= 0xDFFF:
            return (
                f"holds a UTF-16 surrogate pair written as two code points (U+{code:04X} "
                f"U+{following:04X} at character {at}), which is not text; join the pair "
                "(s.encode('utf-16', 'surrogatepass').decode('utf-16'))"
            )
        return f"holds a lone surrogate (U+{code:04X} at character {at}), which is not text"
    return None


class TextError(ValueError):
    """A text that cannot be tokenised: ``texts[index] reason`` (``texts[index][side]``
    for one side of a sentence pair; ``the text`` when ``index`` is None)."""

    def __init__(self, index: int | None, reason: str, side: int | None = None):
        self.index, self.side, self.reason = index, side, reason
        name = "the text" if index is None else f"texts[{index}]"
        if side is not None:
            name += f"[{side}]"
        super().__init__(f"{name} {reason}")
