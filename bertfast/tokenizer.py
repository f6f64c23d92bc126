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

Memory is bounded whatever a text's length: a text of more than
``max(CUT_MIN_CHARS, CUT_CHARS_PER_TOKEN * max_length)`` characters is first cut, at a
place proven not to change its first ``max_length`` tokens (:func:`cut_text`), so a
50 MB text costs what a few thousand characters cost. Each long side of a sentence pair
is cut so that longest-first truncation keeps the same tokens; when both sides are
long and the budget is odd, which side is longer decides where the extra token goes,
so both are also tokenised whole once (alone, not as a pair) to count them. A
tokenizer with a part the argument does not cover tokenises every text whole, as
before. :meth:`Tokenizer.count` counts tokens up to a limit with the same bound (the
server's length check). A text the Rust library refuses (a lone surrogate) is a
:class:`~bertfast.text.TextError` that names it.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np
import torch

from .text import TextError, text_problem

__all__ = ["Tokenizer", "TokenizerError", "cut_text", "model_max_length"]

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


# ---------------------------------------------------------------- cutting long texts
#: A text of at most ``max(CUT_MIN_CHARS, CUT_CHARS_PER_TOKEN * max_length)``
#: characters is tokenised whole; a longer one is cut first (:func:`cut_text`).
CUT_MIN_CHARS = 4096
CUT_CHARS_PER_TOKEN = 16
#: The longest prefix :func:`cut_text` tokenises to find a text's first tokens.
CUT_MAX_CHARS = 1 << 20
#: A prefix's last words, and the words that end in its last characters, are not
#: trusted to be the whole text's (see :func:`cut_text`).
_MARGIN_WORDS = 2
_MARGIN_CHARS = 64
#: The longest ``Replace`` / ``Split`` string pattern the argument covers.
_MAX_PATTERN = 16

#: Normalisers whose effect on a string's end is local (see :func:`cut_text`);
#: ``Replace`` is checked apart.
_LOCAL_NORMALIZERS = frozenset(
    {
        "BertNormalizer",
        "NFC",
        "NFD",
        "NFKC",
        "NFKD",
        "Lowercase",
        "StripAccents",
        "Strip",
        "Prepend",
        "Nmt",
        "Precompiled",
        "ByteLevel",
    }
)
#: Pre-tokenisers that decide each word boundary from the characters around it;
#: ``Metaspace``, ``ByteLevel`` and ``Split`` are checked apart.
_LOCAL_PRE_TOKENIZERS = frozenset(
    {
        "BertPreTokenizer",
        "Whitespace",
        "WhitespaceSplit",
        "Punctuation",
        "Digits",
        "CharDelimiterSplit",
        "UnicodeScripts",
    }
)
_WORD_MODELS = frozenset({"WordPiece", "BPE", "Unigram", "WordLevel"})
#: A regex ``Replace`` pattern that matches whitespace only (`` {2,}`` in XLM-R).
_WHITESPACE_REGEX = re.compile(
    r"(?:[ \t]|\\[stnr]|\[(?:[ \t]|\\[stnr])+\]|[+*?]|\{\d+(?:,\d*)?\})+"
)
#: BERT's CJK ranges (the characters ``BertNormalizer`` surrounds with spaces).
#: Two or more characters that BERT's pre-tokeniser treats as whitespace.
_BERT_SPACE_RUN = re.compile("[\t\n\r \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]{2,}")
_CJK = (
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002b73f"
    "\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f"
)


@dataclass(frozen=True)
class _CutPlan:
    """What :func:`cut_text` needs to know about a tokenizer."""

    #: Why its texts are not cut (a part the argument does not cover), or None.
    unsupported: str | None = None
    #: Added tokens' contents, kept away from a cut.
    added: tuple[str, ...] = ()
    #: BERT's WordPiece (BertNormalizer + BertPreTokenizer): its word-length limit.
    giant_unk: int | None = None
    #: BertNormalizer spaces out CJK characters.
    chinese: bool = False
    #: No added token holds whitespace (so runs of it may be shortened for BERT).
    spaceless_added: bool = True


def _normalizer_problem(spec) -> str | None:
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        for part in spec.get("normalizers") or ():
            problem = _normalizer_problem(part)
            if problem:
                return problem
        return None
    if kind == "Replace":
        pattern = spec.get("pattern") or {}
        string, regex = pattern.get("String"), pattern.get("Regex")
        if isinstance(string, str) and 0 < len(string) <= _MAX_PATTERN:
            return None
        if isinstance(regex, str) and _WHITESPACE_REGEX.fullmatch(regex):
            return None
        return f"the normaliser Replace({pattern})"
    return None if kind in _LOCAL_NORMALIZERS else f"the normaliser {kind}"


def _pre_tokenizer_problem(spec) -> tuple[str | None, bool]:
    """(why it is not covered or None, whether it splits a text into words)."""
    if spec is None:
        return None, False
    kind = spec.get("type")
    if kind == "Sequence":
        parts = spec.get("pretokenizers") or []
        splits = False
        for i, part in enumerate(parts):
            if part.get("type") == "ByteLevel" and i != len(parts) - 1:
                return "a pre-tokeniser ByteLevel that is not the last of its Sequence", False
            problem, part_splits = _pre_tokenizer_problem(part)
            if problem:
                return problem, False
            splits = splits or part_splits
        return None, splits
    if kind in _LOCAL_PRE_TOKENIZERS:
        return None, True
    if kind == "Metaspace":
        return None, bool(spec.get("split", True))
    if kind == "ByteLevel":
        return None, bool(spec.get("use_regex", True))
    if kind == "Split":
        string = (spec.get("pattern") or {}).get("String")
        if isinstance(string, str) and 0 < len(string) <= _MAX_PATTERN:
            return None, True
        return f"the pre-tokeniser Split({spec.get('pattern')})", False
    return f"the pre-tokeniser {kind}", False


def _cut_plan(backend) -> _CutPlan:
    """Read the parts of a ``tokenizers.Tokenizer`` that :func:`cut_text` relies on."""

    def spec(part):
        return None if part is None else json.loads(part.__getstate__())

    try:
        normalizer, pre_tokenizer = spec(backend.normalizer), spec(backend.pre_tokenizer)
    except Exception:  # a custom (Python) part has no JSON form
        return _CutPlan(unsupported="a custom normaliser or pre-tokeniser")
    model = backend.model
    kind = type(model).__name__
    added = backend.get_added_tokens_decoder().values()
    problem = _normalizer_problem(normalizer)
    pre_problem, splits = _pre_tokenizer_problem(pre_tokenizer)
    problem = problem or pre_problem
    if not problem and not splits:
        problem = "a pre-tokeniser that does not split the text into words"
    if not problem and kind not in _WORD_MODELS:
        problem = f"the model {kind}"
    if not problem and kind == "BPE" and getattr(model, "dropout", None):
        problem = "BPE dropout"
    if not problem:
        late = [t.content for t in added if t.normalized]
        if late:
            problem = f"added tokens matched after normalisation ({late[0]!r})"
    if problem:
        return _CutPlan(unsupported=problem)
    giant = None
    chinese = False
    if (
        kind == "WordPiece"
        and (normalizer or {}).get("type") == "BertNormalizer"
        and (pre_tokenizer or {}).get("type") == "BertPreTokenizer"
    ):
        giant = int(model.max_input_chars_per_word)
        chinese = bool(normalizer.get("handle_chinese_chars", True))
    contents = sorted({t.content for t in added if t.content}, key=len, reverse=True)
    spaceless = not any(char.isspace() for token in contents for char in token)
    return _CutPlan(
        added=tuple(contents), giant_unk=giant, chinese=chinese, spaceless_added=spaceless
    )


def _added_token_near(text: str, at: int, added: Sequence[str]) -> int | None:
    """Start of the first added token found within its length + 1 of ``at``."""
    hit = None
    for token in added:
        n = len(token)
        i = text.find(token, max(0, at - n - 1), at + n + 1)
        if i >= 0 and (hit is None or i < hit):
            hit = i
    return hit


def _cut_point(text: str, size: int, added: Sequence[str]) -> int | None:
    """The largest ``c`` in ``(size // 2, size]`` with ``text[c - 1]`` not whitespace
    and no added token near ``c``; None if there is none. ``c`` stays far enough from
    the end that the search for added tokens stays inside ``text``, so the choice also
    holds for any longer text that begins with ``text``."""
    low = size // 2
    cut = min(size, len(text) - max(map(len, added), default=0) - 2)
    while cut > low:
        cut = low + len(text[low:cut].rstrip())
        if cut <= low:
            return None
        hit = _added_token_near(text, cut, added)
        if hit is None:
            return cut
        cut = min(hit, cut) - 1  # before the token, and always further left
    return None


def _proven(encoding, cut: int, needed: int) -> bool:
    """Whether the first ``needed`` tokens of ``text[:cut]``'s encoding (no special
    tokens) come from whole words that are neither among its last ``_MARGIN_WORDS``
    words nor end within its last ``_MARGIN_CHARS`` characters."""
    words = encoding.word_ids
    if len(words) <= needed or words[-1] is None:
        return False
    untrusted = words[-1] - _MARGIN_WORDS + 1  # word ids from here on are not trusted
    last = needed - 1
    while last + 1 < len(words) and words[last + 1] == words[needed - 1]:
        last += 1  # the whole word of the needed-th token
    bound = cut - _MARGIN_CHARS
    offsets = encoding.offsets
    for i in range(last + 1):
        if words[i] is None or words[i] >= untrusted or offsets[i][1] > bound:
            return False
    return True


def _bert_boundary(char: str, chinese: bool) -> bool:
    """Whether BERT's normaliser and pre-tokeniser always end a word before ``char``
    (whitespace, punctuation, or a CJK character when those are spaced out)."""
    if char in " \t\n\r":
        return True
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    category = unicodedata.category(char)
    if category == "Zs" or category.startswith("P"):
        return True
    return chinese and re.match(f"[{_CJK}]", char) is not None


def _giant_word_end(text: str, cut: int, encoding, plan: _CutPlan) -> int | None:
    """For BERT's WordPiece: where the over-long word that ``text[:cut]`` ends in ends
    in ``text`` (``len(text)`` when it runs to the end), if that is provably a word
    boundary; None when the rule does not apply (see :func:`cut_text`)."""
    if plan.giant_unk is None or not encoding.ids:
        return None
    words = encoding.word_ids
    if len(words) > 1 and words[-2] == words[-1]:
        return None  # a word of several tokens is not an over-long one
    start = encoding.offsets[-1][0]
    word = text[start:cut]
    if len(word) <= plan.giant_unk + 1 or not word.isalnum():
        return None
    cjk = f"[{_CJK}]" if plan.chinese else None
    if cjk and re.search(cjk, word):
        return None
    # The run of letters and digits (not CJK) goes on to the first other character.
    found = re.compile(r"[\W_]" + (f"|{cjk}" if cjk else "")).search(text, cut)
    if found is None:
        return len(text)
    end = found.start()
    if not _bert_boundary(text[end], plan.chinese):
        return None
    if _added_token_near(text, end, plan.added) is not None:
        return None
    return end


def cut_text(backend, text: str, needed: int, threshold: int, plan: _CutPlan) -> tuple[str, bool]:
    """A short text whose tokens begin with ``text``'s first ``needed`` tokens.

    ``backend`` is a ``tokenizers.Tokenizer`` with truncation off; tokens are counted
    before special tokens are added. Returns ``(kept, complete)``: tokenising ``kept``
    gives at least ``needed`` tokens, the first ``needed`` of them ``text``'s (all of
    ``text``'s tokens when ``complete``). ``kept`` is ``text`` when it has at most
    ``threshold`` characters or when the tokenizer has a part the argument below does
    not cover (``plan.unsupported``: such a tokenizer tokenises every text whole, as
    before); else a prefix of at most ``CUT_MAX_CHARS`` characters, or for BERT a prefix
    with over-long words shortened. Truncating ``kept`` to ``needed`` tokens then gives
    what truncating ``text`` gives, at a cost that does not grow with ``text``.

    Why the tokens of a prefix ``P = text[:c]`` start like ``text``'s. The Rust
    tokenizer (1) splits a text at added tokens (matched in the raw text), (2)
    normalises each piece, (3) pre-tokenises each piece into words and (4) tokenises
    each word on its own; only then does it truncate and add special tokens.

    1. ``c`` is chosen with ``text[c-1]`` not whitespace and no added token within its
       length + 1 of ``c``. No match crosses ``c`` (leftmost-longest matching picks the
       same ones), ``lstrip``/``rstrip`` eat whitespace only and so stop before ``c``,
       ``single_word`` looks at the same characters: P's pieces are ``text``'s, the
       last one cut short.
    2. Each normaliser allowed changes a string's end only locally: the normalised P
       is a prefix of the normalised text except for the image of P's last *unit*: a
       character (lower-casing, accent stripping, BERT's cleaning and CJK spacing,
       NFKC's expansions such as ``ﷺ``), a starter and the combining marks after it
       (NF(K)C/D composition and mark reordering; a starter blocks both), a grapheme
       cluster (``Precompiled``), a ``Replace`` string match (at most 16 characters)
       or whitespace-only regex match (none crosses ``c``, as ``text[c-1]`` is not
       whitespace), trailing whitespace (``Strip``). ``Prepend`` touches the start.
    3. Each pre-tokeniser allowed ends a word from the characters around the end (at
       most three ahead: GPT-2's ``'ll``); ``Metaspace`` (any ``prepend_scheme``; with
       ``split=false`` a piece is one word) and ``ByteLevel``'s prefix space only touch
       a piece's start, and a ``Sequence`` splits words further (``ByteLevel``, which
       rewrites characters, only last). So P's words are ``text``'s up to the changed
       end. A unit holds at most one whitespace character (a starter sequence's or a
       cluster's first), so a word of P that differs is among its last two or ends in
       its last few characters (patterns, contractions).
    4. WordPiece, BPE (no dropout), Unigram and WordLevel tokenise each word alone.

    So the tokens of P's words that are not among its last ``_MARGIN_WORDS`` words and
    do not end in its last ``_MARGIN_CHARS`` characters are ``text``'s first tokens
    (:func:`_proven`). ``c`` starts at ``threshold`` and doubles until they number
    ``needed``, up to ``CUT_MAX_CHARS``; a text shorter than ``c`` is kept whole. No
    step looks past ``text``'s end unless the result is ``complete``, so an incomplete
    result holds for every text that begins with ``text`` (:meth:`Tokenizer.head`).

    A word that is longer than that cannot be proven that way. For BERT's WordPiece
    it can: a word of more than ``max_input_chars_per_word`` characters is one
    ``[UNK]`` at any length, and BERT's normaliser keeps every letter and digit (not
    CJK, which it spaces out) as at least one character and its pre-tokeniser never
    splits a run of them, so when P ends in such a run longer than the limit, all of
    P's tokens are ``text``'s; where the run ends in ``text`` (a regular expression
    finds it) is a word boundary if whitespace or punctuation follows, and the rest is
    then cut the same way and appended (:func:`_giant_word_end`). BERT also drops
    whitespace, so when no proof is found a run of it (tab, newline, carriage return
    and ``Zs``, whitespace to its normaliser whatever ``clean_text`` says) becomes one
    space and the search starts again. Any other text whose first ``needed`` tokens are not
    proven within ``CUT_MAX_CHARS`` characters raises :class:`~bertfast.text.TextError`
    (index ``None``: the caller names the text).
    """
    needed = wanted = max(int(needed), 1)
    if len(text) <= threshold or plan.unsupported:
        return text, True
    kept: list[str] = []
    rest = text
    collapsed = False
    while len(rest) > threshold:
        size = threshold
        end = None
        while True:
            if size >= len(rest):
                return "".join(kept) + rest, True
            cut = _cut_point(rest, size, plan.added)
            if cut:
                encoding = backend.encode(rest[:cut], add_special_tokens=False)
                if _proven(encoding, cut, needed):
                    return "".join(kept) + rest[:cut], False
                end = _giant_word_end(rest, cut, encoding, plan)
                if end is not None:
                    break
            if size >= CUT_MAX_CHARS:
                break
            size = min(2 * size, CUT_MAX_CHARS)
        if end is None:
            # BERT drops whitespace: a run of it is one space to its tokens.
            if plan.giant_unk is not None and not collapsed and plan.spaceless_added:
                collapsed = True
                shorter = _BERT_SPACE_RUN.sub(" ", rest)
                if len(shorter) < len(rest):
                    rest = shorter
                    continue
            raise TextError(
                None,
                f"is {len(text):,} characters long and its first {wanted} tokens are not "
                f"within its first {CUT_MAX_CHARS:,} characters that can be cut safely (a "
                "word or a run of whitespace longer than that); shorten it",
            )
        # rest[:cut] ends inside an over-long word: its tokens are rest's; go on after it.
        kept.append(rest[:cut])
        needed -= len(encoding.ids)
        if end == len(rest):
            return "".join(kept), True
        if needed <= 0:
            return "".join(kept), False
        rest = rest[end:]
    return "".join(kept) + rest, True


def _long_pair(item, threshold: int) -> bool:
    return isinstance(item, tuple) and any(
        isinstance(text, str) and len(text) > threshold for text in item
    )


@dataclass
class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer``; see the module docstring."""

    backend: object  # tokenizers.Tokenizer
    pad_token_id: int
    max_length: int | None = None
    _plan: _CutPlan | None = field(default=None, init=False, repr=False, compare=False)

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
        """``(ids, type_ids)`` per text (or ``(a, b)`` pair), truncated, unpadded.

        A text longer than the cut threshold is cut first (:func:`cut_text`), which
        leaves the result unchanged. A text that cannot be tokenised raises
        :class:`~bertfast.text.TextError` (a ``ValueError``) naming ``texts[i]``."""
        max_length = max_length or self.max_length
        inputs = [tuple(t) if isinstance(t, (tuple, list)) else t for t in texts]
        if max_length:
            inputs = self._cut(inputs, int(max_length))
            self.backend.enable_truncation(int(max_length), strategy="longest_first")
        else:
            self.backend.no_truncation()
        encodings = self._encode(inputs)
        return [(e.ids, e.type_ids) for e in encodings]

    def count(self, texts: Sequence[str], at_most: int | None = None) -> list[int]:
        """Token count of each text, special tokens included, without truncation.

        With ``at_most``, a text longer than the cut threshold is only counted far
        enough to tell: it may come back as ``at_most + 1``, meaning more than
        ``at_most`` tokens (a count up to ``at_most`` is exact). Without it every text
        is tokenised whole."""
        texts = list(texts)
        counts: list[int | None] = [None] * len(texts)
        self.backend.no_truncation()
        if at_most is not None:
            threshold = self._threshold(at_most)
            extra = self.backend.num_special_tokens_to_add(False)
            for i, text in enumerate(texts):
                if isinstance(text, str) and len(text) > threshold:
                    self._check_text(text, i)
                    try:
                        kept, complete = cut_text(
                            self.backend, text, at_most + 1 - extra, threshold, self._cut_plan()
                        )
                    except TextError as exc:
                        raise TextError(i, exc.reason) from None
                    if complete:
                        texts[i] = kept
                    else:
                        counts[i] = at_most + 1
        todo = [i for i, c in enumerate(counts) if c is None]
        for i, encoding in zip(todo, self._encode([texts[i] for i in todo])):
            counts[i] = len(encoding.ids)
        return counts

    def head(self, text: str, max_length: int | None = None) -> str | None:
        """For a text known only by its beginning ``text`` (a reader that never holds a
        whole over-long line): a prefix of ``text`` whose first ``max_length`` tokens
        are those of every text that begins with ``text``, or None when ``text`` alone
        does not show them (:func:`cut_text` had to see the text's end, or there is no
        length limit). Refused texts raise :class:`~bertfast.text.TextError`."""
        max_length = max_length or self.max_length
        if not max_length:
            return None
        self._check_text(text, 0)
        self.backend.no_truncation()
        plan = self._cut_plan()
        needed = int(max_length) - self.backend.num_special_tokens_to_add(False)
        kept, complete = cut_text(self.backend, text, needed, self._threshold(max_length), plan)
        return None if complete else kept

    # ------------------------------------------------------------ cutting and checks
    @staticmethod
    def _threshold(max_length: int) -> int:
        return max(CUT_MIN_CHARS, CUT_CHARS_PER_TOKEN * int(max_length))

    def _cut_plan(self) -> _CutPlan:
        if self._plan is None:
            self._plan = _cut_plan(self.backend)
        return self._plan

    def _cut(self, inputs: list, max_length: int) -> list:
        """``inputs`` with every text over the threshold cut by :func:`cut_text`, for
        truncation to ``max_length`` tokens (truncation must be off on entry)."""
        threshold = self._threshold(max_length)
        long = [
            i
            for i, item in enumerate(inputs)
            if (len(item) > threshold if isinstance(item, str) else _long_pair(item, threshold))
        ]
        if not long:
            return inputs
        backend = self.backend
        backend.no_truncation()
        plan = self._cut_plan()
        if plan.unsupported:
            return inputs
        inputs = list(inputs)
        single = max_length - backend.num_special_tokens_to_add(False)
        budget = max_length - backend.num_special_tokens_to_add(True)

        def cut(text: str, needed: int, index: int, side: int | None = None) -> str:
            self._check_text(text, index, side)
            try:
                return cut_text(backend, text, needed, threshold, plan)[0]
            except TextError as exc:
                raise TextError(index, exc.reason, side) from None

        def count(text: str) -> int:
            return len(backend.encode(text, add_special_tokens=False).ids)

        for i in long:
            item = inputs[i]
            if isinstance(item, str):
                inputs[i] = cut(item, single, i)
                continue
            sides = list(item)
            if len(sides) != 2 or not all(isinstance(text, str) for text in sides):
                continue  # the Rust side refuses it, and _encode names it
            over = [len(text) > threshold for text in sides]
            for side, text in enumerate(sides):
                self._check_text(text, i, side)
            # Longest-first truncation to the budget (max_length less the special
            # tokens): a side of at most half of it stays whole and the other gets the
            # rest; else the shorter side gets budget // 2 and the longer the rest (a
            # first side strictly longer counts as the longer). So a cut side needs
            # budget tokens, and more than the short side has.
            needed = budget
            if not all(over):
                needed = max(budget, count(sides[over.index(False)]) + 1)
            kept = [
                cut(text, needed, i, side) if over[side] else text
                for side, text in enumerate(sides)
            ]
            if all(over) and budget % 2:
                # Both sides fill the budget; an odd one's extra token goes to the truly
                # longer side, which only whole counts tell (each side tokenised alone,
                # once): the cut sides must compare the same way.
                whole = [count(text) for text in sides]
                view = [count(text) for text in kept]
                if (whole[0] > whole[1]) != (view[0] > view[1]):
                    if whole[0] > whole[1]:
                        kept[0] = cut(sides[0], view[1] + 1, i, 0)
                    else:
                        kept[1] = cut(sides[1], view[0], i, 1)
            inputs[i] = tuple(kept)
        return inputs

    @staticmethod
    def _check_text(text, index: int, side: int | None = None) -> None:
        problem = text_problem(text) if isinstance(text, str) else None
        if problem:
            raise TextError(index, problem, side)

    def _encode(self, inputs: list) -> list:
        """``encode_batch`` with special tokens; a refused input raises an error that
        names it (found only after the Rust side refused the batch: no cost else)."""
        try:
            return self.backend.encode_batch(inputs, add_special_tokens=True)
        except TypeError:
            for i, item in enumerate(inputs):
                sides = [item] if isinstance(item, str) else item
                if isinstance(item, tuple) and len(item) == 2:
                    names = [0, 1]
                elif isinstance(item, str):
                    names = [None]
                else:
                    raise TypeError(
                        f"texts[{i}] must be a string or a pair of strings, "
                        f"not {type(item).__name__}"
                    ) from None
                for side, text in zip(names, sides):
                    if not isinstance(text, str):
                        where = f"texts[{i}]" + ("" if side is None else f"[{side}]")
                        raise TypeError(
                            f"{where} must be a string, not {type(text).__name__}"
                        ) from None
                    self._check_text(text, i, side)
            raise

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
