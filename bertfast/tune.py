"""``bertfast tune``: time every candidate of every op a model runs and write the
winners table of this GPU (``bertfast.ops.winners``).

Steps, for a checkpoint (or built-in preset) and a list of input shapes:

1. **Record.** One forward per shape with ``dispatch.select`` wrapped: each call of a
   tuned op leaves its (op, dtype, shape bucket) and a copy of its arguments; the
   first call per bucket is kept. On CUDA, the small shapes that run as CUDA graphs
   in production are also run through the same static padded path (without
   capture), so the padded ``attention`` calls are recorded too.
2. **Measure.** For each recorded call, every candidate of
   ``dispatch.candidates(op, device, dtype, args, with_configs=True)`` is timed with
   ``bertfast.bench.sweep.time_launches`` and checked against the reference (the
   parity rule below); each result is a sweep row (stage ``"tune"``), appended to
   ``--rows`` as soon as it exists.
3. **Choose.** :func:`bertfast.ops.winners.table_from_rows` (the one implementation,
   shared with the GPU check) keeps the fastest candidate that passed parity per
   (op, dtype, bucket), with its runner-up and the speedup over it, and the table is
   written to ``--out`` (default: the user winners folder, the file named after the
   GPU, its capability and the torch / triton versions).

**Parity** is the rule of docs/design.md section 5, :func:`bertfast.ops.parity.verdict`
(the tests judge with the same function): the candidate's max abs error against the
reference run in float64 may be at most twice the error of the reference run in the
same dtype plus the op's ``atol``.

``--dry-run`` runs everything on the CPU (a tiny random-weight model unless
``--model`` names one; the ``cpu`` and ``torch`` candidates, not the Triton
interpreter) and writes a table keyed by a fake device
(``"gpu": "dry-run"``, ``"dry_run": true``), which lookups use only when
``BERTFAST_WINNERS`` names it: CI exercises the whole path with it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch

from .ops import dispatch, parity, reference, winners
from .ops.winners import table_from_rows

__all__ = ["record_calls", "measure", "tune", "table_from_rows", "DRY_RUN_DEVICE"]

#: The device facts of a ``--dry-run`` table.
DRY_RUN_DEVICE = {"gpu": "dry-run", "capability": "0.0", "dry_run": True}

#: The model ``--dry-run`` builds when no ``--model`` is given (BERT, random weights).
DRY_RUN_CONFIG = {
    "model_type": "bert",
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
}
DRY_RUN_SHAPES = "2x16,r4x8x32"


# ---------------------------------------------------------------- recording
def _clone(args) -> tuple:
    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)


@contextlib.contextmanager
def record_calls(calls: dict):
    """While active, every ``dispatch.select`` of a tuned op with at least one row
    records ``calls[(op, dtype, bucket_key)] = (copied args)`` (the first call per
    key). The implementation it returns is wrapped, so the model's CPU fast path
    (which calls the cpu backend's functions directly, bypassing dispatch) is off and
    every op goes through ``select``."""
    real = dispatch.select

    def select(op, backend, device_type, dtype, args):
        impl = real(op, backend, device_type, dtype, args)
        key = winners.bucket_key(op, args) if op in winners.TUNED_OPS else None
        if key is not None and args[0].numel() > 0 and (op, dtype, key) not in calls:
            calls[(op, dtype, key)] = _clone(args)
        return lambda *a: impl(*a)

    dispatch.select = select
    try:
        yield calls
    finally:
        dispatch.select = real


def _dry_run_model(dtype):
    from .checkpoint import encoder_weight_specs
    from .config import EncoderConfig
    from .heads import head_weight_specs
    from .model import BertfastModel

    cfg = EncoderConfig.from_dict(dict(DRY_RUN_CONFIG), source="dry-run")
    specs = encoder_weight_specs(cfg)
    specs.update(head_weight_specs(cfg, "base")[0])
    g = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in specs.items():
        w = torch.randn(shape, generator=g) * (shape[-1] ** -0.5 if len(shape) == 2 else 0.1)
        if name.endswith("ln.weight"):
            w = w + 1.0
        weights[name] = w.to(dtype)
    return BertfastModel(cfg, weights, head="base", backend="auto")


def _forwards(model, shapes, device) -> None:
    """One forward per shape; on CUDA, the graph-sized ones also on the static path."""
    from .bench.workload import make_batch

    vocab = model.config.vocab_size
    graphs = False
    if device.type == "cuda":
        from .graphs import graphs_enabled

        graphs = graphs_enabled(None, device)
    for _label, lengths in shapes:
        batch = make_batch(lengths, vocab, device=device)
        for static in (False, True) if graphs else (False,):
            model.enable_cuda_graphs(static, capture=False)
            model(batch.input_ids, attention_mask=batch.attention_mask)
    model.enable_cuda_graphs(False)


# ---------------------------------------------------------------- measuring
def _cast(args, dtype) -> tuple:
    return tuple(
        a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )


def _run(op: str, fn, args):
    """``fn(*args)`` on fresh copies; for an in-place op the first argument after it."""
    args = _clone(args)
    out = fn(*args)
    return args[0] if op.endswith("_") else out


def _shape(args) -> dict:
    return {"sizes": [list(a.shape) if isinstance(a, torch.Tensor) else a for a in args]}


def measure(
    calls: dict,
    device: torch.device,
    facts: dict,
    rows_path=None,
    log=print,
    skip_backends=(),
    **timing,
):
    """Time and check every candidate of every recorded call (``timing``: arguments
    of ``time_launches``; backends in ``skip_backends`` are left out); returns the
    sweep rows, each also appended to ``rows_path`` when given."""
    from .bench.sweep import append_row, time_launches

    rows = []
    for (op, dtype, key), args in sorted(calls.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        ref = getattr(reference, op)
        gold = _run(op, ref, _cast(args, torch.float64)).double()
        same_dtype = _run(op, ref, args)
        mine = []
        for c in dispatch.candidates(op, device.type, dtype, args, with_configs=True):
            if c.backend in skip_backends:
                continue
            row = {
                "stage": "tune",
                "op": op,
                "dtype": _dtype_name(dtype),
                "shape": _shape(args),
                "bucket": key,
                "candidate": c.label,
                "backend": c.backend,
                "variant": c.variant,
                "config": dict(c.config),
                "device": facts,
            }
            try:
                fn = dispatch.implementation(c)
                why, err, bound = parity.verdict(op, _run(op, fn, args), gold, same_dtype, dtype)
                row["parity"] = "pass" if why is None else f"fail: {why}"
                row["max_error"], row["bound"] = err, bound
                work = _clone(args)
                stats = time_launches(lambda fn=fn, work=work: fn(*work), device, **timing)
                row["median_ms"], row["iqr_ms"] = stats.median, stats.iqr
                row["launches"] = timing.get("launches", 20)
            except Exception as exc:  # a config that cannot launch, a kernel error...
                first = (str(exc).splitlines() or [""])[0][:200]
                row["parity"] = f"error: {type(exc).__name__}: {first}"
                row["median_ms"] = None
            mine.append(row)
            if rows_path:
                append_row(rows_path, row)
        rows += mine
        passed = [r for r in mine if r["parity"] == "pass"]
        best = min(passed, key=lambda r: r["median_ms"], default=None)
        log(
            f"  {op:<16} {_dtype_name(dtype):<8} {key}: {len(mine)} candidates, "
            + (f"fastest {best['candidate']} {best['median_ms']:.4f} ms" if best else "none passed")
        )
    return rows


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _made_by(argv_text: str) -> str:
    from . import __version__
    from .info import git_revision

    commit = git_revision()
    return f"{argv_text} (bertfast {__version__}{', commit ' + commit if commit else ''})"


def tune(
    model_path,
    device,
    dtypes,
    shapes,
    out=None,
    rows_path=None,
    seconds: float = 0.2,
    dry_run: bool = False,
    made_by: str = "bertfast tune",
    log=print,
) -> tuple[dict, Path]:
    """Record, measure, choose and write (see the module docstring); returns the table
    and where it was written. ``shapes``: ``(label, lengths)`` pairs
    (``bertfast.bench.workload.parse_shape``)."""
    from .bench.sweep import device_facts
    from .checkpoint import load_checkpoint
    from .model import BertfastModel

    device = torch.device(device)
    facts = dict(device_facts(device))
    if dry_run:
        facts.update(DRY_RUN_DEVICE)
    calls: dict = {}
    for dtype in dtypes:
        if model_path is None:
            model = _dry_run_model(dtype)
        else:  # the weights as loaded (not packed for the CPU GEMM): plain op arguments
            cfg, head, weights = load_checkpoint(
                model_path, head="base", dtype=dtype, device=device
            )
            model = BertfastModel(cfg, weights, head=head, backend="auto")
        with record_calls(calls):
            _forwards(model, shapes, device)
        del model
    log(f"# {len(calls)} (op, dtype, bucket) to measure on {facts.get('gpu')}")
    timing = {"launches": 2, "rounds": 3, "warmup": 1} if dry_run else {}
    start = time.perf_counter()
    # --dry-run: the CPU's own candidates (Triton on the CPU is the tests' interpreter)
    skip = ("triton",) if dry_run else ()
    rows = measure(calls, device, facts, rows_path, log, skip, budget_s=seconds, **timing)
    table = table_from_rows(rows, facts, made_by=_made_by(made_by))
    path = Path(out).expanduser() if out else winners.user_dir() / winners.table_filename(facts)
    if path.is_dir():
        path = path / winners.table_filename(facts)
    winners.write_table(table, path)
    winners.reset()  # this process sees the new table from its next lookup
    log(
        f"# {len(rows)} candidate runs in {time.perf_counter() - start:.1f} s; "
        f"{len(table['entries'])} winners written to {path}"
    )
    return table, path


def default_model(dry_run: bool):
    """--model's default: the packaged MiniLM (else the minilm-l6 preset); None for
    --dry-run (its tiny built-in model)."""
    if dry_run:
        return None
    from .presets import resolve

    return resolve(None)


def resolve_model(name: str | None, dry_run: bool):
    """--model: a checkpoint folder, 'minilm' or a preset name (as ``bertfast bench``)."""
    if name is None:
        return default_model(dry_run)
    from .presets import PRESETS, resolve
    from .validate import checkpoint_folder

    if name == "minilm" or name in PRESETS or not os.path.isdir(name):
        return resolve(name)
    return checkpoint_folder(name)
