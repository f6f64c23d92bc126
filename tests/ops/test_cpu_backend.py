"""CPU-backend specific tests (the per-op parity tests live in tests/ops/test_<op>.py).

What only the C++ kernels can get wrong: results that depend on the thread count,
the in-place variant aliasing its input, odd widths (1023, 1500) and head dims
(80, 17), a large common offset in LayerNorm inputs, sequence length 1, rows with
no real key, the fp16 / bf16 conversions (bit-exact against torch's rounding),
the vectorised erf / exp against float64 (and the bf16 result's GELU on every bf16
input), out-of-range ids.

Every accuracy check applies the one parity rule of ``harness.py`` (float64 gold,
2x the reference's own error in the same dtype + the per-op ``ATOL`` table); the
schema / fake-tensor check (opcheck) of every op and backend is test_opcheck.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import bertfast.ops as ops
from bertfast.ops import reference
from bertfast.ops.dispatch import get_backend

from .harness import assert_parity, assert_within_rule

cpu_backend = get_backend("cpu")
pytestmark = pytest.mark.skipif(
    cpu_backend.unavailable("cpu") is not None if hasattr(cpu_backend, "unavailable") else True,
    reason="bertfast._C CPU kernels are not built",
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


# ---------------------------------------------------------------- threading
def _all_ops_once(g):
    x = torch.randn(67, 1500, generator=g)
    r = torch.randn(67, 1500, generator=g)
    w, b, bias = (torch.randn(1500, generator=g) for _ in range(3))
    qkv = torch.randn(3, 45, 3 * 4 * 80, generator=g)
    mask = torch.ones(3, 45, dtype=torch.long)
    mask[1, 30:] = 0
    mask[2] = 0
    cu = torch.tensor([0, 45, 46, 100], dtype=torch.int32)
    vq = torch.randn(100, 3 * 2 * 64, generator=g)
    ids = torch.randint(0, 50, (4, 33), generator=g)
    pos = torch.arange(33).expand(4, 33)
    words, posemb = torch.randn(50, 1500, generator=g), torch.randn(40, 1500, generator=g)
    return [
        ops.add_layernorm(x, r, bias, w, b, backend="cpu"),
        ops.bias_gelu(x, bias, backend="cpu"),
        ops.bias_gelu(x, bias, "gelu_tanh", backend="cpu"),
        ops.attention(qkv, mask, 4, backend="cpu"),
        ops.attention_varlen(vq, cu, 54, 2, backend="cpu"),
        ops.embed_layernorm(ids, pos, None, words, posemb, None, w, b, backend="cpu"),
    ]


def test_results_independent_of_thread_count():
    with _threads(1):
        one = _all_ops_once(_gen(1))
    with _threads(max(2, torch.get_num_threads())):
        many = _all_ops_once(_gen(1))
    with _threads(7):  # more threads than rows / tasks in places
        seven = _all_ops_once(_gen(1))
    for a, b, c in zip(one, many, seven):
        assert torch.equal(a, b)
        assert torch.equal(a, c)


# ---------------------------------------------------------------- bias + activation
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_gelu_inplace_matches_out_of_place(act, dtype):
    g = _gen(2)
    x = (torch.randn(33, 1023, generator=g) * 3).to(dtype)
    b = torch.randn(1023, generator=g).to(dtype)
    expected = ops.bias_gelu(x, b, act, backend="cpu")
    y = x.clone()
    out = ops.bias_gelu_(y, b, act, backend="cpu")
    assert out is y
    assert torch.equal(y, expected)
    # a non-contiguous view is updated through its strides
    z = x.clone().t().contiguous().t()
    ops.bias_gelu_(z, b, act, backend="cpu")
    assert torch.equal(z, expected)


def test_gelu_erf_accuracy_against_float64():
    # Dense sweep over the whole range where GELU is not trivially 0 or x.
    x = torch.linspace(-12, 12, 400_001, dtype=torch.float32)
    gold = F.gelu(x.double())
    ours = assert_parity("bias_gelu", "cpu", (x, None, "gelu"), torch.float32)
    # Relative accuracy where the output is tiny (x << 0): erfc is evaluated
    # directly there (torch's fp32 GELU computes 1 + erf and loses it all by x = -5).
    for lo, hi, bound in ((-5.0, -1.0, 1e-5), (-7.0, -5.0, 1e-4)):
        m = (x > lo) & (x < hi)
        rel = (ours[m].double() - gold[m]).abs() / gold[m].abs()
        assert rel.max().item() < bound, (lo, hi, rel.max().item())


def test_gelu_erf_bf16_every_input_against_float64():
    # bias_gelu on bf16 rounds its result to bf16, and its erf GELU is the one made for
    # that rounding (gelu_erf_bf16 in kernels/cpu/common.h, relative error <= 1.6e-5):
    # on every bf16 input, the output is the correctly rounded float64 GELU or a
    # neighbour of it, and a neighbour only rarely (near a rounding boundary).
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x[torch.isfinite(x)]
    ours = ops.bias_gelu(x, None, "gelu", backend="cpu")
    xd = x.double()  # x Phi(x) by erfc: F.gelu in float64 (1 + erf) loses the far tail
    gold = 0.5 * xd * torch.special.erfc(-xd / 2.0**0.5)
    nearest = gold.float().to(torch.bfloat16)
    # Far left (x < -7.78) gelu_erf_bf16 gives 0 where |gold| < 4e-15 |x|.
    flushed = x.double() < -7.78
    assert (ours[flushed] == 0).all() and (gold[flushed].abs() <= 4e-15 * x[flushed].abs()).all()
    keep = ~flushed
    ours, gold, nearest = ours[keep], gold[keep], nearest[keep]
    ulp = (nearest.double().abs() * 2.0**-7).clamp_min(2.0**-133)  # >= one bf16 unit
    assert ((ours.double() - gold).abs() <= ulp).all()
    same = ours.view(torch.int16) == nearest.view(torch.int16)
    assert (~same).sum().item() <= 0.002 * same.numel(), (~same).sum().item()
    # Special values as the fp32 kernel: +inf stays +inf, -inf and NaN give NaN.
    special = torch.tensor([float("inf"), -float("inf"), float("nan")], dtype=torch.bfloat16)
    out = ops.bias_gelu(special, None, "gelu", backend="cpu")
    assert out[0] == float("inf") and out[1:].isnan().all()


def test_gelu_tanh_accuracy_against_float64():
    x = torch.linspace(-12, 12, 400_001, dtype=torch.float32)
    assert_parity("bias_gelu", "cpu", (x, None, "gelu_tanh"), torch.float32)


def test_activation_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e30, -1e30, 3e-39])
    for act in ("gelu", "gelu_tanh", "relu"):
        ours = ops.bias_gelu(x, None, act, backend="cpu")
        ref = reference.bias_gelu(x, None, act)
        if act == "gelu":  # torch's erf GELU gives NaN at +inf; the limit (inf) is kept
            assert ours[2] == float("inf")
            ours, ref = ours[3:], ref[3:]
        torch.testing.assert_close(ours, ref, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_conversions_bit_exact(dtype):
    # relu(x + b) with fp32 math: the only rounding is the final fp32 -> dtype, which
    # must match torch bit for bit (round to nearest even, subnormals, overflow, NaN).
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    every = bits.view(dtype)  # every 16-bit pattern
    shift = torch.tensor([0.0, 1.0, -0.5, 3.0e-5, 65504.0, 2.0**-24], dtype=torch.float32)
    for s in shift.to(dtype):
        b = s.expand(every.shape[0]).contiguous()
        x = every.view(1, -1)
        ours = ops.bias_gelu(x, b, "relu", backend="cpu")
        ref = reference.bias_gelu(x, b, "relu")
        same = (ours.view(torch.int16) == ref.view(torch.int16)) | (ours.isnan() & ref.isnan())
        bad = ~same[0]
        assert bool(same.all()), (s, x[0][bad][:5], ours[0][bad][:5], ref[0][bad][:5])


# ---------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("hidden", [1, 7, 384, 1023, 1500])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_add_layernorm_widths_and_large_offset(hidden, offset):
    g = _gen(3)
    x = torch.randn(37, hidden, generator=g) + offset
    r = torch.randn(37, hidden, generator=g)
    bias, w, b = (torch.randn(hidden, generator=g) for _ in range(3))
    assert_parity("add_layernorm", "cpu", (x, r, bias, w, b, 1e-12), torch.float32)


def test_layernorm_variance_is_stable_under_offset():
    # Rows = offset + small signal: a one-pass E[x^2] - E[x]^2 in fp32 would lose
    # the signal entirely at 1e4 (variance 1e-2 next to 1e8).
    g = _gen(4)
    sig = torch.randn(16, 1024, generator=g, dtype=torch.float64) * 0.1
    x = (sig + 1e4).float()
    zeros = torch.zeros(16, 1024)
    w, b = torch.ones(1024), torch.zeros(1024)
    assert_parity("add_layernorm", "cpu", (x, zeros, None, w, b, 1e-12), torch.float32)


def test_embed_layernorm_out_of_range_ids_give_nan_rows():
    # checks.py rejects these before the kernel; the kernel itself must still be safe.
    from bertfast import _C

    words, pos = torch.randn(10, 16), torch.randn(8, 16)
    w, b = torch.ones(16), torch.zeros(16)
    ids = torch.tensor([1, 10, -1, 3])
    pids = torch.tensor([0, 1, 2, 8])
    out = _C.cpu.embed_layernorm(ids, pids, None, words, pos, None, w, b, 1e-12)
    assert not out[0].isnan().any()
    assert out[1:].isnan().all()
    with pytest.raises(IndexError):
        ops.embed_layernorm(ids, pids, None, words, pos, None, w, b, backend="cpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embed_layernorm_types_and_packed_ids(dtype):
    g = _gen(5)
    words, pos, types = (torch.randn(n, 96, generator=g) for n in (100, 64, 2))
    w, b = torch.randn(96, generator=g), torch.randn(96, generator=g)
    ids = torch.randint(0, 100, (29,), generator=g).to(torch.int32)  # packed, int32 ids
    pids = torch.arange(29)
    tids = torch.randint(0, 2, (29,), generator=g)
    assert_parity(
        "embed_layernorm", "cpu", (ids, pids, tids, words, pos, types, w, b, 1e-12), dtype
    )


# ---------------------------------------------------------------- attention
def _attention_parity(qkv, mask, heads, dtype=torch.float32):
    d = qkv.shape[-1] // 3 // heads
    return assert_parity("attention", "cpu", (qkv, mask, heads, d**-0.5), dtype)


@pytest.mark.parametrize("heads,head_dim", [(12, 32), (4, 80), (2, 17), (1, 128), (3, 96)])
@pytest.mark.parametrize("seqlen", [1, 63, 64, 65, 200])
def test_attention_shapes(heads, head_dim, seqlen):
    g = _gen(6)
    qkv = torch.randn(2, seqlen, 3 * heads * head_dim, generator=g)
    mask = torch.ones(2, seqlen, dtype=torch.long)
    mask[1, (seqlen + 1) // 2 :] = 0
    ours = _attention_parity(qkv, mask, heads)
    assert (ours[1, (seqlen + 1) // 2 :] == 0).all()


@pytest.mark.parametrize("heads,head_dim", [(12, 32), (2, 64), (2, 17)])
@pytest.mark.parametrize("seqlen", [128, 129, 257, 300, 520])
def test_attention_long_sequences_query_and_key_blocks(heads, head_dim, seqlen):
    # kernels/cpu/attention.cpp: 256 query rows per task, 128 keys per softmax step,
    # the last key block cut to its real keys (rounded up to a micro-tile); masked
    # keys inside and at the end, and the same result from 1 and 2 threads.
    g = _gen(18)
    qkv = torch.randn(2, seqlen, 3 * heads * head_dim, generator=g)
    mask = torch.ones(2, seqlen, dtype=torch.long)
    mask[1, seqlen - seqlen // 3 :] = 0
    mask[1, 5:9] = 0
    with _threads(2):
        ours = _attention_parity(qkv, mask, heads)
    with _threads(1):
        one = ops.attention(qkv, mask, heads, backend="cpu")
    assert torch.equal(ours, one)
    assert (ours[1, seqlen - seqlen // 3 :] == 0).all()


def test_attention_all_masked_row_and_holes():
    g = _gen(7)
    qkv = torch.randn(3, 40, 3 * 64, generator=g)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[0] = False  # no real token at all: zeros
    mask[1, ::3] = False  # holes (left padding and gaps are allowed)
    mask[2, :10] = False
    ours = _attention_parity(qkv, mask, 2)  # finite everywhere
    assert (ours[0] == 0).all()
    # float masks (1.0 / 0.0) are read as nonzero = real token
    assert torch.equal(ops.attention(qkv, mask.float(), 2, backend="cpu"), ours)


def test_attention_batch_invariance():
    # a sequence alone equals the same sequence inside a padded batch
    g = _gen(8)
    qkv = torch.randn(4, 50, 3 * 96, generator=g)
    mask = torch.ones(4, 50, dtype=torch.long)
    mask[2, 31:] = 0
    full = ops.attention(qkv, mask, 3, backend="cpu")
    alone = ops.attention(qkv[2:3, :31], None, 3, backend="cpu")
    assert torch.equal(full[2, :31], alone[0])


def test_attention_varlen_matches_padded():
    g = _gen(9)
    lens = [5, 0, 130, 1, 64]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    qkv = torch.randn(sum(lens), 3 * 160, generator=g)
    assert_parity("attention_varlen", "cpu", (qkv, cu, max(lens), 2, 80**-0.5), torch.float32)


def test_attention_varlen_bad_cu_seqlens_raises():
    from bertfast import _C

    qkv = torch.randn(10, 3 * 32)
    cu = torch.tensor([0, 6, 4, 10], dtype=torch.int32)
    with pytest.raises(IndexError):
        _C.cpu.attention_varlen(qkv, cu, 10, 1, 0.1)
    cu = torch.tensor([0, 6, 12], dtype=torch.int32)
    with pytest.raises(IndexError):
        _C.cpu.attention_varlen(qkv, cu, 10, 1, 0.1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_attention_half_storage(dtype):
    g = _gen(10)
    qkv = torch.randn(2, 70, 3 * 4 * 80, generator=g)
    mask = torch.ones(2, 70, dtype=torch.long)
    mask[0, 50:] = 0
    _attention_parity(qkv, mask, 4, dtype)


# ---------------------------------------------------------------- pack / unpack
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pack_unpack_roundtrip(dtype):
    g = _gen(11)
    x = torch.randn(6, 9, 5, generator=g).to(dtype)
    idx = torch.tensor([5, 0, 3, 2])
    packed = ops.pack_tokens(x, idx, backend="cpu")
    assert torch.equal(packed, x[idx])
    back = ops.unpack_tokens(packed, idx, 7, backend="cpu")
    assert torch.equal(back, reference.unpack_tokens(packed, idx, 7))


def test_pack_out_of_range_raises_in_kernel():
    from bertfast import _C

    x = torch.randn(4, 3)
    idx = torch.tensor([1, 4])
    with pytest.raises(IndexError):
        _C.cpu.pack_rows(x, idx)
    with pytest.raises(IndexError):
        _C.cpu.unpack_rows(x[:2], idx, 4)


# ---------------------------------------------------------------- linear_gelu
def test_linear_gelu_is_matmul_plus_epilogue():
    g = _gen(12)
    x = torch.randn(3, 17, 64, generator=g)
    w = torch.randn(150, 64, generator=g)
    b = torch.randn(150, generator=g)
    ours = assert_parity("linear_gelu", "cpu", (x, w, b, "gelu"), torch.float32)
    assert ours.shape == (3, 17, 150)


@pytest.mark.parametrize("allow_avx512", [True, False], ids=["auto-isa", "avx2"])
@pytest.mark.parametrize(
    "m,k,n",
    [
        (1, 1, 1),
        (7, 33, 17),
        (65, 384, 1536),
        (130, 1536, 40),
        (3, 0, 5),
        (200, 3000, 33),
        (70, 2000, 1100),
    ],
)
@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "relu"])
def test_cpu_gemm_shapes_and_isas(allow_avx512, m, k, n, act):
    # kernels/cpu/gemm.cpp directly: row / column tails, K = 0, long K (chunked sums),
    # both the AVX-512 and the AVX2 micro-kernel (forced), every epilogue, both tile
    # orders (row-block major up to an 8 MiB packed weight, panel major for 70x2000x1100).
    from bertfast import _C

    g = _gen(14)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n)
    out = _C.cpu.linear_act(x, w, b, act, allow_avx512)
    if act is None:
        gold, ref = reference.linear(x.double(), w.double(), b.double()), reference.linear(x, w, b)
        assert_within_rule("linear", "_C.cpu.linear_act", out, gold, ref, torch.float32)
    else:
        gold = reference.linear_gelu(x.double(), w.double(), b.double(), act)
        ref = reference.linear_gelu(x, w, b, act)
        assert_within_rule("linear_gelu", "_C.cpu.linear_act", out, gold, ref, torch.float32)


def test_cpu_gemm_large_output_huge_page_advice():
    # Outputs of >= 8 MiB get madvise(MADV_HUGEPAGE) on the 2 MiB pages inside them
    # (kernels/cpu/gemm.cpp): results must not change.
    from bertfast import _C

    g = _gen(17)
    m, k, n = 4099, 24, 555
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n)
    out = _C.cpu.linear_act(x, w, b, None, True)
    assert_within_rule(
        "linear",
        "_C.cpu.linear_act",
        out,
        reference.linear(x.double(), w.double(), b.double()),
        reference.linear(x, w, b),
        torch.float32,
    )
    # The same GEMM on the weight packed once (what a loaded model runs).
    from bertfast.ops.cpu import weights as cpu_weights

    assert torch.equal(cpu_weights.linear_panels(x, cpu_weights.pack(w), b, n, None), out)


def test_linear_gelu_fp32_uses_fused_gemm_and_threads_agree():
    g = _gen(15)
    x, w = torch.randn(2, 70, 384, generator=g), torch.randn(1536, 384, generator=g)
    b = torch.randn(1536)
    with _threads(1):
        one = ops.linear_gelu(x, w, b, backend="cpu")
    with _threads(2):
        two = ops.linear_gelu(x, w, b, backend="cpu")
    assert torch.equal(one, two)
    # non-contiguous input and weight are accepted (made contiguous by the launcher)
    wt = w.t().contiguous().t()
    assert torch.equal(ops.linear_gelu(x, wt, b, backend="cpu"), one)


@pytest.mark.parametrize("pack_rows", [None, 0], ids=["f_linear", "pack_per_call"])
def test_plain_weights_are_read_at_every_call(pack_rows, monkeypatch):
    """No packed-weight cache: every write to a plain weight is seen by the next call
    (in place, through .data, through a view under no_grad, through NumPy)."""
    from bertfast.ops.cpu import weights as cpu_weights

    monkeypatch.setattr(cpu_weights, "PACK_MIN_ROWS", pack_rows)
    g = _gen(16)
    x, w, b = torch.randn(9, 48, generator=g), torch.randn(70, 48, generator=g), torch.randn(70)
    for write in (
        lambda: w.mul_(-2),
        lambda: w.data.__setitem__(3, 0.5),
        lambda: w[5:9].copy_(torch.ones(4, 48)),
        lambda: w.numpy().__setitem__(7, 2.0),
    ):
        ops.linear(x, w, b, backend="cpu")
        with torch.no_grad():
            write()
        torch.testing.assert_close(
            ops.linear(x, w, b, backend="cpu"), F.linear(x, w, b), rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            ops.linear_gelu(x, w, b, "gelu", backend="cpu"),
            F.gelu(F.linear(x, w, b)),
            rtol=1e-5,
            atol=1e-5,
        )


@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "relu"])
def test_packed_weight_runs_the_cpp_gemm(act):
    """A PackedWeight (what from_pretrained keeps) on the C++ GEMM matches torch,
    with 1 and 2 threads, and reads back as the weight it was packed from."""
    from bertfast.ops.cpu import weights as cpu_weights

    g = _gen(17)
    x, w, b = (
        torch.randn(2, 70, 96, generator=g),
        torch.randn(200, 96, generator=g),
        torch.randn(200),
    )
    pw = cpu_weights.PackedWeight.of(w)
    assert torch.equal(pw.dense(), w) and torch.equal(pw + 0, w)
    ref = F.linear(x, w, b)
    if act is not None:
        ref = {
            "gelu": F.gelu,
            "relu": F.relu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        }[act](ref)
    with _threads(1):
        one = (
            ops.linear(x, pw, b, backend="cpu")
            if act is None
            else ops.linear_gelu(x, pw, b, act, backend="cpu")
        )
    with _threads(2):
        two = (
            ops.linear(x, pw, b, backend="cpu")
            if act is None
            else ops.linear_gelu(x, pw, b, act, backend="cpu")
        )
    assert torch.equal(one, two)
    torch.testing.assert_close(one, ref, rtol=1e-5, atol=5e-5)


# ---------------------------------------------------------------- dtype fallback
def test_float64_falls_back_with_a_reason():
    x = torch.randn(4, 8, dtype=torch.float64)
    reason = cpu_backend.why_not("bias_gelu", "cpu", torch.float64, (x, None, "gelu"))
    assert reason and "float64" in reason
    # auto picks torch for it
    torch.testing.assert_close(ops.bias_gelu(x), F.gelu(x))
