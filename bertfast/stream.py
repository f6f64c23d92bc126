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
model and the settings are the ones it started with: the input's path, size and
modification time, the content (size and SHA-256) of every checkpoint file the model
was read from (``bertfast.fingerprint``), and every setting that changes a vector.

One writer per output: a run holds an exclusive OS lock (``flock``) on
``<output>.partial/lock`` from before it touches anything in that folder until it
has moved the finished output into place. A second run on the same output stops with
one line naming the process that holds it; the kernel drops the lock when its holder
dies, so ``--resume`` after a crash or ``kill -9`` takes it over. Before the finished
file is moved into place the run checks that the partial folder and its lock file are
still the ones it opened.
"""

from __future__ import annotations

import codecs
import csv
import errno
import fcntl
import io
import json
import os
import re
import shutil
import socket
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
    "parquet_row_problems",
    "OutputLock",
    "lock_output",
]

INPUT_FORMATS = ("txt", "jsonl", "csv", "parquet")
OUTPUT_FORMATS = ("npy", "parquet", "jsonl")
DEFAULT_CHUNK_SIZE = 4096
#: Bad rows listed by name in the summary (all are counted).
LISTED_BAD_ROWS = 5
_PROGRESS_VERSION = 1
_READ_BLOCK = 1 << 20
#: How much of a ``.txt`` line is ever held: its first characters, enough for the
#: tokenizer to find its first tokens (``tokenizer.CUT_MAX_CHARS``, with room for
#: over-long words); a longer line's row is encoded from them when they provably
#: hold its first ``max_length`` tokens, else it is a bad row.
LINE_HEAD_CHARS = 1 << 22

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
    #: rows whose text is only the first ``LINE_HEAD_CHARS + 1`` characters of a
    #: longer line (``.txt``: the rest was never held in memory)
    heads: list[int] = field(default_factory=list)


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


class _LongLine:
    """Checks one line longer than a read block as UTF-8 piece by piece (an
    incremental decoder), so that its memory is one block, whatever its length."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.offset = 0
        self.reason: str | None = None

    def feed(self, data: bytes, final: bool = False) -> None:
        if self.reason is None:
            try:
                self.decoder.decode(data, final)
            except UnicodeDecodeError as exc:
                at = self.offset + exc.start
                self.reason = f"is not valid UTF-8 text ({exc.reason} at byte {at})"
        self.offset += len(data)


def _bounded_lines(
    path: Path, max_chars: int
) -> Iterator[tuple[int, str | None, str | None, bool]]:
    """``(0-based line index, text, why it is not UTF-8, whether text is the whole
    line)`` for every line; ``text`` is None for a bad line, else the line, or its
    first ``max_chars + 1`` characters when it is longer: at most that much of a line
    (and one read block) is ever held in memory, however long the line, and the whole
    line is still checked as UTF-8.
    Line ends, a trailing ``\\r`` and a leading BOM are dropped, as in :func:`_lines`."""
    head = 4 * (max_chars + 2)  # bytes that hold more than max_chars + 1 characters
    with open(path, "rb") as f:
        index = 0
        while True:
            raw = f.readline(_READ_BLOCK)
            if not raw:
                return
            if index == 0 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if raw.endswith(b"\n") or len(raw) < _READ_BLOCK:  # the whole line
                raw = raw[:-1] if raw.endswith(b"\n") else raw
                raw = raw[:-1] if raw.endswith(b"\r") else raw
                text, reason = _decode(raw)
                if text is not None and len(text) > max_chars:
                    yield index, text[: max_chars + 1], None, False
                else:
                    yield index, text, reason, True
                index += 1
                continue
            check, kept = _LongLine(), bytearray(raw[:head])
            check.feed(raw)
            while True:  # the rest of a long line, a block at a time
                piece = f.readline(_READ_BLOCK)
                end = not piece or piece.endswith(b"\n")
                piece = piece[:-1] if piece.endswith(b"\n") else piece
                if len(kept) < head:
                    kept += piece[: head - len(kept)]
                check.feed(piece, final=end)
                if end:
                    break
            if check.reason is not None:
                yield index, None, check.reason, True
            else:
                whole = check.offset <= head
                if whole and kept.endswith(b"\r"):
                    kept = kept[:-1]
                text = codecs.getincrementaldecoder("utf-8")().decode(bytes(kept), whole)
                whole = whole and len(text) <= max_chars
                yield index, text if whole else text[: max_chars + 1], None, whole
            index += 1


class TextSource(Source):
    fmt = "txt"

    def _check_all(self, progress):
        # Fast path: whole line-aligned blocks that decode as UTF-8 hold only good rows.
        index = 0
        with open(self.path, "rb") as f, _bytes_bar(self.path, progress, "checking") as bar:
            carry = b""
            first = True
            long_line: _LongLine | None = None  # a line longer than a block, being read
            while True:
                block = f.read(_READ_BLOCK)
                bar.update(len(block))
                if not block:
                    break
                if long_line is not None:
                    cut = block.find(b"\n")
                    long_line.feed(block if cut < 0 else block[:cut], final=cut >= 0)
                    if cut < 0:
                        continue
                    yield index, index + 1, long_line.reason
                    index += 1
                    long_line, block = None, block[cut + 1 :]
                block = carry + block
                cut = block.rfind(b"\n")
                if cut < 0:
                    if len(block) > _READ_BLOCK:  # no line end in sight: check piecewise
                        if first and block.startswith(codecs.BOM_UTF8):
                            block = block[len(codecs.BOM_UTF8) :]
                        first = False
                        long_line, carry = _LongLine(), b""
                        long_line.feed(block)
                    else:
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
            if long_line is not None:
                long_line.feed(b"", final=True)
                yield index, index + 1, long_line.reason
            elif carry:
                if first and carry.startswith(codecs.BOM_UTF8):
                    carry = carry[len(codecs.BOM_UTF8) :]
                _, reason = _decode(carry)
                yield index, index + 1, reason

    def _rows(self) -> Iterator[tuple[int, str | None, dict, bool]]:
        # A line longer than the tokenizer can look at is read only that far (the
        # rest is checked as UTF-8, never held): see bertfast.tokenizer's cut.
        for index, text, _, whole in _bounded_lines(self.path, LINE_HEAD_CHARS):
            yield index, text, {}, not whole

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
        if b"\\u" in raw:  # only an escape can make a string that is not text
            for name in (self.field, *self.keep):
                reason = _value_problem(obj.get(name))
                if reason:
                    return None, f"field {name!r} {reason}"
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
                yield index, None, {}, False
            else:
                yield index, obj[self.field], {k: obj.get(k) for k in self.keep}, False

    def chunks(self, size, start=0):
        return _chunked(self._rows(), size, start, self.keep)


def _value_problem(value) -> str | None:
    """Why a decoded JSON value holds something that is not text (a lone surrogate
    from a ``\\ud800`` escape, in a string at any depth), or None."""
    from .text import text_problem

    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        reason = _value_problem(item)
        if reason:
            return reason
    return None


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
                yield index, None, {}, False
            else:
                yield (
                    index,
                    row[self.position],
                    {name: row[pos] for name, pos in zip(self.keep, self.keep_positions)},
                    False,
                )

    def chunks(self, size, start=0):
        return _chunked(self._rows(), size, start, self.keep)


def _chunked(rows, size: int, start: int, keep: Sequence[str]) -> Iterator[Chunk]:
    """Chunks from ``(index, text or None, kept values, whether text is only the
    line's head)`` rows."""
    texts: list[str | None] = []
    kept: dict[str, list] = {k: [] for k in keep}
    heads: list[int] = []
    first = start
    for index, text, values, head in rows:
        if index < start:
            continue
        if head:
            heads.append(len(texts))
        texts.append(text)
        for k in keep:
            kept[k].append(values.get(k))
        if len(texts) == size:
            yield Chunk(first, texts, kept, heads)
            first += size
            texts, kept, heads = [], {k: [] for k in keep}, []
    if texts:
        yield Chunk(first, texts, kept, heads)


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

    @property
    def _columns(self) -> list[str]:
        return list(dict.fromkeys([self.field, *self.keep]))

    def _problems(self, table) -> dict[int, str]:
        return parquet_row_problems(table, self.field, self.keep)

    def _texts(self, table, bad: dict[int, str]) -> list[str | None]:
        column = table.column(self.field)
        if not bad:
            return column.to_pylist()
        raw = _combined(column)
        return [None if i in bad else raw[i].as_py() for i in range(len(raw))]

    def _check_all(self, progress):
        index = 0
        for batch in self._batches(self._columns):
            n = batch.num_rows
            bad = self._problems(batch)
            if bad:
                for i in range(n):
                    yield index + i, None, bad.get(i)
            else:
                yield index + n - 1, None, None
            index += n

    def chunks(self, size, start=0):
        import pyarrow as pa

        columns = self._columns
        pending: list = []
        held = 0
        first = start

        def emit(table):
            texts = self._texts(table, self._problems(table))
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


def parquet_row_problems(table, field: str, keep: Sequence[str] = ()) -> dict[int, str]:
    """Row of a pyarrow table or record batch -> why it is bad: a null ``field``, or a
    text or kept value that is not valid UTF-8 (Parquet writers do not check string
    columns, and Python cannot decode such a value). Fast when every row is good (one
    vectorised validation); the rows are found one by one only when it fails."""
    import pyarrow as pa

    bad: dict[int, str] = {}
    column = table.column(field)
    if column.null_count:
        for i, null in enumerate(column.is_null().to_pylist()):
            if null:
                bad[i] = "is null, not text"
    try:
        table.validate(full=True)
        return bad
    except pa.ArrowInvalid:
        pass
    for name in dict.fromkeys([field, *keep]):
        values = _combined(table.column(name))
        for i in range(len(values)):
            if i in bad:
                continue
            try:
                values.slice(i, 1).validate(full=True)
            except pa.ArrowInvalid:
                what = "text" if name == field else f"column {name!r}"
                bad[i] = f"{what} is not valid UTF-8"
    return bad


def _combined(column):
    """One pyarrow Array from a table's ChunkedArray or a record batch's Array."""
    return column.combine_chunks() if hasattr(column, "combine_chunks") else column


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


# ---------------------------------------------------------------- the output lock
class OutputLock:
    """The exclusive right to write ``<output>.partial/``: an OS lock (``flock``) on
    the file ``lock`` inside it, released by the kernel when the process ends however
    it ends. :func:`lock_output` takes it; :meth:`release` (or leaving a ``with``
    block) gives it back; :meth:`check` says whether the folder and the lock file are
    still the ones taken."""

    def __init__(self, output: Path, fd: int, folder_id: tuple[int, int]):
        self.output = output
        self.dir = partial_dir(output)
        self.path = self.dir / "lock"
        self._fd: int | None = fd
        self._folder_id = folder_id

    @property
    def held(self) -> bool:
        return self._fd is not None

    def check(self) -> None:
        """StreamError unless the partial folder and its lock file are still the ones
        this lock was taken on (someone removed or replaced them meanwhile)."""
        if self._fd is None:
            raise StreamError(f"internal error: the lock on {self.output} was released")
        try:
            folder = os.stat(self.dir)
            lock = os.stat(self.path)
        except OSError:
            folder = lock = None
        mine = os.fstat(self._fd)
        if (
            folder is None
            or (folder.st_dev, folder.st_ino) != self._folder_id
            or (lock.st_dev, lock.st_ino) != (mine.st_dev, mine.st_ino)
        ):
            raise StreamError(
                f"{self.dir} was removed or replaced while this run wrote into it (by "
                f"another program?); {self.output} was not written: run again"
            )

    def release(self) -> None:
        """Give the lock back. A partial folder that holds nothing but the lock (a run
        that stopped before writing) goes with it: there is nothing to resume."""
        if self._fd is None:
            return
        try:
            mine, now = os.fstat(self._fd), os.stat(self.path)
            same = (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)
            if same and [p.name for p in self.dir.iterdir()] == ["lock"]:
                self.path.unlink()
                self.dir.rmdir()
        except OSError:
            pass  # not ours to clean any more, or not empty: leave it
        os.close(self._fd)  # closing the last descriptor drops the flock
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        self.release()


def _holder(path: Path) -> str:
    """Who holds the lock, from what it wrote into the file (best effort)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        pid, host = int(info["pid"]), str(info["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
    here = socket.gethostname()
    return f"process {pid}" + ("" if host == here else f" on {host}")


def lock_output(output: Path) -> OutputLock:
    """Take the lock of ``output`` (creating ``<output>.partial/`` if needed), or raise
    StreamError naming the process that holds it. Nothing else in the folder is
    touched."""
    folder = partial_dir(output)
    for _ in range(100):  # a holder finishing removes the folder: try again
        try:
            folder.mkdir(exist_ok=True)
        except FileExistsError:
            raise StreamError(
                f"{folder} exists and is not a folder; remove it (bertfast keeps an "
                "unfinished run there)"
            ) from None
        except OSError as exc:  # a read-only folder, a full disk...
            raise StreamError(f"cannot create {folder}: {exc.strerror or exc}") from None
        try:
            fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            raise StreamError(
                f"{folder} exists and is not a folder; remove it (bertfast keeps an "
                "unfinished run there)"
            ) from None
        except OSError as exc:
            raise StreamError(f"cannot write in {folder}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StreamError(
                    f"cannot lock {folder / 'lock'} ({exc.strerror or exc}): this file "
                    "system does not take locks; write the output to a local disk"
                ) from None
            raise StreamError(
                f"{output} is being written by {_holder(folder / 'lock')} (its lock: "
                f"{folder / 'lock'}); wait for that run to end or stop it, then run "
                "again (with --resume to continue its work)"
            ) from None
        # Locked, but a holder that finished meanwhile may have unlinked this file:
        # the lock counts only while the name still leads to the locked file.
        mine = os.fstat(fd)
        try:
            now = os.stat(folder / "lock")
            folder_stat = os.stat(folder)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)
            continue
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        return OutputLock(output, fd, (folder_stat.st_dev, folder_stat.st_ino))
    raise StreamError(f"cannot lock {folder / 'lock'}: it keeps being replaced; run again")


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
        self.lock: OutputLock | None = None
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

    def open(self, resume: bool, lock: OutputLock | None = None) -> int:
        """Prepare the partial folder under ``lock`` (taken here when not given);
        returns the first row still to encode."""
        if lock is None:
            lock = lock_output(self.output)
        elif not lock.held or lock.output != self.output:
            raise StreamError(f"internal error: no lock held on {self.output}")
        self.lock = lock
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
        leftovers = [p for p in self.dir.iterdir() if p.name != "lock"]
        if leftovers and not resume:
            print(
                f"bertfast: discarding the unfinished run in {self.dir} "
                "(pass --resume to continue it instead)",
                file=sys.stderr,
            )
        for p in leftovers:  # the lock file stays: it is what this run holds
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
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
        self.lock.check()  # still our folder: nobody swapped it while we wrote
        os.replace(final, self.output)
        shutil.rmtree(self.dir)  # the lock file with it; released just after
        self.lock.release()

    def close(self) -> None:
        """Release what an unfinished run holds (file descriptors, the lock); the
        partial folder stays for --resume."""
        self._close()
        if self.lock is not None:
            self.lock.release()

    # format hooks
    def _create(self): ...
    def _reopen(self, done: int): ...
    def _write(self, chunk, good, vectors): ...
    def _finalize(self) -> Path: ...
    def _close(self): ...


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
        self._close()
        return self.data

    def _close(self):
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            os.close(fd)


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

    @property
    def schema_file(self) -> Path:
        return self.dir / "schema.arrow"

    def _save_schema(self) -> None:
        """The output's Arrow schema, as the first chunk fixed it, kept for a resumed
        run: read back from a Parquet part it would differ (a list's inner field is
        ``element`` there, ``item`` in memory), and so would the output's bytes."""
        data = self.schema.serialize().to_pybytes()
        tmp = self.schema_file.with_name(self.schema_file.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.schema_file)

    def _reopen(self, done):
        import pyarrow as pa

        if done:
            try:
                data = self.schema_file.read_bytes()
                self.schema = pa.ipc.read_schema(pa.py_buffer(data))
            except (OSError, pa.ArrowException) as exc:
                raise StreamError(
                    f"cannot resume: {self.schema_file} is missing or unreadable ({exc}); "
                    "run without --resume"
                ) from None

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
            self._save_schema()
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


#: 10**k, k = 0..22: each exact in float64 (5**22 < 2**53), so scaling by one and
#: dividing by one are each a single correctly rounded operation.
_POW10 = np.array([float(10**k) for k in range(23)])


def shortest_float32(values) -> np.ndarray:
    """float64 copies of float32 ``values`` whose ``repr`` (what :mod:`json` writes) is
    the shortest decimal that reads back as the same float32: ``json.loads`` then a
    cast to float32 gives the identical bits. A float32 converted as it is prints 17
    digits (its exact float64 value); this needs 9 at most, usually 7 to 9, and is the
    decimal numpy's shortest float32 repr (``np.format_float_scientific(x,
    unique=True)``) gives: the nearest of the shortest, a tie to the even last digit.

    Vectorised: for each value, a binary search over the decimal scale ``10**-k``
    (one to ten significant digits) for the smallest at which the multiple of
    ``10**-k`` just below or just above the value reads back as it; the float64 nearest
    that decimal is returned, and its ``repr`` is that decimal (at most 9 digits, so
    float64 holds it exactly as a shortest repr). Zeros (signed), NaN and infinities
    are returned as they are (``json`` writes ``NaN``, ``Infinity``, ``-Infinity``);
    values outside 1e-13 .. 1e22 in magnitude (where ``10**k`` would not be exact),
    subnormals included, take numpy's shortest float32 repr one at a time.
    """
    x = np.asarray(values, dtype=np.float32)
    out = np.empty(x.shape, np.float64)
    flat_in, flat_out = x.ravel(), out.reshape(-1)
    for start in range(0, x.size, _SHORTEST_BLOCK):  # temporaries that stay in cache
        block = slice(start, start + _SHORTEST_BLOCK)
        flat_out[block] = _shortest_float32(flat_in[block])
    return out


#: values per block of shortest_float32: its dozen temporaries stay in cache
_SHORTEST_BLOCK = 1 << 16


def _shortest_float32(x: np.ndarray) -> np.ndarray:
    """shortest_float32 of a 1-D float32 array."""
    out = x.astype(np.float64)
    a = np.abs(out)
    nonzero = np.isfinite(x) & (x != 0)
    e = np.floor(np.log10(a, where=nonzero, out=np.ones_like(a))).astype(np.int64)
    # k from one significant digit to ten (one more on each side than 1..9: log10's
    # floor may be one off next to a power of ten)
    lo, hi = -e - 1, 9 - e
    fast = nonzero & (lo >= -22) & (hi <= 22)
    idx = np.flatnonzero(fast)
    v, want, lo, hi = out[idx], x[idx], lo[idx], hi[idx]

    def at(k):
        """The decimals with last digit 10**-k just below and above v, as float64,
        whether each reads back as the float32 ``want``, and which one is nearer (a
        tie: the even last digit), as numpy's shortest repr picks."""
        up = k >= 0
        p = _POW10[np.abs(k)]
        y = np.where(up, v * p, v / p)  # exact where it is a tie (N + 0.5, N < 2**52)
        n = np.floor(y)
        frac = y - n
        above_is_nearer = (frac > 0.5) | ((frac == 0.5) & (n % 2 == 1))
        below = np.where(up, n / p, n * p)
        above = np.ceil(y)
        above = np.where(up, above / p, above * p)
        ok = (below.astype(np.float32) == want, above.astype(np.float32) == want)
        return below, above, *ok, above_is_nearer

    while np.any(lo < hi):
        mid = (lo + hi) // 2
        _, _, ok_below, ok_above, _ = at(mid)
        ok = ok_below | ok_above
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    below, above, ok_below, ok_above, above_is_nearer = at(lo)
    take_above = ok_above & (~ok_below | above_is_nearer)
    out[idx] = np.where(take_above, above, np.where(ok_below, below, v))
    # the rest: numpy's Dragon4, one value at a time (rare in embeddings)
    slow = np.concatenate([np.flatnonzero(nonzero & ~fast), idx[~(ok_below | ok_above)]])
    for i in slow:
        d = float(np.format_float_scientific(x[i], unique=True))
        if np.float32(d) == x[i]:
            out[i] = d  # else keep the exact value: 17 digits, but it reads back
    return out


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
        vectors = shortest_float32(vectors)  # shortest digits that read back bit for bit
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
        self._close()
        return self.data

    def _close(self):
        f = getattr(self, "file", None)
        if f is not None:
            f.close()


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
    lock: OutputLock | None = None,
) -> EncodeSummary:
    """Encode every row of ``source`` into ``output`` chunk by chunk (see the module doc).

    ``settings``: what a resumed run must share with the one it continues (model
    settings, the checkpoint's content fingerprint...); ``scanned``: the result of
    ``source.scan`` when already done; ``lock``: the output's lock when the caller
    took it already (:func:`lock_output`; else it is taken here). Whatever happens,
    the lock is released on return."""
    try:
        return _encode_stream(
            embedder,
            source,
            output,
            lock,
            chunk_size=chunk_size,
            batch_size=batch_size,
            normalize=normalize,
            skip_bad=skip_bad,
            resume=resume,
            show_progress=show_progress,
            settings=settings,
            scanned=scanned,
        )
    finally:
        if lock is not None:
            lock.release()


def _encode_stream(
    embedder,
    source,
    output,
    lock,
    *,
    chunk_size,
    batch_size,
    normalize,
    skip_bad,
    resume,
    show_progress,
    settings,
    scanned,
) -> EncodeSummary:
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
    try:
        start_row = sink.open(resume, lock)
        start = time.perf_counter()
        encoded, late = _encode_chunks(
            embedder,
            source,
            sink,
            rows,
            start_row,
            chunk_size=chunk_size,
            batch_size=batch_size,
            normalize=normalize,
            skip_bad=skip_bad,
            show_progress=show_progress,
        )
        done = sink.state["done"]
        if done != rows:
            raise StreamError(
                f"{source.name} changed while it was read ({done} rows now, "
                f"{rows} when checked); run again"
            )
        sink.finish()
    finally:
        sink.close()
    return EncodeSummary(
        rows=rows,
        encoded=encoded,
        skipped=bad_count + len(late),
        bad=(listed + late)[:LISTED_BAD_ROWS],
        resumed_from=start_row,
        seconds=time.perf_counter() - start,
    )


def _encode_chunks(
    embedder,
    source,
    sink,
    rows,
    start_row,
    *,
    chunk_size,
    batch_size,
    normalize,
    skip_bad,
    show_progress,
) -> tuple[int, list[BadRow]]:
    """The chunk loop of :func:`encode_stream`; returns the number of texts encoded
    and the rows found bad only while
    encoding (a text the tokenizer refuses, a line too long to read whole whose first
    tokens are not in its head), which ``skip_bad`` skips like the others."""
    from tqdm.auto import tqdm

    late: list[BadRow] = []
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
            texts = {i: chunk.texts[i] for i in good}
            for i in chunk.heads:
                head = _line_head(embedder, texts[i])
                if head is None:
                    reason = (
                        f"is a line of more than {LINE_HEAD_CHARS:,} characters whose first "
                        "tokens are not within them (a word or a run of whitespace that long)"
                    )
                    late.append(_late_bad(source, chunk, i, reason, skip_bad))
                    del texts[i]
                else:
                    texts[i] = head
            vectors = _encode_rows(
                embedder, source, chunk, texts, late, skip_bad, batch_size, normalize
            )
            good = sorted(texts)
            sink.write(chunk, good, vectors)
            encoded += len(good)
            bar.update(len(chunk.texts))
    return encoded, late


def _late_bad(source, chunk: Chunk, i: int, reason: str, skip_bad: bool) -> BadRow:
    """A row of ``chunk`` found bad while encoding: StreamError unless ``skip_bad``."""
    index = chunk.start + i
    bad = BadRow(index, index + 1 if source.fmt in ("txt", "jsonl") else None, reason)
    if not skip_bad:
        raise StreamError(bad.describe(source.name) + "; fix the row or pass --skip-bad")
    return bad


def _line_head(embedder, text: str) -> str | None:
    """For a line of which only ``text`` (its first ``LINE_HEAD_CHARS + 1``
    characters) was read: a prefix of it whose first ``max_length`` tokens are the
    whole line's, or None when that cannot be shown from ``text``."""
    tokenizer = getattr(embedder, "tokenizer", None)
    head = getattr(tokenizer, "head", None)
    if head is None:
        return None
    try:
        return head(text)
    except ValueError:
        return None


def _encode_rows(embedder, source, chunk, texts, late, skip_bad, batch_size, normalize):
    """Vectors of ``texts`` ({row in chunk: text}, in row order); a text the tokenizer
    refuses is dropped from ``texts`` as a bad row (:func:`_late_bad`)."""
    from .text import TextError

    while texts:
        order = sorted(texts)
        try:
            return embedder.encode(
                [texts[i] for i in order],
                batch_size=batch_size,
                normalize=normalize,
                show_progress=False,
            )
        except TextError as exc:
            if exc.index is None or not 0 <= exc.index < len(order):
                raise
            i = order[exc.index]
            late.append(_late_bad(source, chunk, i, exc.reason, skip_bad))
            del texts[i]
    return np.zeros((0, embedder.dim), dtype=np.float32)
