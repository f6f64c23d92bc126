"""Streaming readers and writers for ``bertfast encode``: corpora larger than memory.

Inputs (format from the suffix, or ``input_format``):

- ``.txt`` (any other suffix too): one text per line, UTF-8; lines end at ``\\n``
  (a trailing ``\\r`` is dropped, a leading BOM too); an empty line is an empty text.
- ``.jsonl`` / ``.ndjson``: one JSON object per line, the text in ``field``.
- ``.csv``: a header row, the text in ``column``; blank lines are not rows.
- ``.parquet``: the text in the string ``column``.

Rows are numbered from 0 in input order (``id``). Every row is checked before any
vector is computed (the same pass counts the rows, which the ``.npy`` output needs);
a bad row (not UTF-8, not JSON, a missing field, not a string, null, a CSV row with
the wrong number of fields) stops the run with a message naming its row and line,
or, with ``skip_bad``, is skipped and counted, never shifting the rows after it.

Outputs:

- ``.npy``: float32 ``[rows, dim]``, row i = input row i (the file is preallocated
  and written in place, chunk by chunk; it opens with ``np.load(mmap_mode="r")``).
  A skipped bad row holds NaN.
- ``.parquet``: columns ``id`` (int64), the ``keep`` columns, ``embedding``
  (fixed-size list of float32); skipped rows are absent (their ids are missing).
- ``.jsonl``: one ``{"id": ..., <keep>..., "embedding": [...]}`` per line, same rule.

Texts are read ``chunk_size`` rows at a time, so memory holds one chunk, whatever
the input size. Work in progress lives in ``<output>.partial/`` (data plus a
``progress.json`` written atomically after each chunk); the output appears under
its own name only when complete. ``resume`` continues an interrupted ``.npy`` /
``.parquet`` run from its last finished chunk, after checking that the input, the
model and the settings are the ones it started with.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "StreamError",
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "DEFAULT_CHUNK_SIZE",
    "input_format",
    "output_format",
    "open_source",
    "open_sink",
    "encode_stream",
    "EncodeSummary",
    "partial_dir",
]

INPUT_FORMATS = ("txt", "jsonl", "csv", "parquet")
OUTPUT_FORMATS = ("npy", "parquet", "jsonl")
DEFAULT_CHUNK_SIZE = 4096
#: Bad rows listed by name in the summary (all are counted).
LISTED_BAD_ROWS = 5
_PROGRESS_VERSION = 1
_READ_BLOCK = 1 << 20

_SUFFIX_FORMATS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_SURROGATE = re.compile("[\ud800-\udfff]")


class StreamError(ValueError):
    """A user-side problem with the input, the output or the settings: one line."""


def input_format(path: str, override: str | None = None) -> str:
    if override is not None:
        if override not in INPUT_FORMATS:
            raise StreamError(f"unknown input format {override!r}; expected one of {INPUT_FORMATS}")
        return override
    return _SUFFIX_FORMATS.get(Path(path).suffix.lower(), "txt")


def output_format(path: str) -> str:
    suffix = Path(path).suffix.lower()
    fmt = {".npy": "npy", ".parquet": "parquet", ".jsonl": "jsonl"}.get(suffix)
    if fmt is None:
        raise StreamError(f"output {path!r} must end in .npy, .parquet or .jsonl")
    return fmt


def partial_dir(output: Path) -> Path:
    """Where an unfinished run keeps its data and ``progress.json``."""
    return output.with_name(output.name + ".partial")


def _require_pyarrow(what: str):
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise StreamError(
            f"{what} needs pyarrow, which is not installed: "
            "run `pip install pyarrow` (or `pip install bertfast[ray]`)"
        ) from None
    return pyarrow


# ---------------------------------------------------------------- rows
@dataclass
class Chunk:
    """Rows ``start .. start + len(texts) - 1``; ``texts[i] is None`` for a bad row."""

    start: int
    texts: list[str | None]
    #: kept columns: a list of Python values (text formats) or a pyarrow array (Parquet)
    keep: dict[str, object] = field(default_factory=dict)


@dataclass
class BadRow:
    index: int  # 0-based row id
    line: int | None  # 1-based line of the file, where the format has lines
    reason: str

    def describe(self, name: str) -> str:
        where = f"line {self.line}, " if self.line is not None else ""
        return f"{name}: row {self.index + 1} ({where}id {self.index}) {self.reason}"


class Source:
    """A readable input: ``scan`` checks and counts, ``chunks`` yields the rows."""

    name: str
    fmt: str

    def __init__(self, path: Path, display: str, field_name: str, keep: Sequence[str]):
        self.path = path
        self.name = display
        self.field = field_name
        self.keep = list(keep)

    def scan(self, skip_bad: bool, progress: bool = False) -> tuple[int, list[BadRow], int]:
        """Returns (rows, first bad rows, number of bad rows); raises at the first bad
        row unless ``skip_bad``."""
        rows, listed, count = 0, [], 0
        for index, line, reason in self._check_all(progress):
            if reason is None:
                rows = index + 1
                continue
            rows = index + 1
            bad = BadRow(index, line, reason)
            if not skip_bad:
                raise StreamError(bad.describe(self.name) + "; fix the row or pass --skip-bad")
            count += 1
            if len(listed) < LISTED_BAD_ROWS:
                listed.append(bad)
        return rows, listed, count

    def _check_all(self, progress: bool) -> Iterator[tuple[int, int | None, str | None]]:
        raise NotImplementedError

    def chunks(self, size: int, start: int = 0) -> Iterator[Chunk]:
        raise NotImplementedError

    def keep_types(self):
        """pyarrow types of the kept columns when known up front (Parquet), else None."""
        return None

    def close(self) -> None:
        pass


def _bytes_bar(path: Path, show: bool, desc: str):
    from tqdm.auto import tqdm

    try:
        total = path.stat().st_size
    except OSError:
        total = None
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc=desc,
        disable=not show,
        dynamic_ncols=True,
        leave=False,
    )


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(0-based line index, raw line without its ``\\n``/``\\r\\n``) for every line."""
    with open(path, "rb") as f:
        for index, raw in enumerate(f):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
            if index == 0 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            yield index, raw


def _decode(raw: bytes) -> tuple[str | None, str | None]:
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"is not valid UTF-8 text ({exc.reason} at byte {exc.start})"


class TextSource(Source):
    fmt = "txt"

    def _check_all(self, progress):
        # Fast path: whole line-aligned blocks that decode as UTF-8 hold only good rows.
        index = 0
        with open(self.path, "rb") as f, _bytes_bar(self.path, progress, "checking") as bar:
            carry = b""
            first = True
            while True:
                block = f.read(_READ_BLOCK)
                bar.update(len(block))
                if not block:
                    break
                block = carry + block
                cut = block.rfind(b"\n")
                if cut < 0:
                    carry = block
                    continue
                body, carry = block[: cut + 1], block[cut + 1 :]
                if first and body.startswith(codecs.BOM_UTF8):
                    body = body[len(codecs.BOM_UTF8) :]
                first = False
                try:
                    body.decode("utf-8")
                    n = body.count(b"\n")
                    index += n
                    yield index - 1, index, None
                    continue
                except UnicodeDecodeError:
                    pass
                for raw in body.split(b"\n")[:-1]:
                    _, reason = _decode(raw)
                    yield index, index + 1, reason
                    index += 1
            if carry:
                if first and carry.startswith(codecs.BOM_UTF8):
                    carry = carry[len(codecs.BOM_UTF8) :]
                _, reason = _decode(carry)
                yield index, index + 1, reason

    def _rows(self) -> Iterator[tuple[int, str | None, dict]]:
        for index, raw in _lines(self.path):
            text, _ = _decode(raw)
            yield index, text, {}

    def chunks(self, size, start=0):
        return _chunked(self._rows(), size, start, self.keep)


class JsonlSource(Source):
    fmt = "jsonl"

    def _parse(self, raw: bytes) -> tuple[dict | None, str | None]:
        text, reason = _decode(raw)
        if reason:
            return None, reason
        if not text.strip():
            return None, "is an empty line, not a JSON object"
        try:
            obj = json.loads(text)
        except ValueError as exc:
            return None, f"is not valid JSON ({exc})"
        if not isinstance(obj, dict):
            return None, f"is a JSON {_json_kind(obj)}, not an object"
        if self.field not in obj:
            return None, f"has no field {self.field!r}"
        value = obj[self.field]
        if not isinstance(value, str):
            return None, f"field {self.field!r} is {_json_kind(value, article=True)}, not text"
        return obj, None

    def _check_all(self, progress):
        with _bytes_bar(self.path, progress, "checking") as bar:
            for index, raw in _lines(self.path):
                bar.update(len(raw) + 1)
                _, reason = self._parse(raw)
                yield index, index + 1, reason

    def _rows(self):
        for index, raw in _lines(self.path):
            obj, _ = self._parse(raw)
            if obj is None:
                yield index, None, {}
            else:
                yield index, obj[self.field], {k: obj.get(k) for k in self.keep}

    def chunks(self, size, start=0):
        return _chunked(self._rows(), size, start, self.keep)


def _json_kind(value, article: bool = False) -> str:
    if value is None:
        return "null"
    kind = {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)
    if article:
        return ("an " if kind[0] in "aeiou" else "a ") + kind
    return kind


class CsvSource(Source):
    fmt = "csv"

    def __init__(self, *args):
        super().__init__(*args)
        limit = sys.maxsize
        while True:  # long texts are fine: lift the 128 KiB field limit
            try:
                csv.field_size_limit(limit)
                break
            except OverflowError:
                limit //= 2
        self.header = self._header()
        missing = [c for c in [self.field, *self.keep] if c not in self.header]
        if missing:
            raise StreamError(
                f"{self.name} has no column {missing[0]!r} "
                f"(its header: {', '.join(self.header) or 'empty'}); "
                "pick one with --column"
            )
        self.position = self.header.index(self.field)
        self.keep_positions = [self.header.index(c) for c in self.keep]

    def _open(self):
        raw = open(self.path, "rb")
        return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")

    def _header(self) -> list[str]:
        with self._open() as f:
            try:
                header = next(csv.reader(f), None)
            except csv.Error as exc:
                raise StreamError(f"{self.name}: cannot read the CSV header: {exc}") from None
        if not header:
            raise StreamError(
                f"{self.name} is empty: a CSV input needs a header row naming its columns"
            )
        if any(_SURROGATE.search(name) for name in header):
            raise StreamError(f"{self.name}: the CSV header is not valid UTF-8")
        return header

    def _records(self, bar=None) -> Iterator[tuple[int, int, list[str] | None, str | None]]:
        """(row index, line, fields or None, reason) per data row; blank lines skipped."""
        with self._open() as f:
            reader = csv.reader(f)
            try:
                next(reader)
            except StopIteration:  # pragma: no cover - checked in _header
                return
            index = 0
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    raise StreamError(
                        f"{self.name}: line {reader.line_num}: not valid CSV ({exc})"
                    ) from None
                if not row:
                    continue
                line = reader.line_num
                if bar is not None and index % 4096 == 0:
                    bar.update(f.buffer.tell() - bar.n)
                if len(row) != len(self.header):
                    yield (
                        index,
                        line,
                        None,
                        (f"has {len(row)} fields, the header has {len(self.header)}"),
                    )
                elif any(_SURROGATE.search(value) for value in row):
                    yield index, line, None, "is not valid UTF-8 text"
                else:
                    yield index, line, row, None
                index += 1

    def _check_all(self, progress):
        with _bytes_bar(self.path, progress, "checking") as bar:
            for index, line, _, reason in self._records(bar):
                yield index, line, reason

    def _rows(self):
        for index, _, row, _ in self._records():
            if row is None:
                yield index, None, {}
            else:
                yield (
                    index,
                    row[self.position],
                    {name: row[pos] for name, pos in zip(self.keep, self.keep_positions)},
                )

    def chunks(self, size, start=0):
        return _chunked(self._rows(), size, start, self.keep)


def _chunked(rows, size: int, start: int, keep: Sequence[str]) -> Iterator[Chunk]:
    texts: list[str | None] = []
    kept: dict[str, list] = {k: [] for k in keep}
    first = start
    for index, text, values in rows:
        if index < start:
            continue
        texts.append(text)
        for k in keep:
            kept[k].append(values.get(k))
        if len(texts) == size:
            yield Chunk(first, texts, kept)
            first += size
            texts, kept = [], {k: [] for k in keep}
    if texts:
        yield Chunk(first, texts, kept)


class ParquetSource(Source):
    fmt = "parquet"

    def __init__(self, *args):
        super().__init__(*args)
        pa = _require_pyarrow("Parquet input")
        import pyarrow.parquet as pq

        try:
            self.file = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as exc:
            raise StreamError(f"cannot read {self.name} as Parquet: {exc}") from None
        schema = self.file.schema_arrow
        for name in [self.field, *self.keep]:
            if name not in schema.names:
                raise StreamError(
                    f"{self.name} has no column {name!r} (its columns: "
                    f"{', '.join(schema.names)}); pick one with --column"
                )
        kind = schema.field(self.field).type
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda t: False)(kind)
        ):
            raise StreamError(
                f"{self.name}: column {self.field!r} holds {kind}, not text; "
                "pick the text column with --column"
            )
        self.rows = self.file.metadata.num_rows

    def keep_types(self):
        schema = self.file.schema_arrow
        return {name: schema.field(name).type for name in self.keep}

    def _batches(self, columns, start=0, batch_size=65536):
        """Record batches from row ``start`` on (whole row groups before it are skipped)."""
        meta = self.file.metadata
        offset, group = 0, 0
        while group < meta.num_row_groups and offset + meta.row_group(group).num_rows <= start:
            offset += meta.row_group(group).num_rows
            group += 1
        skip = start - offset
        groups = list(range(group, meta.num_row_groups))
        if not groups:
            return
        for batch in self.file.iter_batches(
            batch_size=batch_size, row_groups=groups, columns=columns
        ):
            if skip:
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                batch = batch.slice(skip)
                skip = 0
            yield batch

    def _check_all(self, progress):
        index = 0
        for batch in self._batches([self.field]):
            column = batch.column(0)
            n = batch.num_rows
            if column.null_count:
                for i, value in enumerate(column.is_null().to_pylist()):
                    yield index + i, None, "is null, not text" if value else None
            else:
                yield index + n - 1, None, None
            index += n

    def chunks(self, size, start=0):
        import pyarrow as pa

        columns = list(dict.fromkeys([self.field, *self.keep]))
        pending: list = []
        held = 0
        first = start

        def emit(table):
            texts = table.column(self.field).to_pylist()
            keep = {k: table.column(k).combine_chunks() for k in self.keep}
            return Chunk(first, texts, keep)

        for batch in self._batches(columns, start, batch_size=size):
            pending.append(batch)
            held += batch.num_rows
            while held >= size:
                table = pa.Table.from_batches(pending)
                yield emit(table.slice(0, size))
                first += size
                rest = table.slice(size)
                pending = rest.to_batches() if rest.num_rows else []
                held = rest.num_rows
        if held:
            yield emit(pa.Table.from_batches(pending))


def open_source(path: str, fmt: str, field_name: str = "text", keep: Sequence[str] = ()) -> Source:
    """An input file (``-``: stdin, spooled to a temporary file first)."""
    if path == "-":
        if fmt == "parquet":
            raise StreamError("Parquet input cannot come from stdin; pass a file")
        spool = tempfile.NamedTemporaryFile(prefix="bertfast-stdin-", delete=False)
        with spool:
            shutil.copyfileobj(sys.stdin.buffer, spool, _READ_BLOCK)
        source = _make_source(Path(spool.name), "<stdin>", fmt, field_name, keep)
        source.close = lambda: os.unlink(spool.name) if os.path.exists(spool.name) else None
        return source
    p = Path(path)
    if not p.exists():
        raise StreamError(f"input file {path!r} does not exist")
    if p.is_dir():
        raise StreamError(f"input {path!r} is a folder, not a file")
    try:
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise StreamError(f"cannot read input file {path!r}: {exc.strerror or exc}") from None
    return _make_source(p, path, fmt, field_name, keep)


def _make_source(path: Path, display: str, fmt: str, field_name: str, keep) -> Source:
    keep = list(dict.fromkeys(keep))
    if fmt == "txt":
        if keep:
            raise StreamError(
                "--keep needs named columns: a .txt input has none (use .jsonl, .csv or .parquet)"
            )
        return TextSource(path, display, field_name, keep)
    if "id" in keep or "embedding" in keep:
        raise StreamError(
            "--keep cannot name 'id' or 'embedding': the output has its own "
            "(id = the input row number, from 0); rename that input column"
        )
    cls = {"jsonl": JsonlSource, "csv": CsvSource, "parquet": ParquetSource}[fmt]
    return cls(path, display, field_name, keep)


# ---------------------------------------------------------------- outputs
def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Sink:
    """Writes chunks into ``<output>.partial/``; ``finish`` moves the result into place."""

    resumable = True

    def __init__(self, output: Path, rows: int, dim: int, chunk_size: int, fingerprint: dict):
        self.output = output
        self.rows = rows
        self.dim = dim
        self.chunk_size = chunk_size
        self.dir = partial_dir(output)
        self.progress_file = self.dir / "progress.json"
        self.state = {
            "version": _PROGRESS_VERSION,
            "format": self.fmt,
            "rows": rows,
            "dim": dim,
            "chunk_size": chunk_size,
            "run": fingerprint,
            "done": 0,
        }

    fmt = ""

    def open(self, resume: bool) -> int:
        """Prepare the partial folder; returns the first row still to encode."""
        if resume:
            if not self.resumable:
                raise StreamError(f"--resume works with .npy and .parquet outputs, not .{self.fmt}")
            if self.progress_file.is_file():
                return self._resume()
            print(
                f"bertfast: nothing to resume for {self.output} (no {self.progress_file}); "
                "starting from the first row",
                file=sys.stderr,
            )
        elif self.dir.exists():
            print(
                f"bertfast: discarding the unfinished run in {self.dir} "
                "(pass --resume to continue it instead)",
                file=sys.stderr,
            )
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir()
        self._create()
        _write_json_atomic(self.progress_file, self.state)
        return 0

    def _resume(self) -> int:
        try:
            with open(self.progress_file, encoding="utf-8") as f:
                saved = json.load(f)
        except (OSError, ValueError) as exc:
            raise StreamError(
                f"cannot resume: {self.progress_file} is unreadable ({exc}); "
                "run without --resume to start over"
            ) from None
        for key, what in (
            ("version", "progress format"),
            ("format", "output format"),
            ("rows", "input row count"),
            ("dim", "vector size"),
            ("chunk_size", "--chunk-size"),
        ):
            if saved.get(key) != self.state[key]:
                raise StreamError(
                    f"cannot resume {self.output}: the {what} differs from the "
                    f"interrupted run ({saved.get(key)!r} then, {self.state[key]!r} "
                    "now); run without --resume to start over"
                )
        before, now = saved.get("run", {}), self.state["run"]
        for key in sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                raise StreamError(
                    f"cannot resume {self.output}: {key} differs from the "
                    f"interrupted run ({before.get(key)!r} then, {now.get(key)!r} "
                    "now); run without --resume to start over"
                )
        done = int(saved.get("done", 0))
        if done % self.chunk_size and done != self.rows:
            raise StreamError(f"cannot resume: {self.progress_file} is inconsistent")
        self.state["done"] = done
        self._reopen(done)
        return done

    def write(self, chunk: Chunk, good: list[int], vectors: np.ndarray) -> None:
        self._write(chunk, good, vectors)
        self.state["done"] = chunk.start + len(chunk.texts)
        _write_json_atomic(self.progress_file, self.state)

    def finish(self) -> None:
        final = self._finalize()
        os.replace(final, self.output)
        shutil.rmtree(self.dir)

    # format hooks
    def _create(self): ...
    def _reopen(self, done: int): ...
    def _write(self, chunk, good, vectors): ...
    def _finalize(self) -> Path: ...


class NpySink(Sink):
    fmt = "npy"

    @property
    def data(self) -> Path:
        return self.dir / "data.npy"

    def _create(self):
        header = {
            "descr": np.lib.format.dtype_to_descr(np.dtype("<f4")),
            "fortran_order": False,
            "shape": (self.rows, self.dim),
        }
        with open(self.data, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, header
            ) if self.rows < 2**31 else np.lib.format.write_array_header_2_0(f, header)
            self.offset = f.tell()
            f.truncate(self.offset + self.rows * self.dim * 4)  # sparse until written
        self.fd = os.open(self.data, os.O_WRONLY)
        self.state["offset"] = self.offset

    def _reopen(self, done):
        if not self.data.is_file():
            raise StreamError(f"cannot resume: {self.data} is missing; run without --resume")
        self.offset = int(self.state.get("offset") or 0)
        with open(self.data, "rb") as f:
            version = np.lib.format.read_magic(f)
            reader = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = reader(f)
            self.offset = f.tell()
        if shape != (self.rows, self.dim) or dtype != np.dtype("<f4"):
            raise StreamError(
                f"cannot resume: {self.data} has shape {shape}, expected "
                f"{(self.rows, self.dim)}; run without --resume"
            )
        self.state["offset"] = self.offset
        self.fd = os.open(self.data, os.O_WRONLY)

    def _write(self, chunk, good, vectors):
        block = np.full((len(chunk.texts), self.dim), np.nan, dtype="<f4")
        if good:
            block[np.asarray(good)] = vectors
        data = block.tobytes()
        at = self.offset + chunk.start * self.dim * 4
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, at)
            view, at = view[written:], at + written
        os.fsync(self.fd)

    def _finalize(self):
        os.close(self.fd)
        return self.data


class ParquetSink(Sink):
    fmt = "parquet"

    def __init__(self, *args, keep: Sequence[str] = (), keep_types=None):
        super().__init__(*args)
        _require_pyarrow("Parquet output")
        self.keep = list(keep)
        self.keep_types = keep_types
        self.schema = None

    def _part(self, start: int) -> Path:
        return self.dir / f"part-{start // self.chunk_size:08d}.parquet"

    def _create(self):
        pass

    def _reopen(self, done):
        import pyarrow.parquet as pq

        if done:
            first = self._part(0)
            if not first.is_file():
                raise StreamError(f"cannot resume: {first} is missing; run without --resume")
            self.schema = pq.read_schema(first)

    def _table(self, chunk, good, vectors):
        import pyarrow as pa

        ids = pa.array(np.asarray(good, dtype=np.int64) + chunk.start, type=pa.int64())
        columns, names = [ids], ["id"]
        take = pa.array(good, type=pa.int64())
        for name in self.keep:
            values = chunk.keep[name]
            if isinstance(values, list):
                values = [values[i] for i in good]
                want = None if self.schema is None else self.schema.field(name).type
                try:
                    array = pa.array(values, type=want)
                    if want is None and pa.types.is_null(array.type):
                        array = array.cast(pa.string())  # all null so far: a text column
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    raise StreamError(
                        f"--keep {name}: the values from row {chunk.start + 1} on do not fit "
                        f"one column type ({want or 'mixed'}): {exc}"
                    ) from None
            else:
                array = values.take(take)
            columns.append(array)
            names.append(name)
        flat = pa.array(
            np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), type=pa.float32()
        )
        columns.append(pa.FixedSizeListArray.from_arrays(flat, self.dim))
        names.append("embedding")
        table = pa.Table.from_arrays(columns, names=names)
        if self.schema is None:
            self.schema = table.schema
        elif table.schema != self.schema:
            try:
                table = table.cast(self.schema)
            except (pa.ArrowException, ValueError) as exc:
                raise StreamError(
                    f"--keep: column types change at row {chunk.start + 1}: {exc}"
                ) from None
        return table

    def _write(self, chunk, good, vectors):
        import pyarrow.parquet as pq

        table = self._table(chunk, good, vectors)
        part = self._part(chunk.start)
        tmp = part.with_name(part.name + ".tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, part)

    def _empty_schema(self):
        import pyarrow as pa

        fields = [pa.field("id", pa.int64())]
        for name in self.keep:
            kind = (self.keep_types or {}).get(name, pa.string())
            fields.append(pa.field(name, kind))
        fields.append(pa.field("embedding", pa.list_(pa.float32(), self.dim)))
        return pa.schema(fields)

    def _finalize(self):
        import pyarrow.parquet as pq

        merged = self.dir / "merged.parquet"
        parts = sorted(self.dir.glob("part-*.parquet"))
        schema = self.schema or (pq.read_schema(parts[0]) if parts else self._empty_schema())
        with pq.ParquetWriter(merged, schema) as writer:
            if not parts:
                writer.write_table(schema.empty_table())
            for part in parts:  # one row group per chunk: memory holds one chunk
                writer.write_table(pq.read_table(part).cast(schema))
        return merged


class JsonlSink(Sink):
    fmt = "jsonl"
    resumable = False

    def __init__(self, *args, keep: Sequence[str] = ()):
        super().__init__(*args)
        self.keep = list(keep)

    @property
    def data(self) -> Path:
        return self.dir / "data.jsonl"

    def _create(self):
        self.file = open(self.data, "w", encoding="utf-8")

    def _write(self, chunk, good, vectors):
        lines = []
        for j, i in enumerate(good):
            record = {"id": chunk.start + i}
            for name in self.keep:
                value = chunk.keep[name]
                value = value[i] if isinstance(value, list) else value[i].as_py()
                record[name] = value
            record["embedding"] = vectors[j].tolist()
            lines.append(json.dumps(record, ensure_ascii=False, default=str))
        if lines:
            self.file.write("\n".join(lines) + "\n")
        self.file.flush()

    def _finalize(self):
        self.file.close()
        return self.data


def open_sink(
    output: Path,
    rows: int,
    dim: int,
    chunk_size: int,
    fingerprint: dict,
    keep: Sequence[str] = (),
    keep_types=None,
) -> Sink:
    fmt = output_format(str(output))
    if fmt == "npy":
        return NpySink(output, rows, dim, chunk_size, fingerprint)
    if fmt == "parquet":
        return ParquetSink(
            output, rows, dim, chunk_size, fingerprint, keep=keep, keep_types=keep_types
        )
    return JsonlSink(output, rows, dim, chunk_size, fingerprint, keep=keep)


# ---------------------------------------------------------------- the loop
@dataclass
class EncodeSummary:
    rows: int  # rows in the input
    encoded: int  # texts encoded by this run (a resumed run counts only its own)
    skipped: int  # bad rows skipped (whole input)
    bad: list[BadRow]  # the first few of them
    resumed_from: int  # first row this run encoded
    seconds: float  # encoding time of this run

    @property
    def rate(self) -> float:
        return self.encoded / max(self.seconds, 1e-9)


def input_fingerprint(path: Path) -> dict:
    st = path.stat()
    return {"input": str(path.resolve()), "input size": st.st_size, "input mtime": st.st_mtime_ns}


def encode_stream(
    embedder,
    source: Source,
    output: Path,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = 32,
    normalize: bool | None = None,
    skip_bad: bool = False,
    resume: bool = False,
    show_progress: bool | None = None,
    settings: dict | None = None,
    scanned: tuple[int, list[BadRow], int] | None = None,
) -> EncodeSummary:
    """Encode every row of ``source`` into ``output`` chunk by chunk (see the module doc).

    ``settings``: what a resumed run must share with the one it continues (model,
    pooling...); ``scanned``: the result of ``source.scan`` when already done."""
    from tqdm.auto import tqdm

    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise StreamError(f"--chunk-size must be a positive integer, not {chunk_size!r}")
    if resume and source.name == "<stdin>":
        raise StreamError("--resume needs an input file, not stdin")
    if scanned is None:
        scanned = source.scan(skip_bad, progress=bool(show_progress))
    rows, listed, bad_count = scanned
    if show_progress is None:
        from .embedder import PROGRESS_MIN_TEXTS

        show_progress = rows >= PROGRESS_MIN_TEXTS
    fingerprint = dict(settings or {})
    if source.name != "<stdin>":
        fingerprint.update(input_fingerprint(source.path))
    fingerprint["skip bad rows"] = bool(skip_bad)
    sink = open_sink(
        output,
        rows,
        embedder.dim,
        chunk_size,
        fingerprint,
        keep=source.keep,
        keep_types=source.keep_types(),
    )
    start_row = sink.open(resume)
    start = time.perf_counter()
    encoded = 0
    with tqdm(
        total=rows,
        initial=start_row,
        unit="text",
        desc="encoding",
        disable=not show_progress,
        dynamic_ncols=True,
        smoothing=0.1,
    ) as bar:
        for chunk in source.chunks(chunk_size, start_row):
            if chunk.start + len(chunk.texts) > rows:
                raise StreamError(
                    f"{source.name} changed while it was read (more than {rows} rows); run again"
                )
            good = [i for i, text in enumerate(chunk.texts) if text is not None]
            if len(good) != len(chunk.texts) and not skip_bad:
                first = next(i for i, t in enumerate(chunk.texts) if t is None)
                raise StreamError(
                    f"{source.name} changed while it was read (row "
                    f"{chunk.start + first + 1} is now bad); run again"
                )
            texts = [chunk.texts[i] for i in good]
            if texts:
                vectors = embedder.encode(
                    texts, batch_size=batch_size, normalize=normalize, show_progress=False
                )
            else:
                vectors = np.zeros((0, embedder.dim), dtype=np.float32)
            sink.write(chunk, good, vectors)
            encoded += len(good)
            bar.update(len(chunk.texts))
    done = sink.state["done"]
    if done != rows:
        raise StreamError(
            f"{source.name} changed while it was read ({done} rows now, "
            f"{rows} when checked); run again"
        )
    sink.finish()
    return EncodeSummary(
        rows=rows,
        encoded=encoded,
        skipped=bad_count,
        bad=listed,
        resumed_from=start_row,
        seconds=time.perf_counter() - start,
    )
