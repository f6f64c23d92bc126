"""``attention`` (padded batch + key-padding mask) and ``attention_varlen`` (packed
batch + cu_seqlens): flash-style multi-head self-attention reading the fused QKV
tensor through strides and writing heads already merged.

One program per (query block, head, sequence): the Q tile [BLOCK_M, BLOCK_D] stays
in registers while K/V tiles of BLOCK_N keys stream past it; the softmax is online
in fp32 (running row max and row sum, rescaled per tile) using exp2 with the scale
pre-multiplied by log2(e). head_dim need not be a power of two (80, 96): BLOCK_D is
the next power of two (at least 16, for tl.dot) and the extra columns are masked.

**Launch configs.** The tile lists are per GPU generation (:data:`_SM90_CONFIGS` on
compute capability 9.x and later, :data:`_SM80_CONFIGS` before), one autotuner per
list, picked at launch from the tensors' device; both are pruned per input by
:func:`_prune` (short sequences, wide heads, shared memory). Under the interpreter
one small config. ``config=`` (a dict, see :func:`check_config`) launches exactly
that config and bypasses the autotuner; :func:`attention_configs` lists what a
caller may force for an input (the autotuner's pruned list).

**Alignment.** Row strides and the K / V column offset reach the kernel in *bytes*:
Triton specialises an integer argument divisible by 16 (and a pointer aligned to 16
bytes), so every row of a tensor whose rows start on 16-byte boundaries is known to
be aligned and the K / V tile loads become ``cp.async`` copies pipelined with the
math, also for widths that are not a multiple of 16 elements (e.g. head_dim 40 in
fp16: rows of 600 elements are 1200 bytes). ``tests/ops/test_triton_sm90_compile.py``
compiles the kernel for sm_90 and sm_80 and checks the PTX for it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import (
    LOG2E,
    bucket,
    cast_out,
    check_launch_config,
    dot_precision,
    max_shared_memory,
    next_pow2,
)


def _cfg(bm, bn, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


# A100 (sm_80) defaults for BERT shapes (head_dim 32..128, sequences up to 512); also
# the list of other pre-Hopper GPUs (sm_86 / sm_89 lose the deep ones to _prune's
# shared-memory check: 99 KB there).
_SM80_CONFIGS = [
    _cfg(128, 64, 4, 3),
    _cfg(128, 64, 8, 2),
    _cfg(128, 128, 8, 2),
    _cfg(128, 32, 4, 3),
    _cfg(64, 64, 4, 3),
    _cfg(64, 32, 4, 2),
    _cfg(32, 32, 4, 2),
    _cfg(16, 32, 2, 2),
]
# H100 (sm_90): wgmma works on 64-row slices per warpgroup (4 warps), so a 128-row
# query tile with 8 warps keeps two warpgroups busy on one tile; 2-4 stages of K / V
# in flight (228 KB of shared memory leaves room for them even at BLOCK_D 128). The
# short-sequence tail (64 / 32 / 16 rows) is kept for batches of short sentences.
_SM90_CONFIGS = [
    _cfg(128, 64, 8, 2),
    _cfg(128, 64, 8, 3),
    _cfg(128, 64, 8, 4),
    _cfg(128, 128, 8, 2),
    _cfg(128, 128, 8, 3),
    _cfg(128, 32, 8, 3),
    _cfg(128, 64, 4, 3),
    _cfg(64, 64, 4, 3),
    _cfg(64, 32, 4, 2),
    _cfg(32, 32, 4, 2),
    _cfg(16, 32, 2, 2),
]
#: The pre-Hopper list under its historical name (tests and scripts compile from it).
_GPU_CONFIGS = _SM80_CONFIGS
_INTERPRET_CONFIG = _cfg(32, 32, 4, 1)

#: Keys of a forced config (``config=``), all required.
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
#: Most fp32 values of the score tile + output accumulator per thread (registers
#: hold them; beyond this the tile spills whatever ptxas does).
_MAX_TILE_VALUES_PER_THREAD = 256


def _arch(device: torch.device) -> str:
    """Which config list runs on ``device``: "interpret", "sm90" or "sm80"."""
    if device.type != "cuda":
        return "interpret"
    return "sm90" if _capability(device.index)[0] >= 9 else "sm80"


@functools.cache
def _capability(index) -> tuple:
    return torch.cuda.get_device_capability(index)


def _config_list(arch: str) -> list:
    if arch == "interpret":
        return [_INTERPRET_CONFIG]
    return list(_SM90_CONFIGS if arch == "sm90" else _SM80_CONFIGS)


def shared_memory_estimate(block_m, block_n, block_d, num_stages, elem_bytes) -> int:
    """An upper bound of the shared memory a config takes: ``num_stages`` buffers of the
    K and V tiles, the Q tile (wgmma reads its A operand from shared memory; on sm_80
    some tiles stage Q there too) and 1 KB for the small scratch of the masked path.
    Never below what triton allocates for the configs of both lists (asserted against
    compiled kernels in tests/ops/test_triton_sm90_compile.py); at most ~1/3 above."""
    kv = num_stages * 2 * block_n * block_d * elem_bytes
    return kv + block_m * block_d * elem_bytes + 1024


def _fits(arch, device, block_m, block_n, block_d, num_warps, num_stages, elem_bytes) -> str:
    """Why a tile cannot run on ``device`` (too many registers, too much shared
    memory), or ""."""
    per_thread = block_m * (block_n + block_d) // (32 * num_warps)
    if per_thread > _MAX_TILE_VALUES_PER_THREAD:
        return (
            f"BLOCK_M x (BLOCK_N + BLOCK_D) = {block_m} x ({block_n} + {block_d}) holds "
            f"{per_thread} fp32 values per thread with {num_warps} warps "
            f"(at most {_MAX_TILE_VALUES_PER_THREAD})"
        )
    if arch != "interpret":
        need = shared_memory_estimate(block_m, block_n, block_d, num_stages, elem_bytes)
        limit = max_shared_memory(device)
        if need > limit:
            return f"needs ~{need} bytes of shared memory, the device has {limit}"
    return ""


def _keep(arch, device, seq_bucket, block_d, elem_bytes, c) -> bool:
    bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
    return (
        bm <= max(16, 2 * seq_bucket)
        and not (block_d >= 128 and bm * bn > 8192)
        and not _fits(arch, device, bm, bn, block_d, c.num_warps, c.num_stages, elem_bytes)
    )


def _prune(configs_, named_args, **kwargs):
    """Short sequences: no query tile taller than twice the longest sequence; wide heads
    (BLOCK_D 128): no 128 x 128 tiles (register spills); no tile that does not fit the
    device (shared memory, registers)."""
    qkv = named_args["qkv_ptr"]
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 64))
    arch = _arch(qkv.device)
    seq_bucket = named_args["seq_bucket"]
    kept = [
        c for c in configs_ if _keep(arch, qkv.device, seq_bucket, block_d, qkv.element_size(), c)
    ]
    return kept or configs_[-1:]


# out[tok(s, i), h*d:(h+1)*d] = softmax_j(scale * q_i . k_j, j a real key of s) @ v_j
# Layout: qkv rows [.., 3H] = [Q | K | V], head h at columns h*d (Q), H + h*d (K),
# 2H + h*d (V), unit column stride. Sequence s, position i lives at
#   qkv_ptr + s * qkv_batch_stride + (seq_start + i) * qkv_token_stride   (in BYTES)
# and K / V are ``hidden`` BYTES (H elements) to the right of Q: strides and ``hidden``
# are byte counts, so Triton's divisible-by-16 specialisation of integer arguments
# tells the compiler that rows are 16-byte aligned (module docstring).
# padded ([B, S, 3H]): seq_start = 0, length S; the key mask row s is read from
# mask_ptr (nonzero = real; its strides in elements) and masked query rows are
# written as zeros. varlen ([T, 3H]): batch stride 0, seq_start / length from
# cu_seqlens. Out [.., H] uses the same scheme with its own byte strides. Keys past the
# length or masked get -inf; rows with no real key (or no real query) are zeros.
# Grid: (cdiv(max_seqlen, BLOCK_M), num_heads, batch).
@triton.jit
def _attention_kernel(
    qkv_ptr,
    mask_ptr,
    cu_seqlens_ptr,
    out_ptr,
    padded_len,
    hidden,
    qk_scale,
    seq_bucket,
    qkv_batch_stride,
    qkv_token_stride,
    out_batch_stride,
    out_token_stride,
    mask_batch_stride,
    mask_token_stride,
    HEAD_DIM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    if IS_VARLEN:
        seq_start = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
        seq_len = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int64) - seq_start
    else:
        seq_start = 0
        seq_len = padded_len
    elem = qkv_ptr.dtype.element_ty
    out_elem = out_ptr.dtype.element_ty
    ELEM_BYTES: tl.constexpr = elem.primitive_bitwidth // 8
    # byte pointers to this (sequence, head)'s Q columns / output columns
    qkv_base = (
        qkv_ptr.to(tl.pointer_type(tl.int8))
        + seq.to(tl.int64) * qkv_batch_stride
        + head * (HEAD_DIM * ELEM_BYTES)
    )
    out_base = (
        out_ptr.to(tl.pointer_type(tl.int8))
        + seq.to(tl.int64) * out_batch_stride
        + head * (HEAD_DIM * ELEM_BYTES)
    )

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    is_q = offs_m < seq_len
    is_d = offs_d < HEAD_DIM  # all true (folded away) when head_dim is a power of two

    q_rows = (seq_start + offs_m).to(tl.int64) * qkv_token_stride
    q_ptrs = (qkv_base + q_rows).to(tl.pointer_type(elem))
    q = tl.load(q_ptrs[:, None] + offs_d[None, :], mask=is_q[:, None] & is_d[None, :], other=0.0)
    k_base = qkv_base + hidden
    v_base = qkv_base + 2 * hidden

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    # query blocks past the end of the sequence skip the loop (and store nothing);
    # blocks whose queries are all padding skip it too (and store zeros)
    has_work = start_m * BLOCK_M < seq_len
    if HAS_MASK:
        query_mask = (
            tl.load(
                mask_ptr + seq.to(tl.int64) * mask_batch_stride + offs_m * mask_token_stride,
                mask=is_q,
                other=0,
            )
            != 0
        )
        has_work = has_work & (tl.max(query_mask.to(tl.int32), axis=0) > 0)
    kv_end = tl.where(has_work, seq_len, 0)
    for start_n in range(0, kv_end, BLOCK_N):
        cols = start_n + offs_n
        is_k = cols < seq_len
        k_rows = (seq_start + cols).to(tl.int64) * qkv_token_stride
        k_ptrs = (k_base + k_rows).to(tl.pointer_type(elem))  # K^T tile [BLOCK_D, BLOCK_N]
        k_mask = is_d[:, None] & is_k[None, :]
        k = tl.load(k_ptrs[None, :] + offs_d[:, None], mask=k_mask, other=0.0)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        if HAS_MASK:
            key_mask = tl.load(
                mask_ptr + seq.to(tl.int64) * mask_batch_stride + cols * mask_token_stride,
                mask=is_k,
                other=0,
            )
            is_k = is_k & (key_mask != 0)
        s = tl.where(is_k[None, :], s, float("-inf"))
        # On a GPU the max ignores a NaN score (PTX max.f32), under the interpreter
        # it propagates it (NumPy): either way p is NaN at that key (exp2(NaN - m)),
        # so l and the row of acc are NaN, as torch's softmax row is.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no real key yet: no NaN
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_ptrs = (v_base + k_rows).to(tl.pointer_type(elem))  # V tile [BLOCK_N, BLOCK_D]
        v_mask = is_k[:, None] & is_d[None, :]
        v = tl.load(v_ptrs[:, None] + offs_d[None, :], mask=v_mask, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

    # l == 0: no real key, or every score -inf (torch's SDPA gives p = 0 there, so
    # the row is p V: zeros, NaN where V is inf). A NaN l (NaN / +inf scores)
    # stays NaN, as in torch.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if HAS_MASK:
        out = tl.where(query_mask[:, None], out, 0.0)
    out_rows = (seq_start + offs_m).to(tl.int64) * out_token_stride
    out_ptrs = (out_base + out_rows).to(tl.pointer_type(out_elem))
    tl.store(
        out_ptrs[:, None] + offs_d[None, :],
        cast_out(out, out_elem),
        mask=is_q[:, None] & is_d[None, :],
    )


@functools.cache
def _autotuned(arch: str):
    """The autotuner over ``arch``'s config list (one per list, made on first use)."""
    return triton.autotune(
        configs=_config_list(arch),
        key=["HEAD_DIM", "seq_bucket", "IS_VARLEN", "HAS_MASK"],
        prune_configs_by={"early_config_prune": _prune},
    )(_attention_kernel)


def _block_d(head_dim: int) -> int:
    return max(16, next_pow2(head_dim))


def check_config(config, qkv: torch.Tensor, head_dim: int) -> dict:
    """``config`` as launch arguments, or a one-line ValueError: exactly the keys
    BLOCK_M, BLOCK_N, num_warps, num_stages; tiles powers of two from 16 to 256; a
    tile that fits the registers and (on a GPU) the device's shared memory."""
    cfg = check_launch_config(
        "attention", config, CONFIG_KEYS, blocks=("BLOCK_M", "BLOCK_N"), max_block=256
    )
    arch = _arch(qkv.device)
    why = _fits(
        arch,
        qkv.device,
        cfg["BLOCK_M"],
        cfg["BLOCK_N"],
        _block_d(head_dim),
        cfg["num_warps"],
        cfg["num_stages"],
        qkv.element_size(),
    )
    if why:
        raise ValueError(f"attention config {config}: {why}")
    return cfg


def _as_dict(c) -> dict:
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}


def _configs_for(qkv: torch.Tensor, head_dim: int, seq_len: int) -> list:
    arch = _arch(qkv.device)
    named = {"qkv_ptr": qkv, "seq_bucket": bucket(seq_len, 1024)}
    return [_as_dict(c) for c in _prune(_config_list(arch), named, BLOCK_D=_block_d(head_dim))]


def attention_configs(qkv, attention_mask, num_heads, scale) -> list:
    """The configs ``attention(..., config=)`` may be forced to for this input: the
    autotuner's list for the device, pruned as it prunes it."""
    return _configs_for(qkv, qkv.shape[-1] // 3 // num_heads, qkv.shape[1])


def attention_varlen_configs(qkv, cu_seqlens, max_seqlen, num_heads, scale) -> list:
    """As :func:`attention_configs`, for ``attention_varlen``."""
    return _configs_for(qkv, qkv.shape[-1] // 3 // num_heads, int(max_seqlen))


def _launch(qkv3, mask, cu_seqlens, batch, max_seqlen, num_heads, scale, out3, is_varlen, cfg):
    """qkv3 / out3: [batch or 1, tokens, 3H / H] with unit column stride; ``cfg``: a
    checked forced config, or None to autotune."""
    hidden = qkv3.shape[-1] // 3
    head_dim = hidden // num_heads
    es, out_es = qkv3.element_size(), out3.element_size()
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
        mask_strides = (mask.stride(0), mask.stride(1))
    else:
        mask_strides = (0, 0)

    def grid(meta):
        return (triton.cdiv(max_seqlen, meta["BLOCK_M"]), num_heads, batch)

    args = (
        qkv3,
        mask if mask is not None else qkv3,
        cu_seqlens if cu_seqlens is not None else qkv3,
        out3,
        max_seqlen,
        hidden * es,
        scale * LOG2E,
        bucket(max_seqlen, 1024),
        0 if is_varlen else qkv3.stride(0) * es,
        qkv3.stride(1) * es,
        0 if is_varlen else out3.stride(0) * out_es,
        out3.stride(1) * out_es,
        *mask_strides,
    )
    constexprs = dict(
        HEAD_DIM=head_dim,
        IS_VARLEN=is_varlen,
        HAS_MASK=mask is not None,
        DOT_PRECISION=dot_precision(qkv3.dtype),
        BLOCK_D=_block_d(head_dim),
    )
    if cfg is None:
        _autotuned(_arch(qkv3.device))[grid](*args, **constexprs)
    else:  # exactly this config: the jit function itself, no autotuner
        _attention_kernel[grid](*args, **constexprs, **cfg)
    return out3


def _unit_cols(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(qkv, attention_mask, num_heads, scale, config=None):
    B, S, H3 = qkv.shape
    qkv = _unit_cols(qkv)
    out = torch.empty((B, S, H3 // 3), dtype=qkv.dtype, device=qkv.device)
    # a bad config is refused before any early return: the same answer for every shape
    cfg = None if config is None else check_config(config, qkv, H3 // 3 // num_heads)
    if B == 0 or S == 0 or H3 == 0:
        return out
    return _launch(qkv, attention_mask, None, B, S, num_heads, scale, out, False, cfg)


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale, config=None):
    T, H3 = qkv.shape
    qkv = _unit_cols(qkv)
    out = (
        torch.zeros((T, H3 // 3), dtype=qkv.dtype, device=qkv.device)
        if max_seqlen == 0
        else torch.empty((T, H3 // 3), dtype=qkv.dtype, device=qkv.device)
    )
    cfg = None if config is None else check_config(config, qkv, H3 // 3 // num_heads)
    batch = cu_seqlens.shape[0] - 1
    if T == 0 or H3 == 0 or batch == 0 or max_seqlen == 0:
        return out
    _launch(
        qkv.unsqueeze(0),
        None,
        cu_seqlens,
        batch,
        max_seqlen,
        num_heads,
        scale,
        out.unsqueeze(0),
        True,
        cfg,
    )
    return out
