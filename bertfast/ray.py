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
dynamic batching; ``bertfast serve`` runs it from the command line.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
class RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class EmbeddingService:
    """The Ray Serve deployment behind :func:`serve_app` (plain HTTP ingress).

    - ``POST /embed``: text-embeddings-inference: ``{"inputs": "text" | ["text", ...],
      "normalize": bool, "truncate": bool}`` -> ``[[float, ...], ...]``; errors as
      ``{"error": ..., "error_type": ...}``.
    - ``POST /v1/embeddings``: OpenAI: ``{"input": "text" | ["text", ...],
      "encoding_format": "float" | "base64", "model": ...}`` -> ``{"object": "list",
      "data": [{"object": "embedding", "index": i, "embedding": ...}], "model": ...,
      "usage": {...}}``; errors as ``{"error": {"message": ..., "type": ...}}``.
    - ``GET /health``, ``GET /info`` (model, dim, limits), ``GET /stats`` (batches
      run and their sizes).

    Texts from concurrent requests are batched (``@serve.batch``, at most
    ``max_batch_size`` texts per batch, waiting at most ``batch_wait_timeout_s`` for
    a batch to fill). A request holding more than ``max_batch_size`` texts, or a
    text longer than the model's limit (unless truncation is asked for), gets a 4xx.
    """

    def __init__(
        self,
        path=None,
        max_batch_size: int = 32,
        batch_wait_timeout_s: float = 0.005,
        auto_truncate: bool = False,
        model_name: str | None = None,
        embedder_kwargs: dict | None = None,
    ):
        from ray import serve
        from tokenizers import Tokenizer as RustTokenizer

        kwargs = dict(embedder_kwargs or {})
        self.encode_batch_size = int(kwargs.pop("encode_batch_size", 32))
        self.embedder = load_embedder(path, **kwargs)
        self.max_batch_size = int(max_batch_size)
        self.auto_truncate = bool(auto_truncate)
        self.model_name = model_name or (Path(path).name if path else "all-MiniLM-L6-v2")
        # A private copy of the tokenizer counts tokens (without truncation) while the
        # model's own tokenizer may be busy in the batch thread.
        from .tokenizer import Tokenizer

        backend = RustTokenizer.from_str(self.embedder.tokenizer.backend.to_str())
        backend.no_padding()
        self.counter = Tokenizer(backend, self.embedder.tokenizer.pad_token_id)
        self.limit = self.embedder.max_length
        self.lock = threading.Lock()
        self.batch_requests: collections.Counter = collections.Counter()
        self.batch_texts: collections.Counter = collections.Counter()
        self.embed_batched = serve.batch(
            max_batch_size=self.max_batch_size,
            batch_wait_timeout_s=batch_wait_timeout_s,
            batch_size_fn=lambda items: sum(len(item[0]) for item in items),
        )(self._run_batch)

    # ------------------------------------------------------------ batching
    async def _run_batch(self, items: list[tuple[list[str], bool, bool]]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._compute, items)

    def _compute(self, items):
        with self.lock:
            self.batch_requests[len(items)] += 1
            self.batch_texts[sum(len(texts) for texts, _, _ in items)] += 1
            # One model call per (normalize, truncate) combination in the batch.
            groups: dict[tuple[bool, bool], list[int]] = collections.defaultdict(list)
            for i, (_, normalize, truncate) in enumerate(items):
                groups[(normalize, truncate)].append(i)
            results: list[np.ndarray | None] = [None] * len(items)
            for (normalize, _), members in groups.items():
                texts = [t for i in members for t in items[i][0]]
                vectors = self.embedder.encode(
                    texts,
                    batch_size=self.encode_batch_size,
                    normalize=normalize,
                    show_progress=False,
                )
                at = 0
                for i in members:
                    n = len(items[i][0])
                    results[i] = vectors[at : at + n]
                    at += n
            return results

    # ------------------------------------------------------------ validation
    def _texts(self, value, name: str) -> list[str]:
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            raise RequestError(
                422, f"'{name}' must be a string or a list of strings, not {_json_kind(value)}"
            )
        if not value:
            raise RequestError(400, f"'{name}' is an empty list: send at least one text", "Empty")
        for i, text in enumerate(value):
            if not isinstance(text, str):
                raise RequestError(422, f"'{name}[{i}]' must be a string, not {_json_kind(text)}")
        if len(value) > self.max_batch_size:
            raise RequestError(
                413,
                f"'{name}' holds {len(value)} texts, more than the batch "
                f"limit of {self.max_batch_size}; split the request",
            )
        return value

    def _check_lengths(self, texts: list[str], name: str, truncate: bool) -> int:
        """Token count of the request; a text over the limit is an error unless truncated.

        A long text is only counted up to the limit + 1 (``Tokenizer.count``), so a
        megabyte text costs what a short one does; a text that cannot be tokenised (a
        lone surrogate) is a 422 that names it."""
        from .text import TextError

        try:
            counts = self.counter.count(texts, at_most=self.limit)
        except TextError as exc:
            raise RequestError(422, f"'{name}[{exc.index}]' {exc.reason}") from None
        if self.limit is not None:
            if truncate:
                counts = [min(c, self.limit) for c in counts]
            else:
                for i, count in enumerate(counts):
                    if count > self.limit:
                        # limit + 1 may stand for any larger count (counting stopped).
                        size = (
                            f"{count} tokens, more than the model's limit of {self.limit}"
                            if count > self.limit + 1
                            else f"more than {self.limit} tokens, the model's limit"
                        )
                        raise RequestError(
                            413,
                            f"'{name}[{i}]' has {size}; shorten it or ask for truncation",
                        )
        return sum(counts)

    @staticmethod
    async def _json(request) -> Any:
        body = await request.body()
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not JSON: {exc}", "Parse") from None

    # ------------------------------------------------------------ endpoints
    async def embed(self, request) -> Any:
        data = await self._json(request)
        if not isinstance(data, dict) or "inputs" not in data:
            raise RequestError(
                422, "expected a JSON object with 'inputs' (a string or a list of strings)"
            )
        texts = self._texts(data["inputs"], "inputs")
        normalize = data.get("normalize", True)
        truncate = data.get("truncate", self.auto_truncate)
        for key, value in (("normalize", normalize), ("truncate", truncate)):
            if not isinstance(value, bool):
                raise RequestError(422, f"'{key}' must be true or false, not {_json_kind(value)}")
        self._check_lengths(texts, "inputs", truncate)
        vectors = await self.embed_batched((texts, normalize, truncate))
        return np.asarray(vectors).tolist()

    async def openai(self, request) -> Any:
        data = await self._json(request)
        if not isinstance(data, dict) or "input" not in data:
            raise RequestError(
                400, "expected a JSON object with 'input' (a string or a list of strings)"
            )
        value = data["input"]
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, int) for v in value)
            or (isinstance(value, list) and value and isinstance(value[0], list))
        ):
            raise RequestError(400, "'input' as token ids is not supported: send text")
        texts = self._texts(value, "input")
        fmt = data.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise RequestError(400, f"'encoding_format' must be 'float' or 'base64', not {fmt!r}")
        dims = data.get("dimensions")
        if dims is not None and dims != self.embedder.dim:
            raise RequestError(
                400, f"'dimensions' must be {self.embedder.dim} (this model's size), not {dims!r}"
            )
        tokens = self._check_lengths(texts, "input", self.auto_truncate)
        vectors = np.asarray(
            await self.embed_batched((texts, True, self.auto_truncate)), dtype=np.float32
        )
        items = []
        for i, vector in enumerate(vectors):
            if fmt == "base64":
                encoded: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
            else:
                encoded = vector.tolist()
            items.append({"object": "embedding", "index": i, "embedding": encoded})
        return {
            "object": "list",
            "data": items,
            "model": data.get("model") or self.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def stats(self, request=None) -> dict[str, Any]:
        with self.lock:
            requests = dict(self.batch_requests)
            texts = dict(self.batch_texts)
        return {
            "batches": sum(requests.values()),
            "requests": sum(k * v for k, v in requests.items()),
            "texts": sum(k * v for k, v in texts.items()),
            "max_requests_per_batch": max(requests, default=0),
            "max_texts_per_batch": max(texts, default=0),
            "requests_per_batch": {str(k): v for k, v in sorted(requests.items())},
            "texts_per_batch": {str(k): v for k, v in sorted(texts.items())},
        }

    def info(self, request=None) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "dim": self.embedder.dim,
            "max_input_tokens": self.limit,
            "max_batch_size": self.max_batch_size,
            "normalize": self.embedder.normalize,
            "pooling": list(self.embedder.pooling),
            "auto_truncate": self.auto_truncate,
            "device": str(self.embedder.device),
        }

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        path = request.url.path.rstrip("/") or "/"
        routes = {
            "/embed": ("POST", self.embed),
            "/v1/embeddings": ("POST", self.openai),
            "/health": ("GET", None),
            "/info": ("GET", self.info),
            "/stats": ("GET", self.stats),
        }
        openai = path == "/v1/embeddings"
        try:
            if path not in routes:
                raise RequestError(
                    404, f"no endpoint {path}; POST /embed or /v1/embeddings", "NotFound"
                )
            method, handler = routes[path]
            if request.method != method:
                raise RequestError(
                    405, f"{path} takes {method}, not {request.method}", "MethodNotAllowed"
                )
            if handler is None:
                return JSONResponse({"status": "ok"})
            result = handler(request)
            if asyncio.iscoroutine(result):
                result = await result
            return JSONResponse(result)
        except RequestError as exc:
            status = exc.status
            if openai:  # the OpenAI API answers every invalid request with 400
                status = 400 if status in (413, 422) else status
                body = {
                    "error": {
                        "message": exc.message,
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                }
            else:
                body = {"error": exc.message, "error_type": exc.kind}
            return JSONResponse(body, status_code=status)


def _json_kind(value) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


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
    **embedder_kwargs,
):
    """A Ray Serve application embedding texts over HTTP (see :class:`EmbeddingService`):
    run it with ``serve.run(serve_app(...))`` or ``bertfast serve``.

    ``max_batch_size`` texts at most per model batch (and per request);
    ``batch_wait_timeout_s``: how long a batch waits to fill; ``num_replicas`` copies
    of the model, each with ``num_cpus`` / ``num_gpus``; ``auto_truncate``: truncate
    long texts instead of refusing them (a TEI request may still ask with
    ``"truncate": true``). ``embedder_kwargs``: ``device``, ``dtype``, ``backend``,
    ``max_length``, ``pooling``, ``normalize``, ``encode_batch_size``.
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
    )
