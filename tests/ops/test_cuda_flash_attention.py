"""The cuda backend's second attention kernel, the variant ``"flash"``
(``kernels/cuda/flash_attention.cu``: FlashAttention-2 style, fp16 / bf16, sm_80+).

Registration, dispatch reasons and the build's entry points are checked without a
GPU; everything that launches the kernel is marked ``gpu``. The parity rule is
harness.py's (``assert_within_rule``, the variant called through
``dispatch.implementation``). Shapes aim at the kernel's edges: BLOCK_M = 128 query
rows per CTA (16 per warp), BLOCK_N = 64 keys per tile, every compiled head dim (80
and 96 are 5 and 6 k-steps of 16), varlen lengths on both sides of the tile edges,
zero-length sequences (the device-side tile table), masks that empty whole key
tiles, whole warps and whole CTAs of queries.

On a GPU machine:  pytest -m gpu tests/ops/test_cuda_flash_attention.py
and under the sanitizer:
  compute-sanitizer --tool memcheck python -m pytest -m gpu -x -q \\
      tests/ops/test_cuda_flash_attention.py -k "varlen or holes or nonfinite"
"""

from __future__ import annotations

import pytest
import torch

from bertfast.ops import dispatch, native, reference
from bertfast.ops.dispatch import Candidate

from .harness import HAS_CUDA, assert_within_rule, cast

cuda_backend = pytest.importorskip("bertfast.ops.cuda")

gpu = pytest.mark.gpu
DEV = torch.device("cuda")
HALF_DTYPES = [
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]
HEAD_DIMS = [32, 64, 80, 96, 128]
BACKEND = cuda_backend.BACKEND
_C = native._C
BUILD_HAS_FLASH = hasattr(getattr(_C, "cuda", None), "flash_attention")
STALE_BUILD = "this build of bertfast._C has no flash attention kernel (rebuild it)"


def _mask(lengths, seqlen):
    return (torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]).to(torch.int64)


def _cu(lengths):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return cu


def _varlen_args(lengths, heads, head_dim):
    T = sum(lengths)
    qkv = torch.randn(T, 3 * heads * head_dim)
    return (qkv, _cu(lengths), max(max(lengths), 1), heads, head_dim**-0.5)


def _flash(op):
    return dispatch.implementation(Candidate(op, "cuda", "flash"))


def assert_flash_parity(op, args, dtype):
    """harness.py's parity rule for the flash variant of ``op`` (the reference in float64
    is the gold, the reference in ``dtype`` sets the bound)."""
    ref = getattr(reference, op)
    gold = ref(*cast(args, torch.float64, DEV))
    same_dtype = ref(*cast(args, dtype, DEV))
    dev_args = cast(args, dtype, DEV)
    reason = BACKEND.why_not_variant(op, "flash", "cuda", dtype, dev_args)
    assert reason is None, reason
    out = _flash(op)(*dev_args)
    assert out.dtype == dtype, f"{op}[cuda:flash] returned {out.dtype}, expected {dtype}"
    assert_within_rule(op, f"{op}[cuda:flash]", out, gold, same_dtype, dtype)
    return out


# ---------------------------------------------------------------- no GPU needed
def test_flash_is_a_variant_of_both_attention_ops():
    assert BACKEND.variant_names("attention") == ("default", "flash")
    assert BACKEND.variant_names("attention_varlen") == ("default", "flash")
    assert BACKEND.variants["attention"]["flash"] is cuda_backend.flash_attention
    assert BACKEND.variants["attention_varlen"]["flash"] is cuda_backend.flash_attention_varlen
    # The default kernel stays attention.cu: the flash one runs only as a named
    # candidate (a winners table entry or a sweep), never as the backend's own op.
    assert BACKEND.ops["attention"] is cuda_backend.attention
    assert BACKEND.ops["attention_varlen"] is cuda_backend.attention_varlen
    assert Candidate("attention", "cuda", "flash").label == "cuda:flash"
    assert BACKEND.function("attention_varlen", "flash") is cuda_backend.flash_attention_varlen


def test_why_not_variant_reasons_on_this_machine():
    args = _varlen_args([5, 17], 2, 64)
    args = cast(args, torch.float16)
    reason = BACKEND.why_not_variant("attention_varlen", "flash", "cpu", torch.float16, args)
    assert reason == "runs on cuda tensors, got cpu"
    reason = BACKEND.why_not_variant("attention", "nope", "cuda", torch.float16, args)
    assert reason == "has no attention variant 'nope'"
    if not HAS_CUDA:
        # No GPU (or no CUDA build): the backend's own reason, before any input check.
        why = BACKEND.unavailable("cuda")
        assert why
        for variant in ("default", "flash"):
            got = BACKEND.why_not_variant("attention_varlen", variant, "cuda", torch.float16, args)
            assert got == why
        found = dispatch.candidates("attention_varlen", "cuda", torch.float16, args)
        assert all(c.backend != "cuda" for c in found), found


@pytest.mark.parametrize("op", ["attention", "attention_varlen"])
def test_flash_supports_reasons(op):
    supports = BACKEND.variant_supports[(op, "flash")]

    def args(dtype, heads, head_dim, batch=2, seqlen=8, device="meta"):
        H = heads * head_dim
        if op == "attention":
            return (torch.empty(batch, seqlen, 3 * H, dtype=dtype, device=device), None, heads, 0.1)
        cu = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        qkv = torch.empty(batch * seqlen, 3 * H, dtype=dtype, device=device)
        return (qkv, cu, seqlen, heads, 0.1)

    assert "float32" in supports(*args(torch.float32, 2, 64))
    # Rows of 3H fp16 elements: H = 36 -> 72 bytes, not a multiple of 16 (cp.async).
    assert "16 bytes" in supports(*args(torch.float16, 1, 36))
    if not BUILD_HAS_FLASH:  # the head dims and limits come with the kernel
        assert supports(*args(torch.float16, 2, 64)) == STALE_BUILD
        pytest.skip("bertfast._C was built before the flash kernel: " + STALE_BUILD)
    assert "head_dim 48" in supports(*args(torch.bfloat16, 2, 48))
    assert "num_heads 65536" in supports(*args(torch.float16, 65536, 32, batch=1, seqlen=1))
    if op == "attention":
        assert "sequence length" in supports(*args(torch.float16, 1, 32, batch=1, seqlen=2**30 + 1))
    else:
        assert "batch 65536" in supports(*args(torch.float16, 1, 32, batch=65536, seqlen=1))
        qkv, cu, _, heads, scale = args(torch.float16, 1, 32)
        assert "sequence length" in supports(qkv, cu, 2**30 + 1, heads, scale)
    assert supports(*args(torch.float16, 2, 64)) is None


def test_flash_needs_sm80(monkeypatch):
    monkeypatch.setattr(cuda_backend, "_capability", lambda index: (7, 5))
    reason = cuda_backend._flash_device(torch.device("cuda", 0))
    assert reason == "the flash kernel needs compute capability 8.0+, device has 7.5"
    monkeypatch.setattr(cuda_backend, "_capability", lambda index: (8, 0))
    assert cuda_backend._flash_device(torch.device("cuda", 0)) is None
    assert cuda_backend._flash_device(torch.device("cpu")) is None


def test_build_exposes_the_flash_entry_points():
    if _C is None or not hasattr(_C, "cuda"):
        pytest.skip("bertfast._C has no CUDA kernels in this build")
    assert hasattr(_C.cuda, "flash_attention"), "rebuild bertfast._C (pip install -e .)"
    assert hasattr(_C.cuda, "flash_attention_varlen")
    dims = _C.constants()["cuda_flash_attention_head_dims"]
    assert tuple(dims) == native.CUDA_FLASH_ATTENTION_HEAD_DIMS == tuple(HEAD_DIMS)
    # Without a CUDA tensor the binding refuses before touching any device.
    with pytest.raises(ValueError, match="flash_attention: qkv is on cpu"):
        _C.cuda.flash_attention(torch.zeros(1, 4, 96, dtype=torch.float16), None, 1, 0.1, 0)
    with pytest.raises(ValueError, match="flash_attention_varlen: qkv is on cpu"):
        _C.cuda.flash_attention_varlen(
            torch.zeros(4, 96, dtype=torch.float16), torch.zeros(2, dtype=torch.int32), 4, 1, 0.1, 0
        )


# ---------------------------------------------------------------- padded
@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_padded_every_head_dim(dtype, head_dim):
    # S = 200: two query tiles (the second 72 rows: warps 5..7 idle), four key tiles
    # (the last 8 keys); no mask, then right padding (a 1-token sequence included).
    qkv = torch.randn(3, 200, 3 * 2 * head_dim)
    assert_flash_parity("attention", (qkv, None, 2, head_dim**-0.5), dtype)
    mask = _mask([200, 77, 1], 200)
    out = assert_flash_parity("attention", (qkv, mask, 2, head_dim**-0.5), dtype)
    assert (out[~mask.bool().to(DEV)] == 0).all()


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
def test_padded_left_padding_holes_and_empty_rows(dtype, head_dim):
    S = 300
    mask = (torch.rand(5, S) > 0.4).to(torch.int64)  # holes everywhere
    mask[1, :190] = 0  # left padding: key tiles 0..1 empty, query tile 0 empty
    mask[2] = 0  # an all-masked sequence: zeros
    mask[3, 64:128] = 0  # one whole key tile masked (skipped)
    mask[3, 16:32] = 0  # a whole warp of queries padded
    mask[4] = 0
    mask[4, 299] = 1  # one real token, the last one
    qkv = torch.randn(5, S, 3 * 2 * head_dim)
    out = assert_flash_parity("attention", (qkv, mask, 2, head_dim**-0.5), dtype)
    assert (out[~mask.bool().to(DEV)] == 0).all()
    assert (out[2] == 0).all()


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_large_logits_rescale_across_tiles(dtype):
    # Scores of std ~16: the running max changes from tile to tile (alpha rescaling).
    qkv = 4 * torch.randn(2, 300, 3 * 2 * 64)
    assert_flash_parity("attention", (qkv, _mask([300, 141], 300), 2, 0.125), dtype)


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_batch_invariance_and_misaligned_input(dtype):
    # A sequence alone equals itself inside a padded batch, bit for bit: masked keys
    # are zero-filled and -inf as keys past the end are, empty key tiles skipped.
    heads, d, L, S = 2, 64, 77, 300
    qkv = torch.randn(3, S, 3 * heads * d, device=DEV, dtype=dtype)
    mask = _mask([S, L, 5], S).to(DEV)
    fn = _flash("attention")
    batched = fn(qkv, mask, heads, d**-0.5)
    alone = fn(qkv[1:2, :L].contiguous(), None, heads, d**-0.5)
    torch.testing.assert_close(batched[1:2, :L], alone, atol=0, rtol=0)
    # A qkv whose data is not 16-byte aligned runs on an aligned copy.
    flat = torch.empty(qkv.numel() + 1, dtype=dtype, device=DEV)
    shifted = flat[1:].view(qkv.shape)
    shifted.copy_(qkv)
    torch.testing.assert_close(fn(shifted, mask, heads, d**-0.5), batched, atol=0, rtol=0)


# ---------------------------------------------------------------- varlen
RAGGED = [1, 15, 16, 17, 127, 128, 129, 300, 512]


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_varlen_ragged_lengths(dtype, head_dim):
    # Zero-length sequences at the start, in the middle and at the end: no tile of
    # theirs in the device-side table.
    lengths = [0] + RAGGED[:4] + [0] + RAGGED[4:] + [0]
    assert_flash_parity("attention_varlen", _varlen_args(lengths, 2, head_dim), dtype)


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("length", RAGGED)
def test_varlen_single_sequence(dtype, length):
    assert_flash_parity("attention_varlen", _varlen_args([length], 3, 32), dtype)


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_varlen_many_short_sequences(dtype):
    # 2500 sequences: the prologue's scan gives each of its 1024 threads 3 of them;
    # a third are empty; tiles (2500 - empties) < grid (T / 128 + 2500).
    lengths = torch.randint(0, 40, (2500,))
    lengths[::3] = 0
    args = _varlen_args(lengths.tolist(), 2, 32)
    assert_flash_parity("attention_varlen", args, dtype)


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_varlen_empty(dtype):
    fn = _flash("attention_varlen")
    qkv = torch.randn(0, 3 * 64, device=DEV, dtype=dtype)
    cu = torch.zeros(3, dtype=torch.int32, device=DEV)
    assert fn(qkv, cu, 0, 1, 0.125).shape == (0, 64)
    qkv = torch.randn(4, 3 * 64, device=DEV, dtype=dtype)
    out = fn(qkv, torch.zeros(1, dtype=torch.int32, device=DEV), 0, 1, 0.125)  # no sequence
    assert out.shape == (4, 64) and (out == 0).all()


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_varlen_matches_padded(dtype):
    import bertfast.ops as ops

    lengths, heads, d = [50, 3, 129, 1, 300], 2, 80
    S = max(lengths)
    qkv = torch.randn(len(lengths), S, 3 * heads * d, device=DEV, dtype=dtype)
    mask = _mask(lengths, S).to(DEV)
    info = ops.pack_info(mask)
    padded = _flash("attention")(qkv, mask, heads, d**-0.5)
    packed = ops.pack_tokens(qkv.view(-1, qkv.shape[-1]), info.indices, backend="cuda")
    var = _flash("attention_varlen")(packed, info.cu_seqlens, info.max_seqlen, heads, d**-0.5)
    back = ops.unpack_tokens(var, info.indices, len(lengths) * S, backend="cuda").view_as(padded)
    torch.testing.assert_close(back, padded, atol=0, rtol=0)


# ---------------------------------------------------------------- non-finite inputs
def _nonfinite_kinds():
    from .test_nonfinite import KINDS

    return KINDS


@gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("kind", _nonfinite_kinds())
def test_nonfinite_propagate_as_in_torch(dtype, kind):
    from . import test_nonfinite as nf

    qkv = nf._inject(kind, nf._qkv()).to(dtype)
    lengths = nf._lengths()
    args = (qkv, nf._mask(lengths), nf.NH, nf.D**-0.5)
    gold = reference.attention(*cast(args, torch.float64))
    out = _flash("attention")(*cast(args, dtype, DEV)).cpu()
    nf.assert_same_nonfinite(out, gold, 3e-2, f"attention[cuda:flash, {kind}, {dtype}]")
    assert (out[2] == 0).all(), "a sequence with no real token must give zeros"
    assert (out[1, 150:] == 0).all(), "padded query rows must be zeros"
    vargs = nf._varlen_args(qkv, lengths, nf.D**-0.5)
    vgold = reference.attention_varlen(*cast(vargs, torch.float64))
    vout = _flash("attention_varlen")(*cast(vargs, dtype, DEV)).cpu()
    nf.assert_same_nonfinite(vout, vgold, 3e-2, f"attention_varlen[cuda:flash, {kind}, {dtype}]")


# ---------------------------------------------------------------- dispatch on a GPU
@gpu
def test_candidates_on_gpu():
    args = cast(_varlen_args([5, 200], 2, 64), torch.float16, DEV)
    found = dispatch.candidates("attention_varlen", "cuda", torch.float16, args)
    assert Candidate("attention_varlen", "cuda") in found
    assert Candidate("attention_varlen", "cuda", "flash") in found
    assert found.index(Candidate("attention_varlen", "cuda")) < found.index(
        Candidate("attention_varlen", "cuda", "flash")
    )
    args32 = cast(_varlen_args([5, 200], 2, 64), torch.float32, DEV)
    found = dispatch.candidates("attention_varlen", "cuda", torch.float32, args32)
    assert Candidate("attention_varlen", "cuda", "flash") not in found
    reason = BACKEND.why_not_variant("attention_varlen", "flash", "cuda", torch.float32, args32)
    assert "float32" in reason


@gpu
def test_binding_refuses_what_the_kernel_cannot_run():
    stream = torch.cuda.current_stream().cuda_stream
    qkv = torch.randn(1, 8, 3 * 64, device=DEV)
    with pytest.raises(TypeError, match="float32"):
        _C.cuda.flash_attention(qkv, None, 1, 0.125, stream)
    qkv = torch.randn(1, 8, 3 * 48, device=DEV, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim 48"):
        _C.cuda.flash_attention(qkv, None, 1, 0.125, stream)
