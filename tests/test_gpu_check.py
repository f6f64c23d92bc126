"""``benchmarks/gpu_check.sh`` (the GPU check, a stage per 10-minute device call) where
there is no GPU.

Without a CUDA device the script must stop at once with "no CUDA device" and exit 3,
before installing or writing anything. ``--list`` prints every stage's commands, each
under a ``timeout`` that keeps it inside a 10-minute call; ``--dry-run`` also runs the
Python stages (the attention and ops sweeps, the winners table, end to end) on the CPU
with tiny shapes, so their code runs here, and checks the rows and the summary they
leave. The report script is checked on fabricated stage logs (pytest JUnit XML per file
group, compute-sanitizer and ``bertfast check`` output, sweep and end-to-end rows) and
on the limits of what a device run brings back.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
SCRIPT = os.path.join(BENCH, "gpu_check.sh")
STAGES = ("tests", "sanitize", "sweep-attention", "sweep-ops", "winners", "e2e", "check")
HAS_OPS_SWEEP = os.path.exists(os.path.join(BENCH, "gpu_sweep_ops.py"))

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


def _bench_module(name):
    sys.path.insert(0, BENCH)
    try:
        return __import__(name)
    finally:
        sys.path.remove(BENCH)


def _labels(stdout: str) -> list[str]:
    return [m.group(1) for ln in stdout.splitlines() for m in [re.match(r"\[([\w:-]+)\]", ln)] if m]


def _limits(stdout: str) -> dict[str, int]:
    return {
        m.group(1): int(m.group(2))
        for ln in stdout.splitlines()
        for m in [re.match(r"\[([\w:-]+)\] timeout (\d+) ", ln)]
        if m
    }


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
    budget = _run("/tmp/unused-gpu-check-out", "e2e=soon")
    assert budget.returncode == 2 and "'e2e=soon' is not STAGE=SECONDS" in budget.stderr
    helped = _run("--help")
    assert helped.returncode == 0 and "sweep-attention" in helped.stderr


def test_list_shows_every_stage_bounded(tmp_path):
    out = tmp_path / "out"
    result = _run(out, "--list", "all")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    labels = _labels(result.stdout)
    assert labels[0] == "install"
    expected = ["tests:new-gpu", "tests:rest", "sweep-attention"]
    expected += ["winners", "e2e"]
    expected += ["check:float16", "check:bfloat16"] + (["sweep-ops"] if HAS_OPS_SWEEP else [])
    for stage in expected:
        assert stage in labels, labels
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert f"sanitize:{tool}" in labels
    # initcheck with the kernel filter flags torch's own writes; racecheck skips the
    # cuBLASLt GELU epilogue it failed inside (seen on an H100 and an H200)
    assert "sanitize:initcheck" not in labels
    race = next(ln for ln in lines if ln.startswith("[sanitize:racecheck]"))
    assert "not\\ linear_gelu" in race or "not linear_gelu" in race
    assert "not\\ test_cuda_epilogue" in race or "not test_cuda_epilogue" in race
    memcheck = next(ln for ln in lines if ln.startswith("[sanitize:memcheck]"))
    assert "test_cuda_epilogue" not in memcheck.split(" -k ")[-1]
    assert labels.index("winners") < labels.index("e2e")  # e2e takes the table
    assert any("--no-build-isolation --no-deps" in ln for ln in lines)
    # the files that failed on the last GPU run first (then those no GPU run reached:
    # none listed now), the rest of tests/ last without them and without the files that
    # passed on the last GPU runs; each names its failures as they happen
    assert "tests:unfinished" not in labels  # an empty group runs nothing
    assert labels.index("tests:new-gpu") < labels.index("tests:rest")
    first = next(ln for ln in lines if ln.startswith("[tests:new-gpu]"))
    assert "pytest tests/test_docs.py -q" in first
    assert "BERTFAST_TEST_EARLY_FAILURES=1" in first and "--dist load " in first
    rest = next(ln for ln in lines if ln.startswith("[tests:rest]"))
    assert " --ignore=tests/test_docs.py" in rest  # each file in one group
    assert " --ignore=tests/test_compile.py" in rest and " --ignore=tests/test_hub.py" in rest
    assert " --ignore=tests/ops/test_cuda_backend.py" in rest
    assert "--dist loadfile" in rest and " -v " in rest  # a cut run still names its tests
    all_env = dict(os.environ, GPU_CHECK_ALL_TESTS="1")
    everything = _run(tmp_path / "all", "--list", "all", env=all_env)
    assert everything.returncode == 0, everything.stderr
    rest_all = next(ln for ln in everything.stdout.splitlines() if ln.startswith("[tests:rest]"))
    assert "--ignore=tests/test_docs.py" in rest_all and "test_compile" not in rest_all
    # every command is bounded, each stage within a 10-minute call
    limits = _limits(result.stdout)
    assert limits and max(limits.values()) < 600
    assert sum(v for k, v in limits.items() if k.startswith("sanitize:")) < 600
    # the sanitizers check bertfast's kernels only
    memcheck = next(ln for ln in lines if ln.startswith("[sanitize:memcheck]"))
    assert "--kernel-name kns=bertfast" in memcheck and "test_cuda_backend.py" in memcheck
    assert "--out " + str(out) + "/rows.jsonl" in result.stdout
    assert "BERTFAST_WINNERS=" + str(out) + "/winners.json" in result.stdout
    assert not any(out.iterdir())  # nothing ran, nothing written


def test_list_budgets_and_call_deadline(tmp_path):
    result = _run(tmp_path / "out", "--list", "sweep-attention=200", "e2e")
    assert result.returncode == 0, result.stderr
    limits = _limits(result.stdout)
    assert limits["sweep-attention"] == 200 and "--budget-s 170" in result.stdout
    assert limits["e2e"] == 540
    # the whole call is cut to GPU_CHECK_CALL_S, less the report's share
    env = dict(os.environ, GPU_CHECK_CALL_S="100")
    clipped = _run(tmp_path / "out2", "--list", "sweep-attention", "e2e", env=env)
    assert max(_limits(clipped.stdout).values()) <= 75, clipped.stdout


def test_dry_run_runs_the_python_stages(tmp_path):
    """--dry-run all: the sweeps, the winners table and e2e run on the CPU (tiny shapes)
    and leave their rows, the table and summary.md in OUTDIR."""
    out = tmp_path / "out"
    result = _run(out, "--dry-run", "all", timeout=300)
    assert result.returncode == 0, (result.stdout, result.stderr, _log(out))
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and "summary.md" in files, files
    rows = [json.loads(ln) for ln in (out / "rows.jsonl").read_text().splitlines()]
    attn = [r for r in rows if r["stage"] == "b"]
    assert {r["op"] for r in attn} == {"attention", "attention_varlen"}
    assert {"torch", "cpu"} <= {r["backend"] for r in attn}
    for r in attn:
        assert r["bucket"] and r["median_ms"] > 0 and r["device"]["gpu"] is None
    assert all(r["parity"] == "pass" for r in attn if r["backend"] in ("torch", "cpu"))
    assert [r["rank"] for r in attn if r["auto"]] and all(r["rank"] == 0 for r in attn if r["auto"])
    if HAS_OPS_SWEEP:
        assert any(r["stage"] == "c" for r in rows)
    table = json.loads((out / "winners.json").read_text())
    assert table["device"].get("dry_run") and table["entries"]
    assert {"attention", "attention_varlen"} <= {e["op"] for e in table["entries"]}
    e2e = [json.loads(ln) for ln in (out / "e2e.jsonl").read_text().splitlines()]
    auto = [r for r in e2e if r.get("kind") == "e2e" and r["provider"] == "bertfast-auto"]
    assert len(auto) == 2 and all(r["parity"] == "ok" for r in auto)
    assert auto[0]["winners"] == str(out / "winners.json")
    assert any(r.get("kind") == "profile-summary" for r in e2e)
    text = (out / "summary.md").read_text()
    for part in ("## (b) Attention candidates", "## (e) Winners table", "## (d) End to end"):
        assert part in text
    assert "| sweep-attention | PASS |" in text and "| tests | SKIP |" in text
    assert "Kernel profile, bertfast-auto" in text and "| bertfast-auto |" in text


def _log(out) -> str:
    try:
        return (out / "gpu_check.log").read_text()[-3000:]
    except OSError:
        return ""


# ---------------------------------------------------------------- the sweep's plan
def test_attention_sweep_plan_puts_the_key_shapes_first():
    sweep = _bench_module("gpu_sweep_attention")
    pts = sweep.points(dry=False)
    assert [p.label for p in pts[:3]] == ["32x128", "32x512", "64x256"]
    assert pts[3].kind.startswith("ragged") and {p.label for p in pts[9:12]} == {
        "1x128",
        "1x256",
        "1x512",
    }
    assert len({p.label for p in pts}) == len(pts) == 21  # 9 full + 12 ragged, once each
    for p in pts:
        assert max(p.lengths) == p.seqlen and len(p.lengths) == p.batch
        if p.kind == "ragged-heavy":
            assert p.padding >= 0.5, (p.label, p.padding)
        if p.kind == "ragged-uniform":
            assert min(p.lengths) >= p.seqlen // 8
    cases = sweep.cases(False, ["bert-base", "bert-large"], [torch.float16, torch.bfloat16])
    assert len(cases) == 21 * 2 * 2 * 2
    assert [c.priority for c in cases] == sorted(c.priority for c in cases)
    heads = {c.model: (c.heads, c.head_dim) for c in cases}
    assert heads == {"bert-base": (12, 64), "bert-large": (16, 64)}


# ---------------------------------------------------------------- the report
SANITIZE_LOG = """
$ env compute-sanitizer --tool memcheck --kernel-name kns=bertfast python -m pytest
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

CHECK_LOG = """install: up to date
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

TESTS_LOG = """
########## tests group 1 unfinished
....F.s                                                  [100%]
########## tests group 3 rest
........................................................ [ 41%]
..F

EARLY FAILED tests/ops/test_nonfinite.py::test_y[fp16] (call)
        def test_y():
    >       assert err < bound
    E       AssertionError: max abs diff 0.5 > 0.01
    tests/ops/test_nonfinite.py:12: AssertionError
.................................................. [ 83%]
"""


def _fabricated(tmp_path):
    rep = _bench_module("gpu_check_report")
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    state.mkdir()
    (state / "stages.tsv").write_text(
        "install\tpass\t60\tBERTFAST_CUDA_ARCHS=90\n"
        "tests\ttimeout\t540\texit status 124\n"
        "sanitize\tfail\t400\texit status 86\n"
        "sweep-attention\tpass\t300\texit status 0\n"
        "winners\tpass\t5\texit status 0\n"
        "e2e\tpass\t400\texit status 0\n"
        "check\tfail\t90\texit status 1\n"
    )
    (state / "test-groups.tsv").write_text(
        "1\tunfinished\t1\t80\ttests/ops/test_nonfinite.py tests/test_build.py\n"
        "3\trest\t124\t400\ttests --ignore=tests/ops/test_nonfinite.py\n"
    )
    (state / "tests-1.xml").write_text(JUNIT)
    (out / "tests.log").write_text(TESTS_LOG)
    (out / "sanitize.log").write_text(SANITIZE_LOG)
    (out / "gpu_check.log").write_text(CHECK_LOG)
    return rep, out, state


def test_report_summarises_logs_and_keeps_the_limits(tmp_path):
    rep, out, state = _fabricated(tmp_path)
    big = out / "tests.log"
    with open(big, "ab") as f:  # a runaway log: 17 MiB
        f.write(b"x" * (17 * 1024 * 1024) + b"\nlast line\n")
    assert rep.main([str(out), str(state)]) == 0
    text = (out / "summary.md").read_text()
    assert "| tests | TIMEOUT | 540 |" in text and "| install | PASS | 60 |" in text
    # one row per file group; a group cut by its timeout says how far it got
    assert "| 1 unfinished | FAIL (exit 1) | 2 | 1 | 0 | 1 | 80 |" in text
    assert "| 3 rest | TIMEOUT | ? | 1 |" in text and "cut at 83%" in text
    # a cut group still names the failures it printed as they happened
    assert (
        "`tests/ops/test_nonfinite.py::test_y[fp16] (call): "
        "AssertionError: max abs diff 0.5 > 0.01`" in text
    )
    assert "tests.test_a::test_bad: assert 1 == 2" in text
    assert "1 x needs a thing" in text
    memcheck = next(ln for ln in text.splitlines() if "**memcheck**" in ln)
    assert "ERRORS FOUND" in memcheck and "ERROR SUMMARY: 2 errors" in memcheck
    assert "2 x Invalid __global__ read of size 4 bytes in bertfast::cuda::pack_rows_kernel" in text
    racecheck = next(ln for ln in text.splitlines() if "**racecheck**" in ln)
    assert "clean" in racecheck and "0 hazards" in racecheck
    assert "float16: PASS" in text and "bfloat16: FAIL" in text
    # gpu-tests.md: the tests' and sanitizers' part alone
    tests_md = (out / "gpu-tests.md").read_text()
    assert "| 1 unfinished | FAIL (exit 1) |" in tests_md and "ERROR SUMMARY: 2 errors" in tests_md
    assert "bertfast check" not in tests_md
    # the log was cut under 16 MiB, keeping its head and tail
    assert big.stat().st_size < 16 * 1024 * 1024
    data = big.read_bytes()
    assert data.startswith(b"\n########## tests group 1") and data.endswith(b"last line\n")
    assert len([p for p in out.iterdir() if p.is_file()]) <= 8


def _row(**kw):
    base = {"stage": "b", "op": "attention", "model": "bert-base", "dtype": "float16"}
    base.update(point="32x128", parity="pass", auto=False, bucket="head_dim=64,seq=128,rows=4096")
    base.update(kw)
    return json.dumps(base)


EARLY_CASES = """
import pytest


def test_fails():
    assert 1 == 2, "boom"


def test_passes():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("setup broke")


def test_errors(broken):
    pass
"""


@pytest.mark.parametrize("early", [True, False])
def test_failures_are_printed_as_they_happen(tmp_path, early):
    # tests/conftest.py's hook (the GPU check sets BERTFAST_TEST_EARLY_FAILURES): each
    # failure is named before the end-of-run summary a timeout would cut off
    (tmp_path / "test_cases.py").write_text(EARLY_CASES)
    env = dict(os.environ, BERTFAST_TEST_EARLY_FAILURES="1" if early else "0")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_cases.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lines = out.splitlines()
    named = [ln for ln in lines if ln.startswith("EARLY FAILED")]
    if not early:
        assert named == []
        return
    assert named == [
        "EARLY FAILED test_cases.py::test_fails (call)",
        "EARLY FAILED test_cases.py::test_errors (setup)",
    ]
    ends = ("short test summary", "= FAILURES", "= ERRORS")
    summary = next(i for i, ln in enumerate(lines) if any(e in ln for e in ends))
    assert lines.index(named[1]) < summary
    assert any(ln.strip().startswith("E ") and "boom" in ln for ln in lines[:summary])
    assert any("setup broke" in ln for ln in lines[:summary])
    rep = _bench_module("gpu_check_report")
    found = rep.early_failures(out)
    assert found[0].startswith("test_cases.py::test_fails (call): AssertionError: boom")
    assert found[1].startswith("test_cases.py::test_errors (setup): RuntimeError: setup broke")


def test_report_sweep_winners_and_e2e_sections(tmp_path):
    rep, out, state = _fabricated(tmp_path)
    rows = [
        _row(candidate="cuda", backend="cuda", median_ms=0.20, auto=True, rank=0),
        _row(candidate="cuda:flash", backend="cuda", median_ms=0.05, tflops=300.0),
        _row(
            candidate="triton[BLOCK_M=64]",
            backend="triton",
            median_ms=0.01,
            parity="fail: 1 > 0.01",
        ),
        _row(candidate="torch", backend="torch", median_ms=None, parity="error: RuntimeError: x"),
        _row(candidate="torch:sdpa[sdpa_backend=efficient]", backend="torch", median_ms=0.10),
        _row(stage="c", op="gemm_ceiling", candidate="torch.mm", median_ms=0.04, parity="n/a"),
        '{"stage": "b", "op": "attention", "cut by a time',  # a line cut by a timeout
    ]
    (out / "rows.jsonl").write_text("\n".join(rows) + "\n")
    (out / "winners.json").write_text(
        json.dumps(
            {
                "format": 1,
                "device": {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "torch": "2.11"},
                "entries": [
                    {
                        "op": "attention",
                        "dtype": "float16",
                        "bucket": "head_dim=64,seq=128,rows=4096",
                        "backend": "cuda",
                        "variant": "flash",
                        "config": {},
                        "median_ms": 0.05,
                        "runner_up": "cuda",
                        "speedup": 4.0,
                    }
                ],
            }
        )
    )
    e2e = {"stage": "d", "kind": "e2e", "group": 1, "shape": "32x128", "iqr_ms": 0.01}
    e2e.update(model="bert-base", dtype="float16", winners="w.json", winners_table="t")
    e2e.update(seq_per_s=1.0, tok_per_s=1.0, gflops=1.0, ceiling_share=None, parity="ok")
    prof = {"stage": "d", "kind": "profile", "name": "void bertfast::cuda::k<64>", "share": 0.5}
    prof.update(calls_per_forward=12.0, ms_per_forward=0.3)
    summ = {"stage": "d", "kind": "profile-summary", "shape": "32x128", "what": "CUDA kernels"}
    summ.update(kernels_per_forward=150.0, copies_per_forward=2.0, forwards=10)
    summ.update(device_ms_per_forward=1.1, wall_ms_per_forward=1.4)
    (out / "e2e.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                dict(e2e, provider="transformers-sdpa", median_ms=7.0, ratios={}),
                dict(
                    e2e, provider="bertfast-auto", median_ms=1.75, ratios={"transformers-sdpa": 4.0}
                ),
                {"stage": "d", "kind": "skip", "provider": "bertfast-triton", "why": "no triton"},
                prof,
                summ,
            )
        )
        + "\n"
    )
    assert rep.main([str(out), str(state)]) == 0
    text = (out / "summary.md").read_text()
    # best passing candidate vs what auto takes; failures and errors listed, never best
    assert (
        "| attention | bert-base | float16 | 32x128 | `cuda:flash` | 0.0500 | 300.0 | `cuda` "
        in text
    )
    # against the fastest torch SDPA candidate: 0.10 ms over ours (cuda:flash) 0.05 ms
    assert "| 4.00x | 0.1000 | 2.00x | 3/5 |" in text
    assert "`triton[BLOCK_M=64]`: fail: 1 > 0.01" in text and "`torch`: error: RuntimeError" in text
    assert "nvidia-h100-80gb-hbm3_sm90" in text and "`cuda:flash`" in text
    assert "| 32x128 | bertfast-auto | 1.75 |" in text and "| 4.00 |" in text
    assert "skipped bertfast-triton: no triton" in text
    assert "150 CUDA kernels per forward" in text and "bertfast::cuda::k<64>" in text


def test_winners_builder_without_rows_writes_nothing(tmp_path, capsys):
    rep = _bench_module("gpu_check_report")
    target = tmp_path / "winners.json"
    assert rep.main(["--winners", str(target), str(tmp_path / "missing.jsonl")]) == rep.NO_ROWS
    assert not target.exists() and "no sweep rows" in capsys.readouterr().out


def test_winners_table_is_for_the_gpu_most_rows_name(tmp_path, capsys):
    """A call may land on another kind of GPU than the call before it: the table is
    built for the GPU most rows name (the others left out, and said so)."""
    rep = _bench_module("gpu_check_report")
    h100 = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "torch": "2.11.0"}
    h200 = dict(h100, gpu="NVIDIA H200")
    rows = tmp_path / "rows.jsonl"
    lines = [
        _row(candidate=c, backend=c, median_ms=ms, device=h100, shape={"batch": 32})
        for c, ms in (("cuda", 0.2), ("triton", 0.1))
    ] + [_row(candidate="cuda", backend="cuda", median_ms=0.01, device=h200, shape={})]
    rows.write_text("\n".join(lines) + "\n")
    target = tmp_path / "winners.json"
    assert rep.main(["--winners", str(target), str(rows)]) == 0
    table = json.loads(target.read_text())
    assert table["device"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert [(e["op"], e["backend"]) for e in table["entries"]] == [("attention", "triton")]
    out = capsys.readouterr().out
    assert "the table is for NVIDIA H100 80GB HBM3" in out
    assert "/data/winners/" + "nvidia-h100-80gb-hbm3_sm90_torch2.11" in out
    # rows committed under benchmarks/results/<gpu>/ are gzipped: read the same
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(rows.read_bytes()))
    target.unlink()
    assert rep.main(["--winners", str(target), str(packed)]) == 0
    assert json.loads(target.read_text())["entries"] == table["entries"]


H200 = os.path.join(ROOT, "benchmarks", "results", "gpu-h200")


@pytest.mark.skipif(not os.path.isdir(H200), reason="no H200 results in this checkout")
def test_committed_gpu_winners_table_is_what_its_rows_give(tmp_path):
    """The winners table kept with a GPU run's results is the one the builder makes from
    the rows kept beside it (nothing edited by hand)."""
    rep = _bench_module("gpu_check_report")
    target = tmp_path / "winners.json"
    assert rep.main(["--winners", str(target), os.path.join(H200, "rows.jsonl.gz")]) == 0
    with open(os.path.join(H200, "winners.json")) as f:
        kept = json.load(f)
    built = json.loads(target.read_text())
    assert kept["device"] == built["device"] and kept["entries"] == built["entries"]
