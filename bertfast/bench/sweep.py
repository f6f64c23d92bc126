"""What the GPU sweeps and ``bertfast tune`` share: timing one op's candidate on
back-to-back launches, the facts that key a winners table, and one JSON line per
result, written as soon as it exists (a run cut short keeps what it measured).

A sweep row (one JSON object per line) has at least:

``stage``      the gpu_check stage that wrote it ("b" attention, "c" GEMM/LayerNorm, ...)
``op``         the bertfast op (``attention_varlen``, ``linear_gelu``, ...) or a
               reference such as ``gemm_ceiling``
``dtype``      "float16", "bfloat16", "float32"
``shape``      the input's sizes, a dict (``{"batch": 32, "seqlen": 128, ...}``)
``bucket``     ``bertfast.ops.winners.bucket_key(op, args)``: the table's key
``candidate``  ``Candidate.label`` (``cuda:flash``, ``triton[BLOCK_M=128,...]``)
``backend``, ``variant``, ``config``   the candidate's parts (config a dict)
``median_ms``, ``iqr_ms``, ``launches``   the time of one launch (see ``time_launches``)
``parity``     "pass", or "fail: <max error> > <bound>" (a failing candidate never wins)
``device``     ``device_facts()`` of the machine
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .timing import Stats

__all__ = [
    "time_launches",
    "timing_fields",
    "device_facts",
    "append_row",
    "read_rows",
    "parity_text",
    "plan_candidates",
    "plan_sweep",
    "context_lost",
    "sweep_parser",
    "sweep_device",
    "split_names",
    "print_plan",
    "SweepResult",
    "run_sweep",
]


def time_launches(
    fn: Callable[[], object],
    device="cpu",
    warmup: int = 3,
    launches: int = 20,
    rounds: int = 7,
    budget_s: float = 1.0,
) -> Stats:
    """Milliseconds per launch of ``fn``: ``rounds`` rounds of ``launches`` back-to-back
    calls each (CUDA events around the round on a GPU, so the host's launch cost is
    hidden when the kernel is longer than it, as in a model's forward; the wall clock
    on the CPU), after ``warmup`` calls. Stops early once ``budget_s`` is spent (at
    least three rounds)."""
    device = torch.device(device)
    for _ in range(max(warmup, 1)):
        fn()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    times: list[float] = []
    start = time.perf_counter()
    for r in range(rounds):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(launches):
                fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / launches)
        else:
            t0 = time.perf_counter()
            for _ in range(launches):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / launches)
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    return Stats(times)


def timing_fields(stats: Stats, launches: int) -> dict:
    """A row's timing fields: ``median_ms``, ``iqr_ms``, ``min_ms``, ``launches`` (per
    round) and ``rounds`` of ``time_launches``' result."""
    return {
        "median_ms": stats.median,
        "iqr_ms": stats.iqr,
        "min_ms": stats.min,
        "launches": launches,
        "rounds": len(stats.times),
    }


def device_facts(device="cpu") -> dict:
    """What a winners table is keyed by: GPU name and compute capability (or the CPU's
    name), and the torch / triton / CUDA versions."""
    device = torch.device(device)
    facts = {"torch": torch.__version__.split("+")[0], "cuda": torch.version.cuda}
    try:
        import triton

        facts["triton"] = triton.__version__
    except Exception:  # triton missing or broken: the table says so
        facts["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts["gpu"] = props.name
        facts["capability"] = f"{props.major}.{props.minor}"
        facts["sm_count"] = props.multi_processor_count
    else:
        from ..info import cpu_info

        facts["gpu"] = None
        facts["capability"] = None
        facts["cpu"] = cpu_info().get("model")
    return facts


def append_row(path, row: dict) -> None:
    """Append ``row`` as one JSON line and flush it to disk."""
    line = json.dumps(row, sort_keys=True, default=str)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path) -> list[dict]:
    """The rows of a JSON-lines file (``*.gz``: gzipped); a last line cut by a timeout
    is skipped."""
    rows = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def parity_text(op: str, out, gold, same_dtype, dtype) -> tuple[str, float, float]:
    """``("pass" | "fail: <why>", err, bound)``: a row's ``parity`` field by the
    project's rule (``bertfast.ops.parity.verdict``, the one the tests use)."""
    from ..ops.parity import verdict

    why, err, bound = verdict(op, out, gold, same_dtype, dtype)
    return ("pass" if why is None else f"fail: {why}"), err, bound


def plan_candidates(cases, device) -> list[tuple]:
    """Each sweep case with the candidates that can run it
    (``dispatch.candidates(..., with_configs=True)`` on the case's uninitialised
    inputs, ``case.inputs(device, fill=False)``; a case whose listing raises gets none,
    and the reason is printed)."""
    from ..ops import dispatch

    out = []
    for case in cases:
        args = case.inputs(device, fill=False)
        try:
            found = dispatch.candidates(case.op, device.type, case.dtype, args, with_configs=True)
        except Exception as exc:  # a backend's support check or config list that breaks
            print(f"  {case.describe()}: candidates() raised {type(exc).__name__}: {exc}")
            found = []
        out.append((case, found))
        del args
    return out


def plan_sweep(cases, device, estimate_row: Callable, timing_s: float) -> tuple[list, list]:
    """``(planned, estimates)``: ``plan_candidates(cases, device)`` and the guessed seconds
    of each of its rows, ``estimate_row(case, candidate, device.type, compiled, timing_s)``
    (``compiled``: a set the estimates share, so each compile is counted once)."""
    planned = plan_candidates(cases, device)
    compiled: set = set()
    estimates = [
        [estimate_row(c, cand, device.type, compiled, timing_s) for cand in cands]
        for c, cands in planned
    ]
    return planned, estimates


def context_lost(exc: BaseException) -> bool:
    """A CUDA error that poisons the context (every later launch would fail too)."""
    text = f"{type(exc).__name__}: {exc}"
    return "AcceleratorError" in text or any(
        s in text for s in ("illegal memory access", "unspecified launch failure", "CUDA error")
    )


# ---------------------------------------------------------------- the sweeps' driver
def sweep_parser(description: str, timing_help: str) -> argparse.ArgumentParser:
    """A sweep script's parser with the options every sweep has (``--out``, ``--budget-s``,
    ``--device``, ``--timing-s``, ``--dry-run``); the script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    p.add_argument("--budget-s", type=float, default=480.0, help="no row starts after this")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    p.add_argument("--timing-s", type=float, default=None, help=timing_help)
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: checks the script")
    return p


def sweep_device(name: str | None, dry: bool, script: str) -> torch.device | None:
    """The device a sweep runs on (``name``, else cuda, cpu in a dry run); None, with the
    reason on stderr, when it asks for CUDA and there is none (the script exits 3)."""
    device = torch.device(name or ("cpu" if dry else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{script}: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return None
    return device


def split_names(text: str) -> list[str]:
    """The names of a comma-separated option (``"float16, bfloat16"``), blanks dropped."""
    return [n.strip() for n in text.split(",") if n.strip()]


def print_plan(headline: str, planned, shown: int, notes=()) -> None:
    """The plan a sweep prints before its first row: ``headline``, each note, then the
    candidates of the first ``shown`` cases of ``planned`` (``plan_candidates``)."""
    print(headline)
    for note in notes:
        print(f"  {note}")
    for case, cands in planned[:shown]:
        print(f"  {case.describe()}: {len(cands)} candidates: {', '.join(c.label for c in cands)}")
    if len(planned) > shown:
        print(f"  ... {len(planned) - shown} more cases")
    sys.stdout.flush()


@dataclass
class SweepResult:
    """What ``run_sweep`` wrote: the candidate rows (error rows included), in order."""

    rows: list[dict] = field(default_factory=list)
    failed: int = 0  # measured rows whose parity is not "pass"
    errors: int = 0  # candidates that raised
    stopped: str | None = None  # why the budget stopped the sweep early
    lost: bool = False  # the CUDA context was lost: the sweep stopped at once (exit 2)

    @property
    def measured(self) -> int:
        return len(self.rows) - self.errors

    def done_line(self, counted: str, t_start: float) -> str:
        """The sweep's last line; ``counted`` says how many rows, e.g. "12 rows"."""
        elapsed = time.perf_counter() - t_start
        return (
            f"done: {counted} ({self.failed} failing parity, {self.errors} errors) in "
            f"{elapsed:.0f} s"
            + (f"; stopped: {self.stopped}" if self.stopped else "; every planned row ran")
        )


def run_sweep(
    planned,
    estimates,
    args: argparse.Namespace,
    *,
    script: str,
    device: torch.device,
    t_start: float,
    golds: Callable,
    base_row: Callable,
    measure: Callable,
    progress: Callable,
    before_case: Callable | None = None,
    fit_each: bool = True,
) -> SweepResult:
    """Every planned case's candidates, one row each, appended to ``out`` as it is measured.

    ``planned`` and ``estimates`` (the guessed seconds of each row) come from
    ``plan_sweep``; ``args`` holds the ``sweep_parser`` options (``out``, ``budget_s``);
    ``script`` names the sweep in its messages. Per case (its inputs drawn after
    ``torch.manual_seed(case.priority)``, its ``bucket`` = ``bucket_key(case.op, inputs)``),
    the script's callbacks give:

    - ``before_case(case, inputs, bucket)``: rows of its own to write first (optional);
    - ``golds(case, inputs) -> (gold, same)``: the references ``parity_text`` checks against;
    - ``base_row(case, candidate, bucket, rank) -> dict``: a row's fixed fields;
    - ``measure(case, candidate, inputs, gold, same) -> dict``: the measured fields (a
      candidate that raises gets an error row; one that loses the CUDA context stops all);
    - ``progress(case, candidate, row) -> str``: the line printed for a measured row.

    No case starts unless its first row's guess fits the budget left; a candidate starts
    unless its guess does not fit (``fit_each``) or, without ``fit_each``, the budget is
    spent."""
    from ..ops.winners import bucket_key

    out, budget_s = args.out, args.budget_s
    result = SweepResult()
    for (case, cands), est in zip(planned, estimates):
        if not cands:
            continue
        if budget_s - (time.perf_counter() - t_start) < est[0]:
            result.stopped = f"budget spent before {case.describe()}"
            break
        torch.manual_seed(case.priority)
        inputs = case.inputs(device)
        bucket = bucket_key(case.op, inputs)
        if before_case is not None:
            before_case(case, inputs, bucket)
        gold, same = golds(case, inputs)
        for rank, (cand, guess) in enumerate(zip(cands, est)):
            left = budget_s - (time.perf_counter() - t_start)
            if fit_each and left < guess:
                result.stopped = f"budget spent in {case.describe()}, before {cand.label}"
                break
            if not fit_each and left < 0:
                result.stopped = f"budget spent in {case.describe()}"
                break
            row = base_row(case, cand, bucket, rank)
            try:
                row.update(measure(case, cand, inputs, gold, same))
            except Exception as exc:  # a candidate that raises is a row, not the end
                row.update(median_ms=None, parity=f"error: {type(exc).__name__}: {exc}"[:300])
                result.errors += 1
                append_row(out, row)
                result.rows.append(row)
                print(f"  ERROR {case.describe()} {cand.label}: {row['parity']}")
                if device.type == "cuda" and context_lost(exc):
                    print(f"{script}: the CUDA context is lost; stopping", flush=True)
                    result.lost = True
                    return result
                continue
            append_row(out, row)
            result.rows.append(row)
            result.failed += row["parity"] != "pass"
            print(progress(case, cand, row), flush=True)
        del inputs, gold, same
        if result.stopped:
            break
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result
