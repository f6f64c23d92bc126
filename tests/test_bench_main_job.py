"""The main-job benchmark (bertfast/bench/main_job.py, benchmarks/main_job.py): a short
run on 8 texts, each provider in a worker process of its own as the command line runs
it, sentence-transformers loaded here too as the independent reference; and the
command line's argument checks. No timed assertions: times only have to be real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertfast.bench import main_job
from bertfast.embedder import default_checkpoint
from tests.scripts import load_script

st = pytest.importorskip("sentence_transformers")

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ["sentence-transformers", "bertfast"]
LIMIT = 8


@pytest.fixture(scope="module")
def model() -> str:
    try:
        return default_checkpoint()
    except ImportError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def result(model):
    lines: list[str] = []
    out = main_job.run(
        model, providers=PROVIDERS, rounds=1, n=1, limit=LIMIT, command="test", say=lines.append
    )
    out.lines = lines
    return out


def _load_cli():
    return load_script("benchmarks/main_job.py")


def test_rows_times_and_counts(result, model):
    assert result.skipped == {}, result.lines
    assert [r["provider"] for r in result.rows] == PROVIDERS
    h = result.header
    assert h["texts"] == LIMIT and h["isolation"] == "process" and h["threads"] >= 1
    texts = main_job.load_texts(LIMIT)
    tokens, _ = main_job.count_tokens(model, texts)
    assert h["tokens"] == tokens > LIMIT  # [CLS] and [SEP] at least, per text
    for r in result.rows:
        assert len(r["times_s"]) == 1 and r["times_s"][0] > 0
        assert r["median_s"] == r["times_s"][0]
        assert r["texts_per_s"] == pytest.approx(LIMIT / r["median_s"])
        assert r["tokens_per_s"] == pytest.approx(tokens / r["median_s"])
        assert r["load_s"] > 0 and r["warm_pass_s"] > 0
        assert r["info"] == {"texts": LIMIT, "batch_size": main_job.BATCH_SIZE}
    ref, bf = result.row("sentence-transformers"), result.row("bertfast")
    assert ref["x_reference"] == 1.0
    assert bf["x_reference"] == pytest.approx(ref["median_s"] / bf["median_s"])


def test_vectors_match_sentence_transformers(result, model):
    """The harness's sentence-transformers vectors are those of a SentenceTransformer
    loaded here (same texts, same order), and bertfast's match them."""
    texts = main_job.load_texts(LIMIT)
    reference = st.SentenceTransformer(model, device="cpu").encode(
        texts, batch_size=32, convert_to_tensor=True, show_progress_bar=False
    )
    ours = result.vectors["sentence-transformers"]
    assert ours.shape == reference.shape == (LIMIT, 384) and ours.dtype == torch.float32
    assert F.cosine_similarity(ours, reference.float(), dim=-1).min() >= 0.99999
    cos = F.cosine_similarity(result.vectors["bertfast"], reference.float(), dim=-1)
    assert cos.min() >= 0.9999
    row = result.row("bertfast")
    assert row["cos_min"] >= 0.9999 and row["cos_mean"] >= row["cos_min"]
    assert row["cos_min"] == pytest.approx(float(cos.min()), abs=1e-5)


def test_markdown_and_json(result, tmp_path):
    table = main_job.format_markdown(result)
    assert "- command: `test`" in table and f"- texts: {LIMIT} " in table
    assert "| sentence-transformers | float32 |" in table
    assert "| bertfast | float32 |" in table
    assert "`bertfast` >= 1.8x sentence-transformers: " in table
    assert "`bertfast-bf16` >= 6x sentence-transformers (on a CPU with AMX): not measured" in table
    path = tmp_path / "main_job.json"
    main_job.write_json(str(path), result)
    data = json.loads(path.read_text())
    assert data["texts"] == LIMIT and data["skipped"] == {}
    assert [r["provider"] for r in data["rows"]] == PROVIDERS
    assert data["rows"][1]["times_s"] == result.rows[1]["times_s"]


def test_unknown_provider_is_rejected(capsys):
    with pytest.raises(ValueError, match=r"unknown provider\(s\) 'nope'; choose from "):
        main_job.run("/nowhere", providers=["bertfast", "nope"])
    with pytest.raises(ValueError, match="choose from sentence-transformers, "):
        main_job.provider_by_name("nope")
    with pytest.raises(SystemExit) as exc:
        _load_cli().main(["--providers", "bertfast,nope", "--limit", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --providers: unknown provider(s) 'nope'; choose from " in err
    assert ", ".join(main_job.PROVIDERS) in err


def test_command_line_writes_the_table_and_json(model, tmp_path, capsys):
    md, js = tmp_path / "mj.md", tmp_path / "mj.json"
    argv = ["--providers", "bertfast", "--limit", "4", "--rounds", "1", "--n", "1"]
    argv += ["--isolation", "inline", "--markdown", str(md), "--json", str(js)]
    assert _load_cli().main(argv) == 0
    table = md.read_text()
    assert table in capsys.readouterr().out
    assert f"- command: `python benchmarks/main_job.py {' '.join(argv)}`" in table
    assert "| bertfast | float32 |" in table and "`bertfast` >= 1.8x" in table
    data = json.loads(js.read_text())
    assert data["model_path"] == model and data["texts"] == 4 and data["isolation"] == "inline"
    (row,) = data["rows"]
    assert row["x_reference"] is None and row["cos_min"] is None  # no reference row
