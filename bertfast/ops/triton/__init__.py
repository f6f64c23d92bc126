"""The ``triton`` backend: every fused op as a Triton kernel.

One file per kernel, each in three tiers (raw ``@triton.jit`` kernel, host launcher
that sizes the launch, the function registered here):

=================  ==========================================================
``layernorm.py``   ``embed_layernorm``, ``add_layernorm``
``bias_act.py``    ``bias_gelu``, ``bias_gelu_`` (erf GELU, tanh GELU, ReLU)
``linear_act.py``  ``linear_gelu``: GEMM with bias + activation in its epilogue
``attention.py``   ``attention`` (padded + key mask), ``attention_varlen`` (packed)
``pack.py``        ``pack_tokens``, ``unpack_tokens``
=================  ==========================================================

Runs on CUDA tensors when triton imports and a GPU is present, and on CPU tensors
only under the Triton interpreter (``TRITON_INTERPRET=1``, set before the first
call), which is how the test suite checks the kernels without a GPU.

triton is imported lazily: this module imports no triton at all, so a missing or
broken triton makes the backend unavailable with a reason instead of breaking
``import bertfast``. The kernel modules are imported on the first call of an op.

Launches are CUDA-graph capturable (no host syncs in the launchers); the two
autotuned kernels (``linear_gelu``, ``attention``) benchmark their configs on the
first call per key, so run one warm-up call per shape bucket before capturing.
Both take ``config=`` (a dict) to launch one config without autotuning (what a
sweep times); ``BACKEND.configs`` lists the configs that may be forced for an
input. Attention's config lists are per GPU generation (sm_90 / earlier).
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from ..dispatch import Backend
from ..native import HEADER_CONSTANTS

__all__ = ["BACKEND"]

# The limits and codes shared with the C++ / CUDA kernels come from kernels/constants.h,
# through its Python restatement (bertfast.ops.native.HEADER_CONSTANTS: no build needed).
#: The storage dtypes of the native kernels (math in fp32).
FLOAT_DTYPES = tuple(getattr(torch, name) for name in HEADER_CONSTANTS["dtypes"])
#: pack/unpack only move rows, so they take ids and masks too.
PACK_DTYPES = FLOAT_DTYPES + (
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
#: LayerNorm keeps a whole row in registers: the CUDA kernels' limit (kMaxLayerNormWidth).
MAX_HIDDEN = HEADER_CONSTANTS["max_layernorm_width"]
#: Attention head_dim range the tiles are sized for (BLOCK_D = next power of two): a
#: property of these tiles, not a native constant (any head_dim up to it, not a list).
MAX_HEAD_DIM = 128
#: Attention launches one program column per sequence on grid axis z (kMaxGridYZ).
MAX_GRID_Z = HEADER_CONSTANTS["max_grid_yz"]


@functools.cache
def _triton_import_error():
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a triton broken in its own imports
        return f"triton could not be imported ({type(exc).__name__}: {exc})"
    return None


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _unavailable(device_type: str):
    error = _triton_import_error()
    if error:
        return error
    if device_type == "cpu" and not _interpret():
        return (
            "runs on CPU tensors only under the Triton interpreter "
            "(set TRITON_INTERPRET=1 before the first call; meant for tests)"
        )
    if device_type == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU is available"
    return None


def _lazy(module: str, name: str):
    """A function that imports ``bertfast.ops.triton.<module>`` on first call."""
    impl = None

    def call(*args, **kwargs):
        nonlocal impl
        if impl is None:
            impl = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        return impl(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"triton.{module}.{name}"
    return call


# ------------------------------------------------------------------ supports
def _float(t):
    if t.dtype not in FLOAT_DTYPES:
        return f"does not support {t.dtype}"
    return None


def _hidden(op, size):
    if size > MAX_HIDDEN:
        return f"{op} keeps a row in registers: hidden size {size} > {MAX_HIDDEN}"
    return None


def _supports_embed_layernorm(input_ids, position_ids, token_type_ids, word, *rest):
    return _float(word) or _hidden("embed_layernorm", word.shape[1])


def _supports_add_layernorm(x, *rest):
    return _float(x) or _hidden("add_layernorm", x.shape[-1])


def _supports_float(x, *rest):
    return _float(x)


def _head_dim(qkv, num_heads):
    d = qkv.shape[-1] // 3 // num_heads
    if d > MAX_HEAD_DIM:
        return f"head_dim {d} > {MAX_HEAD_DIM} (tiles are sized for 16..{MAX_HEAD_DIM})"
    return None


def _batch(batch):
    if batch > MAX_GRID_Z:
        return f"batch {batch} > {MAX_GRID_Z} sequences (CUDA grid z limit); split the batch"
    return None


def _interpreter_loops(t):
    """The kernels with a runtime loop bound (GEMM K loop, attention key loop) cannot
    run under an interpreter that fails such loops (see ``_interpreter.py``)."""
    if t.device.type != "cpu" or not _interpret():
        return None
    from ._interpreter import runtime_loop_limit

    return runtime_loop_limit()


def _supports_linear_gelu(x, *rest):
    return _float(x) or _interpreter_loops(x)


def _supports_attention(qkv, mask, num_heads, scale):
    return (
        _float(qkv) or _head_dim(qkv, num_heads) or _batch(qkv.shape[0]) or _interpreter_loops(qkv)
    )


def _supports_attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return (
        _float(qkv)
        or _head_dim(qkv, num_heads)
        or _batch(cu_seqlens.shape[0] - 1)
        or _interpreter_loops(qkv)
    )


def _supports_pack(x, *rest):
    if x.dtype not in PACK_DTYPES:
        return f"does not support {x.dtype}"
    return None


BACKEND = Backend(
    name="triton",
    device_types=("cuda", "cpu"),
    ops={
        # A projection with nothing to fuse stays with the framework GEMM (cuBLAS).
        "linear": torch.nn.functional.linear,
        "embed_layernorm": _lazy("layernorm", "embed_layernorm"),
        "add_layernorm": _lazy("layernorm", "add_layernorm"),
        "bias_gelu": _lazy("bias_act", "bias_gelu"),
        "bias_gelu_": _lazy("bias_act", "bias_gelu_"),
        "linear_gelu": _lazy("linear_act", "linear_gelu"),
        "attention": _lazy("attention", "attention"),
        "attention_varlen": _lazy("attention", "attention_varlen"),
        "pack_tokens": _lazy("pack", "pack_tokens"),
        "unpack_tokens": _lazy("pack", "unpack_tokens"),
    },
    supports={
        "linear": _supports_float,
        "embed_layernorm": _supports_embed_layernorm,
        "add_layernorm": _supports_add_layernorm,
        "bias_gelu": _supports_float,
        "bias_gelu_": _supports_float,
        "linear_gelu": _supports_linear_gelu,
        "attention": _supports_attention,
        "attention_varlen": _supports_attention_varlen,
        "pack_tokens": _supports_pack,
        "unpack_tokens": _supports_pack,
    },
    dtypes=PACK_DTYPES,
    unavailable=_unavailable,
    # The autotuned kernels take config= (a dict: exactly that launch config, no
    # autotuning; a ValueError names what is wrong with a bad one); these list the
    # configs a caller may force for an input (the autotuner's list for the device,
    # pruned as it prunes it; under the interpreter its one small config).
    configs={
        "attention": _lazy("attention", "attention_configs"),
        "attention_varlen": _lazy("attention", "attention_varlen_configs"),
        "linear_gelu": _lazy("linear_act", "linear_gelu_configs"),
    },
)
