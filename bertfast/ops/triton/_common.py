"""Helpers shared by the Triton kernels: interpreter detection, launch sizing,
autotune config lists and the checks of a forced config, the device's shared-memory
limit, and the activation epilogue used by two kernels.

This module imports triton; only the kernel modules import it (lazily, through
``bertfast.ops.triton.__init__``), so a missing triton never breaks ``import bertfast``.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ..native import HEADER_CONSTANTS

#: Activation codes passed to kernels as the ``ACTIVATION`` constexpr: the native
#: kernels' codes (kernels/constants.h, code = index), which apply_activation follows.
ACTIVATION_CODES = {name: code for code, name in enumerate(HEADER_CONSTANTS["activations"])}

LOG2E = 1.4426950408889634


def is_interpret() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1).

    Read once per decision; ``@triton.jit`` itself reads it when a kernel module is
    first imported, so the variable must be set before that.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def bucket(n: int, cap: int) -> int:
    """Power-of-two bucket of ``n`` (at most ``cap``): an autotune key that does not
    re-tune for every token count of a packed batch."""
    return min(next_pow2(max(int(n), 1)), cap)


def configs(gpu_configs, interpret_config):
    """The GPU autotune list, or one small config under the interpreter (autotuning
    there would run every config through the slow interpreter)."""
    return [interpret_config] if is_interpret() else list(gpu_configs)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision for fp32 operands: IEEE unless torch allows TF32
    (docs/design.md: fp32 runs compare with TF32 off). Other dtypes ignore it."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


#: Shared memory per block (opt-in maximum) by compute capability, where triton's
#: driver cannot be asked: H100 228 KB - 1 KB, A100 164 KB - 1 KB, consumer Ampere /
#: Ada 100 KB - 1 KB; anything else: the 48 KB every CUDA GPU has.
_SHARED_MEMORY_BY_CAPABILITY = {(9, 0): 232448, (8, 0): 166912, (8, 7): 166912, (8, 6): 101376}
_SHARED_MEMORY_DEFAULT = 49152


@functools.cache
def _max_shared_memory(index: int) -> int:
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # an older / newer driver API: the table
        cap = tuple(torch.cuda.get_device_capability(index))
        if cap in _SHARED_MEMORY_BY_CAPABILITY:
            return _SHARED_MEMORY_BY_CAPABILITY[cap]
        if cap >= (9, 0):
            return _SHARED_MEMORY_BY_CAPABILITY[(9, 0)]
        if cap >= (8, 6):
            return _SHARED_MEMORY_BY_CAPABILITY[(8, 6)]
        return _SHARED_MEMORY_DEFAULT


def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on ``device`` (a CUDA device)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _max_shared_memory(index)


def _is_pow2(n) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_launch_config(
    op: str, config, keys: tuple, blocks: tuple, max_block: int, min_block: int = 16
) -> dict:
    """A forced launch config (``config=``) as a dict of ints, or a one-line ValueError.

    ``keys``: the keys the kernel takes, all required; ``blocks``: those that are tile
    sizes (powers of two in [min_block, max_block]); ``num_warps`` a power of two up to
    16; ``num_stages`` 1 to 8. Limits that depend on the input (registers, shared
    memory) are the kernel module's to check.
    """
    expected = ", ".join(keys)
    if not isinstance(config, dict):
        raise ValueError(
            f"{op} config must be a dict with the keys {expected}, got {type(config).__name__}"
        )
    unknown = [k for k in config if k not in keys]
    missing = [k for k in keys if k not in config]
    if unknown or missing:
        what = "; ".join(
            part
            for part in (
                f"unknown key(s) {', '.join(map(str, unknown))}" if unknown else "",
                f"missing key(s) {', '.join(missing)}" if missing else "",
            )
            if part
        )
        raise ValueError(f"{op} config {config}: {what}; expected exactly {expected}")
    for k, v in config.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{op} config {config}: {k} must be an int, got {v!r}")
    for k in blocks:
        v = config[k]
        if not (_is_pow2(v) and min_block <= v <= max_block):
            raise ValueError(
                f"{op} config {config}: {k}={v} is not a power of two in [{min_block}, {max_block}]"
            )
    if "num_warps" in keys and not (_is_pow2(config["num_warps"]) and config["num_warps"] <= 16):
        raise ValueError(
            f"{op} config {config}: num_warps={config['num_warps']} is not 1, 2, 4, 8 or 16"
        )
    if "num_stages" in keys and not 1 <= config["num_stages"] <= 8:
        raise ValueError(
            f"{op} config {config}: num_stages={config['num_stages']} is not in [1, 8]"
        )
    return {k: int(v) for k, v in config.items()}


def elementwise_warps(tile_elements: int) -> int:
    """num_warps for a memory-bound tile: about 8-16 elements per thread."""
    return max(1, min(16, tile_elements // 512))


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """GELU (erf) / GELU (tanh approximation) / ReLU of an fp32 block.

    The tanh form uses 0.5 * (1 + tanh(u)) == sigmoid(2u) (no tanh intrinsic needed),
    with the sigmoid evaluated from e = exp(-2|u|) <= 1 so exp never overflows.
    ReLU keeps NaN (where(x < 0, 0, x)) like torch.
    """
    if ACTIVATION == 0:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == 1:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = tl.exp(-2.0 * tl.abs(u))
        y = x * tl.where(u >= 0.0, 1.0, e) / (1.0 + e)
    else:
        y = tl.where(x < 0.0, 0.0, x)
    return y


def rows_of(t: torch.Tensor) -> int:
    """Rows of ``t`` seen as [rows, t.shape[-1]] (also when the last dim is 0)."""
    rows = 1
    for s in t.shape[:-1]:
        rows *= s
    return rows


@triton.jit
def cast_out(y, DTYPE: tl.constexpr):
    """fp32 block -> storage dtype, rounding to nearest even.

    For bf16 the rounding is done on the bits, and the upper half of them is the
    result, because the Triton interpreter casts fp32 -> bf16 by truncation (and
    flushes subnormal results to zero); on a GPU this costs a few integer ops in a
    memory-bound epilogue and gives the same result as the RTNE cast.
    Overflow rounds to inf as it should. A NaN is not rounded: its quiet bit is set and
    the low half dropped. Rounding it would carry out of the mantissa for some payloads:
    the NaN an NVIDIA GPU's fp32 arithmetic produces is 0x7FFFFFFF, which the rounding
    add turned into -0.0 (NaN dropped from every bf16 output on a GPU; the interpreter's
    NumPy NaNs, 0x7FC00000 / 0xFFC00000, never carried), and 0x7F808000 into +inf.
    """
    if DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        # exponent all ones and a nonzero mantissa, on the bits (no float compare)
        is_nan = (((bits >> 23) & 0xFF) == 0xFF) & ((bits & 0x7FFFFF) != 0)
        bits = tl.where(is_nan, bits | 0x400000, bits + 0x7FFF + ((bits >> 16) & 1))
        out = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        out = y.to(DTYPE)
    return out


@triton.jit
def row_tile(n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile of program ``(i, j)`` over an ``[n_rows, n_cols]`` array: its rows
    (int64) and columns (``j`` is 0 on a one-axis grid), their in-range masks and the
    tile's mask, as ``(rows, cols, is_row, is_col, mask)``."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    is_row = rows < n_rows
    is_col = cols < n_cols
    return rows, cols, is_row, is_col, is_row[:, None] & is_col[None, :]


@triton.jit
def store_rows(out_ptr, rows, cols, out_row_stride, y, mask):
    """Stores the fp32 tile ``y`` at ``out[rows, cols]`` in the output's dtype."""
    tl.store(
        out_ptr + rows[:, None] * out_row_stride + cols[None, :],
        cast_out(y, out_ptr.dtype.element_ty),
        mask=mask,
    )
