"""A test-only Triton kernel: fp32 values stored through ``cast_out`` (the store of
every Triton kernel), for tests/ops/test_triton_backend.py. Imports triton: import it
only where triton is installed and runnable (a GPU or TRITON_INTERPRET=1)."""

import triton
import triton.language as tl

from bertfast.ops.triton._common import cast_out


@triton.jit
def cast_store_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    is_in = offs < n
    x = tl.load(x_ptr + offs, mask=is_in, other=0.0)
    tl.store(out_ptr + offs, cast_out(x, out_ptr.dtype.element_ty), mask=is_in)


def cast_store(x, dtype):
    """``x`` (fp32, 1-D) stored as ``dtype`` by ``cast_out``."""
    out = x.new_empty(x.shape, dtype=dtype)
    cast_store_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out
