"""The CPU attention in bf16 storage, on each of its micro-kernel paths.

On a CPU with AVX512-BF16 the C++ kernel runs Q K^T and P V on ``vdpbf16ps`` (bf16
products, fp32 sums, fp32 softmax statistics, P rounded to bf16; docs/design.md);
``BERTFAST_CPU_ATTENTION_ISA=avx512`` forces the fp32-math AVX-512 kernel every
CPU without bf16 dot products runs, ``avx2`` the AVX2 one. Every case runs on each
path against the float64 reference within the bf16 parity rule of harness.py, and
the non-finite rules of test_nonfinite.py hold on each.
"""

from __future__ import annotations

import pytest
import torch

import bertfast.ops as ops
from bertfast.info import low_precision_paths, native_dot_products

from .harness import assert_parity
from .test_nonfinite import (
    KINDS,
    NH,
    D,
    _gold,
    _inject,
    _lengths,
    _mask,
    _qkv,
    _varlen_args,
    assert_same_nonfinite,
)

HAS_BF16_DOT = "avx512_bf16" in native_dot_products()["bf16"]
HAS_AMX = "amx_bf16" in native_dot_products()["bf16"]

#: native: the best path this CPU has (AMX tiles where it has amx_bf16, else vdpbf16ps
#: where it has avx512_bf16); avx512bf16: vdpbf16ps without AMX
ISAS = ["native", "avx512bf16", "avx512", "avx2"]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    if request.param == "native":
        monkeypatch.delenv("BERTFAST_CPU_ATTENTION_ISA", raising=False)
    else:
        monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", request.param)
    return request.param


def _key_mask(lengths, seqlen):
    return (torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)


# (lengths, heads, head_dim): odd and block-crossing lengths (1, 7, 129, 257; 600
# crosses the AMX path's 512-key chunk, so its softmax runs online across chunks),
# the head dims of supported models (32, 64, 80, 96, 128), an odd head dim, an
# all-masked sequence.
PADDED = [
    ([1], 2, 32),
    ([7, 3], 3, 32),
    ([129, 64, 0], 2, 64),
    ([257, 100], 1, 80),
    ([40, 33], 2, 96),
    ([130, 1], 2, 128),
    ([9, 5], 2, 33),
    ([600, 513], 1, 64),
]


@pytest.mark.parametrize("lengths,heads,head_dim", PADDED)
def test_attention_bf16_padded(isa, lengths, heads, head_dim):
    torch.manual_seed(len(lengths) * 1000 + head_dim)
    S = max(lengths)
    qkv = torch.randn(len(lengths), S, 3 * heads * head_dim)
    mask = _key_mask(lengths, S)
    out = assert_parity("attention", "cpu", (qkv, mask, heads, head_dim**-0.5), torch.bfloat16)
    assert (out[~mask.bool()] == 0).all(), "padded query rows must be zeros"


def test_attention_bf16_no_mask_large_logits(isa):
    torch.manual_seed(1)
    qkv = 4 * torch.randn(2, 150, 3 * 64)  # scores ~50: needs the running max
    assert_parity("attention", "cpu", (qkv, None, 2, 0.125), torch.bfloat16)


VARLEN = [
    ([5, 1, 129, 64], 3, 32),
    ([257, 7], 2, 64),
    ([0, 17, 130], 2, 80),
    ([1030, 31, 33], 1, 32),
]


@pytest.mark.parametrize("lengths,heads,head_dim", VARLEN)
def test_attention_bf16_varlen(isa, lengths, heads, head_dim):
    torch.manual_seed(sum(lengths))
    qkv = torch.randn(sum(lengths), 3 * heads * head_dim)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    args = (qkv, cu, max(lengths), heads, head_dim**-0.5)
    assert_parity("attention_varlen", "cpu", args, torch.bfloat16)


def test_attention_bf16_varlen_matches_padded(isa):
    """Packed and padded runs of one batch agree bit for bit (same kernel per sequence)."""
    torch.manual_seed(3)
    lengths, heads, d = [129, 7, 60], 2, 64
    S = max(lengths)
    qkv = torch.randn(len(lengths), S, 3 * heads * d).bfloat16()
    mask = _key_mask(lengths, S)
    padded = ops.attention(qkv, mask, heads, d**-0.5, backend="cpu")
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    packed = ops.attention_varlen(qkv[mask.bool()], cu, S, heads, d**-0.5, backend="cpu")
    assert torch.equal(packed, padded[mask.bool()])


@pytest.mark.skipif(not HAS_BF16_DOT, reason="this CPU has no avx512_bf16")
def test_bf16_dot_paths_are_taken(monkeypatch):
    """On an avx512_bf16 CPU the bf16 paths differ from the forced fp32-math one (P is
    rounded to bf16 before P V), within the bf16 rule of each other: the switch really
    selects another kernel; bertfast.info names the path taken."""
    torch.manual_seed(4)
    qkv = torch.randn(2, 100, 3 * 128).bfloat16()
    runs = {}
    for isa in ("native", "avx512bf16", "avx512"):
        if isa == "native":
            monkeypatch.delenv("BERTFAST_CPU_ATTENTION_ISA", raising=False)
        else:
            monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", isa)
        runs[isa] = ops.attention(qkv, None, 2, 0.125, backend="cpu")
        path = low_precision_paths()["bf16_attention"]
        if isa == "avx512":
            assert path.startswith("fp32 math") and "ISA=avx512" in path
        elif isa == "avx512bf16" or not HAS_AMX:
            assert path.startswith("vdpbf16ps")
        else:
            assert path.startswith("AMX")
    for isa in ("native", "avx512bf16"):
        assert not torch.equal(runs[isa], runs["avx512"])
        assert (runs[isa].float() - runs["avx512"].float()).abs().max().item() < 3e-2


@pytest.mark.parametrize("kind", KINDS)
def test_attention_bf16_nonfinite(isa, kind):
    """NaN / inf propagate as in torch, fully masked sequences and padded rows are zeros."""
    qkv = _inject(kind, _qkv()).bfloat16()
    args = (qkv, _mask(_lengths()), NH, D**-0.5)
    out = ops.attention(*args, backend="cpu")
    assert out.dtype == torch.bfloat16
    assert_same_nonfinite(out, _gold("attention", args), 3e-2, f"attention[{isa}, {kind}]")
    assert (out[2] == 0).all() and (out[1, 150:] == 0).all()
    vargs = _varlen_args(qkv, _lengths(), D**-0.5)
    vout = ops.attention_varlen(*vargs, backend="cpu")
    gold = _gold("attention_varlen", vargs)
    assert_same_nonfinite(vout, gold, 3e-2, f"attention_varlen[{isa}, {kind}]")


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_attention_bf16_nonfinite_scale(isa, scale):
    qkv = _qkv()
    H = NH * D
    qkv[:, :, :H] = qkv[:, :, :H].abs() + 0.1
    qkv = qkv.bfloat16()
    args = (qkv, _mask(_lengths()), NH, scale)
    out = ops.attention(*args, backend="cpu")
    assert torch.equal(torch.isnan(out), torch.isnan(_gold("attention", args)))
    assert (out[2] == 0).all() and (out[1, 150:] == 0).all()


@pytest.mark.parametrize("scale", [0.0, -0.3, 1e-30])
def test_attention_bf16_any_finite_scale(isa, scale):
    """A zero, negative or tiny scale is applied to the scores before the key mask, so
    keys past a sequence's end (a length off a multiple of 32) stay out of the softmax:
    scale 0 is a plain mean over the real keys' V."""
    torch.manual_seed(11)
    lengths, heads, d = [37, 5, 64], 2, 32
    qkv = torch.randn(sum(lengths), 3 * heads * d)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    args = (qkv, cu, max(lengths), heads, scale)
    assert_parity("attention_varlen", "cpu", args, torch.bfloat16)
    if scale == 0.0:
        out = ops.attention_varlen(qkv.bfloat16(), cu, max(lengths), heads, scale, backend="cpu")
        v = qkv.bfloat16().float()[:, 2 * heads * d :]
        for b, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            mean = v[b:e].mean(0, keepdim=True).expand(e - b, -1)
            torch.testing.assert_close(out[b:e].float(), mean, atol=2e-2, rtol=2e-2)


def _halfway(x: torch.Tensor, share: float, g: torch.Generator) -> torch.Tensor:
    """``x`` with about ``share`` of its values moved to exactly halfway between two
    bf16 neighbours (the low 16 bits 0x8000), where round-to-nearest-even decides."""
    half = ((x.view(torch.int32) & ~0xFFFF) | 0x8000).view(torch.float32)
    return torch.where(torch.rand(x.shape, generator=g) < share, half, x)


@pytest.mark.parametrize("lengths", [[1], [16], [5, 17, 0, 3], [130]])
def test_attention_varlen_bf16_is_attention_on_the_bf16_cast(isa, lengths):
    """``_C.cpu.attention_varlen_bf16`` (an int8 model's attention, one call and op by
    op): attention_varlen on torch's bf16 cast of the fp32 qkv, widened back by torch,
    bit for bit; a quarter of the values sit exactly halfway between two bf16
    numbers, where both must round to even; a NaN stays in its sequence."""
    from bertfast import _C

    heads, d = 2, 32
    g = torch.Generator().manual_seed(sum(lengths))
    qkv = _halfway(torch.randn(sum(lengths), 3 * heads * d, generator=g), 0.25, g)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    args = (cu, max(lengths), heads, d**-0.5)
    want = _C.cpu.attention_varlen(qkv.to(torch.bfloat16), *args).to(torch.float32)
    got = _C.cpu.attention_varlen_bf16(qkv, *args)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    qkv[0, 0] = float("nan")  # a query of the first sequence's first head
    want = _C.cpu.attention_varlen(qkv.to(torch.bfloat16), *args).to(torch.float32)
    got = _C.cpu.attention_varlen_bf16(qkv, *args)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert got[0, :d].isnan().all() and not got[lengths[0] :].isnan().any()
