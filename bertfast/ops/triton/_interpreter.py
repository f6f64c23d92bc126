"""What the Triton interpreter in use can run (imported only under TRITON_INTERPRET=1).

The interpreter is a test device, and old ones have limits that GPU compilation does
not share. Each limit here is probed once, by running a tiny kernel, rather than
inferred from version numbers, so a fixed interpreter is used as soon as it is there.

- Loops over a runtime bound (``for k in range(0, n)`` with ``n`` a kernel argument):
  triton 3.6's interpreter holds every scalar as a 1-element array and reads a loop
  bound with ``int(array)``, which NumPy >= 2.3 refuses ("only 0-dimensional arrays
  can be converted to Python scalars"). ``linear_gelu`` (the K loop) and the attention
  kernels (the key loop) need such loops; on a GPU they compile and run normally.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _runtime_loop_probe(out_ptr, n):
    acc = tl.zeros((1,), dtype=tl.int32)
    for _ in range(n):
        acc += 1
    tl.store(out_ptr + tl.arange(0, 1), acc)


@functools.cache
def runtime_loop_limit() -> str | None:
    """Why this interpreter cannot run a loop with a runtime bound, or ``None``."""
    import numpy as np

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _runtime_loop_probe[(1,)](out, 3)
    except Exception as exc:  # the interpreter's own failure, whatever its type
        cause = str(exc).splitlines()[0][:160]
        return (
            f"the Triton {triton.__version__} interpreter cannot run loops with a runtime "
            f"bound under NumPy {np.__version__} ({cause}); a GPU runs them. Use "
            "NumPy < 2.3 with this triton, or a newer triton"
        )
    if int(out[0]) != 3:
        return (
            f"the Triton {triton.__version__} interpreter ran a 3-step runtime loop "
            f"{int(out[0])} times"
        )
    return None
