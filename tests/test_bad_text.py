"""A text that cannot be tokenised is a one-line error that names it.

The Rust ``tokenizers`` library refuses a Python ``str`` only when it holds a
surrogate code point (checked here on a sample of every code point): then
``Embedder.encode`` used to raise ``TypeError: TextEncodeInput must be Union[...]``,
naming neither the text nor its index. ``bertfast.text.text_problem`` says why, and
``Embedder.encode``, ``Tokenizer.tokenize`` and ``Tokenizer.count`` raise a
``ValueError`` (``TextError``) naming ``texts[i]``.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as RustTokenizer

from bertfast.embedder import Embedder
from bertfast.text import TextError, text_problem
from bertfast.tokenizer import Tokenizer

from . import tiny_embedder

LONE = "bad \ud800 text"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = tiny_embedder.make_checkpoint(tmp_path_factory.mktemp("tiny"), size="micro")
    return Embedder.from_pretrained(folder)


# ---------------------------------------------------------------- text_problem
@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain ASCII",
        "café ☕ 東京 😀",
        "\x00 NUL",
        "\ufffe\uffff",
        "\U0010ffff",
        "é" * 3_000_000,
    ],
)
def test_good_texts(text):
    assert text_problem(text) is None


def test_lone_surrogates():
    assert text_problem(LONE) == (
        "holds a lone surrogate (U+D800 at character 4), which is not text"
    )
    assert "U+DFFF at character 0" in text_problem("\udfff")
    # Past the first megabyte slice, the position is still the text's.
    assert "U+DC00 at character 3000001" in text_problem("é" * 3_000_001 + "\udc00")


def test_surrogate_pair_written_as_two_code_points():
    problem = text_problem("a \ud83d\ude00 b")
    assert "surrogate pair" in problem and "U+D83D U+DE00 at character 2" in problem
    assert "\n" not in problem


def test_the_rust_tokenizer_refuses_exactly_what_text_problem_names(embedder):
    """Every 61st code point and all the surrogates: the Rust side takes a text
    exactly when ``text_problem`` finds nothing."""
    backend = embedder.tokenizer.backend
    points = set(range(0, 0x110000, 61)) | set(range(0xD7F0, 0xE010)) | {0, 0xFFFE, 0xFFFF}
    for code in sorted(points):
        text = f"a{chr(code)}b"
        try:
            backend.encode(text)
            accepted = True
        except TypeError:
            accepted = False
        assert accepted == (text_problem(text) is None), hex(code)


# ---------------------------------------------------------------- the callers
def test_encode_names_the_text(embedder):
    with pytest.raises(ValueError, match=r"^texts\[1\] holds a lone surrogate \(U\+D800 at"):
        embedder.encode(["fine", LONE])
    with pytest.raises(TextError, match=r"^the text holds a lone surrogate"):
        embedder.encode(LONE)
    with pytest.raises(TypeError, match=r"^texts\[2\] must be a string"):
        embedder.encode(["fine", "also fine", None])
    assert embedder.encode(["fine", "\x00 and \uffff are text"]).shape == (2, embedder.dim)


def test_tokenize_names_the_text(embedder):
    tok = embedder.tokenizer
    with pytest.raises(TextError, match=r"^texts\[1\] holds a lone surrogate"):
        tok.tokenize(["fine", LONE])
    with pytest.raises(TextError, match=r"^texts\[0\]\[1\] holds a lone surrogate"):
        tok.tokenize([("fine", LONE)])
    with pytest.raises(TextError, match=r"^texts\[1\]"):
        tok(["fine", "also fine"], ["fine", LONE])
    # A long text is cut before it is tokenised: the part past the cut is checked too.
    with pytest.raises(TextError, match=r"^texts\[0\] holds a lone surrogate"):
        tok.tokenize(["word " * 100_000 + LONE])
    with pytest.raises(TypeError, match=r"^texts\[1\] must be a string or a pair"):
        tok.tokenize(["fine", 3])


def test_count_names_the_text(embedder):
    backend = RustTokenizer.from_str(embedder.tokenizer.backend.to_str())
    counter = Tokenizer(backend, 0)
    with pytest.raises(TextError, match=r"^texts\[1\] holds") as info:
        counter.count(["fine", LONE], at_most=16)
    assert info.value.index == 1 and info.value.reason.startswith("holds a lone surrogate")
    with pytest.raises(TextError, match=r"^texts\[0\] holds"):
        counter.count(["word " * 100_000 + LONE], at_most=16)


def test_server_names_the_text(embedder):
    """The servers' request preparation (``bertfast.serving.prepare``, shared by the
    embedded and the Ray Serve server) answers a bad or over-long text with a 4xx naming
    it; a long text is counted only up to the limit (the embedder's, 64 tokens here)."""
    import json

    from bertfast.serving.prepare import Preparer
    from bertfast.serving.protocol import Limits, RequestError

    preparer = Preparer(embedder, Limits())

    def prepare(route, body):
        return preparer.prepare(route, json.dumps(body).encode())

    with pytest.raises(RequestError, match=r"^'inputs\[1\]' holds a lone surrogate") as info:
        prepare("/embed", {"inputs": ["fine", LONE]})
    assert info.value.status == 422
    with pytest.raises(RequestError, match=r"'input\[0\]' has 72 tokens, more than") as info:
        prepare("/v1/embeddings", {"input": ["cat " * 70]})
    assert info.value.status == 413
    with pytest.raises(RequestError, match=r"'input\[0\]' has more than 64 tokens"):
        prepare("/v1/embeddings", {"input": ["cat " * 100_000]})
    truncated = prepare("/embed", {"inputs": ["cat " * 100_000, "cat"], "truncate": True})
    assert truncated.tokens == 64 + 3
