"""``bertfast encode`` never loses or mixes data: one writer per output (an OS lock),
a resume that checks the model's bytes and the settings, Parquet output identical
after a resume, and every text that is not text a named row error.

Each test reproduces a case that once failed (issue 27's table) and checks against
an independent reference: an uninterrupted run, ``Embedder.encode`` on the same
texts, or the bytes of a file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bertfast import cli, stream
from bertfast.embedder import Embedder

from . import tiny_embedder

ENV = dict(os.environ, OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def embedder(micro):
    return Embedder.from_pretrained(micro)


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("bertfast: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _write_jsonl(path, texts, **extra):
    rows = [{"text": t, "doc": f"d{i}", **extra} for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _dies_after(n: int, effect=None):
    """An ``Embedder.encode`` that raises KeyboardInterrupt at call ``n`` (a Ctrl-C
    in the middle of a run: the chunks before it are finished); ``effect(call)`` runs
    first at every call."""
    real, calls = Embedder.encode, [0]

    def encode(self, *args, **kwargs):
        calls[0] += 1
        if effect is not None:
            effect(calls[0])
        if calls[0] == n:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    return encode


def _txt_run(micro, tmp_path, n: int, seed: int, chunk_size: int):
    """``n`` short texts in a .txt file: (texts, the .npy output, the CLI arguments)."""
    texts = tiny_embedder.corpus(n, seed=seed, max_words=6)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.npy"
    args = ["encode", str(micro), "-i", str(source), "-o", str(out)]
    return texts, out, args + ["--chunk-size", str(chunk_size), "--no-progress"]


def _interrupt(args, after: int = 3):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Embedder, "encode", _dies_after(after + 1))
        assert cli.main(args) == 130


# ---------------------------------------------------------------- one writer
_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bertfast import stream
    lock = stream.lock_output(Path(sys.argv[1]))
    print("locked", flush=True)
    time.sleep(600)
    """
)


def _hold_lock(output):
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(output)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_is_refused_naming_the_holder(micro, tmp_path, capsys):
    texts = tiny_embedder.corpus(50, seed=1)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.npy"
    holder = _hold_lock(out)
    try:
        partial = stream.partial_dir(out)
        (partial / "progress.json").write_text('{"the holder": "its work"}')
        assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
        err = _err(capsys)
        assert str(out) in err and f"process {holder.pid}" in err, err
        # Nothing of the holder's was touched, and no output appeared.
        assert (partial / "progress.json").read_text() == '{"the holder": "its work"}'
        assert not out.exists()
        assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out), "--resume"]) == 2
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the dead holder's lock: a new run takes it over.
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 0
    assert np.load(out).shape[0] == len(texts)
    assert not stream.partial_dir(out).exists()


_PAUSED_RUN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bertfast import cli
    from bertfast.embedder import Embedder

    real, calls, go = Embedder.encode, [0], Path(sys.argv[1])

    def paused(self, *args, **kwargs):  # the second chunk waits for the test's go
        calls[0] += 1
        if calls[0] == 2:
            print("paused", file=sys.stderr, flush=True)
            while not go.exists():
                time.sleep(0.01)
        return real(self, *args, **kwargs)

    Embedder.encode = paused
    sys.exit(cli.main(sys.argv[2:]))
    """
)


def test_two_concurrent_runs_lose_no_rows(micro, embedder, tmp_path, capsys):
    """The failing case: a second run on the same output while the first ran used to
    recreate the partial folder, and the first then moved a half-zero file into
    place. Now the second stops at once and the first finishes intact."""
    texts, out, args = _txt_run(micro, tmp_path, 3000, seed=3, chunk_size=1000)
    go = tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_RUN, str(go), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        line = ""
        while line != "paused" and first.poll() is None:
            line = first.stderr.readline().strip()
        assert line == "paused", first.communicate()
        # The first run is in the middle of its second chunk: a second run now.
        assert cli.main(args) == 2
        err = _err(capsys)
        assert f"process {first.pid}" in err and str(out) in err, err
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert f"encoded {len(texts)} texts" in stdout
    vectors = np.load(out)
    assert vectors.shape[0] == len(texts)
    np.testing.assert_allclose(vectors, embedder.encode(texts), rtol=0, atol=1e-5)
    assert not stream.partial_dir(out).exists()


def test_partial_folder_replaced_during_the_run_is_not_moved_into_place(micro, tmp_path, capsys):
    """Another program (not bertfast: it would wait for the lock) removes and
    recreates the partial folder while the run writes: the run must not move what it
    has into place as if it were complete."""
    texts = tiny_embedder.corpus(100, seed=2)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.npy"
    partial = stream.partial_dir(out)

    def replace_folder(calls):
        if calls == 2:
            shutil.rmtree(partial)
            partial.mkdir()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Embedder, "encode", _dies_after(0, effect=replace_folder))
        args = ["encode", str(micro), "-i", str(source), "-o", str(out), "--chunk-size", "20"]
        assert cli.main(args) == 2
    assert "removed or replaced" in _err(capsys)
    assert not out.exists()


def test_a_failed_run_leaves_no_empty_partial_folder(micro, tmp_path, capsys):
    source = tmp_path / "bad.txt"
    source.write_bytes(b"fine\n\xff\n")
    out = tmp_path / "out.npy"
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    capsys.readouterr()
    assert not stream.partial_dir(out).exists()


def test_partial_path_that_is_a_file(micro, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a\n")
    out = tmp_path / "out.npy"
    stream.partial_dir(out).write_text("not a folder")
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    assert "is not a folder" in _err(capsys)


# ---------------------------------------------------------------- resume checks
def _resume_setup(micro, tmp_path, name="out.npy"):
    texts = tiny_embedder.corpus(400, seed=6)
    source = _write_jsonl(tmp_path / "in.jsonl", texts)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(micro, ckpt)
    out = tmp_path / name
    args = ["encode", str(ckpt), "-i", str(source), "-o", str(out), "--chunk-size", "50"]
    args += ["--no-progress"]
    _interrupt(args)
    assert json.loads((stream.partial_dir(out) / "progress.json").read_text())["done"] == 150
    return ckpt, args, out, texts


def test_resume_refuses_replaced_weights(micro, tmp_path, capsys):
    """The failing case: weights replaced in the same folder between the kill and the
    resume were accepted (only the path was checked), and the output mixed two
    models."""
    ckpt, args, out, _ = _resume_setup(micro, tmp_path)
    other = tiny_embedder.make_checkpoint(tmp_path / "other", seed=9, size="micro")
    shutil.copy(other / "model.safetensors", ckpt / "model.safetensors")
    capsys.readouterr()
    assert cli.main(args + ["--resume"]) == 2
    err = _err(capsys)
    assert "checkpoint file model.safetensors differs" in err and "--resume" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "edit",
    [
        ("vocab.txt", lambda text: text.replace("\ncat\n", "\ncats\n")),
        ("tokenizer_config.json", lambda text: json.dumps({"do_lower_case": False})),
        (
            "config.json",
            lambda text: text.replace('"layer_norm_eps": 1e-12', '"layer_norm_eps": 1e-5'),
        ),
    ],
    ids=["vocab", "tokenizer-config", "config"],
)
def test_resume_refuses_changed_checkpoint_files(micro, tmp_path, capsys, edit):
    name, change = edit
    ckpt, args, out, _ = _resume_setup(micro, tmp_path)
    before = (ckpt / name).read_text()
    after = change(before)
    assert after != before
    (ckpt / name).write_text(after)
    capsys.readouterr()
    assert cli.main(args + ["--resume"]) == 2
    assert f"checkpoint file {name} differs" in _err(capsys)


def test_resume_refuses_changed_settings_and_accepts_a_moved_copy(
    micro, embedder, tmp_path, capsys
):
    ckpt, args, out, texts = _resume_setup(micro, tmp_path)
    capsys.readouterr()
    assert cli.main(args + ["--resume", "--quantize", "int8"]) == 2
    assert "quantize differs" in _err(capsys)
    assert cli.main(args + ["--resume", "--max-length", "16"]) == 2
    assert "max_length differs" in _err(capsys)
    # The same bytes in another folder are the same model: the resume goes on.
    moved = tmp_path / "moved"
    shutil.copytree(ckpt, moved)
    shutil.rmtree(ckpt)
    args = [a if a != str(ckpt) else str(moved) for a in args]
    assert cli.main(args + ["--resume"]) == 0
    assert "resumed at row 150" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out), embedder.encode(texts), rtol=0, atol=1e-5)


def test_fingerprint_covers_what_the_loader_reads(micro):
    from bertfast import fingerprint

    names = fingerprint.checkpoint_files(micro)
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= set(names)
    import hashlib

    prints = fingerprint.checkpoint_fingerprint(micro)
    data = (micro / "model.safetensors").read_bytes()
    assert prints["checkpoint file model.safetensors"] == (
        f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
    )


# ---------------------------------------------------------------- Parquet resume
def test_parquet_resume_is_byte_identical(micro, tmp_path):
    """The failing case: after a resume the embedding list's inner field was
    ``element`` (the schema read back from a part file), ``item`` otherwise."""
    pytest.importorskip("pyarrow.parquet")
    texts = tiny_embedder.corpus(300, seed=8)
    rows = [
        {"text": t, "doc": f"d{i}", "tags": [i, i + 1], "meta": {"n": i}}
        for i, t in enumerate(texts)
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def args(out):
        return [
            "encode",
            str(micro),
            "-i",
            str(source),
            "-o",
            str(out),
            "--keep",
            "doc,tags,meta",
            "--chunk-size",
            "40",
            "--no-progress",
        ]

    whole = tmp_path / "whole.parquet"
    assert cli.main(args(whole)) == 0
    resumed = tmp_path / "resumed.parquet"
    _interrupt(args(resumed), after=4)
    assert cli.main(args(resumed) + ["--resume"]) == 0
    assert resumed.read_bytes() == whole.read_bytes()


# ---------------------------------------------------------------- bad texts
def test_lone_surrogate_in_jsonl_is_a_row_error(micro, embedder, tmp_path, capsys):
    """The failing case: ``{"text": "bad \\ud800 x"}`` passed the up-front check and
    then crashed the run with a tokenizer TypeError; --skip-bad did not help."""
    lines = ['{"text": "fine"}', '{"text": "bad \\ud800 x"}', '{"text": "also fine"}']
    lines.append('{"text": "ok", "doc": ["x", {"k": "\\udfff"}]}')
    lines.append('{"text": "a pair \\ud83d\\ude00 is fine"}')
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.npy"
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    err = _err(capsys)
    assert "row 2 (line 2, id 1)" in err and "surrogate" in err and "--skip-bad" in err, err

    args = ["encode", str(micro), "-i", str(source), "-o", str(out), "--skip-bad"]
    assert cli.main(args) == 0
    summary = capsys.readouterr().out
    assert "skipped 1 bad row" in summary and "row 2 (line 2, id 1)" in summary
    vectors = np.load(out)
    assert np.isnan(vectors[1]).all() and not np.isnan(vectors[[0, 2, 3, 4]]).any()
    good = ["fine", "also fine", "ok", "a pair \U0001f600 is fine"]
    np.testing.assert_allclose(vectors[[0, 2, 3, 4]], embedder.encode(good), rtol=0, atol=1e-5)

    # A kept value that is not text is the row's error too (the output would hold it).
    out = tmp_path / "out.jsonl"
    args = ["encode", str(micro), "-i", str(source), "-o", str(out), "--keep", "doc"]
    assert cli.main(args + ["--skip-bad"]) == 0
    summary = capsys.readouterr().out
    assert "skipped 2 bad rows" in summary and "field 'doc'" in summary
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [0, 2, 4]


def _invalid_utf8(pa, values):
    """A Parquet string column holding bytes that are not UTF-8 (pyarrow writes a
    string column without checking it, as other writers may)."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_invalid_utf8_in_parquet_is_a_row_error(micro, embedder, tmp_path, capsys):
    """The failing case: a Parquet string column holding ``\\xff\\xfe`` crashed the
    run with UnicodeDecodeError, with or without --skip-bad."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = _invalid_utf8(pa, [b"fine", b"\xff\xfe", None, b"also fine", b"ok"])
    docs = _invalid_utf8(pa, [b"a", b"b", b"c", b"d", b"\xc3"])
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": texts, "doc": docs}), source)
    out = tmp_path / "out.npy"
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    err = _err(capsys)
    assert "row 2 (id 1) text is not valid UTF-8" in err and "--skip-bad" in err, err

    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out), "--skip-bad"]) == 0
    capsys.readouterr()
    vectors = np.load(out)
    assert np.isnan(vectors[[1, 2]]).all() and not np.isnan(vectors[[0, 3, 4]]).any()
    np.testing.assert_allclose(
        vectors[[0, 3, 4]], embedder.encode(["fine", "also fine", "ok"]), rtol=0, atol=1e-5
    )

    out = tmp_path / "out.jsonl"
    args = ["encode", str(micro), "-i", str(source), "-o", str(out), "--keep", "doc"]
    assert cli.main(args) == 2
    assert "row 2 (id 1) text is not valid UTF-8" in _err(capsys)
    assert cli.main(args + ["--skip-bad"]) == 0
    summary = capsys.readouterr().out
    assert "skipped 3 bad rows" in summary and "column 'doc' is not valid UTF-8" in summary
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["doc"]) for r in records] == [(0, "a"), (3, "d")]


def test_invalid_utf8_in_csv_is_a_row_error(micro, tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_bytes(b"text,doc\nfine,a\nbad \xff\xfe,b\nok,\xed\xa0\x80\n")
    out = tmp_path / "out.npy"
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    assert "row 2 (line 3, id 1) is not valid UTF-8" in _err(capsys)
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out), "--skip-bad"]) == 0
    assert "skipped 2 bad rows" in capsys.readouterr().out
    vectors = np.load(out)
    assert np.isnan(vectors[[1, 2]]).all() and not np.isnan(vectors[0]).any()


def test_interrupted_run_releases_its_lock(micro, tmp_path):
    """In one process (a notebook, a test): after a Ctrl-C the same output can be
    resumed at once: the lock went with the failed call, not with the process."""
    _, args, out, _ = _resume_setup(micro, tmp_path)
    lock = stream.lock_output(out)
    assert lock.held
    lock.release()
    assert cli.main(args + ["--resume"]) == 0


def test_killed_run_resumes(micro, embedder, tmp_path):
    """``kill -9`` in the middle of a run: the lock dies with the process and
    ``--resume`` finishes the same rows as an uninterrupted run."""
    texts, out, args = _txt_run(micro, tmp_path, 20_000, seed=4, chunk_size=500)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertfast", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    progress = stream.partial_dir(out) / "progress.json"
    deadline = time.monotonic() + 300
    done = 0
    while time.monotonic() < deadline and proc.poll() is None and done < 1000:
        try:
            done = json.loads(progress.read_text())["done"]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert cli.main(args + ["--resume"]) == 0
    vectors = np.load(out)
    rows = np.r_[0:100, len(texts) - 100 : len(texts)]
    np.testing.assert_allclose(
        vectors[rows], embedder.encode([texts[i] for i in rows]), rtol=0, atol=1e-5
    )


# ---------------------------------------------------------------- long lines
def _reference_lines(data: bytes, max_chars: int):
    """What every line is, read whole (the reference for the bounded reader)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for raw in lines:
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            out.append(raw.decode("utf-8")[: max_chars + 1])
        except UnicodeDecodeError:
            out.append(None)
    return out


@pytest.mark.parametrize("max_chars", [5, 1000, 300_000])
def test_bounded_lines_equal_whole_lines(tmp_path, max_chars):
    block = stream._READ_BLOCK
    lines = [
        b"short",
        b"",
        b"x" * (block - 1),
        b"y" * block,
        b"z" * (block + 1) + b"\r",
        "é".encode() * block,  # 2 bytes a character, across block edges
        "😀".encode() * (block // 3) + b"end",
        b"a" * (3 * block) + b"\xff" + b"b" * 10,  # bad far into a long line
        b"c" * (2 * block) + "é".encode()[:1],  # a cut character at the end
        b"\xed\xa0\x80 surrogate bytes",
        "tail ü".encode(),
    ]
    data = b"\xef\xbb\xbf" + b"\n".join(lines)  # BOM; the last line has no line end
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    got = [(i, text) for i, text, _, _ in stream._bounded_lines(path, max_chars)]
    want = _reference_lines(data, max_chars)
    assert [i for i, _ in got] == list(range(len(want)))
    assert [text for _, text in got] == want
    # The up-front check finds the same bad lines.
    source = stream.TextSource(path, "in.txt", "text", [])
    rows, listed, count = source.scan(skip_bad=True)
    assert rows == len(want)
    assert [b.index for b in listed] == [i for i, t in enumerate(want) if t is None]


def test_one_huge_line_streams_in_bounded_memory(micro, embedder, tmp_path):
    """The failing case: one 10 MB line took 1.9 GB (a 50 MB one 7.5 GB and 63 s):
    the whole line was read and tokenized before it was cut to max_length tokens."""
    words = tiny_embedder.WORDS
    rng = np.random.default_rng(0)
    line = " ".join(words[i] for i in rng.integers(0, len(words), 12_000_000))  # ~64 MB
    small, huge = tmp_path / "small.txt", tmp_path / "huge.txt"
    small.write_text("a short line\nanother\n")
    huge.write_text("a short line\n" + line + "\nanother\n")
    peaks = {}
    for path in (small, huge):
        out = tmp_path / (path.stem + ".npy")
        wrapper = (
            "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
            "file=sys.stderr); sys.exit(r.returncode)"
        )
        cmd = [sys.executable, "-c", wrapper, sys.executable, "-m", "bertfast", "encode"]
        cmd += [str(micro), "-i", str(path), "-o", str(out), "--no-progress"]
        result = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
        assert result.returncode == 0, result.stderr
        peak = [x for x in result.stderr.splitlines() if x.startswith("PEAK")][-1]
        peaks[path.stem] = int(peak.split()[1]) / 1024
    # The reference: Embedder.encode truncates to the same tokens.
    vectors = np.load(tmp_path / "huge.npy")
    expect = embedder.encode(["a short line", line[:100_000], "another"])
    np.testing.assert_allclose(vectors, expect, rtol=0, atol=1e-5)
    assert peaks["huge"] - peaks["small"] < 150, peaks


def test_rows_found_bad_while_encoding_are_row_errors(micro, embedder, tmp_path, capsys):
    """Rows the up-front check cannot judge without tokenizing: a text whose first
    tokens cannot be found within the characters the tokenizer may look at (a 1.1M
    character word of combining marks), and a .txt line longer than what is read of
    it whose head ends in an unfinished word. Both are named row errors; --skip-bad
    skips them like any bad row, and the rows around them are right."""
    giant = "x" + "\u0301" * 1_100_000
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["fine", giant, "also fine"]))
    out = tmp_path / "out.npy"
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    err = _err(capsys)
    assert "row 2 (line 2, id 1)" in err and "1,100,001 characters" in err, err
    assert "--skip-bad" in err and not out.exists()
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out), "--skip-bad"]) == 0
    assert "skipped 1 bad row" in capsys.readouterr().out
    vectors = np.load(out)
    assert np.isnan(vectors[1]).all()
    np.testing.assert_allclose(
        vectors[[0, 2]], embedder.encode(["fine", "also fine"]), rtol=0, atol=1e-5
    )

    # A line longer than what is read of it, whose head is one unfinished word: its
    # first token depends on where that word ends, which was never read.
    lines = tmp_path / "in.txt"
    with open(lines, "w") as f:
        f.write("fine\n" + "a" * (stream.LINE_HEAD_CHARS + 10) + " cat\nalso fine\n")
    assert cli.main(["encode", str(micro), "-i", str(lines), "-o", str(out)]) == 2
    err = _err(capsys)
    assert "row 2 (line 2, id 1) is a line of more than" in err, err
    assert cli.main(["encode", str(micro), "-i", str(lines), "-o", str(out), "--skip-bad"]) == 0
    capsys.readouterr()
    vectors = np.load(out)
    assert np.isnan(vectors[1]).all()
    np.testing.assert_allclose(
        vectors[[0, 2]], embedder.encode(["fine", "also fine"]), rtol=0, atol=1e-5
    )


def test_ray_row_groups_refuse_or_skip_invalid_utf8(tmp_path):
    """The Ray Data reader (``bertfast encode --ray``) shares the Parquet row check:
    a text or kept value that is not UTF-8 is named, or dropped with skip_bad."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from bertfast.ray import parquet_row_groups, read_row_groups

    path = tmp_path / "in.parquet"
    texts = _invalid_utf8(pa, [b"fine", b"\xff\xfe", None, b"ok"])
    docs = _invalid_utf8(pa, [b"a", b"b", b"c", b"\xc3"])
    pq.write_table(pa.table({"text": texts, "doc": docs}), path)
    groups, total = parquet_row_groups(str(path), "text", ["doc"])
    assert total == 4
    batch = {k: np.array([g[k] for g in groups]) for k in ("file", "row_group", "first_id", "uri")}
    with pytest.raises(ValueError, match=r"row 2 \(id 1\) text is not valid UTF-8"):
        read_row_groups(batch, "text", ["doc"])
    table = read_row_groups(batch, "text", ["doc"], skip_bad=True)
    assert table.column("id").to_pylist() == [0]
    assert table.column("text").to_pylist() == ["fine"]


def test_unwritable_output_folder_is_one_line(micro, tmp_path, capsys, monkeypatch):
    """A folder where the partial folder cannot be made (read-only: simulated, since
    the tests may run as root) is one line and exit 2, not a traceback."""
    import errno
    import pathlib

    source = tmp_path / "in.txt"
    source.write_text("a\n")
    out = tmp_path / "out.npy"

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    assert cli.main(["encode", str(micro), "-i", str(source), "-o", str(out)]) == 2
    err = _err(capsys)
    assert "cannot create" in err and "Read-only file system" in err, err
