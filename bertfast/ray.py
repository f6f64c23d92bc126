"""bertfast on Ray: bulk embedding with Ray Data, online embedding with Ray Serve.

Install with ``pip install bertfast[ray]``.

Ray Data (one model per actor, one actor per GPU on a GPU cluster)::

    import ray
    from bertfast.ray import embed_dataset

    ds = ray.data.read_parquet("s3://bucket/corpus/")          # a "text" column
    ds = embed_dataset(ds, "/models/all-MiniLM-L6-v2", concurrency=8, num_gpus=1)
    ds.write_parquet("s3://bucket/vectors/")

``BertfastPredictor`` is the callable class behind it, for ``Dataset.map_batches``
directly. Ray Serve: ``serve.run(serve_app(path))`` answers ``POST /embed`` (the
text-embeddings-inference API) and ``POST /v1/embeddings`` (the OpenAI API), with
dynamic batching; ``bertfast serve --ray`` runs it from the command line. Its request
handling is the embedded server's (:mod:`bertfast.serving`); only the batching is Ray's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .serving import protocol
from .serving.protocol import ROUTES, Limits, RequestError

__all__ = [
    "BertfastPredictor",
    "embed_dataset",
    "serve_app",
    "EmbeddingService",
    "parquet_row_groups",
    "read_row_groups",
]

_DTYPES = ("float32", "float16", "bfloat16")


def _import_ray(what: str):
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"{what} needs Ray, which is not installed: run `pip install bertfast[ray]`"
        ) from None
    return ray


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES} or a torch.dtype, not {dtype!r}")
    return getattr(torch, dtype)


def load_embedder(
    path=None,
    *,
    device=None,
    dtype="float32",
    backend="auto",
    max_length=None,
    pooling=None,
    normalize=None,
    quantize=None,
):
    """An :class:`~bertfast.Embedder` set up as the Ray classes ask: ``device=None``
    takes the GPU Ray gave this process if any, else the CPU; ``pooling`` (a mode or
    a sequence of modes) and ``normalize`` override the checkpoint's."""
    import torch

    from .embedder import Embedder

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    embedder = Embedder.from_pretrained(
        path,
        device=device,
        dtype=_torch_dtype(dtype),
        backend=backend,
        max_length=max_length,
        quantize=quantize,
    )
    if pooling is not None or normalize is not None:
        modes = (pooling,) if isinstance(pooling, str) else pooling
        embedder = Embedder(
            embedder.model,
            embedder.tokenizer,
            pooling=embedder.pooling if modes is None else tuple(modes),
            normalize=embedder.normalize if normalize is None else normalize,
            max_length=embedder.max_length,
        )
    return embedder


# ---------------------------------------------------------------- Ray Data
class BertfastPredictor:
    """Callable class for :meth:`ray.data.Dataset.map_batches`: the model loads once
    per actor, each batch gets ``output_column`` (float32 ``[rows, dim]``, a tensor
    column) computed from the strings in ``column``.

    ``path`` (None: the default all-MiniLM-L6-v2 checkpoint), ``device`` (None: the
    actor's GPU if Ray gave it one, else CPU), ``dtype``, ``backend``,
    ``max_length``, ``pooling`` and ``normalize`` are as in
    :meth:`bertfast.Embedder.from_pretrained` / :meth:`~bertfast.Embedder.encode`;
    ``batch_size`` and ``max_tokens`` cut each Ray batch into model batches. The
    checkpoint folder must be readable where the actors run (a shared file system or
    the same path on every node).

    >>> ds.map_batches(BertfastPredictor, fn_constructor_kwargs={"path": ckpt},
    ...                batch_size=256, concurrency=2, num_gpus=1)   # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        column: str = "text",
        output_column: str = "embedding",
        device=None,
        dtype="float32",
        backend: str = "auto",
        max_length: int | None = None,
        pooling=None,
        normalize: bool | None = None,
        batch_size: int = 32,
        max_tokens: int | None = 16384,
    ):
        self.column = column
        self.output_column = output_column
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.embedder = load_embedder(
            path,
            device=device,
            dtype=dtype,
            backend=backend,
            max_length=max_length,
            pooling=pooling,
            normalize=normalize,
        )

    def texts(self, batch: dict[str, Any]) -> list[str]:
        """The batch's texts, checked: every row must be a string."""
        if self.column not in batch:
            raise ValueError(
                f"the dataset has no column {self.column!r} (its columns: "
                f"{', '.join(map(str, batch))}); pass column=..."
            )
        values = batch[self.column]
        texts = values.tolist() if isinstance(values, np.ndarray) else list(values)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                kind = "null" if text is None else type(text).__name__
                raise TypeError(
                    f"column {self.column!r} holds a {kind} value, not text "
                    f"(row {i} of this batch); drop or fix such rows first, "
                    "e.g. with Dataset.filter"
                )
        return texts

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        vectors = self.embedder.encode(
            self.texts(batch),
            batch_size=self.batch_size,
            max_tokens=self.max_tokens,
            show_progress=False,
        )
        out = dict(batch)
        out[self.output_column] = np.asarray(vectors, dtype=np.float32).reshape(
            len(vectors), self.embedder.dim
        )
        return out


_RAY_ARGS = ("batch_size", "concurrency", "num_cpus", "num_gpus", "memory")
# The embedder arguments embed_dataset accepts (serve_app: all but max_tokens).
_EMBEDDER_KWARGS = frozenset(
    {
        "device",
        "dtype",
        "backend",
        "max_length",
        "pooling",
        "normalize",
        "max_tokens",
        "encode_batch_size",
        "quantize",
    }
)


def embed_dataset(
    ds,
    path: str | Path | None = None,
    column: str = "text",
    output_column: str = "embedding",
    *,
    batch_size: int = 256,
    concurrency: int | tuple[int, int] | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: float | None = None,
    preserve_order: bool = True,
    predictor: type = BertfastPredictor,
    ray_remote_args: dict | None = None,
    **embedder_kwargs,
):
    """``ds`` with a float32 vector column ``output_column`` computed from the
    strings in ``column`` (lazy, like every Ray Data transform).

    ``batch_size`` rows go to one actor call; ``concurrency`` (actors, or a
    ``(min, max)`` range), ``num_cpus``, ``num_gpus`` and ``memory`` (per actor) go
    to :meth:`~ray.data.Dataset.map_batches`: on a GPU cluster, ``num_gpus=1`` and
    ``concurrency=<GPUs>`` give one actor per GPU. ``embedder_kwargs`` (``device``,
    ``dtype``, ``backend``, ``max_length``, ``pooling``, ``normalize``,
    ``max_tokens`` and the model batch size ``encode_batch_size``) go to
    :class:`BertfastPredictor` (or ``predictor``, a subclass of it, which may take
    more keyword arguments).

    Rows keep their input order (the dataset's ``preserve_order`` execution option
    is switched on; pass ``preserve_order=False`` when order does not matter). An
    actor that dies is restarted and its batch retried (Ray Data's defaults), so no
    row is lost or repeated.
    """
    _import_ray("embed_dataset")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    unknown = set(embedder_kwargs) - _EMBEDDER_KWARGS
    if unknown and predictor is BertfastPredictor:  # a subclass may take more
        raise TypeError(f"embed_dataset() got unexpected arguments {sorted(unknown)}")
    if "dtype" in embedder_kwargs:
        _torch_dtype(embedder_kwargs["dtype"])  # fail here, not in every actor
    kwargs = dict(embedder_kwargs)
    if "encode_batch_size" in kwargs:
        kwargs["batch_size"] = kwargs.pop("encode_batch_size")
    constructor = dict(
        path=None if path is None else str(path),
        column=column,
        output_column=output_column,
        **kwargs,
    )
    options: dict[str, Any] = dict(ray_remote_args or {})
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("memory", memory)):
        if value is not None:
            options[name] = value
    out = ds.map_batches(
        predictor,
        fn_constructor_kwargs=constructor,
        batch_size=batch_size,
        batch_format="numpy",
        compute=_actor_pool(concurrency),
        **options,
    )
    if preserve_order:
        out.context.execution_options.preserve_order = True
    return out


def _actor_pool(concurrency):
    """``concurrency`` (actors, ``(min, max)`` or ``(min, max, initial)``) as the
    ``compute`` strategy Ray Data asks for since 2.51."""
    from ray.data import ActorPoolStrategy

    if concurrency is None:
        return ActorPoolStrategy(min_size=1, max_size=None)
    if isinstance(concurrency, bool) or not isinstance(concurrency, (int, tuple)):
        raise TypeError(f"concurrency must be an int or a tuple of ints, not {concurrency!r}")
    if isinstance(concurrency, int):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        return ActorPoolStrategy(size=concurrency)
    if len(concurrency) == 2:
        return ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    if len(concurrency) == 3:
        return ActorPoolStrategy(
            min_size=concurrency[0], max_size=concurrency[1], initial_size=concurrency[2]
        )
    raise ValueError(
        f"concurrency must be n, (min, max) or (min, max, initial), not {concurrency!r}"
    )


# ---------------------------------------------------------------- Parquet with row ids
def _filesystem(path: str):
    import pyarrow.fs as pafs

    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), str(Path(path).expanduser().resolve())


def parquet_row_groups(
    path: str, column: str | None = "text", keep: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], int]:
    """The row groups of a Parquet file or folder (files in name order), each with
    the global row id of its first row: the work list of :func:`read_row_groups`.
    Reads only the footers; checks that ``column`` (unless None) holds strings and
    that the ``keep`` columns exist. Returns (row groups, total rows)."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = _filesystem(path)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"input {path!r} does not exist")
    if info.type == pafs.FileType.Directory:
        selector = pafs.FileSelector(root, recursive=True)
        files = sorted(
            i.path
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File
            and i.path.endswith(".parquet")
            and not Path(i.path).name.startswith(("_", "."))
        )
        if not files:
            raise ValueError(f"input folder {path!r} holds no .parquet files")
    else:
        files = [root]
    groups: list[dict[str, Any]] = []
    offset = 0
    for file in files:
        with fs.open_input_file(file) as f:
            meta = pq.ParquetFile(f)
            schema = meta.schema_arrow
            for name in ([column] if column is not None else []) + list(keep):
                if name not in schema.names:
                    raise ValueError(
                        f"{file} has no column {name!r} (its columns: {', '.join(schema.names)})"
                    )
            kind = schema.field(column).type if column is not None else pa.string()
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise ValueError(f"{file}: column {column!r} holds {kind}, not text")
            for g in range(meta.metadata.num_row_groups):
                rows = meta.metadata.row_group(g).num_rows
                if rows:
                    groups.append({"file": file, "row_group": g, "first_id": offset, "rows": rows})
                offset += rows
    uri = path if "://" in path else ""
    for g in groups:
        g["uri"] = uri  # "" for local files (a None would become NaN in a numpy batch)
    return groups, offset


def read_row_groups(
    batch: dict[str, Any], column: str = "text", keep: Sequence[str] = (), skip_bad: bool = False
):
    """Ray Data task: the rows of the listed row groups as a pyarrow table ``id``,
    ``column``, ``keep``... (ids are global row numbers); a bad row (a null text, a text
    or kept value that is not UTF-8: ``stream.parquet_row_problems``) raises (or is
    dropped with ``skip_bad``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .stream import parquet_row_problems

    tables = []
    for file, group, first, uri in zip(
        batch["file"], batch["row_group"], batch["first_id"], batch["uri"]
    ):
        fs, _ = _filesystem(str(uri)) if uri else _filesystem(str(file))
        with fs.open_input_file(str(file)) as f:
            table = pq.ParquetFile(f).read_row_group(
                int(group), columns=list(dict.fromkeys([column, *keep]))
            )
        ids = pa.array(np.arange(int(first), int(first) + table.num_rows, dtype=np.int64))
        bad = parquet_row_problems(table, column, keep)
        if bad:
            if not skip_bad:
                i = min(bad)
                row = int(first) + i
                raise ValueError(
                    f"{file}: row {row + 1} (id {row}) {bad[i]}; fix it or pass --skip-bad"
                )
            mask = pa.array([i not in bad for i in range(table.num_rows)], type=pa.bool_())
            table, ids = table.filter(mask), ids.filter(mask)
        columns = [ids, table.column(column)] + [table.column(k) for k in keep if k != column]
        names = ["id", column] + [k for k in keep if k != column]
        tables.append(pa.Table.from_arrays(columns, names=names))
    return pa.concat_tables(tables)


def to_fixed_size_list(batch, column: str = "embedding", drop: Sequence[str] = ()):
    """pyarrow batch: ``column`` (a Ray tensor column) as a plain
    ``fixed_size_list<float32>[dim]`` column, which every Parquet reader reads."""
    import pyarrow as pa

    vectors = batch.column(column)
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    if isinstance(vectors.type, pa.ExtensionType):
        vectors = vectors.storage
    values = (
        np.asarray(vectors.to_numpy(zero_copy_only=False).tolist(), dtype=np.float32)
        if not pa.types.is_fixed_size_list(vectors.type)
        else None
    )
    if values is None:
        return batch.drop_columns(list(drop))
    dim = values.shape[1] if values.ndim == 2 else 0
    flat = pa.array(values.reshape(-1), type=pa.float32())
    fixed = pa.FixedSizeListArray.from_arrays(flat, dim)
    index = batch.schema.get_field_index(column)
    return batch.set_column(index, column, fixed).drop_columns(list(drop))


# ---------------------------------------------------------------- Ray Serve
#: The routes of the Ray Serve app: the embedded server's, less /metrics (Ray Serve
#: exports its own metrics).
_SERVE_ROUTES = {path: spec for path, spec in ROUTES.items() if path != "/metrics"}


class EmbeddingService:
    """The Ray Serve deployment behind :func:`serve_app` (plain HTTP ingress).

    It answers the routes of the embedded server (``POST /embed``, ``POST
    /v1/embeddings``, ``GET /health``, ``/info``, ``/stats``; not ``/metrics``) through
    the same code: :mod:`bertfast.serving.protocol` decides what a request means, what
    is refused and what an answer looks like, :class:`~bertfast.serving.prepare.Preparer`
    parses and tokenises it (in a worker thread, off the replica's event loop), and
    :func:`~bertfast.serving.batcher.embed_items` runs the model. Only the batching is
    Ray's: ``@serve.batch`` groups requests, at most ``max_batch_size`` texts per batch,
    waiting at most ``batch_wait_timeout_s`` for a batch to fill; a request may hold at
    most ``limits.max_client_batch_size`` texts (at most ``max_batch_size``).
    """

    def __init__(
        self,
        path=None,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.005,
        auto_truncate: bool = False,
        model_name: str | None = None,
        embedder_kwargs: dict | None = None,
        api_key: str | None = None,
        limits: dict | None = None,
    ):
        from ray import serve

        from .serving.batcher import BatchStats
        from .serving.prepare import Preparer

        kwargs = dict(embedder_kwargs or {})
        self.encode_batch_size = int(kwargs.pop("encode_batch_size", 32))
        self.embedder = load_embedder(path, **kwargs)
        self.max_batch_size = int(max_batch_size)
        self.auto_truncate = bool(auto_truncate)
        self.api_key = api_key
        self.limits = Limits(**(limits or {"max_client_batch_size": self.max_batch_size}))
        if path is None:
            from .embedder import default_checkpoint

            path = default_checkpoint()
        self.model_name = model_name or protocol.model_name(path)
        self.preparer = Preparer(self.embedder, self.limits, auto_truncate=self.auto_truncate)
        self.batch_stats = BatchStats()
        self.embed_batched = serve.batch(
            max_batch_size=self.max_batch_size,
            batch_wait_timeout_s=batch_wait_timeout_s,
            batch_size_fn=lambda items: sum(len(item) for item in items),
        )(self._run_batch)

    # ------------------------------------------------------------ batching
    async def _run_batch(self, items: list) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._compute, items)

    def _compute(self, prepared: list) -> list[np.ndarray]:
        """One Ray batch: every request's texts in one :func:`embed_items` call."""
        from .serving.batcher import embed_items

        items = [item for p in prepared for item in p.items]
        flags = [p.request.normalize for p in prepared for _ in p.items]
        vectors = embed_items(
            self.embedder, items, flags, batch_size=self.encode_batch_size, max_tokens=16384
        )
        self.batch_stats.record(len(prepared), len(items), sum(p.tokens for p in prepared))
        out, at = [], 0
        for p in prepared:
            out.append(vectors[at : at + len(p)])
            at += len(p)
        return out

    # ------------------------------------------------------------ endpoints
    async def embed(self, request, path: str) -> bytes:
        body = await request.body()
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(None, self.preparer.prepare, path, body)
        vectors = await self.embed_batched(prepared)
        return protocol.embed_response(prepared.request, vectors, prepared.tokens, self.model_name)

    def stats(self) -> dict[str, Any]:
        return self.batch_stats.as_dict()

    def info(self) -> dict[str, Any]:
        info = protocol.describe_model(self.embedder, self.model_name)
        info.update(
            server="ray",
            auto_truncate=self.auto_truncate,
            max_batch_size=self.max_batch_size,
            api_key=self.api_key is not None,
            **dataclasses.asdict(self.limits),
        )
        return info

    async def __call__(self, request):
        from starlette.responses import Response

        path = request.url.path.rstrip("/") or "/"
        try:
            if path not in _SERVE_ROUTES or request.method != _SERVE_ROUTES[path][0]:
                raise protocol.route_error(path, request.method, _SERVE_ROUTES)
            if _SERVE_ROUTES[path][1]:
                protocol.check_api_key(request.headers.get("authorization"), self.api_key)
            if path in (protocol.TEI, protocol.OPENAI):
                body = await self.embed(request, path)
            else:
                result = {
                    "/health": lambda: {"status": "ok"},
                    "/info": self.info,
                    "/stats": self.stats,
                }[path]()
                body = protocol.json_bytes(result)
            return Response(body, media_type="application/json")
        except Exception as exc:
            if not isinstance(exc, RequestError):
                exc = protocol.model_failed(exc)
            status, body, headers = protocol.error_response(path, exc)
            return Response(body, status, headers, media_type="application/json")


def serve_app(
    path: str | Path | None = None,
    *,
    max_batch_size: int = 32,
    batch_wait_timeout_s: float = 0.005,
    num_replicas: int = 1,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    auto_truncate: bool = False,
    model_name: str | None = None,
    max_ongoing_requests: int | None = None,
    api_key: str | None = None,
    limits: Limits | None = None,
    **embedder_kwargs,
):
    """A Ray Serve application embedding texts over HTTP (see :class:`EmbeddingService`):
    run it with ``serve.run(serve_app(...))`` or ``bertfast serve --ray``.

    ``max_batch_size`` texts at most per model batch; ``batch_wait_timeout_s``: how long
    a batch waits to fill; ``num_replicas`` copies of the model, each with ``num_cpus`` /
    ``num_gpus``; ``auto_truncate``: truncate long texts instead of refusing them (a TEI
    request may still ask with ``"truncate": true``); ``model_name``: the name answered
    (default: the checkpoint folder's); ``api_key``: required as ``Authorization: Bearer
    <key>`` on every route but ``/health``; ``limits``: per request
    (:class:`bertfast.serving.protocol.Limits`; default: ``max_batch_size`` texts, whose
    maximum it also is). ``embedder_kwargs``: ``device``, ``dtype``, ``backend``,
    ``max_length``, ``pooling``, ``normalize``, ``encode_batch_size``.

    The HTTP host (``serve.start(http_options=...)``) binds Ray Serve's proxy only; the
    cluster's own processes (GCS server, raylet, workers) listen on all interfaces, and
    ``ray start --node-ip-address`` only sets the address a node advertises: keep the
    cluster on a private network or behind a firewall.
    """
    _import_ray("serve_app")
    from ray import serve

    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size must be a positive integer, not {max_batch_size!r}")
    if not isinstance(batch_wait_timeout_s, (int, float)) or batch_wait_timeout_s < 0:
        raise ValueError(f"batch_wait_timeout_s must be >= 0, not {batch_wait_timeout_s!r}")
    unknown = set(embedder_kwargs) - (_EMBEDDER_KWARGS - {"max_tokens"})
    if unknown:
        raise TypeError(f"serve_app() got unexpected arguments {sorted(unknown)}")
    if "dtype" in embedder_kwargs:
        _torch_dtype(embedder_kwargs["dtype"])
    if limits is None:
        limits = Limits(max_client_batch_size=max_batch_size)
    if limits.max_client_batch_size > max_batch_size:
        raise ValueError(
            f"limits.max_client_batch_size ({limits.max_client_batch_size}) must not exceed "
            f"max_batch_size ({max_batch_size}): a request is one item of a Ray Serve batch"
        )
    if api_key == "":
        raise ValueError("api_key must not be empty (None: no key)")
    actor_options: dict[str, Any] = {}
    if num_cpus is not None:
        actor_options["num_cpus"] = num_cpus
    if num_gpus is not None:
        actor_options["num_gpus"] = num_gpus
    deployment = serve.deployment(EmbeddingService).options(
        name="bertfast",
        num_replicas=num_replicas,
        ray_actor_options=actor_options,
        # room for one batch being computed and the next one filling
        max_ongoing_requests=max_ongoing_requests or max(2 * max_batch_size, 16),
    )
    return deployment.bind(
        None if path is None else str(path),
        max_batch_size,
        float(batch_wait_timeout_s),
        auto_truncate,
        model_name,
        dict(embedder_kwargs),
        api_key,
        dataclasses.asdict(limits),
    )
