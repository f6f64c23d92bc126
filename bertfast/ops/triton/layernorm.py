"""LayerNorm kernels: ``embed_layernorm`` (embedding gather + sum + LayerNorm) and
``add_layernorm`` (bias + residual + LayerNorm, "SkipLayerNorm").

Each program normalises ``BLOCK_M`` rows held whole in registers (``BLOCK_H`` is the
hidden size rounded up to a power of two; the tail is masked, so any hidden size
works: 96, 1023, 1500). Statistics are fp32 and two-pass over the registers: the
mean first, then the variance of the centred values, so inputs with a large mean
offset keep their precision. The sums are taken in fp32 too (the reference sums in
the storage dtype; fp32 is never less accurate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    elementwise_warps,
    is_interpret,
    next_pow2,
    row_tile,
    rows_of,
    store_rows,
)


@triton.jit
def _normalize_rows(h, is_col, n_cols, eps, weight_ptr, ln_bias_ptr, cols):
    """LayerNorm of fp32 rows ``h`` [BLOCK_M, BLOCK_H]; masked columns must be 0."""
    mean = tl.sum(h, axis=1) / n_cols
    centered = tl.where(is_col[None, :], h - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(weight_ptr + cols, mask=is_col, other=0.0).to(tl.float32)
    b = tl.load(ln_bias_ptr + cols, mask=is_col, other=0.0).to(tl.float32)
    return centered * rstd[:, None] * w[None, :] + b[None, :]


# out[r, :] = LayerNorm((x[r, :] + bias) + residual[r, :]) * weight + ln_bias
# Layout: x, residual, out are [n_rows, n_cols] with unit column stride and the
# given row strides; bias, weight, ln_bias are [n_cols].
# Grid: (cdiv(n_rows, BLOCK_M),), each program BLOCK_M whole rows.
@triton.jit
def _add_layernorm_kernel(
    x_ptr,
    residual_ptr,
    bias_ptr,
    weight_ptr,
    ln_bias_ptr,
    out_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    residual_row_stride,
    out_row_stride,
    eps,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows, cols, _, is_col, mask = row_tile(n_rows, n_cols, BLOCK_M, BLOCK_H)
    h = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(
        tl.float32
    )
    if HAS_BIAS:
        h += tl.load(bias_ptr + cols, mask=is_col, other=0.0).to(tl.float32)[None, :]
    h += tl.load(
        residual_ptr + rows[:, None] * residual_row_stride + cols[None, :], mask=mask, other=0.0
    ).to(tl.float32)
    h = tl.where(mask, h, 0.0)
    y = _normalize_rows(h, is_col, n_cols, eps, weight_ptr, ln_bias_ptr, cols)
    store_rows(out_ptr, rows, cols, out_row_stride, y, mask)


# out[t, :] = LayerNorm(word[input_ids[t]] + type[token_type_ids[t]] + pos[position_ids[t]])
# Layout: ids are flat [n_tokens] (any integer dtype); tables [rows, n_cols] with
# unit column stride; out [n_tokens, n_cols] contiguous.
# Bounds-safe: an id outside its table is clamped to row 0 for the load and the
# token's whole output row is NaN (a loud flag; the op boundary rejects such ids
# whenever it may sync, so this only fires for inputs it could not check).
# Grid: (cdiv(n_tokens, BLOCK_M),).
@triton.jit
def _embed_layernorm_kernel(
    input_ids_ptr,
    position_ids_ptr,
    token_type_ids_ptr,
    word_ptr,
    pos_ptr,
    type_ptr,
    weight_ptr,
    ln_bias_ptr,
    out_ptr,
    n_tokens,
    n_cols,
    vocab_size,
    max_positions,
    type_vocab_size,
    word_row_stride,
    pos_row_stride,
    type_row_stride,
    out_row_stride,
    eps,
    HAS_TOKEN_TYPES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows, cols, is_row, is_col, mask = row_tile(n_tokens, n_cols, BLOCK_M, BLOCK_H)

    word_id = tl.load(input_ids_ptr + rows, mask=is_row, other=0).to(tl.int64)
    pos_id = tl.load(position_ids_ptr + rows, mask=is_row, other=0).to(tl.int64)
    is_bad = (word_id < 0) | (word_id >= vocab_size) | (pos_id < 0) | (pos_id >= max_positions)
    word_id = tl.where(is_bad, 0, word_id)
    pos_id = tl.where(is_bad, 0, pos_id)
    h = tl.load(
        word_ptr + word_id[:, None] * word_row_stride + cols[None, :], mask=mask, other=0.0
    ).to(tl.float32)
    if HAS_TOKEN_TYPES:
        type_id = tl.load(token_type_ids_ptr + rows, mask=is_row, other=0).to(tl.int64)
        is_bad_type = (type_id < 0) | (type_id >= type_vocab_size)
        is_bad = is_bad | is_bad_type
        type_id = tl.where(is_bad_type, 0, type_id)
        h += tl.load(
            type_ptr + type_id[:, None] * type_row_stride + cols[None, :], mask=mask, other=0.0
        ).to(tl.float32)
    h += tl.load(
        pos_ptr + pos_id[:, None] * pos_row_stride + cols[None, :], mask=mask, other=0.0
    ).to(tl.float32)
    y = _normalize_rows(h, is_col, n_cols, eps, weight_ptr, ln_bias_ptr, cols)
    y = tl.where(is_bad[:, None], float("nan"), y)
    store_rows(out_ptr, rows, cols, out_row_stride, y, mask)


# ---------------------------------------------------------------- launchers
def _row_tiles(n_cols: int):
    """(BLOCK_M, BLOCK_H, num_warps): whole rows, ~4K elements per program on a GPU
    (bigger tiles under the interpreter, where each program costs Python time)."""
    block_h = max(16, next_pow2(n_cols))
    target = 32768 if is_interpret() else 4096
    block_m = max(1, min(64, target // block_h))
    return block_m, block_h, elementwise_warps(block_m * block_h)


def _rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    t2 = t.reshape(rows_of(t), n_cols)
    return t2 if t2.stride(1) == 1 else t2.contiguous()


def _unit_cols(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def launch_add_layernorm(x, residual, bias, weight, ln_bias, eps):
    n_cols = x.shape[-1]
    x2, r2 = _rows(x, n_cols), _rows(residual, n_cols)
    n_rows = x2.shape[0]
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows and n_cols:
        block_m, block_h, warps = _row_tiles(n_cols)
        _add_layernorm_kernel[(triton.cdiv(n_rows, block_m),)](
            x2,
            r2,
            bias if bias is not None else weight,
            weight.contiguous(),
            ln_bias.contiguous(),
            out,
            n_rows,
            n_cols,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            eps,
            HAS_BIAS=bias is not None,
            BLOCK_M=block_m,
            BLOCK_H=block_h,
            num_warps=warps,
        )
    return out.view(x.shape)


def launch_embed_layernorm(
    input_ids, position_ids, token_type_ids, word, pos, types, weight, bias, eps
):
    n_cols = word.shape[1]
    ids = input_ids.reshape(-1).contiguous()
    pos_ids = position_ids.reshape(-1).contiguous()
    has_types = types is not None
    type_ids = token_type_ids.reshape(-1).contiguous() if has_types else ids
    word, pos = _unit_cols(word), _unit_cols(pos)
    types = _unit_cols(types) if has_types else word
    n_tokens = ids.shape[0]
    out = torch.empty((n_tokens, n_cols), dtype=word.dtype, device=word.device)
    if n_tokens and n_cols:
        block_m, block_h, warps = _row_tiles(n_cols)
        _embed_layernorm_kernel[(triton.cdiv(n_tokens, block_m),)](
            ids,
            pos_ids,
            type_ids,
            word,
            pos,
            types,
            weight.contiguous(),
            bias.contiguous(),
            out,
            n_tokens,
            n_cols,
            word.shape[0],
            pos.shape[0],
            types.shape[0],
            word.stride(0),
            pos.stride(0),
            types.stride(0),
            out.stride(0),
            eps,
            HAS_TOKEN_TYPES=has_types,
            BLOCK_M=block_m,
            BLOCK_H=block_h,
            num_warps=warps,
        )
    return out.view(tuple(input_ids.shape) + (n_cols,))


# ---------------------------------------------------------------- registered ops
# The launchers take the ops' arguments as they are.
embed_layernorm = launch_embed_layernorm
add_layernorm = launch_add_layernorm
