"""Triton-specific tests of the ``triton`` backend (bertfast/ops/triton/).

The per-op parity tests (tests/ops/test_<op>.py) already run the triton backend on
the shared cases; this file adds what is particular to the Triton kernels: tile
tails (hidden 96 / 1023 / 1500, head_dim 80 padded to BLOCK_D 128), strided inputs
read through their strides, bounds safety of id / index loads, the bf16 rounding of
the stores, the backend's availability reasons and its lazy import of triton.

Without a GPU every kernel runs on CPU tensors under TRITON_INTERPRET=1 (set in
tests/conftest.py before any kernel is defined), so shapes stay small: the whole
file runs in well under a minute interpreted on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import bertfast.ops as ops
from bertfast.ops import reference
from bertfast.ops.dispatch import BackendError, get_backend

from .harness import DTYPES, HAS_CUDA, INTERPRETED, assert_parity, device_for

pytestmark = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRETED),
    reason="the triton backend needs a CUDA GPU or TRITON_INTERPRET=1",
)

DEV = device_for("triton")
ACTIVATIONS = ["gelu", "gelu_tanh", "relu"]

# Tolerances of the checks below that are not the parity rule (harness.assert_parity
# owns that one, with its ATOL table), as data, per dtype:
# - "pack": pack/unpack only move rows; anything but bit-exact is a bug.
# - "store_rounding": the element-wise kernels compute in fp32 and round once to the
#   storage dtype, like torch's fp16/bf16 element-wise ops (which upcast to fp32
#   internally). The stores round to nearest even on the bits (cast_out), so the
#   result equals torch's except where the two fp32 values (different erf / exp
#   implementations, ~1 fp32 ulp apart where |out| is not tiny) straddle a rounding
#   boundary: a fraction ~2^-13 of elements at most, so 1e-3 of the elements may
#   differ. A truncating cast (what the interpreter's own fp32->bf16 cast does)
#   differs on ~half of them.
# - "attention_batch": one sequence alone vs. inside a padded batch runs the same
#   tiles over the same keys (masked keys add exact zeros), so fp32 agrees to
#   rounding of the reordered sums: 1e-6 on O(1) outputs; fp16 one ulp of O(1): 1e-3.
TOL = {
    "pack": {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 0.0},
    "store_rounding": {torch.float16: 1e-3, torch.bfloat16: 1e-3},
    "attention_batch": {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3},
}


def _skip_bf16_dot(dtype):
    if INTERPRETED and dtype == torch.bfloat16:
        pytest.skip(
            "the Triton interpreter computes tl.dot wrongly for bf16 inputs "
            "(checked on a GPU instead)"
        )


#: Tests that run the kernels with a runtime loop bound (GEMM K loop, attention key
#: loop): skipped, with the probe's reason, under an interpreter that cannot run such
#: loops (triton 3.6's with NumPy >= 2.3; see bertfast/ops/triton/_interpreter.py).
_RUNTIME_LOOP_TESTS = ("test_linear_gelu", "test_attention", "test_encoder_end_to_end")


@pytest.fixture(autouse=True)
def _skip_interpreter_loop_limit(request):
    if INTERPRETED and not HAS_CUDA and request.node.originalname.startswith(_RUNTIME_LOOP_TESTS):
        from bertfast.ops.triton._interpreter import runtime_loop_limit

        reason = runtime_loop_limit()
        if reason:
            pytest.skip(reason)


# ------------------------------------------------------------------ backend object
def test_backend_available_here():
    backend = get_backend("triton")
    assert backend.unavailable(DEV.type) is None


def test_cpu_needs_interpreter(monkeypatch):
    backend = get_backend("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = backend.unavailable("cpu")
    assert reason and "TRITON_INTERPRET=1" in reason


def test_import_is_lazy_and_missing_triton_is_a_reason():
    """``import bertfast.ops.triton`` imports no triton; without triton the backend
    is unavailable with a reason (and ``import bertfast`` still works)."""
    code = (
        "import sys\n"
        "import bertfast.ops.triton as t\n"
        "assert 'triton' not in sys.modules, 'triton imported eagerly'\n"
        "sys.modules['triton'] = None  # make 'import triton' fail\n"
        "r = t.BACKEND.unavailable('cuda')\n"
        "assert r and 'triton' in r, r\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_unsupported_inputs_give_reasons():
    qkv = torch.randn(1, 4, 3 * 256, device=DEV)
    with pytest.raises(BackendError, match="head_dim 256"):
        ops.attention(qkv, None, 1, backend="triton")
    x = torch.randn(3, 8, dtype=torch.float64, device=DEV)
    with pytest.raises(BackendError, match="float64"):
        ops.bias_gelu(x, None, "gelu", backend="triton")


def test_interpreter_loop_limit_is_a_reason():
    """Where the interpreter cannot run runtime-bound loops, the ops that need them
    are unsupported with the probe's reason (auto dispatch falls back); elsewhere they
    run."""
    if not INTERPRETED or HAS_CUDA:
        pytest.skip("only under the Triton interpreter")
    from bertfast.ops.triton._interpreter import runtime_loop_limit

    x, w = torch.randn(3, 16), torch.randn(5, 16)
    qkv = torch.randn(2, 4, 3 * 32)
    reason = runtime_loop_limit()
    if reason is None:
        assert ops.linear_gelu(x, w, None, "gelu", backend="triton").shape == (3, 5)
        assert ops.attention(qkv, None, 2, 0.25, backend="triton").shape == (2, 4, 32)
    else:
        assert "runtime bound" in reason
        with pytest.raises(BackendError, match="runtime bound"):
            ops.linear_gelu(x, w, None, "gelu", backend="triton")
        with pytest.raises(BackendError, match="runtime bound"):
            ops.attention(qkv, None, 2, 0.25, backend="triton")
        # pack has no runtime loop: unaffected
        assert torch.equal(ops.pack_tokens(x, torch.tensor([2, 0]), backend="triton"), x[[2, 0]])


# ------------------------------------------------------------------ layernorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [96, 1023, 1500])
def test_add_layernorm_hidden_tails(dtype, hidden):
    # A large mean offset stresses the variance: a one-pass E[x^2] - E[x]^2 in fp32
    # loses most digits at |mean| / std = 300.
    x = torch.randn(3, 5, hidden) + 300.0
    residual = torch.randn(3, 5, hidden)
    bias, weight, ln_bias = torch.randn(hidden), torch.randn(hidden), torch.randn(hidden)
    assert_parity("add_layernorm", "triton", (x, residual, bias, weight, ln_bias, 1e-12), dtype)
    assert_parity("add_layernorm", "triton", (x, residual, None, weight, ln_bias, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layernorm_strided_rows(dtype):
    base = torch.randn(6, 2 * 96)
    x = base[:, :96]  # row stride 192, unit column stride: read through the stride
    args = (x, torch.randn(6, 96), torch.randn(96), torch.randn(96), torch.randn(96), 1e-12)
    assert_parity("add_layernorm", "triton", args, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "hidden,with_types,id_dtype",
    [(96, True, torch.int64), (1023, False, torch.int32), (1500, True, torch.int32)],
)
def test_embed_layernorm(dtype, hidden, with_types, id_dtype):
    V, P, B, S = 50, 16, 2, 7
    ids = torch.randint(0, V, (B, S), dtype=id_dtype)
    pos = torch.arange(S).expand(B, S).to(id_dtype)
    types = torch.randint(0, 2, (B, S), dtype=id_dtype) if with_types else None
    type_table = torch.randn(2, hidden) if with_types else None
    args = (
        ids,
        pos,
        types,
        torch.randn(V, hidden),
        torch.randn(P, hidden),
        type_table,
        torch.randn(hidden),
        torch.randn(hidden),
        1e-12,
    )
    assert_parity("embed_layernorm", "triton", args, dtype)


def test_embed_layernorm_out_of_range_ids_never_read():
    """Ids outside the tables (which the boundary check lets through only while
    capturing/compiling) are clamped for the load and flag their row with NaN."""
    from bertfast.ops.triton import layernorm

    E, V = 96, 10
    word = torch.randn(V, E, device=DEV)
    pos_table = torch.randn(8, E, device=DEV)
    ids = torch.tensor([[1, V, -3, 2]], device=DEV)
    pos = torch.tensor([[0, 1, 2, 99]], device=DEV)
    w, b = torch.ones(E, device=DEV), torch.zeros(E, device=DEV)
    out = layernorm.embed_layernorm(ids, pos, None, word, pos_table, None, w, b, 1e-12)
    bad = torch.isnan(out).all(-1)[0].tolist()
    assert bad == [False, True, True, True]
    torch.testing.assert_close(
        out[0, 0],
        reference.embed_layernorm(ids[:, :1], pos[:, :1], None, word, pos_table, None, w, b, 1e-12)[
            0, 0
        ],
    )


# ------------------------------------------------------------------ bias + activation
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bias_gelu(dtype, activation):
    x = 3 * torch.randn(4, 9, 1500)
    bias = torch.randn(1500)
    out = assert_parity("bias_gelu", "triton", (x, bias, activation), dtype)
    if dtype in TOL["store_rounding"]:
        # computed in fp32, rounded once to nearest even: torch's result, bit for bit,
        # but for rare boundary cases
        xd, bd = x.to(DEV, dtype), bias.to(DEV, dtype)
        expect = reference.activation(xd.float() + bd.float(), activation).to(dtype)
        # where 1 + erf(x / sqrt 2) cancels (x << 0) both sides carry fp32 *absolute*
        # error only, so compare where the output has full relative precision
        full = expect.abs() > 0.25
        differ = (out[full] != expect[full]).float().mean().item()
        assert differ <= TOL["store_rounding"][dtype], f"{differ:.2%} of elements differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bias_gelu_in_place(dtype, activation):
    x = torch.randn(33, 130, device=DEV, dtype=dtype)
    bias = torch.randn(130, device=DEV, dtype=dtype)
    expect = ops.bias_gelu(x, bias, activation, backend="triton")
    y = x.clone()
    assert ops.bias_gelu_(y, bias, activation, backend="triton") is y
    assert torch.equal(y, expect)
    # a strided view is written through the view, the rest untouched
    base = torch.randn(33, 260, device=DEV, dtype=dtype)
    keep = base.clone()
    view = base[:, ::2]
    ops.bias_gelu_(view, bias, activation, backend="triton")
    assert torch.equal(
        base[:, ::2], ops.bias_gelu(keep[:, ::2], bias, activation, backend="triton")
    )
    assert torch.equal(base[:, 1::2], keep[:, 1::2])


def _f32_from_bits(patterns):
    signed = [b - (1 << 32) if b >= 1 << 31 else b for b in patterns]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_store_cast_special_values(dtype):
    """The stores (cast_out) round fp32 as torch's ``.to(dtype)`` does, bit for bit,
    and keep every NaN a NaN whatever its payload: an NVIDIA GPU's arithmetic NaN is
    0x7FFFFFFF, whose bf16 rounding carry once gave -0.0 (no NaN in any bf16 output on
    a GPU), which the interpreter's own NaNs never showed."""
    from .cast_probe import cast_store

    nans = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F808000,
            0x7FBFFFFF, 0xFF80FFFF, 0x7FFF8000]  # fmt: skip
    others = [
        0x7F800000, 0xFF800000, 0x00000000, 0x80000000,  # +-inf, +-0
        0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000,  # largest: to inf or not
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even, either side
        0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,  # subnormals
        0x477FF000, 0x477FF001, 0x33000000, 0x33000001,  # fp16: 65520 tie, 2^-25 tie
    ]  # fmt: skip
    x = torch.cat([_f32_from_bits(nans + others), 1e3 * torch.randn(500)])
    out = cast_store(x.to(DEV), dtype).cpu()
    expect = x.to(dtype)
    assert torch.isnan(out[: len(nans)]).all(), out[: len(nans)]
    bits = torch.int16
    differ = (out[len(nans) :].view(bits) != expect[len(nans) :].view(bits)).nonzero()
    assert differ.numel() == 0, [
        (hex(int(x[len(nans) + i].view(torch.int32)) & 0xFFFFFFFF), out[len(nans) + i].item())
        for i in differ.flatten()[:8].tolist()
    ]


def test_bias_gelu_extremes():
    """Large |x|: tanh GELU must not overflow (-> NaN) and matches torch's limits."""
    x = torch.tensor([[-1e4, -60.0, -10.0, 0.0, 10.0, 60.0, 1e4]], device=DEV)
    for act in ACTIVATIONS:
        out = ops.bias_gelu(x, None, act, backend="triton")
        torch.testing.assert_close(out, reference.bias_gelu(x, None, act), atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------ linear + activation
LINEAR_SHAPES = [
    (37, 96, 130),  # every tile edge ragged (M, N, K not multiples of the tiles)
    (1, 40, 17),  # one token, K below BLOCK_K
    (128, 256, 512),  # a few full tiles, K loop of several steps
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", LINEAR_SHAPES)
def test_linear_gelu(dtype, M, K, N):
    _skip_bf16_dot(dtype)
    x = torch.randn(M, K)
    weight = torch.randn(N, K) / K**0.5
    bias = torch.randn(N)
    for act in ACTIVATIONS if M < 128 else ["gelu"]:
        assert_parity("linear_gelu", "triton", (x, weight, bias, act), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gelu_strided_and_batched(dtype):
    _skip_bf16_dot(dtype)
    # x transposed in memory (column-major), 3-D, no bias
    x = torch.randn(96, 2 * 9).t().reshape(2, 9, 96)
    assert_parity("linear_gelu", "triton", (x, torch.randn(70, 96) / 10, None, "gelu"), dtype)
    # weight given as a transposed view of a [K, N] tensor
    w = (torch.randn(96, 70) / 10).t()
    assert_parity("linear_gelu", "triton", (torch.randn(5, 96), w, torch.randn(70), "relu"), dtype)


# ------------------------------------------------------------------ attention
def _mask(rows):
    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 80])
def test_attention_ragged_masks(dtype, head_dim):
    _skip_bf16_dot(dtype)
    S, heads = 40, 2
    mask = torch.ones(4, S, dtype=torch.int64)
    mask[0, 23:] = 0  # right padding
    mask[1, :30] = 0  # left padding (keys before the first real token)
    mask[2, 5:9] = 0  # holes in the middle
    mask[2, 33:] = 0
    mask[3, :] = 0  # an all-masked row
    qkv = torch.randn(4, S, 3 * heads * head_dim)
    out = assert_parity("attention", "triton", (qkv, mask, heads, head_dim**-0.5), dtype)
    assert (out[~mask.bool().to(out.device)] == 0).all()


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int32, torch.float32])
def test_attention_mask_dtypes(mask_dtype):
    qkv = torch.randn(2, 9, 3 * 64)
    mask = _mask([[1] * 9, [1] * 4 + [0] * 5]).to(mask_dtype)
    assert_parity("attention", "triton", (qkv, mask, 2, 0.125), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_seq1(dtype):
    _skip_bf16_dot(dtype)
    qkv = torch.randn(3, 1, 3 * 2 * 32)
    assert_parity("attention", "triton", (qkv, None, 2, 32**-0.5), dtype)
    assert_parity("attention", "triton", (qkv, _mask([[1], [0], [1]]), 2, 32**-0.5), dtype)


def test_attention_strided_qkv():
    """qkv read through its strides (a slice of a wider buffer) -- no copy needed."""
    buf = torch.randn(2, 33, 3 * 96 + 16)
    qkv = buf[:, :, 8 : 8 + 3 * 96]
    assert_parity(
        "attention",
        "triton",
        (qkv, _mask([[1] * 33, [1] * 20 + [0] * 13]), 3, 32**-0.5),
        torch.float32,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 80])
def test_attention_varlen(dtype, head_dim):
    _skip_bf16_dot(dtype)
    lengths, heads = [5, 1, 0, 37, 16], 2
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    qkv = torch.randn(sum(lengths), 3 * heads * head_dim)
    assert_parity(
        "attention_varlen", "triton", (qkv, cu, max(lengths), heads, head_dim**-0.5), dtype
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_batch_invariance(dtype):
    """A sequence alone, inside a padded batch, and inside a packed batch: same output."""
    heads, d, S = 3, 32, 24
    qkv = torch.randn(2, S, 3 * heads * d, device=DEV, dtype=dtype)
    mask = _mask([[1] * S, [1] * 10 + [0] * (S - 10)]).to(DEV)
    batched = ops.attention(qkv, mask, heads, backend="triton")
    alone = ops.attention(qkv[1:, :10], None, heads, backend="triton")
    cu = torch.tensor([0, S, S + 10], dtype=torch.int32, device=DEV)
    packed = ops.attention_varlen(torch.cat([qkv[0], qkv[1, :10]]), cu, S, heads, backend="triton")
    tol = TOL["attention_batch"][dtype]
    assert (batched[1, :10] - alone[0]).abs().max().item() <= tol
    assert (packed[S:] - alone[0]).abs().max().item() <= tol
    assert (packed[:S] - batched[0]).abs().max().item() <= tol


# ------------------------------------------------------------------ pack / unpack
@pytest.mark.parametrize("dtype", DTYPES + [torch.int64, torch.bool])
def test_pack_unpack_roundtrip(dtype):
    x = (10 * torch.randn(12, 3, 5)).to(dtype).to(DEV)
    indices = torch.tensor([0, 3, 4, 7, 11], device=DEV)
    packed = ops.pack_tokens(x, indices, backend="triton")
    assert packed.dtype == dtype and torch.equal(packed, reference.pack_tokens(x, indices))
    back = ops.unpack_tokens(packed, indices, 12, backend="triton")
    assert torch.equal(back, reference.unpack_tokens(packed, indices, 12))
    ids = torch.arange(12, device=DEV)  # 1-D (one column per row)
    assert torch.equal(ops.pack_tokens(ids, indices, backend="triton"), ids[indices])


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64, torch.int64])
def test_pack_unpack_out_of_range_never_dereferenced(dtype):
    """Indices the boundary check could not see (graph capture): pack flags NaN
    (0 for integer rows), unpack drops the row; neither reads or writes outside its
    tensors."""
    from bertfast.ops.triton import pack

    x = (10 * torch.randn(4, 3)).to(dtype).to(DEV)
    idx = torch.tensor([2, 4, -1], device=DEV)
    out = pack.pack_tokens(x, idx)
    assert out.dtype == dtype and torch.equal(out[0], x[2])
    if dtype.is_floating_point:
        assert torch.isnan(out[1:]).all()
    else:
        assert (out[1:] == 0).all()
    back = pack.unpack_tokens(x[:3], idx, 4)
    expect = torch.zeros(4, 3, dtype=dtype, device=DEV)
    expect[2] = x[0]
    assert torch.equal(back, expect)


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
def test_pack_unpack_move_bits_exactly(dtype):
    """Rows move as raw bits: NaN payloads, signed zeros, infinities and subnormals
    arrive unchanged (compared as integers of the same width)."""
    bits = {
        torch.float16: torch.int16,
        torch.bfloat16: torch.int16,
        torch.float32: torch.int32,
        torch.float64: torch.int64,
    }[dtype]
    info = torch.finfo(dtype)
    special = torch.tensor(
        [
            float("nan"),
            -0.0,
            0.0,
            float("inf"),
            float("-inf"),
            info.tiny / 4,
            -info.tiny / 2,
            info.max,
        ],
        dtype=dtype,
    )
    x = torch.cat([special, (10 * torch.randn(8)).to(dtype)]).reshape(4, 4)
    raw = x.view(bits).clone()
    raw[0, 0] = raw[0, 0] | 0x5  # a NaN with its own payload
    x = raw.view(dtype).to(DEV)
    indices = torch.tensor([3, 0, 2], device=DEV)
    packed = ops.pack_tokens(x, indices, backend="triton")
    assert torch.equal(packed.view(bits), x.view(bits)[indices])
    back = ops.unpack_tokens(packed, indices, 4, backend="triton")
    assert torch.equal(back.view(bits)[indices], x.view(bits)[indices])


# ------------------------------------------------------------------ end to end
# A tiny random BERT / DistilBERT run entirely on triton kernels vs. transformers,
# fp32: every op is within ~1e-6 of the spec, a few layers of them stay within 1e-5.
E2E_ATOL = 1e-5


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_encoder_end_to_end(tmp_path, family):
    pytest.importorskip("transformers")
    import bertfast
    from tests.models import build, make_batch, save

    hf = build(family, "base")
    folder = save(hf, str(tmp_path))
    batch = make_batch(family)
    with torch.no_grad():
        ref = hf(**batch).last_hidden_state
    model = bertfast.from_pretrained(folder, backend="triton", device=DEV)
    out = model(**{k: v.to(DEV) for k, v in batch.items()}).last_hidden_state.cpu()
    real = batch["attention_mask"].bool()
    assert (out[real] - ref[real]).abs().max().item() <= E2E_ATOL
    assert (out[~real] == 0).all()


# ------------------------------------------------------------------ GPU compile check
_AOT_SCRIPT = r"""
import os, sys
os.environ.pop("TRITON_INTERPRET", None)  # real JIT functions, not interpreted ones
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from bertfast.ops.triton import attention, bias_act, layernorm, linear_act, pack

PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16",
       torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.uint8: "*u8"}

def build(kernel, args, constexprs, cfg, cap):
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn  # through autotune / heuristics
    sig = {}
    for name in kernel.arg_names:
        v = constexprs.get(name, args.get(name))
        sig[name] = ("constexpr" if name in constexprs else PTR[v] if isinstance(v, torch.dtype)
                     else "i32" if isinstance(v, int) else "fp32")
    triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs),
                   target=GPUTarget("cuda", cap, 32),
                   options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})

cap, dt = int(sys.argv[1]), getattr(torch, sys.argv[2])
prec = "ieee" if dt == torch.float32 else "tf32"
for varlen, has_mask, d in ((False, True, 80), (True, False, 64)):
    cfg = attention._GPU_CONFIGS[0]
    build(attention._attention_kernel,
          dict(qkv_ptr=dt, mask_ptr=torch.int64 if has_mask else dt, out_ptr=dt,
               cu_seqlens_ptr=torch.int32 if varlen else dt, padded_len=77, hidden=12 * d,
               qk_scale=0.3, seq_bucket=128, qkv_batch_stride=77 * 36 * d,
               qkv_token_stride=36 * d, out_batch_stride=77 * 12 * d, out_token_stride=12 * d,
               mask_batch_stride=77, mask_token_stride=1),
          dict(HEAD_DIM=d, IS_VARLEN=varlen, HAS_MASK=has_mask, DOT_PRECISION=prec,
               BLOCK_D=triton.next_power_of_2(d), **cfg.kwargs), cfg, cap)
for even_k in (True, False):
    cfg = linear_act._GPU_CONFIGS[3]
    build(linear_act._linear_act_kernel,
          dict(x_ptr=dt, w_ptr=dt, bias_ptr=dt, out_ptr=dt, M=1000, N=1536, K=384, m_bucket=1024,
               x_stride_m=384, x_stride_k=1, w_stride_n=384, w_stride_k=1, out_stride_m=1536),
          dict(ACTIVATION=1, HAS_BIAS=True, DOT_PRECISION=prec, EVEN_K=even_k, **cfg.kwargs),
          cfg, cap)
ew = triton.Config({}, num_warps=8, num_stages=1)
build(bias_act._bias_act_kernel, dict(x_ptr=dt, bias_ptr=dt, out_ptr=dt, n_rows=100,
      n_cols=1500, x_row_stride=1500, out_row_stride=1500),
      dict(ACTIVATION=0, HAS_BIAS=True, BLOCK_M=4, BLOCK_N=1024), ew, cap)
build(layernorm._add_layernorm_kernel, dict(x_ptr=dt, residual_ptr=dt, bias_ptr=dt,
      weight_ptr=dt, ln_bias_ptr=dt, out_ptr=dt, n_rows=100, n_cols=1023, x_row_stride=1023,
      residual_row_stride=1023, out_row_stride=1023, eps=1e-12),
      dict(HAS_BIAS=True, BLOCK_M=4, BLOCK_H=1024), ew, cap)
build(layernorm._embed_layernorm_kernel, dict(input_ids_ptr=torch.int64,
      position_ids_ptr=torch.int64, token_type_ids_ptr=torch.int32, word_ptr=dt, pos_ptr=dt,
      type_ptr=dt, weight_ptr=dt, ln_bias_ptr=dt, out_ptr=dt, n_tokens=100, n_cols=1023,
      vocab_size=30522, max_positions=512, type_vocab_size=2, word_row_stride=1023,
      pos_row_stride=1023, type_row_stride=1023, out_row_stride=1023, eps=1e-12),
      dict(HAS_TOKEN_TYPES=True, BLOCK_M=4, BLOCK_H=1024), ew, cap)
for fdt in (dt, torch.float64):  # rows move as the integer type of their width
    bits, nan = pack._BITS[fdt]
    build(pack._gather_rows_kernel, dict(x_ptr=bits, indices_ptr=torch.int64, out_ptr=bits,
          n_rows=100, n_src_rows=200, n_cols=384, x_row_stride=384, out_row_stride=384),
          dict(FILL_NAN=True, NAN_BITS=nan, BLOCK_M=8, BLOCK_N=512), ew, cap)
build(pack._scatter_rows_kernel, dict(x_ptr=torch.uint8, indices_ptr=torch.int64,
      out_ptr=torch.uint8, n_rows=100, n_dst_rows=200, n_cols=5, x_row_stride=5,
      out_row_stride=5), dict(BLOCK_M=256, BLOCK_N=16), ew, cap)
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.parametrize("cap,dtype", [(80, "float16"), (90, "bfloat16")])
def test_kernels_compile_for_gpu(cap, dtype):
    """Compile every kernel to a cubin for sm_80 / sm_90 without a GPU: catches what
    the interpreter lets through (types, layouts, ptxas limits). Uses triton's
    ahead-of-time compile API, which is not a stable interface: skipped if it moved."""
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"triton's compile API moved: {exc}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _AOT_SCRIPT, str(cap), dtype],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0 and "compiled" in res.stdout, res.stderr[-4000:]


# ------------------------------------------------------------------ GPU only
@pytest.mark.gpu
def test_cuda_graph_capture():
    """Every launcher is capturable: no host syncs once the autotuned kernels have
    been warmed up for the shape bucket (the boundary checks skip their range checks
    while capturing)."""
    dev, dt = torch.device("cuda"), torch.float16
    B, S, heads, d = 2, 64, 4, 64
    H = heads * d
    qkv = torch.randn(B, S, 3 * H, device=dev, dtype=dt)
    mask = torch.ones(B, S, dtype=torch.int64, device=dev)
    mask[1, 40:] = 0
    info = ops.pack_info(mask)
    x = torch.randn(B * S, H, device=dev, dtype=dt)
    w1 = torch.randn(4 * H, H, device=dev, dtype=dt) / H**0.5
    b1 = torch.randn(4 * H, device=dev, dtype=dt)
    lw, lb = torch.ones(H, device=dev, dtype=dt), torch.zeros(H, device=dev, dtype=dt)

    def run():
        a = ops.attention(qkv, mask, heads, backend="triton")
        packed = ops.pack_tokens(qkv.view(B * S, 3 * H), info.indices, backend="triton")
        v = ops.attention_varlen(packed, info.cu_seqlens, info.max_seqlen, heads, backend="triton")
        u = ops.unpack_tokens(v, info.indices, B * S, backend="triton")
        h = ops.add_layernorm(u, x, None, lw, lb, 1e-12, backend="triton")
        f = ops.linear_gelu(h, w1, b1, "gelu", backend="triton")
        ops.bias_gelu_(f, b1, "relu", backend="triton")
        return a, f

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = run()  # warm-up: compiles and autotunes
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    graph.replay()
    torch.cuda.synchronize()
    for e, c in zip(eager, captured):
        assert torch.equal(e, c)
