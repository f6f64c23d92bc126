"""CI smoke run of the benchmark suite: every benchmark path runs once on tiny shapes.

Runs ``pytest benchmarks`` in a subprocess with ``BERTFAST_BENCH_SMOKE=1`` (tiny
2-layer model, 2x16 / ragged / padded batches, kernels at 128 tokens x hidden 64, one
round each, torch.compile left out, each end-to-end provider in its own worker
process; the peers ORT / OpenVINO / CTranslate2 run where installed), then
``benchmarks/make_report.py`` on its JSON. It checks that the suite, the parity bookkeeping
and the report work, never speed. The full suite stays out of CI (``pytest`` only
collects ``tests/``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")

pytest.importorskip("pytest_benchmark")
pytest.importorskip("transformers")


def _run(cmd, env, timeout):
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def test_benchmark_suite_smoke(tmp_path):
    env = dict(
        os.environ,
        BERTFAST_BENCH_SMOKE="1",
        BERTFAST_BENCH_CACHE=str(tmp_path / "cache"),
        BERTFAST_BENCH_DEVICE="cpu",
        PYTHONHASHSEED="0",
    )
    env.pop("BERTFAST_BENCH_PROFILE", None)
    env.pop("BERTFAST_BENCH_ISOLATION", None)
    # Under pytest-xdist (this test in a worker, `pytest -n N`) the child would inherit
    # PYTEST_XDIST_WORKER, and pytest-benchmark disables every benchmark in a process
    # that has it ("xdist plugin is active"): no rows, an empty or missing JSON. The
    # child is a plain, serial pytest run (PYTEST_ADDOPTS may hold a -n too).
    for name in list(env):
        if name.startswith("PYTEST_XDIST_") or name == "PYTEST_ADDOPTS":
            del env[name]
    out = tmp_path / "smoke.json"
    proc = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            BENCH,
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            f"--benchmark-json={out}",
        ],
        env,
        timeout=400,
    )

    text = out.read_text() if out.exists() else ""
    assert text.strip(), (
        "pytest-benchmark wrote no results (benchmarks disabled or none ran):\n"
        + proc.stdout[-3000:]
        + proc.stderr[-2000:]
    )
    data = json.loads(text)
    rows = [b["extra_info"] for b in data["benchmarks"]]
    e2e = [r for r in rows if r.get("suite") == "e2e"]
    kernels = [r for r in rows if r.get("suite") == "kernels"]
    assert e2e and kernels
    providers = {r["provider"] for r in e2e}
    assert {"transformers-eager", "transformers-sdpa"} <= providers
    for r in e2e:
        assert r["median_s"] > 0 and r["flops_useful"] <= r["flops_padded"]
        assert "parity_ok" in r and r["ceiling_gflops"] > 0
    # Every row of a bertfast provider carries ratios to the baselines measured before it.
    for r in e2e:
        if r["is_bertfast"]:
            assert "transformers-eager" in r["ratios"]
    # Each provider ran in a worker process of its own; the CPU is recorded; int8 peers
    # (when installed) are in no ratio and carry none.
    for r in e2e:
        assert r["isolation"] == "process" and "flags" in r["cpu"]
        assert not any(b.endswith("-int8") for b in r["ratios"])
        if r["int8"]:
            assert r["ratios"] == {}

    report_dir = tmp_path / "report"
    proc = _run(
        [sys.executable, os.path.join(BENCH, "make_report.py"), str(out), "--out", str(report_dir)],
        env,
        timeout=120,
    )
    text = (report_dir / "report.md").read_text()
    assert "## End to end" in text and "## Targets" in text
    assert "isolation: process" in text
    assert "## Resident memory" in text  # each provider's growth over its worker's start
    assert (report_dir / "e2e.png").stat().st_size > 0
    assert (report_dir / "kernels.png").stat().st_size > 0
    assert "wrote" in proc.stdout


def test_bench_cli_smoke(tmp_path):
    """``bertfast bench`` (bertfast.cli.bench.main) end to end on a tiny random model."""
    transformers = pytest.importorskip("transformers")
    import torch

    from bertfast.cli import bench

    cfg = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=500,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertModel(cfg).eval().save_pretrained(tmp_path / "m")
    out = tmp_path / "rows.json"
    rc = bench.main(
        [
            "--model",
            str(tmp_path / "m"),
            "--shapes",
            "2x8,r3x8x16",
            "--seconds",
            "0",
            "--device",
            "cpu",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["shape"] for r in rows} == {"2x8", "r3x8x16"}
    assert all(r["median_ms"] > 0 for r in rows)
    data = json.loads(out.read_text())
    assert data["checkpoint_bytes"] > 0
    for mem in data["memory"].values():  # resident growth of each worker, after its load
        assert mem["load"] is not None and mem["first_call"] is not None


def test_flops_and_lengths():
    from bertfast.bench import ModelDims, encoder_flops, padding_lengths, ragged_lengths

    dims = ModelDims(hidden=768, layers=12, heads=12, intermediate=3072)
    # BERT-base: ~85M encoder weights -> ~170 MFLOP per token, plus attention.
    per_token = encoder_flops(dims, [1]) / 1
    assert 1.69e8 < per_token < 1.71e8
    assert encoder_flops(dims, [64, 64]) < encoder_flops(dims, [128, 128])
    lens = ragged_lengths(256, 64, 128, seed=1)
    assert min(lens) >= 8 and max(lens) <= 128 and 45 < sum(lens) / len(lens) < 75
    assert ragged_lengths(8, 64, 128, seed=3) == ragged_lengths(8, 64, 128, seed=3)
    pl = padding_lengths(32, 256, 0.5)
    assert pl[0] == 256 and abs(1 - sum(pl) / (32 * 256) - 0.5) < 0.1
