"""attention (padded, key-padding mask) and attention_varlen (packed, cu_seqlens)."""

import pytest
import torch

import bertfast.ops as ops

from .harness import BACKENDS, DTYPES, assert_parity, device_for, run_backend


def _mask(lengths, seqlen):
    return (torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)


# (lengths, heads, head_dim): ragged, batch 1, sequence 1, head_dim 32/64/80/96/128,
# an all-masked row.
PADDED_CASES = [
    ([64, 37], 3, 32),
    ([1], 2, 80),
    ([17, 0, 5], 4, 80),
    ([9, 16, 3, 16], 2, 64),
    ([20, 11], 2, 96),
    ([12], 1, 128),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths,heads,head_dim", PADDED_CASES)
def test_attention_padded(backend, dtype, lengths, heads, head_dim):
    S = max(max(lengths), 1)
    B, H = len(lengths), heads * head_dim
    qkv = torch.randn(B, S, 3 * H)
    mask = _mask(lengths, S)
    out = assert_parity("attention", backend, (qkv, mask, heads, head_dim**-0.5), dtype)
    # Padded query rows (and every row of an all-masked sequence) are exactly zero.
    pad = ~mask.bool().to(out.device)
    assert (out[pad] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_no_mask(backend, dtype):
    qkv = torch.randn(2, 24, 3 * 64)
    assert_parity("attention", backend, (qkv, None, 2, 0.125), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_large_logits(backend, dtype):
    # Scores of magnitude ~50: an unstabilised softmax overflows in fp16/fp32.
    qkv = 4 * torch.randn(2, 16, 3 * 64)
    mask = _mask([16, 9], 16)
    assert_parity("attention", backend, (qkv, mask, 2, 0.125), dtype)


VARLEN_CASES = [
    ([5, 1, 17, 64], 3, 32),
    ([1], 2, 80),
    ([7, 0, 12], 4, 80),
    ([33, 2], 2, 64),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths,heads,head_dim", VARLEN_CASES)
def test_attention_varlen(backend, dtype, lengths, heads, head_dim):
    T, H = sum(lengths), heads * head_dim
    qkv = torch.randn(T, 3 * H)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    assert_parity(
        "attention_varlen", backend, (qkv, cu, max(lengths), heads, head_dim**-0.5), dtype
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_varlen_matches_padded(backend):
    """Packed and padded execution of the same batch agree (batch invariance)."""
    device = device_for(backend)
    lengths, heads, d = [9, 3, 14], 2, 32
    S, B, H = 14, 3, heads * d
    qkv = torch.randn(B, S, 3 * H, device=device)
    mask = _mask(lengths, S).to(device)
    info = ops.pack_info(mask)
    packed = ops.pack_tokens(qkv.view(B * S, 3 * H), info.indices)
    out_var = run_backend(
        "attention_varlen", backend, (packed, info.cu_seqlens, info.max_seqlen, heads, d**-0.5)
    )
    out_pad = run_backend("attention", backend, (qkv, mask, heads, d**-0.5))
    back = ops.unpack_tokens(out_var, info.indices, B * S).view(B, S, H)
    torch.testing.assert_close(back, out_pad, atol=1e-5, rtol=1e-5)
    # A sequence alone gives what it gives inside the batch.
    alone = run_backend(
        "attention_varlen",
        backend,
        (packed[9:12], torch.tensor([0, 3], dtype=torch.int32, device=device), 3, heads, d**-0.5),
    )
    torch.testing.assert_close(alone, out_var[9:12], atol=1e-6, rtol=1e-5)


def test_attention_rejects_bad_shapes():
    qkv = torch.randn(2, 5, 3 * 96)
    with pytest.raises(ValueError, match="attention_mask shape"):
        ops.attention(qkv, torch.ones(2, 4), 3)
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        ops.attention(qkv, None, 5)
    with pytest.raises(ValueError, match="cu_seqlens must rise"):
        ops.attention_varlen(
            torch.randn(6, 3 * 96), torch.tensor([0, 4, 5], dtype=torch.int32), 4, 3
        )
    with pytest.raises(TypeError, match="int32"):
        ops.attention_varlen(torch.randn(6, 3 * 96), torch.tensor([0, 6]), 6, 3)


# The CPU fp32-math kernel takes a group of query rows at once, one per vector lane
# (32 with AVX-512, 16 with AVX2), scores KJ keys per micro-tile (8 / 4) and runs the
# online softmax over blocks of 128 keys. Lengths on either side of each of these,
# 1, odd lengths and odd head dims, ragged batches; both instruction sets forced.
BLOCKING_LENGTHS = [
    [1],
    [15, 16, 17],
    [31, 32, 33],
    [7, 9, 3, 4, 5],
    [127, 128],
    [129],
    [257, 40],
]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("head_dim", [32, 64, 5])
@pytest.mark.parametrize("lengths", BLOCKING_LENGTHS, ids=str)
def test_attention_cpu_fp32_blocking_edges(monkeypatch, isa, head_dim, lengths):
    monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", isa)
    heads = 2
    T, H = sum(lengths), heads * head_dim
    qkv = torch.randn(T, 3 * H)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    scale = head_dim**-0.5
    assert_parity("attention_varlen", "cpu", (qkv, cu, max(lengths), heads, scale), torch.float32)
    # The same batch padded, with a key-padding mask (masked keys are left out).
    S = max(lengths)
    padded = torch.zeros(len(lengths), S, 3 * H)
    for b, n in enumerate(lengths):
        padded[b, :n] = qkv[cu[b] : cu[b + 1]]
    mask = _mask(lengths, S)
    out = assert_parity("attention", "cpu", (padded, mask, heads, scale), torch.float32)
    assert (out[~mask.bool()] == 0).all()
