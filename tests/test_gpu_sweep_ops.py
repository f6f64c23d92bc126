"""``benchmarks/gpu_sweep_ops.py`` (stage (c) of the GPU check) end to end on the CPU.

``--dry-run`` runs the sweep's own code path on tiny shapes (H 64, FFN 256, M 16) with
the CPU's candidates (and Triton's under ``TRITON_INTERPRET=1``, which the test session
sets without a GPU): every row it writes must be well formed, the reference path must
pass the parity rule, and each GEMM shape must have its ceiling row.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bertfast.bench.sweep import read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_sweep_ops.py")

#: The row fields of bertfast/bench/sweep.py's docstring.
FIELDS = (
    "stage",
    "op",
    "dtype",
    "shape",
    "bucket",
    "candidate",
    "backend",
    "variant",
    "config",
    "median_ms",
    "iqr_ms",
    "launches",
    "parity",
    "device",
)
SWEPT = ("linear_gelu", "linear", "add_layernorm", "bias_gelu_", "embed_layernorm")


def _run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, SCRIPT, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "rows.jsonl"
    result = _run("--dry-run", "--out", out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, read_rows(out)


def test_rows_are_well_formed(dry_run):
    _, rows = dry_run
    assert rows
    for row in rows:
        missing = [f for f in FIELDS if f not in row]
        assert not missing, (missing, row)
        assert row["stage"] == "c"
        assert row["dtype"] in ("float32", "float16")
        assert isinstance(row["shape"], dict) and isinstance(row["config"], dict)
        assert row["device"]["torch"] and row["device"]["gpu"] is None
    timed = [r for r in rows if r["op"] in SWEPT]
    assert {r["op"] for r in timed} == set(SWEPT)
    for r in timed:
        assert r["parity"] == "pass" or r["parity"].startswith(("fail: ", "error: ")), r
        if r["parity"].startswith("error: "):
            continue
        assert r["median_ms"] > 0 and r["iqr_ms"] >= 0 and r["launches"] >= 1
        assert (
            r["candidate"]
            == (r["backend"] if r["variant"] == "default" else f"{r['backend']}:{r['variant']}")
            or r["config"]
        ), r
        assert isinstance(r["rank"], int) and r["auto"] == (r["rank"] == 0)


def test_reference_path_passes_in_every_case(dry_run):
    _, rows = dry_run
    timed = [r for r in rows if r["op"] in SWEPT]
    cases = {(r["op"], repr(sorted(r["shape"].items())), r["dtype"]) for r in timed}
    refs = {
        (r["op"], repr(sorted(r["shape"].items())), r["dtype"]): r for r in timed if r["reference"]
    }
    assert set(refs) == cases  # the torch backend ran on every case
    for r in refs.values():
        assert r["backend"] == "torch" and r["variant"] == "default"
        assert r["parity"] == "pass", r
    # the CPU backend's kernels pass the rule too (they are tested at these shapes)
    assert all(r["parity"] == "pass" for r in timed if r["backend"] == "cpu")


def test_gemm_rows_carry_their_ceiling(dry_run):
    _, rows = dry_run
    ceilings = {
        (r["shape"]["M"], r["shape"]["N"], r["shape"]["K"], r["dtype"]): r
        for r in rows
        if r["op"] == "gemm_ceiling"
    }
    assert ceilings
    for c in ceilings.values():
        assert c["candidate"] == "torch.mm" and c["parity"] == "n/a"
        assert c["median_ms"] > 0 and c["tflops"] > 0
    gemms = [r for r in rows if r["op"] in ("linear", "linear_gelu") and r["median_ms"]]
    # H 64, FFN 256: FFN in (16, 256, 64), QKV (16, 192, 64), out (16, 64, 64),
    # FFN out (16, 64, 256), in each dtype
    shapes = {(r["shape"]["M"], r["shape"]["N"], r["shape"]["K"], r["dtype"]) for r in gemms}
    assert shapes == set(ceilings)
    assert len(shapes) == 4 * 2
    for r in gemms:
        s = r["shape"]
        ceiling = ceilings[(s["M"], s["N"], s["K"], r["dtype"])]["tflops"]
        assert r["tflops"] == pytest.approx(2 * s["M"] * s["N"] * s["K"] / r["median_ms"] / 1e9)
        assert r["ceiling_tflops"] == ceiling
        assert r["ceiling_fraction"] == pytest.approx(r["tflops"] / ceiling)


def test_buckets_are_the_winners_keys(dry_run):
    winners = pytest.importorskip("bertfast.ops.winners")
    _, rows = dry_run
    for r in rows:
        if r["op"] not in SWEPT:
            continue
        parsed = winners.parse_bucket_key(r["op"], r["bucket"])
        assert parsed, r["bucket"]
        s = r["shape"]
        if r["op"] in ("linear", "linear_gelu"):
            assert (parsed["N"], parsed["K"]) == (s["N"], s["K"])
        else:
            assert parsed["width"] == s["width"]
        assert parsed["rows"] == winners.ROWS_MIN  # 16 rows -> the smallest bucket


def test_epilogue_probe_row_and_summary(dry_run):
    result, rows = dry_run
    probes = {r["dtype"]: r for r in rows if r["op"] == "epilogue_probe"}
    # torch's CPU _addmm_activation is the erf GELU (tests/ops/test_cuda_epilogue.py)
    assert set(probes) == {"float32", "float16"}
    assert all(p["form"] == "erf" and p["decisive"] > 0 for p in probes.values())
    out = result.stdout
    assert out.startswith("plan: ") and "candidate rows" in out
    assert "| op | kind | model | M | dtype | winner | ms | runner-up | ratio | % ceiling" in out
    table = out[out.index("| op | kind") :].splitlines()
    assert len(table) == 2 + 8 * 2  # header + one line per (op, kind) and dtype
    assert "(none pass)" not in out


def test_budget_stops_before_any_row(tmp_path):
    out = tmp_path / "rows.jsonl"
    result = _run("--dry-run", "--out", out, "--budget-s", "0", "--ops", "add_layernorm")
    assert result.returncode == 0, result.stderr
    assert "stopped: budget spent before add_layernorm" in result.stdout
    assert not out.exists() or not [r for r in read_rows(out) if r["op"] == "add_layernorm"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_no_gpu_without_dry_run(tmp_path):
    result = _run("--out", tmp_path / "rows.jsonl")
    assert result.returncode == 3
    assert "no CUDA device" in result.stderr
