"""The int8 CPU kernels (kernels/cpu/qgemm.cpp) against independent torch references.

- quantize_rows vs the formulas of kernels/cpu/qgemm.h written in torch (bit-exact);
- qgemm_s32: int32 accumulators bit for bit vs an int64 matmul of the same uint8 /
  int8 values, on both micro-kernels (VNNI where the CPU has it, and the AVX2
  fallback forced), odd M / N / K (K not a multiple of 4 or 64, N not a multiple
  of the 64-column panel);
- qlinear: fp32 output vs the dequantized reference in float64 (tight) and vs the
  fp32 linear (within an int8 tolerance), every activation; NaN / inf rows;
- argument checks.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

try:
    from bertfast import _C

    _K = _C.cpu if hasattr(_C.cpu, "qlinear") else None
except ImportError:  # pragma: no cover
    _K = None

pytestmark = pytest.mark.skipif(_K is None, reason="bertfast._C int8 kernels are not built")


def _isas():
    """Every micro-kernel this CPU can run (avx2 always; vnni, amx where present)."""
    out = ["avx2"]
    for isa in ("vnni", "amx"):
        try:
            out.append(_K.int8_isa(isa))
        except ValueError:  # pragma: no cover - CPUs without them
            pass
    return out


ISAS = _isas() if _K is not None else ["avx2"]

SHAPES = [  # (M, N, K)
    (3, 5, 0),
    (1, 1, 1),
    (5, 7, 3),
    (7, 65, 37),
    (13, 130, 64),
    (49, 64, 129),
    (6, 200, 96),
    (50, 129, 250),
    (97, 191, 383),
    # K % 64 == 0: the AMX tiles (other K run VNNI under isa="amx")
    (1, 5, 64),
    (17, 70, 128),
    (48, 64, 192),
    (33, 191, 384),
    (65, 130, 1536),
    # AMX: tasks of 256 rows in 16-row groups per 32-column half (a last group of
    # 1..15 rows), a task of 1..16 rows (1 x 4 tiles), a last panel of 32 columns
    (300, 130, 128),
    (529, 64, 64),
    (272, 96, 192),
    (16, 160, 320),
]


def _quantize_rows_ref(x: torch.Tensor):
    """kernels/cpu/qgemm.h's per-row asymmetric uint8 quantization, in torch (fp32)."""
    lo = torch.clamp(x.amin(dim=1), max=0.0) if x.shape[1] else x.new_zeros(len(x))
    hi = torch.clamp(x.amax(dim=1), min=0.0) if x.shape[1] else x.new_zeros(len(x))
    scale = hi / 255.0 - lo / 255.0
    scale = torch.clamp(scale, min=2.0**-100)
    inv = 1.0 / scale
    zp = torch.round(-lo * inv).clamp(0, 255)
    q = torch.round(x * inv[:, None])
    q = torch.minimum(torch.maximum(q, -zp[:, None]), 255 - zp[:, None]) + zp[:, None]
    return q.to(torch.uint8), scale, zp.to(torch.int32)


def _quantize_weight_ref(w: torch.Tensor):
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("M,K", [(1, 1), (3, 7), (17, 64), (33, 385), (8, 1536)])
def test_quantize_rows_matches_formula(M, K):
    x = _rand(M, K, seed=M + K) * 3.0
    x[0] = x[0].abs()  # a row with no negative value: zero point 0
    if M > 2:
        x[1] = 0.0  # all zero
        x[2] = -x[2].abs()  # no positive value: zero point 255
    q, scale, zp = _K.quantize_rows(x)
    rq, rscale, rzp = _quantize_rows_ref(x)
    torch.testing.assert_close(scale, rscale, rtol=0, atol=0)
    torch.testing.assert_close(zp, rzp, rtol=0, atol=0)
    torch.testing.assert_close(q, rq, rtol=0, atol=0)
    # and it is a quantization: dequantized within half a step
    deq = (q.double() - zp[:, None].double()) * scale[:, None].double()
    assert ((deq - x.double()).abs() <= scale[:, None].double() * 0.5 + 1e-6).all()


def test_quantize_rows_leading_dims_and_nonfinite():
    x = _rand(2, 3, 20)
    x[0, 1, 4] = float("nan")
    x[1, 2, 0] = float("inf")
    x[1, 0, 3] = -float("inf")
    q, scale, zp = _K.quantize_rows(x)
    assert q.shape == (2, 3, 20) and scale.shape == (2, 3) and zp.shape == (2, 3)
    bad = torch.tensor([[False, True, False], [True, False, True]])
    assert torch.isnan(scale[bad]).all()
    assert torch.isfinite(scale[~bad]).all()


def _packed(w_q):
    packed, colsum = _K.qgemm_pack(w_q)
    return packed, colsum


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_qgemm_s32_bit_exact(isa, M, N, K):
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    a = torch.randint(0, 256, (M, K), generator=g, dtype=torch.int32).to(torch.uint8)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int32).to(torch.int8)
    # extremes too: the largest products of both signs
    a[0, : min(K, 5)] = 255
    w[0, : min(K, 3)] = -127
    packed, colsum = _packed(w)
    out = _K.qgemm_s32(a, packed, N, isa)
    ref = a.to(torch.int64) @ w.to(torch.int64).T
    assert out.dtype == torch.int32
    assert torch.equal(out.to(torch.int64), ref)
    assert torch.equal(colsum[:N].to(torch.int64), w.to(torch.int64).sum(dim=1))
    assert torch.equal(colsum[N:], torch.zeros_like(colsum[N:]))


def test_qgemm_s32_largest_sums_exact():
    # every product 255 * 127 (or -127) over a long K: the int32 range is what it needs
    M, N, K = 3, 5, 4099
    a = torch.full((M, K), 255, dtype=torch.uint8)
    w = torch.full((N, K), 127, dtype=torch.int8)
    w[1] = -127
    packed, _ = _packed(w)
    for isa in ISAS:
        out = _K.qgemm_s32(a, packed, N, isa)
        ref = a.to(torch.int64) @ w.to(torch.int64).T
        assert torch.equal(out.to(torch.int64), ref), isa


def test_isas_agree_and_env_var_forces_fallback():
    code = (
        "import torch; from bertfast import _C; "
        "print(_C.cpu.int8_isa(None)); "
        "a = torch.randint(0, 256, (9, 70), dtype=torch.int32).to(torch.uint8); "
        "w = torch.randint(-127, 128, (77, 70), dtype=torch.int32).to(torch.int8); "
        "p, c = _C.cpu.qgemm_pack(w); "
        "print(torch.equal(_C.cpu.qgemm_s32(a, p, 77).long(), a.long() @ w.long().T))"
    )
    env = dict(os.environ, BERTFAST_CPU_INT8_ISA="avx2")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["avx2", "True"]
    env["BERTFAST_CPU_INT8_ISA"] = "sse9"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "BERTFAST_CPU_INT8_ISA='sse9'" in res.stderr


def _dequant_ref(x, w, bias, act):
    """float64 reference of qlinear from the same quantized values."""
    q, sx, zp = _quantize_rows_ref(x)
    wq, sw = _quantize_weight_ref(w)
    acc = (q.double() - zp[:, None].double()) @ wq.double().T
    y = acc * sx[:, None].double() * sw[None, :].double()
    if bias is not None:
        y = y + bias.double()
    return _act(y, act)


def _act(y, act):
    if act == "gelu":
        return F.gelu(y)
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if act == "relu":
        return F.relu(y)
    return y


def _qweight(w):
    wq, sw = _quantize_weight_ref(w)
    packed, colsum = _packed(wq)
    return packed, colsum, sw


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize(
    "M,N,K", [(1, 3, 5), (7, 65, 37), (50, 129, 250), (33, 384, 384), (100, 70, 128)]
)
def test_qlinear_vs_dequantized_and_fp32(isa, act, M, N, K):
    x = _rand(M, K, seed=1) * 2.0
    w = _rand(N, K, seed=2) / K**0.5
    b = _rand(N, seed=3)
    packed, colsum, sw = _qweight(w)
    out = _K.qlinear(x, packed, colsum, sw, b, act, isa)
    ref = _dequant_ref(x, w, b, act)
    # tight: the same quantized values, fp32 epilogue rounding only
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # and close to fp32 within int8 error: relative to the output scale
    fp32 = _act(F.linear(x, w, b), act)
    err = (out - fp32).abs().max().item()
    assert err <= 0.05 * fp32.abs().max().item() + 1e-3, err
    if M > 1 and N > 1:
        cos = F.cosine_similarity(out.flatten(), fp32.flatten(), dim=0).item()
        assert cos > 0.999, cos


def _split_ref(x, w, bias, act):
    """float64 reference of qlinear(split=True): x's uint8 rows plus what they miss
    (r = x - (q - zp) * scale in fp32, quantized per row in turn), same weights."""
    q, sx, zp = _quantize_rows_ref(x)
    r = x - (q.float() - zp[:, None].float()) * sx[:, None]
    y = _dequant_ref(x, w, None, None) + _dequant_ref(r, w, bias, None)
    return _act(y, act)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("act", [None, "gelu"])
@pytest.mark.parametrize("M,N,K", [(1, 3, 5), (7, 65, 37), (33, 130, 128), (300, 70, 64)])
def test_qlinear_split_vs_reference(isa, act, M, N, K):
    x = _rand(M, K, seed=11) * 3.0
    x[0, 0] = 40.0  # one large value: the first part's scale is coarse
    w = _rand(N, K, seed=12) / K**0.5
    b = _rand(N, seed=13)
    packed, colsum, sw = _qweight(w)
    out = _K.qlinear(x, packed, colsum, sw, b, act, isa, True)
    ref = _split_ref(x, w, b, act)
    # r may round differently in its last bit (the kernel may fuse its multiply-add),
    # moving one second-part value by one step (scale / 255): atol covers that step
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-4)
    # two parts: much closer to the fp32 linear (same weights) than one
    wd = _quantize_weight_ref(w)
    wdeq = wd[0].float() * wd[1][:, None]
    exact = _act(F.linear(x.double(), wdeq.double(), b.double()), act)
    one = _K.qlinear(x, packed, colsum, sw, b, act, isa)
    assert (out.double() - exact).abs().max() < (one.double() - exact).abs().max() / 20


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_split_nonfinite_rows_are_nan(isa):
    x = _rand(5, 64, seed=14)
    x[2, 7] = float("nan")
    x[3, 1] = float("-inf")
    w = _rand(40, 64, seed=15)
    packed, colsum, sw = _qweight(w)
    out = _K.qlinear(x, packed, colsum, sw, None, None, isa, True)
    assert torch.isnan(out[[2, 3]]).all()
    good = [0, 1, 4]
    ref = _split_ref(x[good], w, None, None)
    torch.testing.assert_close(out[good].double(), ref, rtol=1e-5, atol=2e-4)


def test_qlinear_reused_output_buffers_are_independent():
    """Outputs from 1 MiB come from a cache of freed buffers: a live output is never
    handed out again, a reused buffer is fully overwritten."""
    x1, x2 = _rand(512, 64, seed=16), _rand(512, 64, seed=17)
    w = _rand(640, 64, seed=18)
    packed, colsum, sw = _qweight(w)
    ref1, ref2 = _dequant_ref(x1, w, None, None), _dequant_ref(x2, w, None, None)
    out1 = _K.qlinear(x1, packed, colsum, sw, None)
    out2 = _K.qlinear(x2, packed, colsum, sw, None)
    assert out1.data_ptr() != out2.data_ptr()
    torch.testing.assert_close(out1.double(), ref1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2.double(), ref2, rtol=1e-5, atol=1e-5)
    out1.fill_(float("nan"))
    del out1
    for _ in range(3):  # the freed buffer comes back, NaN-filled: every value rewritten
        out3 = _K.qlinear(x1, packed, colsum, sw, None)
        torch.testing.assert_close(out3.double(), ref1, rtol=1e-5, atol=1e-5)
        out3.fill_(float("nan"))
        del out3
    torch.testing.assert_close(out2.double(), ref2, rtol=1e-5, atol=1e-5)


def test_qlinear_no_bias_leading_dims_and_k0():
    x = _rand(2, 3, 40, seed=5)
    w = _rand(17, 40, seed=6)
    packed, colsum, sw = _qweight(w)
    out = _K.qlinear(x, packed, colsum, sw, None, None)
    assert out.shape == (2, 3, 17)
    ref = _dequant_ref(x.reshape(6, 40), w, None, None).reshape(2, 3, 17)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # K == 0: act(bias)
    w0 = torch.zeros(4, 0, dtype=torch.int8)
    p0, c0 = _K.qgemm_pack(w0)
    b = torch.tensor([1.0, -2.0, 0.5, 0.0])
    out = _K.qlinear(torch.zeros(3, 0), p0, c0, torch.ones(4), b, "relu")
    torch.testing.assert_close(out, F.relu(b).expand(3, 4))


@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_nonfinite_rows_are_nan(isa):
    x = _rand(6, 50, seed=7)
    x[1, 3] = float("nan")
    x[4, 0] = float("inf")
    w = _rand(70, 50, seed=8)
    packed, colsum, sw = _qweight(w)
    out = _K.qlinear(x, packed, colsum, sw, _rand(70, seed=9), "gelu", isa)
    assert torch.isnan(out[[1, 4]]).all()
    good = [0, 2, 3, 5]
    assert torch.isfinite(out[good]).all()
    ref = _dequant_ref(x[good], w, _rand(70, seed=9), "gelu")
    torch.testing.assert_close(out[good].double(), ref, rtol=1e-5, atol=1e-5)


def test_qlinear_huge_and_tiny_rows():
    x = torch.stack([torch.full((16,), 3e38), torch.full((16,), -3e38), torch.full((16,), 1e-40)])
    x[0, 0] = -3e38
    w = _rand(5, 16, seed=10)
    packed, colsum, sw = _qweight(w)
    out = _K.qlinear(x, packed, colsum, sw, None, None)
    assert not torch.isnan(out[2]).any() and out[2].abs().max() < 1e-30


def test_argument_checks():
    w = torch.randint(-127, 128, (10, 12), dtype=torch.int32).to(torch.int8)
    packed, colsum = _K.qgemm_pack(w)
    sw = torch.ones(10)
    x = torch.randn(3, 12)
    with pytest.raises(TypeError, match="qgemm_pack: weight has dtype Float"):
        _K.qgemm_pack(w.float())
    with pytest.raises(ValueError, match="qgemm_pack: the reduction size K=70000"):
        _K.qgemm_pack(torch.zeros(1, 70000, dtype=torch.int8))
    with pytest.raises(ValueError, match="qlinear: packed has size 3 in dim 1"):
        _K.qlinear(torch.randn(3, 16), packed, colsum, sw, None, None)
    with pytest.raises(ValueError, match="qlinear: packed has size 1 in dim 0"):
        _K.qlinear(x, packed, colsum, torch.ones(100), None, None)
    with pytest.raises(ValueError, match="qlinear: colsum has size"):
        _K.qlinear(x, packed, colsum[:10], sw, None, None)
    with pytest.raises(ValueError, match="qlinear: bias has size 9"):
        _K.qlinear(x, packed, colsum, sw, torch.ones(9), None)
    with pytest.raises(TypeError, match="qlinear: x has dtype Double"):
        _K.qlinear(x.double(), packed, colsum, sw, None, None)
    with pytest.raises(ValueError, match="qlinear: unknown activation 'swish'"):
        _K.qlinear(x, packed, colsum, sw, None, "swish")
    with pytest.raises(ValueError, match="qlinear: x must be contiguous"):
        _K.qlinear(torch.randn(12, 3).T, packed, colsum, sw, None, None)
    with pytest.raises(ValueError, match="isa='neon' is not one of auto, amx, vnni, avx2"):
        _K.qlinear(x, packed, colsum, sw, None, None, "neon")
    with pytest.raises(TypeError, match="qgemm_s32: q has dtype Char"):
        _K.qgemm_s32(w, packed, 10)
    with pytest.raises(ValueError, match="qgemm_s32: out_features must be >= 0"):
        _K.qgemm_s32(x.to(torch.uint8), packed, -1)
    with pytest.raises(TypeError, match="quantize_rows: x has dtype Half"):
        _K.quantize_rows(x.half())
    if "vnni" not in ISAS:  # pragma: no cover - CPUs without AVX512-VNNI
        with pytest.raises(ValueError, match="no AVX512-VNNI"):
            _K.int8_isa("vnni")
