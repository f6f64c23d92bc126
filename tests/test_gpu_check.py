"""``benchmarks/gpu_check.sh`` (the one-command GPU check) where there is no GPU.

Without a CUDA device the script must stop at once with "no CUDA device" and exit 3,
before installing or writing anything; ``--dry-run`` prints every stage's commands,
each under a ``timeout`` that keeps it inside a 10-minute device call. The report
script is checked on fabricated stage logs (pytest JUnit XML, compute-sanitizer and
``bertfast check`` output) and on the limits of what a device run brings back.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.sh")
STAGES = ("tests", "sanitize", "bench-quick", "bench-full", "check")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(*args, env=None, timeout=120):
    env = dict(os.environ if env is None else env, PYTHON=sys.executable)
    return subprocess.run(
        ["bash", SCRIPT, *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("stage", STAGES + ("install",))
def test_no_cuda_device_stops_at_once(tmp_path, stage):
    out = tmp_path / "out"
    result = _run(out, stage)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "no CUDA device" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert not out.exists()  # nothing installed, nothing written


def test_usage_errors():
    missing = _run()
    assert missing.returncode == 2 and "missing OUTDIR" in missing.stderr
    bad = _run("/tmp/unused-gpu-check-out", "benchmark")
    assert bad.returncode == 2 and "unknown stage 'benchmark'" in bad.stderr
    opt = _run("/tmp/unused-gpu-check-out", "--fast")
    assert opt.returncode == 2 and "unknown option --fast" in opt.stderr


def test_dry_run_lists_every_stage_bounded(tmp_path):
    result = _run(tmp_path / "out", "--dry-run", "all")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    labels = [re.match(r"\[([\w:-]+)\]", ln).group(1) for ln in lines]
    assert labels[0] == "install"
    for stage in ("tests", "check:float16", "check:bfloat16", "quick:bert-base", "full:bert-large"):
        assert stage in labels, labels
    for tool in ("memcheck", "racecheck", "synccheck", "initcheck"):
        assert f"sanitize:{tool}" in labels
    assert any("--no-build-isolation --no-deps" in ln for ln in lines)
    # every command is bounded, each stage within a 10-minute call
    limits = [int(m.group(1)) for ln in lines for m in [re.search(r"\] timeout (\d+) ", ln)] if m]
    assert limits and max(limits) < 600
    sanitize = sum(
        int(re.search(r"timeout (\d+)", ln).group(1)) for ln in lines if ln.startswith("[sanitize:")
    )
    assert sanitize < 600
    assert any(
        "compute-sanitizer --tool memcheck" in ln and "test_cuda_backend.py" in ln for ln in lines
    )


# ---------------------------------------------------------------- the report
SANITIZE_LOG = """
$ env compute-sanitizer --tool memcheck python -m pytest
########## compute-sanitizer --tool memcheck
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at bertfast::cuda::pack_rows_kernel+0x1a0
========= Invalid __global__ read of size 4 bytes
=========     at bertfast::cuda::pack_rows_kernel+0x1a0
1 failed, 10 passed in 40.0s
========= ERROR SUMMARY: 2 errors
########## memcheck exit status 86
########## compute-sanitizer --tool racecheck
========= COMPUTE-SANITIZER
11 passed in 50.0s
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
########## racecheck exit status 0
"""

CHECK_LOG = """
$ python -m bertfast check /x --device cuda --dtype float16
  last_hidden_state   PASS  max |diff| 1.00e-02 (real tokens)
PASS: bertfast vs transformers, max abs diff 1.00e-02 (tolerance 5e-02, float16)

$ python -m bertfast check /x --device cuda --dtype bfloat16
  last_hidden_state   FAIL  max |diff| 9.00e-01 (real tokens)
FAIL: bertfast vs transformers, max abs diff 9.00e-01 (tolerance 2e-01, bfloat16)
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0"
failures="1" skipped="1" tests="4"><testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_ok2"/>
<testcase classname="tests.test_a" name="test_bad">
<failure message="assert 1 == 2">x</failure></testcase>
<testcase classname="tests.test_b" name="test_skip"><skipped message="needs a thing"/></testcase>
</testsuite></testsuites>"""


def test_report_summarises_logs_and_keeps_the_limits(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import gpu_check_report as rep
    finally:
        sys.path.pop(0)
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    state.mkdir()
    (state / "stages.tsv").write_text(
        "install\tpass\t60\tBERTFAST_CUDA_ARCHS=90\n"
        "tests\tfail\t300\texit status 1\n"
        "sanitize\tfail\t400\texit status 86\n"
        "check\tfail\t90\texit status 1\n"
    )
    (state / "tests.xml").write_text(JUNIT)
    (out / "sanitize.log").write_text(SANITIZE_LOG)
    (out / "check.log").write_text(CHECK_LOG)
    big = out / "tests.log"
    with open(big, "wb") as f:  # a runaway log: 17 MiB
        f.write(b"first line\n" + b"x" * (17 * 1024 * 1024) + b"\nlast line\n")
    assert rep.main([str(out), str(state)]) == 0
    text = (out / "summary.md").read_text()
    assert "| tests | FAIL | 300 |" in text and "| install | PASS | 60 |" in text
    assert "2 passed, 1 failed, 0 errors, 1 skipped (4 collected)" in text
    assert "tests.test_a::test_bad: assert 1 == 2" in text
    assert "1 x needs a thing" in text
    memcheck = next(ln for ln in text.splitlines() if "**memcheck**" in ln)
    assert "ERRORS FOUND" in memcheck and "ERROR SUMMARY: 2 errors" in memcheck
    assert "2 x Invalid __global__ read of size 4 bytes in bertfast::cuda::pack_rows_kernel" in text
    racecheck = next(ln for ln in text.splitlines() if "**racecheck**" in ln)
    assert "clean" in racecheck and "0 hazards" in racecheck
    assert "float16: PASS" in text and "bfloat16: FAIL" in text
    # the log was cut under 16 MiB, keeping its head and tail
    assert big.stat().st_size < 16 * 1024 * 1024
    data = big.read_bytes()
    assert data.startswith(b"first line") and data.endswith(b"last line\n")
    assert len([p for p in out.iterdir() if p.is_file()]) <= 8


def test_report_merges_benchmark_json(tmp_path):
    import json

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import gpu_check_report as rep
    finally:
        sys.path.pop(0)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"machine_info": {"m": 1}, "benchmarks": [{"name": "x"}]}))
    b.write_text(json.dumps({"machine_info": {"m": 2}, "benchmarks": [{"name": "y"}]}))
    target = tmp_path / "all.json"
    assert rep.merge(str(target), [str(a), str(tmp_path / "missing.json"), str(b)]) == 0
    merged = json.loads(target.read_text())
    assert [r["name"] for r in merged["benchmarks"]] == ["x", "y"]
    assert rep.merge(str(tmp_path / "none.json"), [str(tmp_path / "missing.json")]) == 1
