"""``bias_gelu`` / ``bias_gelu_``: out = activation(x + bias), activation one of
erf GELU, tanh GELU, ReLU; computed in fp32, stored in the activations' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    ACTIVATION_CODES,
    apply_activation,
    elementwise_warps,
    is_interpret,
    next_pow2,
    row_tile,
    rows_of,
    store_rows,
)


# out[r, c] = act(x[r, c] + bias[c])
# Layout: x, out are [n_rows, n_cols] with unit column stride; bias [n_cols].
# out_ptr may equal x_ptr (in place): every element is read and written by the
# same program. Grid: (cdiv(n_rows, BLOCK_M), cdiv(n_cols, BLOCK_N)).
@triton.jit
def _bias_act_kernel(
    x_ptr,
    bias_ptr,
    out_ptr,
    n_rows,
    n_cols,
    x_row_stride,
    out_row_stride,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, cols, _, is_col, mask = row_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(
        tl.float32
    )
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=is_col, other=0.0).to(tl.float32)[None, :]
    y = apply_activation(x, ACTIVATION)
    store_rows(out_ptr, rows, cols, out_row_stride, y, mask)


def launch_bias_act(x2: torch.Tensor, bias, activation: str, out2: torch.Tensor):
    """x2, out2: [rows, cols] with unit column stride (out2 may be x2)."""
    n_rows, n_cols = x2.shape
    if n_rows == 0 or n_cols == 0:
        return out2
    block_n = min(max(16, next_pow2(n_cols)), 1024)
    target = 32768 if is_interpret() else 4096
    block_m = max(1, min(256, target // block_n))
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))
    _bias_act_kernel[grid](
        x2,
        bias if bias is not None else x2,
        out2,
        n_rows,
        n_cols,
        x2.stride(0),
        out2.stride(0),
        ACTIVATION=ACTIVATION_CODES[activation],
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=elementwise_warps(block_m * block_n),
    )
    return out2


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(rows_of(x), x.shape[-1])
    return x2 if x2.stride(1) == 1 else x2.contiguous()


def bias_gelu(x, bias, activation):
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    return launch_bias_act(x2, bias, activation, out).view(x.shape)


def bias_gelu_(x, bias, activation):
    if x.is_contiguous():
        x2 = x.view(rows_of(x), x.shape[-1])
        launch_bias_act(x2, bias, activation, x2)
    else:  # a strided view: compute aside, then write back through the view
        x.copy_(bias_gelu(x, bias, activation))
    return None
