"""``attention`` (padded batch + key-padding mask) and ``attention_varlen`` (packed
batch + cu_seqlens): flash-style multi-head self-attention reading the fused QKV
tensor through strides and writing heads already merged.

One program per (query block, head, sequence): the Q tile [BLOCK_M, BLOCK_D] stays
in registers while K/V tiles of BLOCK_N keys stream past it; the softmax is online
in fp32 (running row max and row sum, rescaled per tile) using exp2 with the scale
pre-multiplied by log2(e). head_dim need not be a power of two (80, 96): BLOCK_D is
the next power of two (at least 16, for tl.dot) and the extra columns are masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LOG2E, bucket, cast_out, configs, dot_precision, next_pow2


def _cfg(bm, bn, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


# A100 / H100 defaults for BERT shapes (head_dim 32..128, sequences up to 512).
_GPU_CONFIGS = [
    _cfg(128, 64, 4, 3),
    _cfg(128, 64, 8, 2),
    _cfg(128, 128, 8, 2),
    _cfg(128, 32, 4, 3),
    _cfg(64, 64, 4, 3),
    _cfg(64, 32, 4, 2),
    _cfg(32, 32, 4, 2),
    _cfg(16, 32, 2, 2),
]
_INTERPRET_CONFIG = _cfg(32, 32, 4, 1)


def _prune(configs_, named_args, **kwargs):
    """Short sequences: no query tile taller than twice the longest sequence; wide heads
    (BLOCK_D 128): no 128 x 128 tiles (register spills)."""
    seq_bucket = named_args["seq_bucket"]
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 64))
    kept = [
        c
        for c in configs_
        if c.kwargs["BLOCK_M"] <= max(16, 2 * seq_bucket)
        and not (block_d >= 128 and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 8192)
    ]
    return kept or configs_[-1:]


# out[tok(s, i), h*d:(h+1)*d] = softmax_j(scale * q_i . k_j, j a real key of s) @ v_j
# Layout: qkv rows [.., 3H] = [Q | K | V], head h at columns h*d (Q), H + h*d (K),
# 2H + h*d (V), unit column stride. Sequence s, position i lives at
#   qkv_ptr + s * qkv_batch_stride + (seq_start + i) * qkv_token_stride
# padded ([B, S, 3H]): seq_start = 0, length S; the key mask row s is read from
# mask_ptr (nonzero = real) and masked query rows are written as zeros.
# varlen ([T, 3H]): batch stride 0, seq_start / length from cu_seqlens.
# Out [.., H] uses the same scheme with its own strides. Keys past the length or
# masked get -inf; rows with no real key (or no real query) are written as zeros.
# Grid: (cdiv(max_seqlen, BLOCK_M), num_heads, batch).
@triton.autotune(
    configs=configs(_GPU_CONFIGS, _INTERPRET_CONFIG),
    key=["HEAD_DIM", "seq_bucket", "IS_VARLEN", "HAS_MASK"],
    prune_configs_by={"early_config_prune": _prune},
)
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
    qkv_base = qkv_ptr + seq.to(tl.int64) * qkv_batch_stride + head * HEAD_DIM
    out_base = out_ptr + seq.to(tl.int64) * out_batch_stride + head * HEAD_DIM

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    is_q = offs_m < seq_len
    is_d = offs_d < HEAD_DIM  # all true (folded away) when head_dim is a power of two

    q_rows = (seq_start + offs_m).to(tl.int64) * qkv_token_stride
    q = tl.load(
        qkv_base + q_rows[:, None] + offs_d[None, :], mask=is_q[:, None] & is_d[None, :], other=0.0
    )
    k_base = qkv_base + hidden + offs_d[:, None]  # K^T tile [BLOCK_D, BLOCK_N]
    v_base = qkv_base + 2 * hidden + offs_d[None, :]  # V tile [BLOCK_N, BLOCK_D]

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
        k = tl.load(k_base + k_rows[None, :], mask=is_d[:, None] & is_k[None, :], other=0.0)
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
        v = tl.load(v_base + k_rows[:, None], mask=is_k[:, None] & is_d[None, :], other=0.0)
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
    tl.store(
        out_base + out_rows[:, None] + offs_d[None, :],
        cast_out(out, out_ptr.dtype.element_ty),
        mask=is_q[:, None] & is_d[None, :],
    )


def _launch(qkv3, mask, cu_seqlens, batch, max_seqlen, num_heads, scale, out3, is_varlen):
    """qkv3 / out3: [batch or 1, tokens, 3H / H] with unit column stride."""
    hidden = qkv3.shape[-1] // 3
    head_dim = hidden // num_heads
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
        mask_strides = (mask.stride(0), mask.stride(1))
    else:
        mask_strides = (0, 0)

    def grid(meta):
        return (triton.cdiv(max_seqlen, meta["BLOCK_M"]), num_heads, batch)

    _attention_kernel[grid](
        qkv3,
        mask if mask is not None else qkv3,
        cu_seqlens if cu_seqlens is not None else qkv3,
        out3,
        max_seqlen,
        hidden,
        scale * LOG2E,
        bucket(max_seqlen, 1024),
        0 if is_varlen else qkv3.stride(0),
        qkv3.stride(1),
        0 if is_varlen else out3.stride(0),
        out3.stride(1),
        *mask_strides,
        HEAD_DIM=head_dim,
        IS_VARLEN=is_varlen,
        HAS_MASK=mask is not None,
        DOT_PRECISION=dot_precision(qkv3.dtype),
        BLOCK_D=max(16, next_pow2(head_dim)),
    )
    return out3


def _unit_cols(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(qkv, attention_mask, num_heads, scale):
    B, S, H3 = qkv.shape
    qkv = _unit_cols(qkv)
    out = torch.empty((B, S, H3 // 3), dtype=qkv.dtype, device=qkv.device)
    if B == 0 or S == 0 or H3 == 0:
        return out
    return _launch(qkv, attention_mask, None, B, S, num_heads, scale, out, is_varlen=False)


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    T, H3 = qkv.shape
    qkv = _unit_cols(qkv)
    out = (
        torch.zeros((T, H3 // 3), dtype=qkv.dtype, device=qkv.device)
        if max_seqlen == 0
        else torch.empty((T, H3 // 3), dtype=qkv.dtype, device=qkv.device)
    )
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
        is_varlen=True,
    )
    return out
