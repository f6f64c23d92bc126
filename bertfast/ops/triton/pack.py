"""``pack_tokens`` / ``unpack_tokens``: gather the real tokens of a padded batch into
``[T, ...]`` and scatter them back (zeros at padded rows). Pure row movement, so any
dtype (ids, masks, activations) is accepted; trailing dims are flattened to F.

Bounds-safe: an index outside the source rows is never dereferenced. pack writes a
NaN row for it (floating dtypes; 0 for integer ones), unpack skips it.

Rows move as raw bits: floating tensors are viewed as the integer type of their width
(bf16 / fp16 as int16, fp32 as int32, fp64 as int64), so every value, NaN payloads
included, arrives bit-exact, and the NaN fill is an integer bit pattern. No
floating-point constant of the storage dtype is built in the kernel (the Triton 3.6
interpreter cannot build bf16 constants).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import elementwise_warps, is_interpret, next_pow2, row_tile


@triton.jit
def _indexed_tile(
    indices_ptr, n_rows, n_indexed_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """The program's tile of an ``[n_rows, n_cols]`` array (``rows``, ``cols``, ``mask``)
    with the index of each row: ``indices[rows]`` where it lies in ``[0, n_indexed_rows)``
    (``is_valid``), else 0, so it can be dereferenced whatever the caller passed."""
    rows, cols, is_row, _, mask = row_tile(n_rows, n_cols, BLOCK_M, BLOCK_N)
    index = tl.load(indices_ptr + rows, mask=is_row, other=0).to(tl.int64)
    is_valid = (index >= 0) & (index < n_indexed_rows)
    return rows, cols, mask, tl.where(is_valid, index, 0), is_valid


# out[t, :] = x[indices[t], :]
# Layout: x [n_src_rows, n_cols] (row stride, unit column stride), indices [n_rows]
# int64, out [n_rows, n_cols] contiguous.
# Grid: (cdiv(n_rows, BLOCK_M), cdiv(n_cols, BLOCK_N)).
@triton.jit
def _gather_rows_kernel(
    x_ptr,
    indices_ptr,
    out_ptr,
    n_rows,
    n_src_rows,
    n_cols,
    x_row_stride,
    out_row_stride,
    FILL_NAN: tl.constexpr,
    NAN_BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, cols, mask, src, is_valid = _indexed_tile(
        indices_ptr, n_rows, n_src_rows, n_cols, BLOCK_M, BLOCK_N
    )
    vals = tl.load(
        x_ptr + src[:, None] * x_row_stride + cols[None, :], mask=mask & is_valid[:, None], other=0
    )
    if FILL_NAN:  # vals hold the bits of floats: the quiet NaN of their width
        vals = tl.where(is_valid[:, None], vals, NAN_BITS)
    tl.store(
        out_ptr + rows[:, None] * out_row_stride + cols[None, :],
        vals.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


# out[indices[t], :] = x[t, :]   (out is zero-filled by the launcher beforehand)
# Layout: x [n_rows, n_cols] (row stride, unit column stride), indices [n_rows]
# int64, out [n_dst_rows, n_cols] contiguous. Indices outside [0, n_dst_rows) are
# skipped. Grid: (cdiv(n_rows, BLOCK_M), cdiv(n_cols, BLOCK_N)).
@triton.jit
def _scatter_rows_kernel(
    x_ptr,
    indices_ptr,
    out_ptr,
    n_rows,
    n_dst_rows,
    n_cols,
    x_row_stride,
    out_row_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows, cols, mask, dst, is_valid = _indexed_tile(
        indices_ptr, n_rows, n_dst_rows, n_cols, BLOCK_M, BLOCK_N
    )
    vals = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0)
    tl.store(
        out_ptr + dst[:, None] * out_row_stride + cols[None, :], vals, mask=mask & is_valid[:, None]
    )


def _tiles(n_cols: int):
    block_n = min(max(16, next_pow2(n_cols)), 1024)  # >= 16: no 1-wide tiles on GPUs
    target = 32768 if is_interpret() else 4096
    block_m = max(1, min(1024, target // block_n))
    return block_m, block_n, elementwise_warps(block_m * block_n)


#: floating dtype -> (integer dtype of the same width, its quiet NaN's bits)
_BITS = {
    torch.float16: (torch.int16, 0x7E00),
    torch.bfloat16: (torch.int16, 0x7FC0),
    torch.float32: (torch.int32, 0x7FC00000),
    torch.float64: (torch.int64, 0x7FF8000000000000),
}


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """[N, ...] -> [N, F] with unit column stride; floats seen as the integer type of
    their width, bool as uint8."""
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    elif x.dtype in _BITS:
        x = x.view(_BITS[x.dtype][0])
    n_cols = 1
    for s in x.shape[1:]:
        n_cols *= s
    x2 = x.reshape(x.shape[0], n_cols)
    return x2 if x2.stride(1) == 1 or n_cols <= 1 else x2.contiguous()


def pack_tokens(x, indices):
    x2 = _as_rows(x)
    n_rows, n_cols = indices.shape[0], x2.shape[1]
    out = torch.empty((n_rows, n_cols), dtype=x2.dtype, device=x.device)
    if n_rows and n_cols:
        block_m, block_n, warps = _tiles(n_cols)
        _gather_rows_kernel[(triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))](
            x2,
            indices,
            out,
            n_rows,
            x2.shape[0],
            n_cols,
            x2.stride(0),
            out.stride(0),
            FILL_NAN=x.dtype in _BITS,
            NAN_BITS=_BITS.get(x.dtype, (None, 0))[1],
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=warps,
        )
    return out.view(x.dtype).view((n_rows,) + tuple(x.shape[1:]))


def unpack_tokens(x, indices, num_rows):
    x2 = _as_rows(x)
    n_rows, n_cols = x2.shape
    out = torch.zeros((num_rows, n_cols), dtype=x2.dtype, device=x.device)
    if n_rows and n_cols:
        block_m, block_n, warps = _tiles(n_cols)
        _scatter_rows_kernel[(triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))](
            x2,
            indices,
            out,
            n_rows,
            num_rows,
            n_cols,
            x2.stride(0),
            out.stride(0),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=warps,
        )
    return out.view(x.dtype).view((num_rows,) + tuple(x.shape[1:]))
