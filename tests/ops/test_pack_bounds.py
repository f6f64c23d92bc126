"""Out-of-range indices in pack_tokens / unpack_tokens behave the same on every
backend: the public op raises IndexError naming the value and the bound. Below the
op boundary each kernel is bounds-safe on its own: the C++ kernel raises, the
Triton and CUDA kernels never dereference such an index (a pack writes a filler
row, an unpack skips it)."""

import pytest
import torch

import bertfast.ops as ops

from .harness import HAS_CUDA, INTERPRETED

_ALL = ["torch", "cpu", "triton", pytest.param("cuda", marks=pytest.mark.gpu)]


def _device(backend):
    if backend == "cuda" or (backend == "triton" and HAS_CUDA):
        if not HAS_CUDA:
            pytest.skip("needs a CUDA GPU")
        return "cuda"
    if backend == "triton" and not INTERPRETED:
        pytest.skip("triton on CPU tensors needs TRITON_INTERPRET=1")
    return "cpu"


@pytest.mark.parametrize("backend", _ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("bad", [5, -1, 2**40])
def test_pack_rejects_out_of_range_indices(backend, dtype, bad):
    device = _device(backend)
    x = torch.arange(5 * 4, device=device).view(5, 4).to(dtype)
    idx = torch.tensor([0, bad, 2], device=device)
    with pytest.raises(IndexError, match=f"indices contains {bad}, outside \\[0, 5\\)"):
        ops.pack_tokens(x, idx, backend=backend)


@pytest.mark.parametrize("backend", _ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
@pytest.mark.parametrize("bad", [6, -3])
def test_unpack_rejects_out_of_range_indices(backend, dtype, bad):
    device = _device(backend)
    x = torch.ones(3, 4, device=device).to(dtype)
    idx = torch.tensor([0, bad, 2], device=device)
    with pytest.raises(IndexError, match=f"indices contains {bad}, outside \\[0, 6\\)"):
        ops.unpack_tokens(x, idx, 6, backend=backend)


@pytest.mark.parametrize("backend", _ALL)
def test_in_range_indices_still_work(backend):
    device = _device(backend)
    x = torch.randn(5, 4, device=device)
    idx = torch.tensor([4, 0, 2], device=device)
    assert torch.equal(ops.pack_tokens(x, idx, backend=backend), x[idx])
    back = ops.unpack_tokens(x[idx], idx, 5, backend=backend)
    assert torch.equal(back[idx], x[idx]) and (back[[1, 3]] == 0).all()


# ---------------------------------------------------------------- below the op boundary
def test_cpu_kernel_raises():
    _C = pytest.importorskip("bertfast._C")
    x = torch.randn(5, 4)
    for bad in (5, -1, 2**40):
        with pytest.raises(IndexError, match=f"index {bad} outside"):
            _C.cpu.pack_rows(x, torch.tensor([0, bad]))
        with pytest.raises(IndexError, match=f"index {bad} outside"):
            _C.cpu.unpack_rows(x[:2], torch.tensor([0, bad]), 5)


def test_triton_kernel_guards():
    if not INTERPRETED and not HAS_CUDA:
        pytest.skip("triton needs a GPU or TRITON_INTERPRET=1")
    pytest.importorskip("triton")
    from bertfast.ops.triton import pack

    device = "cuda" if HAS_CUDA else "cpu"
    x = torch.randn(5, 4, device=device)
    idx = torch.tensor([1, 5, -1, 2**40, 3], device=device)
    out = pack.pack_tokens(x, idx)
    assert torch.equal(out[[0, 4]], x[[1, 3]])
    assert out[1:4].isnan().all()  # never read: a NaN row
    back = pack.unpack_tokens(x, idx, 4)
    assert torch.equal(back[[1, 3]], x[[0, 4]])  # rows 1..3 of x had no valid target
    assert (back[[0, 2]] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_kernel_guards():
    _C = pytest.importorskip("bertfast._C")
    if not hasattr(_C, "cuda"):
        pytest.skip("this build has no CUDA kernels")
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.randn(5, 4, device="cuda")
    idx = torch.tensor([1, 5, -1, 2**40, 3], device="cuda")
    out = _C.cuda.pack_rows(x, idx, stream)
    assert torch.equal(out[[0, 4]], x[[1, 3]])
    assert (out[1:4] == 0).all()  # never read: a zero row
    back = _C.cuda.unpack_rows(x, idx, 4, stream)
    assert torch.equal(back[[1, 3]], x[[0, 4]])
    assert (back[[0, 2]] == 0).all()
