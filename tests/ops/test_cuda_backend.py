"""The ``cuda`` backend (kernels/cuda/) against the reference, on a GPU.

Everything that launches a kernel is marked ``gpu`` (skips cleanly without one);
the parity rule and tolerances are the shared ones of ``harness.py``. Shapes are
adversarial on purpose: hidden 1023 / 1500 (scalar, non-vectorised paths) and
4096 / 9000 (row-per-block paths), misaligned data pointers (scalar fallbacks),
every compiled head dim, sequence lengths from 1 to 4096 including tile tails
(63, 64, 65, 129...), empty and all-masked sequences, masks with holes.

On a GPU machine:  pytest -m gpu tests/ops/test_cuda_backend.py
and under the sanitizer (slow; a subset):
  compute-sanitizer --tool memcheck python -m pytest -m gpu -x -q \
      tests/ops/test_cuda_backend.py -k "small or misaligned or nan or pack"
"""

from __future__ import annotations

import pytest
import torch

import bertfast.ops as ops
from bertfast.ops import reference

from .harness import DTYPES, HAS_CUDA, assert_parity

cuda_backend = pytest.importorskip("bertfast.ops.cuda")

gpu = pytest.mark.gpu
DEV = torch.device("cuda")


def _mask(lengths, seqlen):
    return (torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t (on the GPU) whose data pointer is one element past
    a 16-byte boundary, to exercise the scalar fallbacks."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=DEV)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


# ---------------------------------------------------------------- no GPU needed
def test_reasons_without_running_anything():
    qkv = torch.zeros(1, 4, 3 * 2 * 48)
    reason = cuda_backend.BACKEND.supports["attention"](qkv, None, 2, 0.1)
    assert reason and "head_dim 48" in reason
    assert (
        cuda_backend.BACKEND.supports["attention"](torch.zeros(1, 4, 3 * 128), None, 2, 0.1) is None
    )
    x = torch.zeros(2, cuda_backend.MAX_LAYERNORM_WIDTH + 1)
    assert "hidden size" in cuda_backend.BACKEND.supports["add_layernorm"](
        x, x, None, None, None, 1e-5
    )
    if not HAS_CUDA:
        assert cuda_backend.BACKEND.unavailable("cuda")  # says why (no GPU / no CUDA build)


# ---------------------------------------------------------------- LayerNorm
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [32, 384, 768, 1023, 1024, 1500, 4096, 9000])
@pytest.mark.parametrize("with_types", [True, False], ids=["types", "no_types"])
def test_embed_layernorm(dtype, hidden, with_types):
    B, S, V, P, Tt = 3, 7, 50, 16, 2
    ids = torch.randint(0, V, (B, S))
    pids = torch.arange(S).expand(B, S).contiguous()
    tids = torch.randint(0, Tt, (B, S)) if with_types else None
    types = torch.randn(Tt, hidden) if with_types else None
    args = (
        ids,
        pids,
        tids,
        torch.randn(V, hidden) + 3.0,
        torch.randn(P, hidden),
        types,
        torch.randn(hidden),
        torch.randn(hidden),
        1e-12,
    )
    assert_parity("embed_layernorm", "cuda", args, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_embed_layernorm_out_of_range_id_gives_nan_row(dtype):
    H = 64
    word = torch.randn(10, H, device=DEV, dtype=dtype)
    pos = torch.randn(8, H, device=DEV, dtype=dtype)
    ids = torch.tensor([[1, 2, 10, 3], [-1, 4, 5, 6]], device=DEV)  # 10 and -1 out of range
    pids = torch.arange(4, device=DEV).expand(2, 4).contiguous()
    w, b = torch.ones(H, device=DEV, dtype=dtype), torch.zeros(H, device=DEV, dtype=dtype)
    # The kernel itself, past the op boundary's range check.
    out = cuda_backend.embed_layernorm(ids, pids, None, word, pos, None, w, b, 1e-12)
    torch.cuda.synchronize()
    bad = torch.tensor([[0, 0, 1, 0], [1, 0, 0, 0]], dtype=torch.bool, device=DEV)
    assert out[bad].isnan().all()
    assert torch.isfinite(out[~bad]).all()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 31, 768, 1023, 1024, 1500, 2048, 9000])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_add_layernorm(dtype, hidden, with_bias):
    rows = 37
    # A large common offset stresses the variance (two-pass statistics).
    x = torch.randn(rows, hidden) + 50.0
    args = (
        x,
        torch.randn(rows, hidden),
        torch.randn(hidden) if with_bias else None,
        torch.randn(hidden),
        torch.randn(hidden),
        1e-5,
    )
    assert_parity("add_layernorm", "cuda", args, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [768, 1500])
def test_add_layernorm_misaligned(dtype, hidden):
    x = torch.randn(5, hidden, device=DEV, dtype=dtype)
    res = torch.randn(5, hidden, device=DEV, dtype=dtype)
    w, b, lb = (torch.randn(hidden, device=DEV, dtype=dtype) for _ in range(3))
    want = reference.add_layernorm(x, res, b, w, lb, 1e-5)
    got = ops.add_layernorm(_misaligned(x), res, b, _misaligned(w), lb, 1e-5, backend="cuda")
    torch.testing.assert_close(
        got,
        want,
        atol=2e-2 if dtype != torch.float32 else 1e-5,
        rtol=1e-2 if dtype != torch.float32 else 1e-5,
    )


@gpu
def test_add_layernorm_on_side_stream():
    x = torch.randn(64, 768, device=DEV)
    w, b = torch.randn(768, device=DEV), torch.randn(768, device=DEV)
    want = reference.add_layernorm(x, x, None, w, b, 1e-5)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = ops.add_layernorm(x, x, None, w, b, 1e-5, backend="cuda")
    stream.synchronize()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- bias + activation
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("width", [1, 1023, 1500, 3072])
def test_bias_gelu(dtype, act, width):
    x = 3 * torch.randn(9, width)
    assert_parity("bias_gelu", "cuda", (x, torch.randn(width), act), dtype)
    assert_parity("bias_gelu", "cuda", (x, None, act), dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
def test_bias_gelu_inplace(dtype, act):
    x = (3 * torch.randn(4, 5, 1024)).to(DEV, dtype)
    bias = torch.randn(1024, device=DEV, dtype=dtype)
    want = reference.bias_gelu(x, bias, act)
    y = x.clone()
    assert ops.bias_gelu_(y, bias, act, backend="cuda") is y
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(y, want, atol=tol, rtol=tol)
    # Non-contiguous input: written back through a contiguous temporary.
    z = x.clone().transpose(0, 1)
    ops.bias_gelu_(z, bias, act, backend="cuda")
    torch.testing.assert_close(z, want.transpose(0, 1), atol=tol, rtol=tol)
    # Misaligned pointer: the scalar path.
    m = _misaligned(x)
    ops.bias_gelu_(m, bias, act, backend="cuda")
    torch.testing.assert_close(m, want, atol=tol, rtol=tol)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_linear_gelu(dtype, act):
    x = torch.randn(3, 17, 384)
    args = (x, torch.randn(1536, 384) / 20, torch.randn(1536), act)
    assert_parity("linear_gelu", "cuda", args, dtype)


# ---------------------------------------------------------------- attention
# (lengths, heads, head_dim): every compiled head dim; lengths from 1 to 4096 with
# tile tails (BLOCK_M = 64; BLOCK_N = 64 fp16/bf16, 32 fp32), an empty sequence.
PADDED_CASES = [
    ([1], 1, 64),
    ([5, 1, 17, 64], 3, 32),
    ([300, 1, 0, 129], 4, 32),
    ([65, 64, 63], 2, 80),
    ([1000, 517], 2, 96),
    ([128, 200, 31], 3, 128),
    ([2048, 33], 1, 128),
    ([4096], 2, 64),
]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lengths,heads,head_dim",
    PADDED_CASES,
    ids=[f"{'-'.join(map(str, c[0]))}x{c[1]}h{c[2]}" for c in PADDED_CASES],
)
def test_attention_padded(dtype, lengths, heads, head_dim):
    S = max(max(lengths), 1)
    B, H = len(lengths), heads * head_dim
    qkv = torch.randn(B, S, 3 * H)
    mask = _mask(lengths, S)
    out = assert_parity("attention", "cuda", (qkv, mask, heads, head_dim**-0.5), dtype)
    assert (out[~mask.bool().to(out.device)] == 0).all()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
def test_attention_small_all_head_dims(dtype, head_dim):
    qkv = torch.randn(2, 70, 3 * 2 * head_dim)
    assert_parity("attention", "cuda", (qkv, None, 2, head_dim**-0.5), dtype)
    assert_parity("attention", "cuda", (qkv, _mask([70, 3], 70), 2, head_dim**-0.5), dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_mask_with_holes(dtype):
    # Left padding and holes: key tiles that are partly or entirely masked.
    S = 200
    mask = (torch.rand(3, S) > 0.4).to(torch.int64)
    mask[1, :150] = 0
    mask[2] = 0  # an all-masked sequence
    qkv = torch.randn(3, S, 3 * 4 * 64)
    out = assert_parity("attention", "cuda", (qkv, mask, 4, 0.125), dtype)
    assert (out[~mask.bool().to(out.device)] == 0).all()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_large_logits(dtype):
    # Scores of std ~16 (max ~60): needs the running-max rescaling across key tiles.
    # Not larger: the fp32 bound is an absolute 5e-5 against torch's own fp32 result,
    # and dot products of magnitude ~1e3 already differ by ~1e-5 between summation
    # orders (checked with a CPU emulation of this kernel's numerics).
    qkv = 4 * torch.randn(2, 100, 3 * 2 * 64)
    assert_parity("attention", "cuda", (qkv, _mask([100, 41], 100), 2, 0.125), dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_misaligned_qkv(dtype):
    qkv = torch.randn(2, 40, 3 * 128, device=DEV, dtype=dtype)
    mask = _mask([40, 22], 40).to(DEV)
    want = ops.attention(qkv, mask, 2, backend="cuda")
    got = ops.attention(_misaligned(qkv), mask, 2, backend="cuda")
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_batch_invariance(dtype):
    # A sequence alone equals itself inside a padded batch, bit for bit (fully
    # masked key tiles are skipped, partial tiles give exact zeros).
    heads, d, L, S = 2, 64, 77, 300
    qkv = torch.randn(3, S, 3 * heads * d, device=DEV, dtype=dtype)
    mask = _mask([S, L, 5], S).to(DEV)
    batched = ops.attention(qkv, mask, heads, backend="cuda")
    alone = ops.attention(qkv[1:2, :L].contiguous(), None, heads, backend="cuda")
    torch.testing.assert_close(batched[1:2, :L], alone, atol=0, rtol=0)


VARLEN_CASES = [
    ([5, 1, 17, 64], 3, 32),
    ([1], 2, 80),
    ([0, 77, 0, 130], 2, 80),
    ([33, 2, 65], 2, 64),
    ([513, 129, 64], 2, 96),
    ([4096, 3], 1, 128),
]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lengths,heads,head_dim",
    VARLEN_CASES,
    ids=[f"{'-'.join(map(str, c[0]))}x{c[1]}h{c[2]}" for c in VARLEN_CASES],
)
def test_attention_varlen(dtype, lengths, heads, head_dim):
    T, H = sum(lengths), heads * head_dim
    qkv = torch.randn(T, 3 * H)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    assert_parity("attention_varlen", "cuda", (qkv, cu, max(lengths), heads, head_dim**-0.5), dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_matches_padded(dtype):
    lengths, heads, d = [50, 3, 128, 1], 2, 80
    S = max(lengths)
    qkv = torch.randn(len(lengths), S, 3 * heads * d, device=DEV, dtype=dtype)
    mask = _mask(lengths, S).to(DEV)
    info = ops.pack_info(mask)
    padded = ops.attention(qkv, mask, heads, backend="cuda")
    packed = ops.pack_tokens(qkv.view(-1, qkv.shape[-1]), info.indices, backend="cuda")
    var = ops.attention_varlen(packed, info.cu_seqlens, info.max_seqlen, heads, backend="cuda")
    back = ops.unpack_tokens(var, info.indices, len(lengths) * S, backend="cuda").view_as(padded)
    torch.testing.assert_close(back, padded, atol=0, rtol=0)


# ---------------------------------------------------------------- pack / unpack
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 3, 768, 1023])
def test_pack_unpack(dtype, width):
    x = torch.randn(40, width, device=DEV).to(dtype)
    idx = torch.tensor([0, 3, 4, 17, 39, 38], device=DEV)
    packed = ops.pack_tokens(x, idx, backend="cuda")
    assert torch.equal(packed, x[idx])
    out = ops.unpack_tokens(packed, idx, 40, backend="cuda")
    want = torch.zeros_like(x)
    want[idx] = x[idx]
    assert torch.equal(out, want)
    # Misaligned source: narrower copy units.
    assert torch.equal(ops.pack_tokens(_misaligned(x), idx, backend="cuda"), x[idx])


@gpu
def test_pack_multidim_rows_and_empty():
    x = torch.randn(6, 3, 5, device=DEV, dtype=torch.float16)
    idx = torch.tensor([5, 0], device=DEV)
    assert torch.equal(ops.pack_tokens(x, idx, backend="cuda"), x[idx])
    empty = torch.empty(0, dtype=torch.int64, device=DEV)
    assert ops.pack_tokens(x, empty, backend="cuda").shape == (0, 3, 5)
    assert (ops.unpack_tokens(x[:0], empty, 4, backend="cuda") == 0).all()


# ---------------------------------------------------------------- opcheck on cuda
def _opcheck_cases():
    from .test_opcheck import CASES

    for name, args in CASES:
        yield pytest.param(name, args, id=name)


@gpu
@pytest.mark.parametrize("name,args", list(_opcheck_cases()))
def test_opcheck_cuda(name, args):
    args = tuple(a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args)
    op = getattr(torch.ops.bertfast, name).default
    torch.library.opcheck(op, args + ("cuda",))
