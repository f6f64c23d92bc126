"""Streaming ``bertfast encode``: formats, bounded memory, --resume, bad rows.

The reference is :meth:`bertfast.Embedder.encode` on the same texts in one call; the
model is a tiny random BERT (tests/tiny_embedder.py) so that 200k lines run in CI.
Subprocesses run with one OpenMP thread: the tests check memory and rows, not speed,
and one thread per process keeps a shared 2-core runner from oversubscribing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bertfast import cli
from bertfast.embedder import Embedder

from . import tiny_embedder

N_BIG = 200_000
ENV = dict(os.environ, OMP_NUM_THREADS="1")

#: What a peak RSS may grow by from a 2k-line run to a 200k-line run. Reading the
#: whole file and tokenising it at once (the old `bertfast encode`) adds ~300 MB here.
RSS_GROWTH_BOUND_MB = 80


def run(*args, cwd, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "bertfast", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def run_measured(*args, cwd):
    """Run ``bertfast`` in a child of a fresh Python: returns (result, peak RSS in MB)
    of that child alone (RUSAGE_CHILDREN of the wrapper)."""
    wrapper = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:]); "
        "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
        "file=sys.stderr); sys.exit(r.returncode)"
    )
    result = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "bertfast", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    line = [x for x in result.stderr.splitlines() if x.startswith("PEAK_RSS_KB")][-1]
    return result, int(line.split()[1]) / 1024


@pytest.fixture(scope="module")
def embedder(micro):
    return Embedder.from_pretrained(micro)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    texts = tiny_embedder.corpus(N_BIG, seed=1, max_words=6)
    path = folder / "big.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path, texts


def _encode_big(micro, path, out):
    """The CLI arguments that encode the big file into ``out`` (every run of it alike)."""
    args = ("--input", path, "--output", out, "--batch-size", 256, "--chunk-size", 5000)
    return ("encode", micro, *args, "--no-progress")


@pytest.fixture(scope="module")
def big_run(micro, big, tmp_path_factory):
    """The 200k-line file encoded once, uninterrupted, with its peak RSS."""
    path, _ = big
    out = tmp_path_factory.mktemp("big_out") / "full.npy"
    result, rss = run_measured(*_encode_big(micro, path, out), cwd=path.parent)
    assert result.returncode == 0, result.stderr
    return out, rss, result


def close(a, b, atol=1e-5):
    np.testing.assert_allclose(a, b, rtol=0, atol=atol)


# ---------------------------------------------------------------- 200k lines
@pytest.mark.slow
def test_200k_lines_bounded_memory(micro, big, big_run, embedder, tmp_path):
    path, texts = big
    out, rss_big, result = big_run
    assert f"encoded {N_BIG} texts" in result.stdout
    vectors = np.load(out, mmap_mode="r")
    assert vectors.shape == (N_BIG, embedder.dim) and vectors.dtype == np.float32
    # Row i is line i: compare a spread of rows with the reference.
    rows = np.r_[0:300, N_BIG // 2 : N_BIG // 2 + 300, N_BIG - 300 : N_BIG]
    close(vectors[rows], embedder.encode([texts[i] for i in rows]))
    assert not os.path.exists(str(out) + ".partial")

    small = tmp_path / "small.txt"
    small.write_text("\n".join(texts[:2000]) + "\n", encoding="utf-8")
    result, rss_small = run_measured(
        "encode",
        micro,
        "--input",
        small,
        "--output",
        tmp_path / "small.npy",
        "--batch-size",
        256,
        "--chunk-size",
        5000,
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert rss_big - rss_small < RSS_GROWTH_BOUND_MB, (rss_small, rss_big)


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted(micro, big, big_run, tmp_path):
    path, _ = big
    full, _, _ = big_run
    out = tmp_path / "resumed.npy"
    args = _encode_big(micro, path, out)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertfast", *map(str, args)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    progress = tmp_path / "resumed.npy.partial" / "progress.json"
    done = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            done = json.loads(progress.read_text())["done"]
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= 20_000:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert 0 < done < N_BIG
    assert not out.exists()  # the output appears only when complete

    result = run(*args, "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resumed_at = int(result.stdout.split("resumed at row ")[1].split(")")[0])
    assert resumed_at >= done and resumed_at % 5000 == 0
    assert f"encoded {N_BIG - resumed_at} texts" in result.stdout
    assert out.read_bytes() == full.read_bytes()
    assert not (tmp_path / "resumed.npy.partial").exists()


def test_resume_parquet_and_refusals(micro, embedder, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    texts = tiny_embedder.corpus(3000, seed=2)
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(json.dumps({"text": t, "doc": f"d{i}"}) + "\n" for i, t in enumerate(texts)),
        encoding="utf-8",
    )
    out = tmp_path / "out.parquet"
    base = [
        "encode",
        str(micro),
        "--input",
        str(source),
        "--output",
        str(out),
        "--keep",
        "doc",
        "--chunk-size",
        "500",
        "--no-progress",
    ]
    assert cli.main(base) == 0
    expect = pq.read_table(out)

    # An interrupted run: the first three chunks are done, the rest is not.
    from bertfast import stream

    calls = {"n": 0}
    real = Embedder.encode

    def dies_after_three(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    out.unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Embedder, "encode", dies_after_three)
        assert cli.main(base) == 130  # interrupted, as by Ctrl-C
    partial = stream.partial_dir(out)
    assert json.loads((partial / "progress.json").read_text())["done"] == 1500
    assert not out.exists()

    # Another chunk size or another model cannot continue it.
    assert cli.main(base[:-3] + ["--chunk-size", "1000", "--resume", "--no-progress"]) == 2
    other = tiny_embedder.make_checkpoint(tmp_path / "other", seed=5, size="micro")
    assert cli.main(["encode", str(other)] + base[2:] + ["--resume"]) == 2
    assert cli.main(base + ["--resume"]) == 0
    got = pq.read_table(out)
    assert got.equals(expect)
    assert got.column("id").to_pylist() == list(range(3000))
    assert got.column("doc").to_pylist() == [f"d{i}" for i in range(3000)]
    vectors = np.asarray(got.column("embedding").combine_chunks().flatten()).reshape(3000, -1)
    close(vectors, embedder.encode(texts))


# ---------------------------------------------------------------- formats
def test_formats_in_and_out(micro, embedder, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [
        "the cat sat, on the mat",
        "",
        "a \u2028 line separator stays one text",
        "Crème brûlée 🙂",
        "hello\tworld",
        "x" * 300,
    ]
    expect = embedder.encode(texts)

    # .txt with a BOM and CRLF line ends: one row per line.
    txt = tmp_path / "in.txt"
    txt.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(texts).encode("utf-8") + b"\r\n")
    assert cli.main(["encode", str(micro), "-i", str(txt), "-o", str(tmp_path / "a.npy")]) == 0
    close(np.load(tmp_path / "a.npy"), expect)

    # .jsonl (--field) -> .jsonl with --keep
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"body": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "b.jsonl"
    assert (
        cli.main(
            [
                "encode",
                str(micro),
                "-i",
                str(jsonl),
                "-o",
                str(out),
                "--field",
                "body",
                "--keep",
                "n",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [r["n"] for r in records] == list(range(len(texts)))
    close(np.array([r["embedding"] for r in records], dtype=np.float32), expect)

    # .csv (--column, quoted newlines and commas) -> .parquet
    csv = tmp_path / "in.csv"
    import csv as csvlib

    with open(csv, "w", newline="", encoding="utf-8") as f:
        writer = csvlib.writer(f)
        writer.writerow(["title", "body"])
        for i, t in enumerate(texts):
            writer.writerow([f"t{i}\nsecond line", t])
    out = tmp_path / "c.parquet"
    assert (
        cli.main(
            [
                "encode",
                str(micro),
                "-i",
                str(csv),
                "-o",
                str(out),
                "--column",
                "body",
                "--keep",
                "title",
            ]
        )
        == 0
    )
    table = pq.read_table(out)
    assert table.column_names == ["id", "title", "embedding"]
    assert table.column("title").to_pylist() == [f"t{i}\nsecond line" for i in range(len(texts))]
    close(
        np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(len(texts), -1),
        expect,
    )

    # .parquet (small row groups, chunks across them) -> .npy
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id_in": list(range(len(texts))), "text": texts}), source, row_group_size=4
    )
    assert (
        cli.main(
            [
                "encode",
                str(micro),
                "-i",
                str(source),
                "-o",
                str(tmp_path / "d.npy"),
                "--chunk-size",
                "3",
            ]
        )
        == 0
    )
    close(np.load(tmp_path / "d.npy"), expect)
    capsys.readouterr()


def test_empty_input(micro, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert cli.main(["encode", str(micro), "-i", str(empty), "-o", str(tmp_path / "e.npy")]) == 0
    assert np.load(tmp_path / "e.npy").shape == (0, 32)
    assert (
        cli.main(["encode", str(micro), "-i", str(empty), "-o", str(tmp_path / "e.parquet")]) == 0
    )
    assert pq.read_table(tmp_path / "e.parquet").num_rows == 0


# ---------------------------------------------------------------- bad rows
def _err(capsys):
    err = capsys.readouterr().err
    assert err.startswith("bertfast: error:") and "Traceback" not in err
    return err


def test_bad_rows_are_named(micro, tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out.npy"
    cases = {
        "bad.txt": (
            b"fine\nalso fine\n\xff\xfe broken\n",
            "row 3 (line 3, id 2) is not valid UTF-8",
        ),
        "num.jsonl": (
            b'{"text": "ok"}\n{"text": 7}\n',
            "row 2 (line 2, id 1) field 'text' is a number",
        ),
        "nofield.jsonl": (b'{"text": "ok"}\n{"txt": "x"}\n', "has no field 'text'"),
        "notjson.jsonl": (b'{"text": "ok"}\n{"text": \n', "row 2 (line 2, id 1) is not valid JSON"),
        "blank.jsonl": (
            b'{"text": "ok"}\n\n{"text": "ok"}\n',
            "row 2 (line 2, id 1) is an empty line",
        ),
        "fields.csv": (
            b"text,n\nok,1\nonly\n",
            "row 2 (line 3, id 1) has 1 fields, the header has 2",
        ),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert cli.main(["encode", str(micro), "-i", str(tmp_path / name), "-o", str(out)]) == 2
        err = _err(capsys)
        assert name in err and words in err and "--skip-bad" in err, err
        assert not out.exists() and not (tmp_path / "out.npy.partial").exists()
    pq.write_table(pa.table({"text": ["a", None, "b"]}), tmp_path / "null.parquet")
    null = tmp_path / "null.parquet"
    assert cli.main(["encode", str(micro), "-i", str(null), "-o", str(out)]) == 2
    assert "row 2 (id 1) is null" in _err(capsys)


def test_skip_bad_keeps_rows_in_place(micro, embedder, tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    good = tiny_embedder.corpus(40, seed=4)
    lines, bad_ids = [], []
    for i, t in enumerate(good):
        lines.append(json.dumps({"text": t}))
        if i % 9 == 4:
            lines.append(json.dumps({"text": None}))
            bad_ids.append(len(lines) - 1)
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    expect = embedder.encode(good)
    keep = [i for i in range(len(lines)) if i not in bad_ids]

    def skip_bad_to(out):  # the same run, written as .npy and then as .parquet
        args = ("-i", source, "-o", out, "--skip-bad", "--chunk-size", 7)
        return ["encode", str(micro), *map(str, args)]

    out = tmp_path / "out.npy"
    assert cli.main(skip_bad_to(out)) == 0
    summary = capsys.readouterr().out
    assert f"encoded {len(good)} texts" in summary
    assert f"skipped {len(bad_ids)} bad rows (their rows hold NaN)" in summary
    first = bad_ids[0]
    assert f"row {first + 1} (line {first + 1}, id {first}) field 'text' is null" in summary
    vectors = np.load(out)
    assert vectors.shape == (len(lines), embedder.dim)
    assert np.isnan(vectors[bad_ids]).all()
    close(vectors[keep], expect)

    out = tmp_path / "out.parquet"
    assert cli.main(skip_bad_to(out)) == 0
    assert "their ids are absent" in capsys.readouterr().out
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == keep
    close(
        np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(len(keep), -1),
        expect,
    )


def test_user_errors(micro, tmp_path, capsys):
    texts = tmp_path / "t.txt"
    texts.write_text("a\nb\n")
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"text": "a"}\n')
    csv = tmp_path / "t.csv"
    csv.write_text("body\nx\n")

    def fails(*args, words):
        assert cli.main(["encode", str(micro), *map(str, args)]) == 2
        err = _err(capsys)
        for word in words:
            assert word in err, err

    fails("-i", texts, "-o", tmp_path / "o.csv", words=[".npy, .parquet or .jsonl"])
    fails("-i", csv, "-o", tmp_path / "o.npy", words=["no column 'text'", "body", "--column"])
    fails(
        "-i", texts, "-o", tmp_path / "o.jsonl", "--resume", words=["--resume", ".npy and .parquet"]
    )
    fails("-i", texts, "-o", tmp_path / "o.parquet", "--keep", "x", words=["--keep", ".txt"])
    fails("-i", jsonl, "-o", tmp_path / "o.parquet", "--keep", "id", words=["--keep", "'id'"])
    fails("-i", texts, "-o", tmp_path / "o.npy", "--chunk-size", 0, words=["--chunk-size"])
    (tmp_path / "x.parquet").write_text("not parquet")
    fails("-i", tmp_path / "x.parquet", "-o", tmp_path / "o.npy", words=["x.parquet", "Parquet"])


# ---------------------------------------------------------------- .jsonl floats
def _float32_cases() -> np.ndarray:
    """Unit vectors, other magnitudes (1e-30 .. 1e30), subnormals, the extremes,
    values that print short (0.1, 0.5, 1e-05, 16777216), signed zeros."""
    rng = np.random.default_rng(7)
    unit = rng.standard_normal((64, 32))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    scaled = rng.standard_normal((64, 32)) * 10.0 ** rng.integers(-30, 31, (64, 1))
    bits = rng.integers(0, 2**32, (64, 32), dtype=np.uint64).astype(np.uint32)
    subnormal = (bits & np.uint32(0x807FFFFF)).view(np.float32)  # exponent bits 0
    anything = bits.view(np.float32)
    anything = np.where(np.isfinite(anything), anything, 1.5)  # non-finite: below
    info = np.finfo(np.float32)
    edges = [0.0, -0.0, 0.1, -0.5, 1e-5, 16777216.0, 3.0e-8, 1.0, 1e-13, 1e22]
    edges += [info.max, -info.max, info.tiny, info.smallest_subnormal, -info.eps]
    edges = np.resize(np.array(edges, dtype=np.float32), (1, 32))
    parts = [unit, scaled, subnormal, anything, edges]
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])


def _jsonl_through_sink(tmp_path, vectors: np.ndarray) -> list[dict]:
    from bertfast.stream import Chunk, open_sink

    out = tmp_path / "v.jsonl"
    sink = open_sink(out, len(vectors), vectors.shape[1], len(vectors), {})
    sink.open(resume=False)
    sink.write(Chunk(0, ["t"] * len(vectors)), list(range(len(vectors))), vectors)
    sink.finish()
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_jsonl_floats_read_back_bit_for_bit_in_shortest_form(tmp_path):
    """Each float32 is written with the fewest digits that read back (json.loads, then
    float32) as the same bits: numpy's shortest float32 repr, not the 17 digits a
    float64 conversion prints."""
    vectors = _float32_cases()
    records = _jsonl_through_sink(tmp_path, vectors)
    assert [r["id"] for r in records] == list(range(len(vectors)))
    read = np.array([r["embedding"] for r in records])  # float64, as json.loads gives
    back = read.astype(np.float32)
    assert np.array_equal(back.view(np.uint32), vectors.view(np.uint32))
    # the same decimal as numpy's Dragon4 (shortest, nearest, ties to an even digit)
    shortest = [float(np.format_float_scientific(v, unique=True)) for v in vectors.ravel()]
    differ = np.flatnonzero(read.ravel() != np.array(shortest))
    assert not len(differ), [(read.flat[i], shortest[i]) for i in differ[:5]]
    lines = (tmp_path / "v.jsonl").read_text(encoding="utf-8").splitlines()
    numbers = [n for line in lines for n in line.split('"embedding": [')[1][:-2].split(", ")]
    assert len(numbers) == vectors.size
    digits = [len(re.sub(r"e.*|[-.]", "", n).strip("0")) for n in numbers]
    assert max(digits) <= 9 and np.mean(digits) < 9


def test_jsonl_non_finite_values_as_before(tmp_path):
    """NaN and the infinities are written as json writes them (NaN, Infinity,
    -Infinity; json.loads reads them back); the numbers around them stay short."""
    vectors = np.array([[np.nan, np.inf, -np.inf, 0.1, -0.0]], dtype=np.float32)
    out = _jsonl_through_sink(tmp_path, vectors)
    text = (tmp_path / "v.jsonl").read_text(encoding="utf-8")
    assert '"embedding": [NaN, Infinity, -Infinity, 0.1, -0.0]' in text
    back = np.array(out[0]["embedding"], dtype=np.float32)
    assert np.isnan(back[0]) and back[1] == np.inf and back[2] == -np.inf
    assert np.array_equal(back[3:].view(np.uint32), vectors[0, 3:].view(np.uint32))


def test_shortest_float32_keeps_shape_and_empty_chunks():
    from bertfast.stream import shortest_float32

    assert shortest_float32(np.zeros((0, 8), np.float32)).shape == (0, 8)
    got = shortest_float32(np.array([[0.1, 1 / 3], [2.5e-20, 7.0]], dtype=np.float32))
    assert got.dtype == np.float64 and got.shape == (2, 2)
    assert [repr(v) for v in got.ravel().tolist()] == ["0.1", "0.33333334", "2.5e-20", "7.0"]
