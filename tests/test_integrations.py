"""The framework adapters (issue 28, item 3): ``bertfast.integrations.langchain`` and
``bertfast.integrations.llamaindex`` through the real packages' interfaces, against
sentence-transformers' ``encode_query`` / ``encode_document`` on the same checkpoint
(all-MiniLM-L6-v2, ``tests.models.sentence_checkpoint``) with query and document
prompts in its sentence-transformers config."""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest
import torch

from bertfast.embedder import Embedder

from .models import sentence_checkpoint

st = pytest.importorskip("sentence_transformers")
langchain_core = pytest.importorskip("langchain_core")
llama_index = pytest.importorskip("llama_index.core")

from langchain_core.embeddings import Embeddings  # noqa: E402
from llama_index.core.embeddings import BaseEmbedding  # noqa: E402

from bertfast.integrations.langchain import BertfastEmbeddings  # noqa: E402
from bertfast.integrations.llamaindex import BertfastEmbedding  # noqa: E402

DOCS = [
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog, again and again.",
    "A",
    "Embeddings map text to vectors.",
    "Bertfast runs BERT encoders on fused kernels.",
]
QUERY = "What is the capital of France?"
PROMPTS = {"query": "query: ", "document": "passage: ", "title": "Title: "}


def _close(got, expect):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expect), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("integrations") / "prompted"
    shutil.copytree(sentence_checkpoint(), folder)
    file = folder / "config_sentence_transformers.json"
    data = json.loads(file.read_text()) if file.is_file() else {}
    data["prompts"] = PROMPTS
    file.write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def reference(folder):
    return st.SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def embedder(folder):
    return Embedder.from_pretrained(folder)


# ---------------------------------------------------------------- LangChain
def test_langchain_matches_sentence_transformers(folder, reference):
    emb = BertfastEmbeddings(str(folder), batch_size=2)
    assert isinstance(emb, Embeddings)
    docs = emb.embed_documents(DOCS)
    assert isinstance(docs, list) and len(docs) == len(DOCS)
    assert all(isinstance(v, list) and isinstance(v[0], float) for v in docs)
    _close(docs, reference.encode_document(DOCS))
    query = emb.embed_query(QUERY)
    assert isinstance(query, list) and isinstance(query[0], float)
    _close(query, reference.encode_query(QUERY))
    # the prompts matter: without them the vectors differ
    assert np.abs(np.asarray(query) - reference.encode(QUERY)).max() > 1e-3
    # LangChain's async methods give the same vectors
    _close(asyncio.run(emb.aembed_documents(DOCS)), docs)
    _close(asyncio.run(emb.aembed_query(QUERY)), query)
    assert emb.embed_documents([]) == []


def test_langchain_prompts_normalize_and_a_loaded_embedder(embedder, reference):
    emb = BertfastEmbeddings(embedder, query_prompt_name="title", document_prompt="Represent: ")
    assert emb.embedder is embedder
    _close(emb.embed_query(QUERY), reference.encode(QUERY, prompt_name="title"))
    _close(emb.embed_documents(DOCS), reference.encode(DOCS, prompt="Represent: "))
    # normalize=False: the pooled vectors before the checkpoint's Normalize module
    # (sentence-transformers always applies that module: compare directions)
    raw = np.asarray(BertfastEmbeddings(embedder, normalize=False).embed_documents(DOCS))
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    assert np.abs(norms - 1).max() > 1e-2
    _close(raw / norms, reference.encode_document(DOCS))


def test_langchain_user_errors(folder, embedder):
    with pytest.raises(ValueError, match="unknown query_prompt_name 'nope'.*'query'"):
        BertfastEmbeddings(embedder, query_prompt_name="nope")
    with pytest.raises(ValueError, match="document_prompt or document_prompt_name, not both"):
        BertfastEmbeddings(embedder, document_prompt="x", document_prompt_name="document")
    with pytest.raises(ValueError, match="already loaded Embedder: dtype, quantize"):
        BertfastEmbeddings(embedder, dtype="bfloat16", quantize="int8")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        BertfastEmbeddings(embedder, batch_size=0)
    with pytest.raises(ValueError, match="dtype must be a torch dtype or its name"):
        BertfastEmbeddings(str(folder), dtype="float99")
    with pytest.raises(TypeError, match="model must be a checkpoint folder"):
        BertfastEmbeddings(42)
    with pytest.raises(FileNotFoundError):
        BertfastEmbeddings(str(folder / "missing"))
    emb = BertfastEmbeddings(embedder)
    with pytest.raises(TypeError, match="not one string"):
        emb.embed_documents("one string")
    with pytest.raises(TypeError, match="text must be a string"):
        emb.embed_query(["a list"])
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        emb.embed_documents(["fine", 3])


def test_langchain_passes_dtype_and_quantize(folder):
    # what the adapter loads is what Embedder.from_pretrained loads with the same options
    for kwargs in ({"dtype": torch.bfloat16}, {"quantize": "int8"}):
        expect = Embedder.from_pretrained(folder, **kwargs).encode(DOCS, prompt_name="document")
        name = {"dtype": "bfloat16"} if "dtype" in kwargs else kwargs
        _close(BertfastEmbeddings(str(folder), **name).embed_documents(DOCS), expect)


# ---------------------------------------------------------------- LlamaIndex
def test_llamaindex_matches_sentence_transformers(folder, reference):
    emb = BertfastEmbedding(str(folder), embed_batch_size=2)
    assert isinstance(emb, BaseEmbedding)
    assert emb.class_name() == "BertfastEmbedding" and emb.model_name == "prompted"
    docs = emb.get_text_embedding_batch(DOCS)
    assert len(docs) == len(DOCS) and isinstance(docs[0][0], float)
    _close(docs, reference.encode_document(DOCS))
    _close(emb.get_text_embedding(DOCS[0]), reference.encode_document(DOCS[0]))
    query = emb.get_query_embedding(QUERY)
    _close(query, reference.encode_query(QUERY))
    _close(asyncio.run(emb.aget_query_embedding(QUERY)), query)
    _close(asyncio.run(emb.aget_text_embedding_batch(DOCS)), docs)
    _close(asyncio.run(emb.aget_text_embedding(DOCS[1])), docs[1])


def test_llamaindex_options_and_errors(embedder, reference):
    emb = BertfastEmbedding(embedder, text_prompt_name="title", query_prompt="Q: ")
    assert emb.embedder is embedder and emb.model_name == "bertfast"
    _close(emb.get_text_embedding_batch(DOCS), reference.encode(DOCS, prompt_name="title"))
    _close(emb.get_query_embedding(QUERY), reference.encode(QUERY, prompt="Q: "))
    with pytest.raises(ValueError, match="unknown text_prompt_name 'nope'"):
        BertfastEmbedding(embedder, text_prompt_name="nope")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        BertfastEmbedding(embedder, embed_batch_size=0)
    with pytest.raises(ValueError, match="already loaded Embedder: device"):
        BertfastEmbedding(embedder, device="cuda")
