"""Per-GPU winners tables: which candidate (backend, variant, forced config) ran an op
fastest for a shape bucket on one GPU, as measured by ``bertfast tune`` or the GPU
check's sweeps. ``dispatch.select`` asks :func:`lookup` on CUDA for ``backend="auto"``
and takes the answer when that candidate can run the input; otherwise it walks the
preference order as before.

**Shape buckets** (:func:`bucket`, :func:`bucket_key`; shapes only, no device reads):

* ``attention`` / ``attention_varlen``: ``head_dim`` (qkv's last dim / 3 / num_heads),
  ``seq`` (next power of two >= the padded length, or ``max_seqlen`` for varlen; at
  least 64) and ``rows`` (the token rows: B*S padded, T varlen);
* ``linear`` / ``linear_gelu``: ``N``, ``K`` (the weight's shape) and ``rows`` (x's rows);
* ``add_layernorm`` / ``embed_layernorm`` / ``bias_gelu`` / ``bias_gelu_``: ``width``
  and ``rows``.

``rows`` is the next power of two of the row count, clamped to [128, 65536]. Other
ops (``pack_tokens``, ``unpack_tokens``) are not tuned: :func:`bucket` returns None.

**A table** is one JSON file per GPU (``bertfast/data/winners/README.md`` has the
format)::

    {"format": 1,
     "device": {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0",
                "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"},
     "made_by": "bertfast tune ...",
     "entries": [{"op": "attention_varlen", "dtype": "float16",
                  "bucket": "head_dim=64,seq=256,rows=8192", "backend": "cuda",
                  "variant": "flash", "config": {}, "median_ms": 0.051,
                  "runner_up": "triton", "speedup": 1.31}, ...]}

**Where tables come from**: ``BERTFAST_WINNERS=/path/table.json`` forces one file
(whatever GPU it was made on); otherwise every ``*.json`` in the user directory
(``$BERTFAST_WINNERS_DIR``, default ``~/.cache/bertfast/winners``) and in the shipped
``bertfast/data/winners`` is a candidate. They are read once, at the first lookup
(nothing is timed at load), and one is chosen per device index:

1. exact: same GPU name and capability, same torch and triton major.minor;
2. same GPU name and capability, other versions;
3. same capability;
4. the nearest capability (smallest |major.minor difference|, a lower one first).

At the same level a user table beats a shipped one (then more matching versions, then
the path, for a stable choice). A file that cannot be read or is not a valid table is
ignored with a one-line ``RuntimeWarning`` naming it and the problem (once per
process). Tables written by ``bertfast tune --dry-run`` (``device.dry_run``) are
used only when forced.

**Lookup** in the chosen table: the entry of the exact (op, dtype, bucket); else the
nearest bucket of the same op and dtype with the same head_dim (attention), N and K
(linear) or width: nearest ``seq``, then nearest ``rows``, in log2 steps. An entry
naming a backend, variant or forced config that does not exist here is skipped (the
next nearest is tried); none left: None. Results are memoised per device, by bucket
and by exact input shapes.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import warnings
from pathlib import Path

import torch

from . import dispatch

__all__ = [
    "TUNED_OPS",
    "FORMAT",
    "bucket",
    "bucket_key",
    "parse_bucket_key",
    "lookup",
    "table_summary",
    "table_from_rows",
    "write_table",
    "user_dir",
    "table_filename",
    "device_facts",
    "reset",
]

#: The table format this module reads and writes.
FORMAT = 1
DTYPE_NAMES = ("float32", "float16", "bfloat16")

ROWS_MIN = 128
ROWS_MAX = 65536
SEQ_MIN = 64

_ATTENTION = ("attention", "attention_varlen")
_LINEAR = ("linear", "linear_gelu")
_ROWWISE = ("add_layernorm", "embed_layernorm", "bias_gelu", "bias_gelu_")
#: The ops a winners table may hold.
TUNED_OPS = _ATTENTION + _LINEAR + _ROWWISE


def _pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _rows(n: int) -> int:
    return min(max(_pow2(n), ROWS_MIN), ROWS_MAX)


def _numel_rows(shape) -> int:
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    return rows


def bucket(op: str, args) -> dict | None:
    """The shape bucket of one call of ``op`` with ``args`` (the op's positional
    arguments, as dispatch sees them), or None for an op that is not tuned."""
    if op == "attention":
        qkv, num_heads = args[0], int(args[2])
        shape = qkv.shape
        return {
            "head_dim": int(shape[-1]) // 3 // num_heads,
            "seq": max(SEQ_MIN, _pow2(shape[-2])),
            "rows": _rows(_numel_rows(shape)),
        }
    if op == "attention_varlen":
        qkv, max_seqlen, num_heads = args[0], int(args[2]), int(args[3])
        shape = qkv.shape
        return {
            "head_dim": int(shape[-1]) // 3 // num_heads,
            "seq": max(SEQ_MIN, _pow2(max_seqlen)),
            "rows": _rows(_numel_rows(shape)),
        }
    if op in _LINEAR:
        x, weight = args[0], args[1]
        n, k = (int(d) for d in weight.shape[:2])
        out = {"N": n, "K": k, "rows": _rows(_numel_rows(x.shape))}
        if op == "linear_gelu":  # an epilogue may serve one activation and not another
            out["act"] = str(args[3])
        return out
    if op == "embed_layernorm":
        ids, word = args[0], args[3]
        return {"width": int(word.shape[-1]), "rows": _rows(ids.numel())}
    if op in _ROWWISE:
        shape = args[0].shape
        out = {"width": int(shape[-1]), "rows": _rows(_numel_rows(shape))}
        if op in ("bias_gelu", "bias_gelu_"):
            out["act"] = str(args[2])
        return out
    return None


def _key(b: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in b.items())


def bucket_key(op: str, args) -> str | None:
    """:func:`bucket` as a stable string, e.g. ``"head_dim=64,seq=256,rows=8192"``
    (None for an op that is not tuned)."""
    b = bucket(op, args)
    return None if b is None else _key(b)


#: The bucket fields an entry must match exactly to stand in for another bucket, and
#: those it may differ in (nearest first, in this order).
_IDENTITY = {op: ("head_dim",) for op in _ATTENTION}
_IDENTITY.update({"linear": ("N", "K"), "linear_gelu": ("N", "K", "act")})
_IDENTITY.update({op: ("width",) for op in _ROWWISE})
_IDENTITY.update({op: ("width", "act") for op in ("bias_gelu", "bias_gelu_")})
#: Fields whose values are names (an activation), not positive integers.
_NAMED = ("act",)
_DISTANCE = {op: ("seq", "rows") for op in _ATTENTION}
_DISTANCE.update({op: ("rows",) for op in _LINEAR + _ROWWISE})


def parse_bucket_key(op: str, key: str) -> dict | None:
    """The dict of a :func:`bucket_key` string, or None when it is not one of ``op``'s
    (fields other than the op's, sizes that are not positive integers, an activation
    that is not a name)."""
    if not isinstance(key, str):
        return None
    out = {}
    for part in key.split(","):
        name, sep, value = part.partition("=")
        if not sep or name in out:
            return None
        if name in _NAMED:
            if not value.replace("_", "").isalnum():
                return None
            out[name] = value
            continue
        if not value.isdigit() or int(value) < 1:
            return None
        out[name] = int(value)
    if op in _IDENTITY and set(out) != set(_IDENTITY[op] + _DISTANCE[op]):
        return None
    return out


# ---------------------------------------------------------------- the device at hand
def _triton_version() -> str | None:
    import sys

    mod = sys.modules.get("triton")
    if mod is not None and getattr(mod, "__version__", None):
        return mod.__version__
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:  # not installed
        return None


def device_facts(index: int) -> dict:
    """What a table is matched on, for the CUDA device ``index`` (same fields as
    ``bertfast.bench.sweep.device_facts``); for ``index < 0`` (not a GPU) ``gpu`` and
    ``capability`` are None."""
    facts = {
        "gpu": None,
        "capability": None,
        "torch": torch.__version__.split("+")[0],
        "triton": _triton_version(),
        "cuda": torch.version.cuda,
    }
    if index >= 0:
        props = torch.cuda.get_device_properties(index)
        facts["gpu"] = props.name
        facts["capability"] = f"{props.major}.{props.minor}"
    return facts


def _capability(value) -> int | None:
    """ "9.0" -> 90, "12.1" -> 121 (major * 10 + minor); None when not a capability."""
    m = re.fullmatch(r"(\d+)\.(\d)", str(value)) if value is not None else None
    return int(m.group(1)) * 10 + int(m.group(2)) if m else None


def _major_minor(version) -> str | None:
    m = re.match(r"(\d+)\.(\d+)", str(version)) if version else None
    return f"{m.group(1)}.{m.group(2)}" if m else None


def user_dir() -> Path:
    """Where user tables live: ``$BERTFAST_WINNERS_DIR``, default
    ``~/.cache/bertfast/winners``."""
    env = os.environ.get("BERTFAST_WINNERS_DIR", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bertfast" / "winners"


#: Tables shipped with bertfast (measured on the GPU named in each).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "winners"


def table_filename(device: dict) -> str:
    """A table's file name from its device facts, e.g.
    ``nvidia-h100-80gb-hbm3_sm90_torch2.11_triton3.6.json``."""
    gpu = re.sub(r"[^a-z0-9]+", "-", str(device.get("gpu") or "cpu").lower()).strip("-")
    cap = str(device.get("capability") or "0.0").replace(".", "")
    torch_v = _major_minor(device.get("torch")) or "none"
    triton_v = _major_minor(device.get("triton")) or "none"
    return f"{gpu}_sm{cap}_torch{torch_v}_triton{triton_v}.json"


# ---------------------------------------------------------------- reading tables
_warned: set[str] = set()


def _warn(path, problem: str) -> None:
    message = f"bertfast: ignoring winners table {path}: {problem}".replace("\n", " ")
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class _Entry:
    __slots__ = ("op", "dtype", "key", "bucket", "backend", "variant", "config")

    def __init__(self, op, dtype, key, bucket, backend, variant, config):
        self.op, self.dtype, self.key, self.bucket = op, dtype, key, bucket
        self.backend, self.variant, self.config = backend, variant, config


class Table:
    """One parsed table file: its device facts and its entries by (op, dtype, bucket)."""

    def __init__(self, path: str, source: str, data: dict):
        self.path = path
        self.source = source  # "forced", "user" or "shipped"
        self.device = data["device"]
        self.made_by = data.get("made_by")
        self.entries: dict[tuple, _Entry] = {}
        #: (op, dtype, identity values) -> entries, for the nearest-bucket search
        self.groups: dict[tuple, list[_Entry]] = {}

    def add(self, e: _Entry) -> None:
        if (e.op, e.dtype, e.key) in self.entries:
            return  # a repeated bucket: the first entry stands
        self.entries[(e.op, e.dtype, e.key)] = e
        ident = tuple(e.bucket[f] for f in _IDENTITY[e.op])
        self.groups.setdefault((e.op, e.dtype, ident), []).append(e)


def _config_value(v) -> bool:
    return isinstance(v, (int, float, str, bool)) or v is None


def _parse(path: str, source: str, text: str) -> Table | str:
    """A Table, or the problem with the file (one line)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("format") != FORMAT:
        return f"format {data.get('format')!r}, this bertfast reads format {FORMAT}"
    device = data.get("device")
    if not isinstance(device, dict) or not isinstance(device.get("gpu"), str):
        return "no device.gpu (the GPU name it was measured on)"
    if _capability(device.get("capability")) is None:
        return f"device.capability {device.get('capability')!r} is not like '9.0'"
    entries = data.get("entries")
    if not isinstance(entries, list):
        return "no entries list"
    table = Table(path, source, data)
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict):
            return f"entries[{i}] is not an object"
        op, dtype, key = raw.get("op"), raw.get("dtype"), raw.get("bucket")
        backend, variant = raw.get("backend"), raw.get("variant", dispatch.DEFAULT)
        config = raw.get("config") or {}
        if not isinstance(op, str) or not isinstance(backend, str) or not isinstance(variant, str):
            return f"entries[{i}] needs op, backend and variant strings"
        if dtype not in DTYPE_NAMES:
            return f"entries[{i}] has dtype {dtype!r}, not one of {', '.join(DTYPE_NAMES)}"
        if not isinstance(config, dict) or not all(
            isinstance(k, str) and _config_value(v) for k, v in config.items()
        ):
            return f"entries[{i}].config is not an object of plain values"
        if op not in TUNED_OPS:
            continue  # an op this bertfast does not tune (a newer table): not an error
        parsed = parse_bucket_key(op, key)
        if parsed is None:
            return f"entries[{i}] has bucket {key!r}, not a {op} bucket key"
        canon = _key(parsed)
        table.add(_Entry(op, dtype, canon, parsed, backend, variant, config))
    return table


def _read(path: Path, source: str) -> Table | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _warn(path, f"cannot read it ({getattr(exc, 'strerror', None) or exc})")
        return None
    table = _parse(str(path), source, text)
    if isinstance(table, str):
        _warn(path, table)
        return None
    return table


def _tables() -> tuple[Table | None, list[Table]]:
    """(the forced table or None, the user and shipped tables), read once."""
    global _all
    cached = _all
    if cached is not None:
        return cached
    forced_path = os.environ.get("BERTFAST_WINNERS", "").strip()
    forced, found = None, []
    if forced_path:
        forced = _read(Path(forced_path).expanduser(), "forced")
    else:
        for source, folder in (("user", user_dir()), ("shipped", SHIPPED_DIR)):
            try:
                files = sorted(folder.glob("*.json")) if folder.is_dir() else []
            except OSError:
                files = []
            for f in files:
                table = _read(f, source)
                if table is not None and not table.device.get("dry_run"):
                    found.append(table)
    _all = (forced, found)
    return _all


_all: tuple | None = None

#: Match levels, best first (index = level); "forced" stands before them all.
LEVELS = ("exact", "same GPU, other versions", "same capability", "nearest capability")


def _rank(table: Table, facts: dict):
    """Sort key of ``table`` for the device ``facts`` (lower is better), or None when it
    cannot serve it (the device is no GPU)."""
    want = _capability(facts.get("capability"))
    have = _capability(table.device.get("capability"))
    if want is None or have is None:
        return None
    versions = sum(
        _major_minor(table.device.get(k)) == _major_minor(facts.get(k)) for k in ("torch", "triton")
    )
    if have == want:
        if table.device.get("gpu") == facts.get("gpu"):
            level = 0 if versions == 2 else 1
        else:
            level = 2
        distance, higher = 0, 0
    else:
        level, distance, higher = 3, abs(have - want), int(have > want)
    user = 0 if table.source == "user" else 1
    return (level, distance, higher, user, -versions, table.path)


def _choose(facts: dict) -> tuple[Table | None, str | None]:
    forced, tables = _tables()
    if forced is not None:
        return forced, "forced by BERTFAST_WINNERS"
    ranked = [(r, t) for t in tables if (r := _rank(t, facts)) is not None]
    if not ranked:
        return None, None
    rank, table = min(ranked, key=lambda rt: rt[0])
    return table, LEVELS[rank[0]]


# ---------------------------------------------------------------- lookup
class _State:
    """The chosen table of one device and the lookups resolved so far."""

    MEMO_LIMIT = 4096

    def __init__(self, table: Table | None, level: str | None, facts: dict):
        self.table, self.level, self.facts = table, level, facts
        self.by_bucket: dict[tuple, dispatch.Candidate | None] = {}
        self.by_shape: dict[tuple, dispatch.Candidate | None] = {}


_lock = threading.Lock()
_states: dict[int, _State] = {}


def _index(device) -> int:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        return -1
    return device.index if device.index is not None else torch.cuda.current_device()


def _state(index: int) -> _State:
    state = _states.get(index)
    if state is None:
        with _lock:
            state = _states.get(index)
            if state is None:
                facts = device_facts(index)
                table, level = _choose(facts)
                state = _states[index] = _State(table, level, facts)
    return state


_DTYPE_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _shape_key(op: str, args) -> tuple:
    """The input sizes that decide ``op``'s bucket (a cheap memo key)."""
    if op == "attention":
        return (args[0].shape, args[2])
    if op == "attention_varlen":
        return (args[0].shape, args[2], args[3])
    if op in _LINEAR:
        return (args[0].shape, args[1].shape)
    if op == "embed_layernorm":
        return (args[0].shape, args[3].shape)
    return (args[0].shape,)


def lookup(op: str, device, dtype: torch.dtype, args) -> dispatch.Candidate | None:
    """The candidate the winners table of ``device`` (a torch device, or a CUDA index)
    names for ``op`` on ``args`` in ``dtype``, or None (no table, an op that is not
    tuned, no usable entry for the bucket). Whether it can run ``args`` is the
    caller's check (``why_not_variant``)."""
    state = _states.get(device if isinstance(device, int) else _index(device))
    if state is None:
        state = _state(_index(device))
    if state.table is None or op not in _IDENTITY:
        return None
    name = _DTYPE_NAME.get(dtype)
    if name is None:
        return None
    shape = (op, name, *_shape_key(op, args))
    try:
        return state.by_shape[shape]
    except KeyError:
        pass
    b = bucket(op, args)
    key = (op, name, _key(b))
    if key in state.by_bucket:
        found = state.by_bucket[key]
    else:
        found = state.by_bucket[key] = _resolve(state.table, op, name, b, args)
    if len(state.by_shape) >= _State.MEMO_LIMIT:
        state.by_shape.clear()
    state.by_shape[shape] = found
    return found


def _log2_distance(a: int, b: int) -> float:
    return abs(math.log2(a) - math.log2(b))


def _resolve(table: Table, op: str, dtype: str, b: dict, args) -> dispatch.Candidate | None:
    exact = table.entries.get((op, dtype, _key(b)))
    ident = tuple(b[f] for f in _IDENTITY[op])
    near = [e for e in table.groups.get((op, dtype, ident), ()) if e is not exact]
    fields = _DISTANCE[op]
    near.sort(
        key=lambda e: (
            tuple(_log2_distance(e.bucket[f], b[f]) for f in fields),
            tuple(e.bucket[f] for f in fields),
        )
    )
    for e in [exact, *near] if exact is not None else near:
        candidate = _usable(e, args)
        if candidate is not None:
            return candidate
    return None


def _same_config(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _usable(e: _Entry, args) -> dispatch.Candidate | None:
    """The entry as a Candidate when its backend, variant and config exist here."""
    if e.backend not in dispatch.BACKEND_NAMES:
        return None
    backend = dispatch.get_backend(e.backend)
    variant_names = getattr(backend, "variant_names", None)  # None: it failed to import
    if variant_names is None or e.variant not in variant_names(e.op):
        return None
    if e.config:
        configs = backend.configs_for(e.op, e.variant)
        if configs is None:
            return None
        try:
            offered = configs(*args)
        except Exception:  # the backend cannot list configs for this input
            return None
        if not any(_same_config(e.config, dict(c)) for c in offered):
            return None
    return dispatch.Candidate.make(e.op, e.backend, e.variant, e.config)


def table_summary(device) -> str | None:
    """Which table ``device`` uses and why (for ``bertfast info``), or None."""
    state = _state(_index(device))
    table = state.table
    if table is None:
        return None
    d = table.device
    return (
        f"{table.path} ({table.source}, {state.level}: measured on {d.get('gpu')} "
        f"sm {d.get('capability')}, torch {d.get('torch')}, triton {d.get('triton')}; "
        f"{len(table.entries)} entries)"
    )


def reset() -> None:
    """Forget the tables read and the lookups made (tests; after writing a table)."""
    global _all
    with _lock:
        _all = None
        _states.clear()
        _warned.clear()


# ---------------------------------------------------------------- building tables
_DEVICE_FIELDS = ("gpu", "capability", "torch", "triton", "cuda")


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) and v > 0 else None


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def table_from_rows(rows, device: dict | None = None, made_by: str | None = None) -> dict:
    """A winners table from sweep rows (``bertfast.bench.sweep``'s format; what
    ``bertfast tune`` and the GPU check's sweeps write).

    Rows count when their op is tuned, they carry a ``bucket``, their ``parity`` is
    "pass" and their ``median_ms`` a positive number; with ``device`` (device facts),
    rows that name another GPU or capability are left out too. Per (op, dtype,
    bucket), each candidate's time per input shape is its best row there; a candidate
    that failed parity on any row of the bucket is out of it. The winner covers the
    most shapes of the bucket, then has the smallest geometric mean of its time over
    the best time per shape (with one shape: simply the fastest). Each entry holds
    the winner's median_ms (geometric mean over the shapes), the runner-up's label
    and the speedup over it (1.0 with no runner-up left)."""
    rows = [r for r in rows if isinstance(r, dict)]
    if device is None:
        device = next((r["device"] for r in rows if isinstance(r.get("device"), dict)), {})
    device = {k: device.get(k) for k in _DEVICE_FIELDS} | (
        {"dry_run": True} if device.get("dry_run") else {}
    )
    # (op, dtype, bucket) -> label -> shape -> best ms; and the labels that failed
    times: dict[tuple, dict[str, dict[str, float]]] = {}
    failed: dict[tuple, set] = {}
    parts: dict[str, dispatch.Candidate] = {}
    for r in rows:
        op, dtype, key = r.get("op"), r.get("dtype"), r.get("bucket")
        if op not in _IDENTITY or dtype not in DTYPE_NAMES or parse_bucket_key(op, key) is None:
            continue
        dev = r.get("device")
        if isinstance(dev, dict) and any(
            dev.get(k) != device.get(k) for k in ("gpu", "capability") if device.get(k)
        ):
            continue
        config = r.get("config") or {}
        if not isinstance(config, dict) or not isinstance(r.get("backend"), str):
            continue
        c = dispatch.Candidate.make(op, r["backend"], r.get("variant") or dispatch.DEFAULT, config)
        group = (op, dtype, _key(parse_bucket_key(op, key)))
        ms = _number(r.get("median_ms"))
        if r.get("parity") != "pass" or ms is None:
            failed.setdefault(group, set()).add(c.label)
            continue
        parts[c.label] = c
        shape = json.dumps(r.get("shape"), sort_keys=True, default=str)
        per_shape = times.setdefault(group, {}).setdefault(c.label, {})
        per_shape[shape] = min(ms, per_shape.get(shape, ms))
    entries = []
    for group, by_label in sorted(times.items()):
        by_label = {k: v for k, v in by_label.items() if k not in failed.get(group, ())}
        if not by_label:
            continue
        best: dict[str, float] = {}
        for per_shape in by_label.values():
            for shape, ms in per_shape.items():
                best[shape] = min(ms, best.get(shape, ms))

        def score(label, by_label=by_label, best=best):
            per_shape = by_label[label]
            return (-len(per_shape), _geomean(ms / best[s] for s, ms in per_shape.items()), label)

        ranked = sorted(by_label, key=score)
        win = parts[ranked[0]]
        win_times = list(by_label[ranked[0]].values())
        entry = {
            "op": group[0],
            "dtype": group[1],
            "bucket": group[2],
            "backend": win.backend,
            "variant": win.variant,
            "config": dict(win.config),
            "median_ms": round(_geomean(win_times), 6),
            "runner_up": ranked[1] if len(ranked) > 1 else None,
            "speedup": round(score(ranked[1])[1] / score(ranked[0])[1], 4)
            if len(ranked) > 1
            else 1.0,
            "candidates": len(ranked),
        }
        entries.append(entry)
    return {"format": FORMAT, "device": device, "made_by": made_by, "entries": entries}


def write_table(table: dict, path) -> Path:
    """Write ``table`` to ``path`` (made whole first, then renamed into place)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
