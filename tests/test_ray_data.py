"""Ray Data: ``bertfast.ray.embed_dataset`` / ``BertfastPredictor`` and
``bertfast encode --ray``, on a local 2-CPU Ray cluster started here.

The reference is :meth:`bertfast.Embedder.encode` of the same texts in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from bertfast import cli  # noqa: E402
from bertfast.embedder import Embedder  # noqa: E402
from bertfast.ray import BertfastPredictor, embed_dataset  # noqa: E402

from . import tiny_embedder  # noqa: E402

N = 5000
COSINE_TOL = 1e-6

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_embedder.make_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def texts():
    return tiny_embedder.corpus(N, seed=7)


@pytest.fixture(scope="module")
def expect(ckpt, texts):
    return Embedder.from_pretrained(ckpt).encode(texts)


def assert_same_vectors(got, expect):
    got = np.asarray(got, dtype=np.float64)
    expect = np.asarray(expect, dtype=np.float64)
    assert got.shape == expect.shape
    cos = (got * expect).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expect, axis=1))
    assert cos.min() >= 1 - COSINE_TOL, f"min cosine {cos.min():.9f} at row {cos.argmin()}"


def collect(ds, dim):
    """(ids, [rows, dim] vectors) of a dataset, in its order."""
    ids, vectors = [], []
    for batch in ds.iter_batches(batch_format="numpy", batch_size=1000):
        ids.extend(batch["id"].tolist())
        vectors.append(np.asarray(batch["embedding"], dtype=np.float32).reshape(-1, dim))
    return ids, np.concatenate(vectors)


def source(texts, blocks=20):
    return ray.data.from_items(
        [{"id": i, "text": t} for i, t in enumerate(texts)], override_num_blocks=blocks
    )


def test_embed_dataset_two_actors(cluster, ckpt, texts, expect):
    ds = embed_dataset(source(texts), ckpt, concurrency=2, batch_size=250)
    ids, vectors = collect(ds, expect.shape[1])
    assert ids == list(range(N))  # every row once, in input order
    assert_same_vectors(vectors, expect)


class _DiesOnce(BertfastPredictor):
    """Exits its process (no exception, no cleanup) on its third batch, once per run
    (a marker file, created atomically, says it already happened)."""

    def __init__(self, *args, marker, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker = marker
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == 3:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return super().__call__(batch)


def test_actor_killed_mid_run_loses_nothing(cluster, ckpt, texts, expect, tmp_path):
    import ray.cloudpickle

    marker = tmp_path / "died"
    # The workers cannot import this test module: ship the class by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        ds = embed_dataset(
            source(texts),
            ckpt,
            concurrency=2,
            batch_size=250,
            predictor=_DiesOnce,
            marker=str(marker),
        )
        ids, vectors = collect(ds, expect.shape[1])
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert marker.exists(), "no actor died: the test did not test a retry"
    assert ids == list(range(N))  # nothing lost, nothing twice
    assert_same_vectors(vectors, expect)


def test_predictor_refuses_non_text(cluster, ckpt):
    ds = ray.data.from_items([{"text": "a cat"}, {"text": None}])
    with pytest.raises(Exception, match="holds a null value, not text"):
        embed_dataset(ds, ckpt).take_all()
    ds = ray.data.from_items([{"body": "a cat"}])
    with pytest.raises(Exception, match="no column 'text'"):
        embed_dataset(ds, ckpt).take_all()
    with pytest.raises(TypeError, match="unexpected arguments"):
        embed_dataset(ds, ckpt, bogus=1)


def test_encode_ray_cli(cluster, ckpt, texts, expect, tmp_path):
    # A real `bertfast encode --ray ADDRESS` process joining this test's cluster.
    source_file = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"doc": [f"doc-{i}" for i in range(N)], "text": texts}),
        source_file,
        row_group_size=700,
    )
    out = tmp_path / "out.parquet"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertfast",
            "encode",
            str(ckpt),
            "--input",
            str(source_file),
            "--output",
            str(out),
            "--keep",
            "doc",
            f"--ray={cluster}",
            "--actors",
            "2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"encoded {N} texts" in result.stdout
    table = pq.read_table(out)
    assert table.column_names == ["id", "doc", "embedding"]
    assert table.column("id").to_pylist() == list(range(N))
    assert table.column("doc").to_pylist() == [f"doc-{i}" for i in range(N)]
    vectors = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(N, -1)
    assert_same_vectors(vectors, expect)


def test_encode_ray_bad_rows(cluster, ckpt, tmp_path, capsys):
    source_file = tmp_path / "nulls.parquet"
    pq.write_table(
        pa.table({"text": ["a cat", None, "the dog", None]}), source_file, row_group_size=2
    )
    out = tmp_path / "out.parquet"
    args = [
        "encode",
        str(ckpt),
        "--input",
        str(source_file),
        "--output",
        str(out),
        "--ray",
        "--no-progress",
    ]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "row 2 (id 1) is null" in err and "--skip-bad" in err and "Traceback" not in err
    out_ok = tmp_path / "ok.parquet"
    assert cli.main(args[:5] + [str(out_ok)] + args[6:] + ["--skip-bad"]) == 0
    assert "skipped 2 bad rows" in capsys.readouterr().out
    assert pq.read_table(out_ok).column("id").to_pylist() == [0, 2]
    # An existing output folder is never overwritten; other formats are refused.
    assert cli.main(args[:5] + [str(out_ok)] + args[6:]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli.main(args[:5] + [str(tmp_path / "o.npy")] + args[6:]) == 2
    assert ".parquet folder" in capsys.readouterr().err
