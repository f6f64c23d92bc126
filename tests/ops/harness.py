"""Shared machinery of the per-op parity tests (tests/ops/test_<op>.py).

The parity rule of docs/design.md: against a float64 "gold" computed by the reference
(``bertfast.ops.reference``, the spec), a backend's max abs error may be at most
twice the error of the reference run in the same dtype, plus a small ``atol`` kept
as data in ``ATOL`` with the reason for its value.
"""

from __future__ import annotations

import os

import pytest
import torch

import bertfast.ops as ops
from bertfast.ops import parity, reference
from bertfast.ops.dispatch import BackendError

HAS_CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

#: The backends these tests exercise. "torch" is the reference itself and is
#: tested against independent formulations in test_reference.py instead.
_ALL_BACKENDS = {
    "torch": pytest.param("torch", id="torch"),
    "cpu": pytest.param("cpu", id="cpu"),
    "triton": pytest.param("triton", id="triton"),
    "cuda": pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
}
#: ``BERTFAST_TEST_BACKENDS=cpu,triton`` narrows the list (``torch`` checks the
#: harness itself: the reference must pass its own rule trivially).
BACKENDS = [
    _ALL_BACKENDS[name]
    for name in os.environ.get("BERTFAST_TEST_BACKENDS", "cpu,triton,cuda").split(",")
    if name.strip()
]

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]

#: The atol table of the rule (data, with the reason for each value): bertfast/ops/parity.py.
ATOL = parity.ATOL

#: Ops whose Triton kernels use tl.dot (wrong for bf16 under the interpreter).
DOT_OPS = {"linear_gelu", "attention", "attention_varlen"}


def device_for(backend: str) -> torch.device:
    if backend == "cuda" or (backend == "triton" and HAS_CUDA):
        return torch.device("cuda")
    return torch.device("cpu")


def cast(args, dtype, device=None):
    """Floating tensors to ``dtype`` (and ``device``); everything else as is."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_floating_point():
                a = a.to(dtype)
            if device is not None:
                a = a.to(device)
        out.append(a)
    return tuple(out)


def skip_known_gaps(op: str, backend: str, dtype: torch.dtype):
    if backend == "triton" and INTERPRETED and dtype == torch.bfloat16 and op in DOT_OPS:
        pytest.skip(
            "the Triton interpreter computes tl.dot wrongly for bf16 inputs "
            "(checked on a GPU instead)"
        )


def run_backend(op: str, backend: str, args):
    """Run ``op`` on ``backend``; skip if that backend does not implement ``op`` at all.

    Whether a backend that exists really covers the ops it should is asserted by
    test_backend_coverage.py, so this skip cannot hide a missing kernel.
    """
    try:
        return getattr(ops, op)(*args, backend=backend)
    except BackendError as exc:
        pytest.skip(str(exc))


def assert_within_rule(
    op: str,
    what: str,
    out: torch.Tensor,
    gold: torch.Tensor,
    same_dtype: torch.Tensor,
    dtype: torch.dtype,
) -> float:
    """The parity rule on computed tensors: ``out``'s max abs error against the float64
    ``gold`` is at most twice that of ``same_dtype`` (the reference run in ``dtype``)
    plus ``ATOL[op][dtype]``. For tests that call a kernel directly (no op to run);
    everything else uses :func:`assert_parity`. Returns the error."""
    why, err, _ = parity.verdict(op, out, gold, same_dtype, dtype)
    assert why is None, f"{what} [{dtype}]: {why}"
    return err


def assert_parity(op: str, backend: str, args, dtype: torch.dtype, *, out_index=None):
    """Check ``op`` on ``backend`` in ``dtype`` against the float64 reference."""
    skip_known_gaps(op, backend, dtype)
    device = device_for(backend)
    ref = getattr(reference, op)
    gold = ref(*cast(args, torch.float64, device))
    same_dtype = ref(*cast(args, dtype, device))
    out = run_backend(op, backend, cast(args, dtype, device))
    assert out.dtype == dtype, f"{op}[{backend}] returned {out.dtype}, expected {dtype}"
    assert_within_rule(op, f"{op}[{backend}]", out, gold, same_dtype, dtype)
    return out
