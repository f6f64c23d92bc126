"""pack_tokens / unpack_tokens and pack_info (padding-free execution helpers)."""

import pytest
import torch

import bertfast.ops as ops

from .harness import BACKENDS, DTYPES, assert_parity, cast, device_for, run_backend


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [96, 1023, 1])
def test_pack_unpack(backend, dtype, width):
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]])
    info = ops.pack_info(mask)
    x = torch.randn(mask.numel(), width)
    packed = assert_parity("pack_tokens", backend, (x, info.indices), dtype)
    back = assert_parity(
        "unpack_tokens", backend, (packed.float().cpu(), info.indices, mask.numel()), dtype
    )
    keep = mask.flatten().bool().to(back.device)
    assert (back[~keep] == 0).all()
    torch.testing.assert_close(back[keep].float().cpu(), cast((x,), dtype)[0][keep.cpu()].float())


def test_pack_info():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 1, 1]])
    info = ops.pack_info(mask)
    assert info.indices.tolist() == [0, 1, 6, 7, 8, 10, 11]
    assert info.cu_seqlens.tolist() == [0, 2, 2, 5, 7]
    assert info.cu_seqlens.dtype == torch.int32
    assert info.max_seqlen == 3 and info.total_tokens == 7
    assert info.lengths.tolist() == [2, 0, 3, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpack_rejects_out_of_range_indices(backend):
    device = device_for(backend)
    x = torch.randn(3, 8, device=device)
    with pytest.raises(IndexError, match="indices contains 6"):
        run_backend("unpack_tokens", backend, (x, torch.tensor([0, 2, 6], device=device), 6))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pack_unpack_integer_ids(backend):
    device = device_for(backend)
    ids = torch.arange(12, device=device).view(12)
    index = torch.tensor([1, 4, 11], device=device)
    packed = run_backend("pack_tokens", backend, (ids, index))
    assert packed.tolist() == [1, 4, 11]
    back = run_backend("unpack_tokens", backend, (packed, index, 12))
    assert back.tolist() == [0, 1, 0, 0, 4, 0, 0, 0, 0, 0, 0, 11]
