"""Backends that should exist on this machine really do, with every op.

The per-op parity tests skip a backend that does not implement an op at all; this
file makes sure such a skip can never hide a missing kernel on a backend that is
meant to be complete here.
"""

import pytest
import torch

import bertfast
from bertfast.ops import dispatch, reference

from .harness import HAS_CUDA, INTERPRETED

ALL_OPS = sorted(reference.BACKEND.ops)


def test_cpu_backend_is_complete():
    assert bertfast.build_info()["native"], "bertfast._C is not built"
    backend = dispatch.get_backend("cpu")
    assert isinstance(backend, dispatch.Backend), getattr(backend, "error", backend)
    assert backend.unavailable("cpu") is None
    assert sorted(backend.ops) == ALL_OPS


def test_triton_backend_is_complete():
    pytest.importorskip("triton")
    backend = dispatch.get_backend("triton")
    assert isinstance(backend, dispatch.Backend), getattr(backend, "error", backend)
    assert sorted(backend.ops) == ALL_OPS
    if INTERPRETED:
        assert backend.unavailable("cpu") is None
    else:
        assert backend.unavailable("cpu")  # without the interpreter it must say why


def test_cuda_backend_is_complete_when_built():
    info = bertfast.build_info()
    if not info.get("cuda"):
        pytest.skip("this build has no CUDA kernels (nvcc absent or BERTFAST_SKIP_CUDA)")
    backend = dispatch.get_backend("cuda")
    assert isinstance(backend, dispatch.Backend), getattr(backend, "error", backend)
    assert sorted(backend.ops) == ALL_OPS
    if not HAS_CUDA:
        reason = backend.unavailable("cuda")
        assert reason, "without a GPU the cuda backend must say why it is unavailable"


def test_auto_prefers_native_on_cpu():
    x = torch.randn(2, 8)
    impl = dispatch.select(
        "add_layernorm",
        "auto",
        "cpu",
        torch.float32,
        (x, x, None, torch.ones(8), torch.zeros(8), 1e-12),
    )
    assert impl is dispatch.get_backend("cpu").ops["add_layernorm"]
