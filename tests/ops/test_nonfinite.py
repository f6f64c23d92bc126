"""Non-finite inputs propagate as in torch, on every backend.

NaN / +-inf in Q, K or V, a NaN scale, or a non-finite activation / LayerNorm input
must give NaN (or inf) exactly where the torch reference does, and the same finite
values elsewhere. The reference runs in float64 (``bertfast.ops.reference``, the
spec; torch's own fp32 vectorised GELU gives NaN for +inf where its scalar and
float64 paths give +inf, so float64 is the torch answer taken here).

The CPU attention has AMX and AVX512-BF16 kernels (bf16 storage), AVX-512 and AVX2
ones; ``BERTFAST_CPU_ATTENTION_ISA=avx512bf16`` / ``avx512`` / ``avx2`` forces the
lesser ones, and every attention case runs each. Keys at masked positions
are never read (their content is not part of the input), so values are injected
at real tokens only; sequences with no real token stay zeros.
"""

from __future__ import annotations

import pytest
import torch

import bertfast.ops as ops
from bertfast.ops import reference

from .harness import HAS_CUDA, INTERPRETED, device_for, run_backend

NAN, INF = float("nan"), float("inf")

_BACKENDS = ["torch", "cpu", "cpu-avx512bf16", "cpu-avx512", "cpu-avx2"]
if HAS_CUDA or INTERPRETED:
    _BACKENDS.append("triton")
if HAS_CUDA:
    _BACKENDS.append("cuda")


@pytest.fixture(params=_BACKENDS)
def backend(request, monkeypatch):
    name = request.param
    if name in ("cpu-avx512bf16", "cpu-avx512", "cpu-avx2"):
        monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", name[4:])
        return "cpu"
    return name


def _run(op, backend, args):
    dev = device_for(backend)
    args = tuple(a.to(dev) if isinstance(a, torch.Tensor) else a for a in args)
    return run_backend(op, backend, args).cpu()


def _gold(op, args):
    args = tuple(
        a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )
    return getattr(reference, op)(*args)


def assert_same_nonfinite(out, gold, atol, what=""):
    """NaN, +inf and -inf at the same places; the finite values within atol."""
    out = out.double()
    for name, pred in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        a, b = pred(out), pred(gold)
        if not torch.equal(a, b):
            bad = (a != b).nonzero()[:5].tolist()
            raise AssertionError(
                f"{what}: {name} positions differ from torch's "
                f"({int(a.sum())} vs {int(b.sum())}; first at {bad})"
            )
    fin = torch.isfinite(gold)
    assert fin.any(), f"{what}: the case should keep some finite outputs"
    err = (out[fin] - gold[fin]).abs().max().item()
    assert err <= atol, f"{what}: finite outputs differ by {err:.3g} (atol {atol})"


# ----------------------------------------------------------------- attention
NH, D = 2, 32
H = NH * D
S = 160  # more than one 128-key block of the CPU kernel


def _qkv(B=3):
    torch.manual_seed(0)
    return torch.randn(B, S, 3 * H)


def _lengths():
    return [S, 150, 0]  # full, ragged (last key block short), all-masked


def _mask(lengths):
    return (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)


def _inject(kind, qkv):
    """Put non-finite values at real tokens of sequences 0 and 1 (and garbage in the
    all-masked sequence 2, which must still give zeros)."""
    qkv = qkv.clone()
    qkv[2] = NAN
    if kind == "nan_q":
        qkv[0, 5, 3] = NAN  # one query row of head 0
        qkv[1, 149, H - 1] = NAN  # the last real query of seq 1, head 1
    elif kind == "nan_k":
        qkv[0, 100, H + 1] = NAN  # one key of head 0: every query of seq 0, head 0
    elif kind == "inf_q":
        qkv[0, 7, 0] = INF  # scores +-inf (and NaN where k is 0)
        qkv[1, 8, D] = -INF
    elif kind == "inf_k":
        qkv[1, 140, H + D] = INF  # one key of head 1 in the second key block
    elif kind == "inf_v":
        qkv[0, 30, 2 * H + 4] = INF
        qkv[1, 3, 2 * H + D + 1] = -INF
    elif kind == "neg_inf_scores_first_block":
        # Head 0 of seq 0: keys 0..139 get score -inf for queries with q[0] > 0 (the
        # whole first key block): torch gives them p = 0 and finite rows; queries
        # with q[0] < 0 see +inf scores (NaN rows), q[0] == 0 sees 0 * inf (NaN).
        qkv[0, :140, H] = -INF
        qkv[0, :, 0] = qkv[0, :, 0].abs() + 0.1
        qkv[0, ::9, 0] *= -1
        qkv[0, 4, 0] = 0.0
    elif kind == "all_neg_inf_scores":
        # Every real key of head 1 in seq 1 has score -inf for q[D] > 0: torch's
        # softmax of an all -inf row is NaN.
        qkv[1, :, H + D] = -INF
        qkv[1, :, D] = qkv[1, :, D].abs() + 0.1
    else:
        raise ValueError(kind)
    return qkv


KINDS = [
    "nan_q",
    "nan_k",
    "inf_q",
    "inf_k",
    "inf_v",
    "neg_inf_scores_first_block",
    "all_neg_inf_scores",
]


def _varlen_args(qkv, lengths, scale):
    mask = _mask(lengths).bool()
    packed = qkv[mask]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    return packed, cu, max(lengths), NH, scale


@pytest.mark.parametrize("kind", KINDS)
def test_attention_padded_nonfinite(backend, kind):
    qkv = _inject(kind, _qkv())
    mask = _mask(_lengths())
    args = (qkv, mask, NH, D**-0.5)
    gold = _gold("attention", args)
    out = _run("attention", backend, args)
    assert_same_nonfinite(out, gold, 5e-5, f"attention[{backend}, {kind}]")
    assert (out[2] == 0).all(), "a sequence with no real token must give zeros"
    assert (out[1, 150:] == 0).all(), "padded query rows must be zeros"


@pytest.mark.parametrize("kind", KINDS)
def test_attention_varlen_nonfinite(backend, kind):
    qkv = _inject(kind, _qkv())
    args = _varlen_args(qkv, _lengths(), D**-0.5)
    gold = _gold("attention_varlen", args)
    out = _run("attention_varlen", backend, args)
    assert_same_nonfinite(out, gold, 5e-5, f"attention_varlen[{backend}, {kind}]")


@pytest.mark.parametrize("scale", [NAN, INF])
def test_attention_nonfinite_scale(backend, scale):
    qkv = _qkv()
    qkv[:, :, :H] = qkv[:, :, :H].abs() + 0.1  # q > 0: an inf scale gives +-inf scores
    lengths = _lengths()
    args = (qkv, _mask(lengths), NH, scale)
    gold = _gold("attention", args)
    out = _run("attention", backend, args)
    assert torch.equal(torch.isnan(out), torch.isnan(gold))
    assert (out[2] == 0).all() and (out[1, 150:] == 0).all()
    vargs = _varlen_args(qkv, lengths, scale)
    vout = _run("attention_varlen", backend, vargs)
    assert torch.equal(torch.isnan(vout), torch.isnan(_gold("attention_varlen", vargs)))
    if scale != scale:
        assert torch.isnan(vout).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_nonfinite_half_storage(backend, dtype):
    if backend == "triton" and INTERPRETED and dtype == torch.bfloat16:
        # (the bf16 store it ends with is checked under the interpreter too, in
        # test_elementwise_nonfinite_half_storage and test_store_cast_special_values)
        pytest.skip("the Triton interpreter computes tl.dot wrongly for bf16 inputs")
    qkv = _inject("nan_k", _qkv()).to(dtype)
    qkv[1, 9, 5] = INF
    args = (qkv, _mask(_lengths()), NH, D**-0.5)
    out = _run("attention", backend, args)
    gold = _gold("attention", args)
    assert out.dtype == dtype
    assert_same_nonfinite(out, gold, 3e-2, f"attention[{backend}, {dtype}]")


def test_finite_attention_unchanged_by_isa(monkeypatch):
    """Both CPU micro-kernel variants agree on finite input (the ISA switch works)."""
    qkv = _qkv()
    mask = _mask(_lengths())
    a = ops.attention(qkv, mask, NH, D**-0.5, backend="cpu")
    monkeypatch.setenv("BERTFAST_CPU_ATTENTION_ISA", "avx2")
    b = ops.attention(qkv, mask, NH, D**-0.5, backend="cpu")
    assert torch.isfinite(a).all()
    assert (a - b).abs().max().item() <= 1e-5


# ------------------------------------------------------- other element-wise ops
SPECIALS = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 30.0, -30.0, 100.0, -100.0])


def _row(width=96):
    torch.manual_seed(1)
    x = torch.randn(6, width)  # rows 4, 5 stay finite
    x[0, : SPECIALS.numel()] = SPECIALS
    x[1, 3] = NAN
    x[2, 10] = INF
    x[3, 50] = -INF
    return x


def _torch_fp32_gelu(out, gold, backend, act):
    """torch's own fp32 erf-GELU (the ``torch`` backend) gives NaN for +inf in its
    vectorised loop (its scalar and float64 paths give +inf): accept exactly that."""
    if backend == "torch" and act == "gelu":
        quirk = torch.isposinf(gold) & torch.isnan(out)
        out = torch.where(quirk, torch.full_like(out, INF), out)
    return out


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
def test_bias_gelu_nonfinite(backend, act):
    x = _row()
    bias = torch.randn(x.shape[1])
    bias[7] = NAN  # a NaN bias poisons its column
    args = (x, bias, act)
    out = _run("bias_gelu", backend, args)
    gold = _gold("bias_gelu", args)
    assert_same_nonfinite(
        _torch_fp32_gelu(out, gold, backend, act), gold, 1e-5, f"bias_gelu[{backend}, {act}]"
    )


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
def test_linear_gelu_epilogue_nonfinite(backend, act):
    torch.manual_seed(2)
    x = torch.randn(70, 48)  # rows past one 64-row GEMM block
    w = torch.randn(40, 48) / 7
    bias = torch.randn(40)
    x[3, 5] = NAN  # a NaN input row
    x[66, 0] = INF  # +-inf across its row (w has both signs)
    bias[11] = -INF  # a -inf bias column: gelu(-inf) is NaN, relu(-inf) is 0
    w[20, 7] = NAN  # a NaN weight: its column is NaN
    args = (x, w, bias, act)
    out = _run("linear_gelu", backend, args)
    gold = _gold("linear_gelu", args)
    assert_same_nonfinite(
        _torch_fp32_gelu(out, gold, backend, act), gold, 5e-5, f"linear_gelu[{backend}, {act}]"
    )
    largs = (x, w, bias)
    out = _run("linear", backend, largs)
    assert_same_nonfinite(out, _gold("linear", largs), 5e-5, f"linear[{backend}]")
    if backend != "cpu":
        return
    # The packed GEMMs a loaded model runs: the C++ GEMM and its epilogue, and oneDNN
    # with bias + activation as post-ops (whose erf-GELU, like torch's fp32 one,
    # gives NaN for +inf: accepted exactly there, as for the torch backend).
    from bertfast.ops.cpu import weights as cpu_weights

    for storage in ("own", "onednn") if cpu_weights.ONEDNN else ("own",):
        pw = cpu_weights.PackedWeight.of(w, storage)
        out = ops.linear_gelu(x, pw, bias, act, backend="cpu")
        quirk_as = "torch" if storage == "onednn" else backend
        assert_same_nonfinite(
            _torch_fp32_gelu(out, gold, quirk_as, act), gold, 5e-5, f"linear_gelu[{storage}, {act}]"
        )
        out = ops.linear(x, pw, bias, backend="cpu")
        assert_same_nonfinite(out, _gold("linear", largs), 5e-5, f"linear[{storage}]")


def test_add_layernorm_nonfinite(backend):
    x = _row()
    residual = torch.randn_like(x)
    residual[1, 0] = -INF
    w, b = torch.randn(x.shape[1]), torch.randn(x.shape[1])
    w[5] = NAN
    args = (x, residual, torch.randn(x.shape[1]), w, b, 1e-12)
    out = _run("add_layernorm", backend, args)
    assert_same_nonfinite(out, _gold("add_layernorm", args), 1e-5, f"add_layernorm[{backend}]")


def test_embed_layernorm_nonfinite(backend):
    torch.manual_seed(3)
    V, P, E = 20, 12, 64
    word, pos, types = torch.randn(V, E), torch.randn(P, E), torch.randn(2, E)
    word[3, 4] = NAN
    pos[5, 0] = INF
    types[1, 9] = -INF
    ids = torch.tensor([[1, 3, 2, 0], [4, 5, 6, 7]])
    pids = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    tids = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1]])
    args = (ids, pids, tids, word, pos, types, torch.ones(E), torch.zeros(E), 1e-12)
    out = _run("embed_layernorm", backend, args)
    assert_same_nonfinite(out, _gold("embed_layernorm", args), 1e-5, f"embed_layernorm[{backend}]")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["bias_gelu", "add_layernorm"])
def test_elementwise_nonfinite_half_storage(backend, dtype, op):
    """fp16 / bf16 outputs keep NaN and inf where fp32 ones do (the Triton kernels'
    bf16 store once turned a GPU's NaN into -0.0: tests/ops/test_triton_backend.py,
    test_store_cast_special_values)."""
    x = _row()
    if op == "bias_gelu":
        bias = torch.randn(x.shape[1])
        bias[7] = NAN
        args, atol = (x, bias, "relu"), 0.5  # outputs up to 100: a bf16 ulp there is 0.5
    else:
        residual = torch.randn_like(x)
        residual[1, 0] = -INF
        w, b = torch.randn(x.shape[1]), torch.randn(x.shape[1])
        w[5] = NAN
        args, atol = (x, residual, torch.randn(x.shape[1]), w, b, 1e-12), 3e-2
    args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args)
    out = _run(op, backend, args)
    assert out.dtype == dtype
    assert_same_nonfinite(out, _gold(op, args), atol, f"{op}[{backend}, {dtype}]")
