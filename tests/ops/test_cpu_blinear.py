"""The bf16 CPU GEMM (kernels/cpu/bgemm.cpp, csrc/cpu_bf16_ops.cpp) against independent
torch references.

- bgemm_pack vs the packed layout of kernels/cpu/bgemm.h built in torch (zero pad
  to 32 rows / 32 columns, view, permute), bit for bit;
- blinear vs float64 torch on the bf16 values (x.double() @ w.double().T + bias, the
  activation in float64), each output within one bf16 rounding of the reference plus
  a sum-order term: |got - ref| <= 2**-8 |ref| + 1e-5 (|x| @ |w|.T + 1); on every
  micro-kernel this CPU has (portable always, AMX where the process may use it), odd
  M / N / K around the 16-row tiles, 64-row tasks, 32-column panels and 32-wide k
  blocks, leading dimensions, with and without bias, every activation;
- the erf GELU made for the rounding to bf16, on fp32 sums between the bf16 values,
  against float64: every output the correctly rounded value or one unit off, the
  one-off ones a fraction of a percent, the tail's relative accuracy kept;
- round to nearest even on exact bf16 ties (against torch's own conversion);
- empty sizes (M, N or K = 0), NaN / +-inf where the float64 reference has them;
- the isa argument and BERTFAST_CPU_BF16_ISA, and 1 vs 2 threads bit for bit.
Argument checks: tests/ops/test_native_safety.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

try:
    from bertfast import _C

    cpu = _C.cpu if hasattr(_C.cpu, "blinear") else None
except ImportError:  # pragma: no cover
    cpu = None

pytestmark = pytest.mark.skipif(cpu is None, reason="bertfast._C bf16 GEMM is not built")

BF16 = torch.bfloat16
NAN, INF = float("nan"), float("inf")

_HAS_AMX = cpu is not None and cpu.bf16_gemm_isa("auto") == "amx"
ISAS = [
    "portable",
    pytest.param(
        "amx",
        marks=pytest.mark.skipif(not _HAS_AMX, reason="this CPU (or OS) has no AMX-BF16"),
    ),
]
ACTIVATIONS = [None, "gelu", "gelu_tanh", "relu"]

SHAPES = [  # (M, N, K)
    (1, 1, 1),
    (5, 33, 31),
    (16, 100, 70),  # M a whole tile, K padded
    (17, 130, 384),  # a 1-row last tile, N past two panel pairs
    (37, 96, 31),  # N a multiple of 32, not 64: a task with one panel
    (52, 96, 70),  # a task with one panel, K padded, rows not a multiple of 16
    (64, 1152, 384),  # M a whole task, K whole k blocks: no padded copy on AMX
    (16, 33, 1536),  # no padded copy, N odd
    (150, 200, 96),  # rows over three tasks, the last 22 (two row groups), a one-panel task
    (37, 64, 1536),
    (130, 100, 70),  # three 64-row tasks
    (130, 192, 384),
]


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation == "relu":
        return F.relu(y)
    return F.gelu(y, approximate="tanh" if activation == "gelu_tanh" else "none")


def _data(M, N, K, bias=True, seed=0):
    """Normal-range bf16 x [M, K], w [N, K], bias [N] (AMX reads subnormals as 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(BF16)
    w = torch.randn(N, K, generator=g).to(BF16)
    b = torch.randn(N, generator=g).to(BF16) if bias else None
    return x, w, b


def _reference(x, w, b, activation):
    """float64 act(x @ w.T + b) on the bf16 values, and the bound on each output."""
    x64, w64 = x.double().reshape(-1, x.shape[-1]), w.double()
    y = x64 @ w64.T
    if b is not None:
        y = y + b.double()
    ref = _act(y, activation)
    bound = 2.0**-8 * ref.abs() + 1e-5 * (x64.abs() @ w64.abs().T + 1.0)
    shape = (*x.shape[:-1], w.shape[0])
    return ref.reshape(shape), bound.reshape(shape)


def _assert_within(got, ref, bound, what=""):
    assert got.dtype == BF16 and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    err = (got.double() - ref).abs()
    bad = ~(err <= bound)  # NaN in got counts as outside
    if bad.any():
        i = bad.nonzero()[0].tolist()
        pytest.fail(
            f"{what}: {int(bad.sum())} of {got.numel()} outside the bound; first at {i}: "
            f"got {got[tuple(i)].item()}, ref {ref[tuple(i)].item()}, "
            f"bound {bound[tuple(i)].item()}"
        )


def _pack_ref(w: torch.Tensor) -> torch.Tensor:
    """bgemm.h's layout in torch: packed[p, k2, c, j] = w[32p + c, 2*k2 + j], zero padded."""
    N, K = w.shape
    P, Kp = (N + 31) // 32, (K + 31) // 32 * 32
    padded = torch.zeros(P * 32, Kp, dtype=w.dtype)
    padded[:N, :K] = w
    return padded.view(P, 32, Kp // 2, 2).permute(0, 2, 1, 3).contiguous()


# ---------------------------------------------------------------- bgemm_pack


@pytest.mark.parametrize(
    "N,K",
    [(1, 1), (33, 31), (100, 70), (32, 32), (64, 64), (130, 384), (1152, 384), (0, 5), (5, 0)],
)
def test_pack_layout_bit_exact(N, K):
    # Random bit patterns (every bf16 value, NaNs included): the pack is a copy, and
    # nearly every element differs, so any misplaced element shows.
    g = torch.Generator().manual_seed(N * 1000 + K)
    w = torch.randint(-(2**15), 2**15, (N, K), generator=g, dtype=torch.int32)
    w = w.to(torch.int16).view(BF16)
    packed = cpu.bgemm_pack(w)
    ref = _pack_ref(w)
    assert packed.dtype == BF16
    assert packed.shape == ((N + 31) // 32, (K + 31) // 32 * 16, 32, 2)
    assert packed.shape == ref.shape
    assert torch.equal(packed.view(torch.int16), ref.view(torch.int16))


# ---------------------------------------------------------------- blinear vs float64


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_blinear_vs_float64(isa, activation, bias, M, N, K):
    x, w, b = _data(M, N, K, bias, seed=M + 7 * N + 131 * K)
    out = cpu.blinear(x, cpu.bgemm_pack(w), b, N, activation, isa)
    ref, bound = _reference(x, w, b, activation)
    assert torch.isfinite(out).all()
    _assert_within(out, ref, bound, f"{isa} {activation}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_leading_dims(isa, activation):
    K, N = 70, 100
    _, w, b = _data(1, N, K)
    x = torch.randn(2, 3, K, generator=torch.Generator().manual_seed(3)).to(BF16)
    packed = cpu.bgemm_pack(w)
    out = cpu.blinear(x, packed, b, N, activation, isa)
    assert out.shape == (2, 3, N)
    ref, bound = _reference(x, w, b, activation)
    _assert_within(out, ref, bound, "x [2, 3, K]")
    flat = cpu.blinear(x.reshape(6, K), packed, b, N, activation, isa)
    assert torch.equal(out.reshape(6, N).view(torch.int16), flat.view(torch.int16))
    # 1-D x: one row, out [N]
    one = cpu.blinear(x[1, 2], packed, b, N, activation, isa)
    assert one.shape == (N,)
    _assert_within(one, ref[1, 2], bound[1, 2], "x [K]")


def _gelu_float64(x: torch.Tensor) -> torch.Tensor:
    """x Phi(x) by erfc, in float64: F.gelu's 1 + erf(x / sqrt 2) loses the tail (2% at
    x = -7.75, where 1 + erf is 5e-15)."""
    return 0.5 * x * torch.special.erfc(-x / 2.0**0.5)


def _bf16_neighbours(v: torch.Tensor):
    """The bf16 values just below and above each bf16 value v (finite, nonzero)."""
    bits = v.view(torch.int16).to(torch.int32)
    away, toward = (bits + 1).to(torch.int16).view(BF16), (bits - 1).to(torch.int16).view(BF16)
    lower = torch.where(v > 0, toward, away)
    upper = torch.where(v > 0, away, toward)
    return lower, upper


@pytest.mark.parametrize("isa", ISAS)
def test_gelu_rounded_to_bf16_against_float64(isa):
    # The epilogue's erf GELU is made for the bf16 rounding that follows
    # (gelu_erf_bf16, kernels/cpu/common.h: relative error <= 1.6e-5). Each output is
    # x = a + c, the exact fp32 sum of two bf16 values (K = 2, weights 1), so x runs
    # between the bf16 values, over [-8, 6]: GELU's tail, its knee and where it is ~x.
    g = torch.Generator().manual_seed(5)
    a = torch.linspace(-8.0, 6.0, 40_000).to(BF16)
    u = torch.rand(a.shape, generator=g).clamp_min(2.0**-8)  # the offset, in units of a/128
    c = (a.float() * u * 2.0**-7).to(BF16)
    x = torch.stack([a, c], dim=1)  # [M, 2]
    w = torch.ones(1, 2, dtype=BF16)
    got = cpu.blinear(x, cpu.bgemm_pack(w), None, 1, "gelu", isa)[:, 0]
    xs = a.double() + c.double()
    assert torch.equal(xs.float().double(), xs)  # the sums are exact in fp32
    gold = _gelu_float64(xs)
    # From x = -5.5 sqrt 2 = -7.7782 down, erfc(|x| / sqrt 2) < 4e-15: the output is 0
    # (from -7.7781 on, its neighbours in fp32 may give either).
    far = xs <= -7.7781
    assert (got[xs < -7.7783] == 0).all()
    assert ((got[far].double() - gold[far]).abs() <= 4e-15 * xs[far].abs()).all()
    live = ~far
    got, gold = got[live], gold[live]
    nearest = gold.float().to(BF16)  # the correctly rounded GELU (torch's RNE)
    assert (nearest != 0).all()
    lower, upper = _bf16_neighbours(nearest)
    exact = got.view(torch.int16) == nearest.view(torch.int16)
    one_off = (got == lower) | (got == upper)
    assert (exact | one_off).all(), got[~(exact | one_off)][:5]
    # A relative error of 1.6e-5 moves the rounding only for values within it of a
    # rounding boundary: about 0.04% of them here.
    assert (~exact).sum().item() <= 0.002 * got.numel(), (~exact).sum().item()
    # The tail keeps its relative accuracy: at x = -7 the output is ~1e-11.
    rel = (got.double() - gold).abs() / gold.abs()
    assert rel.max().item() <= 2.0**-7, rel.max().item()


@pytest.mark.parametrize("isa", ISAS)
def test_round_to_nearest_even_once(isa):
    # x = [1, 1, 1], so each output is the exact fp32 sum of its weight row (+ bias):
    # ties between two bf16 values must go to the even one, values just past a tie
    # away from it (one rounding: fp32 -> bf16, nothing truncated).
    t = 2.0**-8  # half a bf16 ulp at 1
    rows = [
        [1.0, t, 0.0],  # 1 + t: tie -> 1 (even)
        [1.0, 3 * t, 0.0],  # 1 + 3t: tie -> 1 + 4t (even)
        [1.0, t, t * 2.0**-8],  # just above a tie -> 1 + 2t
        [1.0, 3 * t, -t * 2.0**-8],  # just below a tie -> 1 + 2t
        [-1.0, -t, 0.0],  # negative tie -> -1
        [-2.0, -3 * 2 * t, 0.0],  # -(2 + 6t): tie -> -(2 + 8t)
        [1.0, 2.0**-9, 0.0],  # below half an ulp -> 1
    ]
    w = torch.tensor(rows, dtype=torch.float64).to(BF16)
    assert torch.equal(w.double(), torch.tensor(rows, dtype=torch.float64))  # exact in bf16
    x = torch.ones(3, 3, dtype=BF16)
    N = len(rows)
    exact = w.double().sum(dim=1)
    expect = exact.float().to(BF16)  # exact in fp32; torch's conversion is RNE
    assert not torch.equal(expect.double(), exact)  # the cases are not representable
    out = cpu.blinear(x, cpu.bgemm_pack(w), None, N, None, isa)
    for r in range(3):
        assert torch.equal(out[r].view(torch.int16), expect.view(torch.int16)), (out[r], expect)
    # the same through the bias: y = x @ w.T + b with b = 1 and w's first column 0
    w2 = w.clone()
    w2[:, 0] = 0
    b = w[:, 0].clone()
    out = cpu.blinear(x, cpu.bgemm_pack(w2), b, N, None, isa)
    for r in range(3):
        assert torch.equal(out[r].view(torch.int16), expect.view(torch.int16)), (out[r], expect)


# ---------------------------------------------------------------- empty sizes


@pytest.mark.parametrize("isa", ISAS)
def test_zero_rows(isa):
    _, w, b = _data(1, 33, 70)
    out = cpu.blinear(torch.empty(0, 70, dtype=BF16), cpu.bgemm_pack(w), b, 33, "gelu", isa)
    assert out.shape == (0, 33) and out.dtype == BF16
    out = cpu.blinear(torch.empty(2, 0, 70, dtype=BF16), cpu.bgemm_pack(w), b, 33, None, isa)
    assert out.shape == (2, 0, 33)


@pytest.mark.parametrize("isa", ISAS)
def test_zero_columns(isa):
    x, w, _ = _data(5, 0, 70)
    packed = cpu.bgemm_pack(w)
    assert packed.shape == (0, 48, 32, 2)
    out = cpu.blinear(x, packed, torch.empty(0, dtype=BF16), 0, "relu", isa)
    assert out.shape == (5, 0) and out.dtype == BF16


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_zero_k_is_act_of_bias(isa, activation):
    M, N = 5, 70
    x, w, b = _data(M, N, 0)
    b[:4] = torch.tensor([0.0, -0.0, 1.0, -3.0])
    packed = cpu.bgemm_pack(w)
    assert packed.shape == (3, 0, 32, 2)
    out = cpu.blinear(x, packed, b, N, activation, isa)
    assert out.shape == (M, N)
    # every row is the same act(bias), one bf16 rounding of the float64 value
    for r in range(1, M):
        assert torch.equal(out[r].view(torch.int16), out[0].view(torch.int16))
    ref = _act(b.double(), activation)
    _assert_within(out[0], ref, 2.0**-8 * ref.abs() + 1e-5, "K = 0")
    # and, these values being far from bf16 ties, exactly the float64 value rounded
    assert torch.equal(out[0].double(), ref.to(BF16).double()), (out[0], ref)
    # without bias: zeros
    out = cpu.blinear(x, packed, None, N, activation, isa)
    assert torch.equal(out.double(), torch.zeros(M, N, dtype=torch.float64))


# ---------------------------------------------------------------- non-finite


def _assert_like_reference(out, ref, bound, what):
    """NaN where ref is NaN, the same inf where ref is +-inf, within the bound elsewhere."""
    got = out.double()
    assert torch.equal(got.isnan(), ref.isnan()), f"{what}: NaN positions differ"
    inf = ref.isinf()
    assert torch.equal(got[inf], ref[inf]), f"{what}: inf values differ"
    fin = ref.isfinite()
    assert torch.isfinite(got[fin]).all(), f"{what}: non-finite where ref is finite"
    assert (got[fin] - ref[fin]).abs().le(bound[fin]).all(), f"{what}: finite values"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_nan_and_inf_in_x(isa, activation):
    M, N, K = 37, 100, 70
    x, w, b = _data(M, N, K, seed=5)
    # column 3 of w: positive, negative and zero weights (inf * 0 is NaN)
    w[:, 3] = w[:, 3].abs() + 0.25
    w[0::3, 3] *= -1
    w[1::3, 3] = 0
    x[4, 3] = INF  # row 4: +inf, -inf or NaN by the weight's sign
    x[20, 50] = NAN  # row 20: NaN everywhere
    x[33, 69] = -INF
    ref, _ = _reference(x, w, b, activation)
    fin_x = x.clone()
    fin_x[4, 3] = fin_x[20, 50] = fin_x[33, 69] = 0
    _, bound = _reference(fin_x, w, b, activation)
    out = cpu.blinear(x, cpu.bgemm_pack(w), b, N, activation, isa)
    _assert_like_reference(out, ref, bound, f"{isa} {activation}")
    assert out[20].isnan().all()
    assert ref[4].isinf().any() and ref[4].isnan().any()  # the case is what it says
    if activation is None:
        assert torch.equal(out[4, 2::3].double(), torch.full((33,), INF, dtype=torch.float64))
    others = [r for r in range(M) if r not in (4, 20, 33)]
    assert torch.isfinite(out[others]).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
def test_nan_in_bias(isa, activation):
    M, N, K = 17, 70, 64
    x, w, b = _data(M, N, K, seed=6)
    b[5] = NAN
    b[64] = NAN  # the second panel pair
    out = cpu.blinear(x, cpu.bgemm_pack(w), b, N, activation, isa)
    ref, bound = _reference(x, w, b, activation)
    _assert_like_reference(out, ref, bound, f"{isa} {activation}")
    assert out[:, [5, 64]].isnan().all()
    others = [n for n in range(N) if n not in (5, 64)]
    assert torch.isfinite(out[:, others]).all()


# ---------------------------------------------------------------- isa and threads


@pytest.mark.skipif(not _HAS_AMX, reason="this CPU (or OS) has no AMX-BF16")
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=str)
@pytest.mark.parametrize(
    "M,N,K", [(17, 130, 384), (64, 1152, 384), (37, 64, 1536), (150, 200, 384)]
)
def test_amx_and_portable_agree(activation, M, N, K):
    x, w, b = _data(M, N, K, seed=11)
    packed = cpu.bgemm_pack(w)
    amx = cpu.blinear(x, packed, b, N, activation, "amx")
    portable = cpu.blinear(x, packed, b, N, activation, "portable")
    ref, bound = _reference(x, w, b, activation)
    _assert_within(amx, ref, bound, "amx")
    _assert_within(portable, ref, bound, "portable")
    # Each is one rounding of its own fp32 sum (the two sum in different orders), so
    # they may sit on the two bf16 neighbours of the reference: at most the sum of the
    # two bounds apart.
    err = (amx.double() - portable.double()).abs()
    assert (err <= 2 * bound).all()


def test_env_var_selects_the_isa(monkeypatch):
    M, N, K = 64, 1152, 384
    x, w, b = _data(M, N, K, seed=12)
    packed = cpu.bgemm_pack(w)
    portable = cpu.blinear(x, packed, b, N, "gelu", "portable")

    monkeypatch.delenv("BERTFAST_CPU_BF16_ISA", raising=False)
    assert cpu.bf16_gemm_isa() == ("amx" if _HAS_AMX else "portable")
    assert cpu.bf16_gemm_isa("portable") == "portable"
    assert cpu.bf16_gemm_isa("Portable") == "portable"  # names are case-insensitive

    monkeypatch.setenv("BERTFAST_CPU_BF16_ISA", "portable")
    assert cpu.bf16_gemm_isa() == "portable"
    assert cpu.bf16_gemm_isa(None) == "portable"
    out = cpu.blinear(x, packed, b, N, "gelu", None)
    assert torch.equal(out.view(torch.int16), portable.view(torch.int16))
    if _HAS_AMX:
        amx = cpu.blinear(x, packed, b, N, "gelu", "amx")  # the argument wins over the env
        monkeypatch.setenv("BERTFAST_CPU_BF16_ISA", "amx")
        assert cpu.bf16_gemm_isa() == "amx"
        out = cpu.blinear(x, packed, b, N, "gelu", None)
        assert torch.equal(out.view(torch.int16), amx.view(torch.int16))

    monkeypatch.setenv("BERTFAST_CPU_BF16_ISA", "avx9")
    msg = "BERTFAST_CPU_BF16_ISA='avx9' is not one of auto, amx, portable"
    with pytest.raises(ValueError, match=msg):
        cpu.bf16_gemm_isa()
    with pytest.raises(ValueError, match=msg):
        cpu.blinear(x, packed, b, N, None, None)
    # an explicit isa does not read the variable
    out = cpu.blinear(x, packed, b, N, "gelu", "portable")
    assert torch.equal(out.view(torch.int16), portable.view(torch.int16))


def test_unknown_isa_raises():
    x, w, _ = _data(3, 5, 7)
    packed = cpu.bgemm_pack(w)
    msg = "isa='avx9' is not one of auto, amx, portable"
    with pytest.raises(ValueError, match=msg):
        cpu.bf16_gemm_isa("avx9")
    with pytest.raises(ValueError, match=msg):
        cpu.blinear(x, packed, None, 5, None, "avx9")


@pytest.mark.skipif(_HAS_AMX, reason="this CPU has AMX-BF16: isa='amx' runs")
def test_amx_without_amx_raises(monkeypatch):
    x, w, _ = _data(3, 5, 7)
    packed = cpu.bgemm_pack(w)
    with pytest.raises(ValueError, match="AMX-BF16"):
        cpu.bf16_gemm_isa("amx")
    with pytest.raises(ValueError, match="AMX-BF16"):
        cpu.blinear(x, packed, None, 5, None, "amx")
    monkeypatch.setenv("BERTFAST_CPU_BF16_ISA", "amx")
    with pytest.raises(ValueError, match="BERTFAST_CPU_BF16_ISA=amx .*AMX-BF16"):
        cpu.blinear(x, packed, None, 5, None, None)


@pytest.mark.parametrize("isa", ISAS)
def test_one_and_two_threads_bit_exact(isa):
    # Large enough for both the pack and the GEMM to split across threads.
    M, N, K = 130, 1152, 384
    x, w, b = _data(M, N, K, seed=13)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        packed1 = cpu.bgemm_pack(w)
        out1 = cpu.blinear(x, packed1, b, N, "gelu", isa)
        torch.set_num_threads(2)
        packed2 = cpu.bgemm_pack(w)
        out2 = cpu.blinear(x, packed2, b, N, "gelu", isa)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(packed1.view(torch.int16), packed2.view(torch.int16))
    assert torch.equal(out1.view(torch.int16), out2.view(torch.int16))
    ref, bound = _reference(x, w, b, "gelu")
    _assert_within(out1, ref, bound, "1 thread")
