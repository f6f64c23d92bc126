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

import json
import os
import time
from collections.abc import Callable

import torch

from .timing import Stats

__all__ = [
    "time_launches",
    "device_facts",
    "append_row",
    "read_rows",
    "parity_text",
    "plan_candidates",
    "context_lost",
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
    """The rows of a JSON-lines file; a last line cut by a timeout is skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
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


def context_lost(exc: BaseException) -> bool:
    """A CUDA error that poisons the context (every later launch would fail too)."""
    text = f"{type(exc).__name__}: {exc}"
    return "AcceleratorError" in text or any(
        s in text for s in ("illegal memory access", "unspecified launch failure", "CUDA error")
    )
