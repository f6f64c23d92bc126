"""Argument checks at the op boundary, shared by every backend.

A kernel never sees an input these functions did not accept: shapes, dtypes,
devices and contiguity are checked here and a clear ``ValueError`` /
``IndexError`` / ``TypeError`` names the problem.

Two kinds of checks: metadata (shape, dtype, device: free) and values (id ranges,
``cu_seqlens`` order: they read device memory back to the host, a sync). Value
checks run on every public op call, and are skipped while tracing / capturing a
CUDA graph and inside :func:`values_checked`, which a caller that has validated
the values itself (the model, once per forward) wraps around its op calls; new
value checks should be guarded by :func:`_can_sync` (as ``check_range`` is).
"""
from __future__ import annotations

import contextlib
import operator
import threading
from typing import Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: Token, position and type ids, and pack indices: every backend takes these two.
INT_DTYPES = (torch.int64, torch.int32)


def _fail(op: str, msg: str, exc=ValueError):
    raise exc(f"bertfast.{op}: {msg}")


def float_tensor(op: str, name: str, t: torch.Tensor, dtype=None, device=None, ndim=None):
    if not isinstance(t, torch.Tensor):
        _fail(op, f"{name} must be a tensor, got {type(t).__name__}", TypeError)
    if t.dtype not in FLOAT_DTYPES:
        _fail(op, f"{name} must be a floating-point tensor, got {t.dtype}", TypeError)
    if dtype is not None and t.dtype != dtype:
        _fail(op, f"{name} has dtype {t.dtype} but the activations are {dtype}", TypeError)
    if device is not None and t.device != device:
        _fail(op, f"{name} is on {t.device} but the activations are on {device}")
    if ndim is not None and t.dim() != ndim:
        _fail(op, f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")


def vector(op: str, name: str, t: Optional[torch.Tensor], size: int, like: torch.Tensor):
    if t is None:
        return
    float_tensor(op, name, t, like.dtype, like.device, 1)
    if t.shape[0] != size:
        _fail(op, f"{name} has {t.shape[0]} elements, expected {size}")


def index_tensor(op: str, name: str, t: torch.Tensor, shape, device, limit: int, what: str):
    """Integer ids of ``shape`` on ``device`` whose values lie in ``[0, limit)``."""
    if not isinstance(t, torch.Tensor):
        _fail(op, f"{name} must be a tensor, got {type(t).__name__}", TypeError)
    if t.dtype not in INT_DTYPES:
        _fail(op, f"{name} must be an int64 or int32 tensor of ids, got {t.dtype} "
                  f"(convert it with .long())", TypeError)
    if tuple(t.shape) != tuple(shape):
        _fail(op, f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.device != device:
        _fail(op, f"{name} is on {t.device}, expected {device}")
    check_range(op, name, t, limit, what)


def positive_int(op: str, name: str, value) -> int:
    """``value`` as a Python int > 0 (a bool or a float is refused)."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        _fail(op, f"{name} must be a positive integer, got {value!r}", TypeError)
    try:
        value = operator.index(value)
    except TypeError:
        _fail(op, f"{name} must be a positive integer, got {value!r}", TypeError)
    if value <= 0:
        _fail(op, f"{name} must be a positive integer, got {value}")
    return value


def attention_args(op: str, qkv, num_heads, scale):
    """Checked ``(num_heads, scale)`` for the attention entry points; ``scale=None``
    is ``head_dim ** -0.5``. Runs before the default scale is computed, so a bad
    head count is a clear error, not a ZeroDivisionError."""
    float_tensor(op, "qkv", qkv)
    if qkv.dim() < 2:
        _fail(op, f"qkv must be [..., 3 * hidden], got shape {tuple(qkv.shape)}")
    num_heads = positive_int(op, "num_heads", num_heads)
    _heads(op, qkv.shape[-1], num_heads)
    if scale is None:
        return num_heads, (qkv.shape[-1] // 3 // num_heads) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _fail(op, f"scale must be a number or None, got {type(scale).__name__}", TypeError)
    return num_heads, float(scale)


def attention_mask_2d(op: str, mask):
    """A ``[batch, seq_len]`` real-valued key mask (nonzero = real token)."""
    if not isinstance(mask, torch.Tensor):
        _fail(op, f"attention_mask must be a tensor, got {type(mask).__name__}", TypeError)
    if mask.dim() != 2:
        _fail(op, f"attention_mask must be [batch, seq_len], got shape {tuple(mask.shape)}")
    if mask.is_complex():
        _fail(op, f"attention_mask must be a bool, integer or float tensor, got {mask.dtype}",
              TypeError)


_state = threading.local()


@contextlib.contextmanager
def values_checked():
    """Inside this block value checks are skipped (the caller has made them)."""
    before = getattr(_state, "trusted", False)
    _state.trusted = True
    try:
        yield
    finally:
        _state.trusted = before


def _can_sync() -> bool:
    """True when value checks (which read device memory) may run."""
    if getattr(_state, "trusted", False):
        return False
    if torch.compiler.is_compiling():
        return False
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    return True


def check_range(op: str, name: str, t: torch.Tensor, limit: int, what: str):
    """Values of ``t`` in ``[0, limit)``. Skipped while tracing or capturing a CUDA
    graph and inside ``values_checked()`` (the model checks its inputs once per
    forward); kernels are bounds-safe regardless."""
    if t.numel() == 0 or not _can_sync():
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        _fail(op, f"{name} contains {bad}, outside [0, {limit}) ({what})", IndexError)


def activation(op: str, act: str):
    from .reference import ACTIVATIONS

    if act not in ACTIVATIONS:
        _fail(op, f"unknown activation {act!r}; expected one of {', '.join(ACTIVATIONS)}")


def embed_layernorm(input_ids, position_ids, token_type_ids, word, pos, types, weight, bias, eps):
    op = "embed_layernorm"
    float_tensor(op, "word_embeddings", word, ndim=2)
    dev, dt = word.device, word.dtype
    E = word.shape[1]
    float_tensor(op, "position_embeddings", pos, dt, dev, 2)
    if pos.shape[1] != E:
        _fail(op, f"position_embeddings width {pos.shape[1]} != word_embeddings width {E}")
    if (types is None) != (token_type_ids is None):
        _fail(op, "token_type_ids and token_type_embeddings must be given together")
    if types is not None:
        float_tensor(op, "token_type_embeddings", types, dt, dev, 2)
        if types.shape[1] != E:
            _fail(op, f"token_type_embeddings width {types.shape[1]} != word_embeddings width {E}")
    vector(op, "weight", weight, E, word)
    vector(op, "bias", bias, E, word)
    if not isinstance(input_ids, torch.Tensor):
        _fail(op, f"input_ids must be a tensor, got {type(input_ids).__name__}", TypeError)
    shape = input_ids.shape
    index_tensor(op, "input_ids", input_ids, shape, dev, word.shape[0], "vocabulary size")
    index_tensor(op, "position_ids", position_ids, shape, dev, pos.shape[0],
                 "max_position_embeddings")
    if types is not None:
        index_tensor(op, "token_type_ids", token_type_ids, shape, dev, types.shape[0],
                     "type_vocab_size")
    if not eps > 0:
        _fail(op, f"eps must be positive, got {eps}")


def add_layernorm(x, residual, bias, weight, ln_bias, eps):
    op = "add_layernorm"
    float_tensor(op, "x", x)
    float_tensor(op, "residual", residual, x.dtype, x.device)
    if residual.shape != x.shape:
        _fail(op, f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    if x.dim() < 1:
        _fail(op, "x must have at least one dimension")
    H = x.shape[-1]
    vector(op, "bias", bias, H, x)
    vector(op, "weight", weight, H, x)
    vector(op, "ln_bias", ln_bias, H, x)
    if not eps > 0:
        _fail(op, f"eps must be positive, got {eps}")


def bias_gelu(x, bias, act):
    op = "bias_gelu"
    float_tensor(op, "x", x)
    if x.dim() < 1:
        _fail(op, "x must have at least one dimension")
    vector(op, "bias", bias, x.shape[-1], x)
    activation(op, act)


def linear(x, weight, bias, op="linear"):
    float_tensor(op, "x", x)
    float_tensor(op, "weight", weight, x.dtype, x.device, 2)
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        _fail(op, f"x shape {tuple(x.shape)} does not match weight shape {tuple(weight.shape)}")
    vector(op, "bias", bias, weight.shape[0], x)


def linear_gelu(x, weight, bias, act):
    op = "linear_gelu"
    float_tensor(op, "x", x)
    float_tensor(op, "weight", weight, x.dtype, x.device, 2)
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        _fail(op, f"x shape {tuple(x.shape)} does not match weight shape {tuple(weight.shape)}")
    vector(op, "bias", bias, weight.shape[0], x)
    activation(op, act)


def _heads(op, H3, num_heads):
    if H3 % 3:
        _fail(op, f"qkv last dimension {H3} is not 3 * hidden")
    H = H3 // 3
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        _fail(op, f"num_heads must be a positive integer, got {num_heads!r}")
    if H % num_heads:
        _fail(op, f"hidden size {H} is not divisible by num_heads={num_heads}")


def attention(qkv, mask, num_heads, scale):
    op = "attention"
    float_tensor(op, "qkv", qkv, ndim=3)
    _heads(op, qkv.shape[2], num_heads)
    if mask is not None:
        attention_mask_2d(op, mask)
        if tuple(mask.shape) != tuple(qkv.shape[:2]):
            _fail(op, f"attention_mask shape {tuple(mask.shape)} != [batch, seq] "
                      f"{tuple(qkv.shape[:2])}")
        if mask.device != qkv.device:
            _fail(op, f"attention_mask is on {mask.device}, qkv on {qkv.device}")


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    op = "attention_varlen"
    float_tensor(op, "qkv", qkv, ndim=2)
    _heads(op, qkv.shape[1], num_heads)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32:
        _fail(op, "cu_seqlens must be an int32 tensor", TypeError)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        _fail(op, f"cu_seqlens must be 1-D with batch + 1 entries, got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != qkv.device:
        _fail(op, f"cu_seqlens is on {cu_seqlens.device}, qkv on {qkv.device}")
    if max_seqlen < 0:
        _fail(op, f"max_seqlen must be >= 0, got {max_seqlen}")
    if _can_sync():
        c = cu_seqlens.tolist()
        if c[0] != 0 or c[-1] != qkv.shape[0] or any(b < a for a, b in zip(c, c[1:])):
            _fail(op, f"cu_seqlens must rise from 0 to the token count {qkv.shape[0]}")
        if len(c) > 1 and max(b - a for a, b in zip(c, c[1:])) > max_seqlen:
            _fail(op, f"a sequence is longer than max_seqlen={max_seqlen}")


def _indices(op, indices):
    if not isinstance(indices, torch.Tensor):
        _fail(op, f"indices must be a tensor, got {type(indices).__name__}", TypeError)
    if indices.dim() != 1 or indices.dtype != torch.int64:
        _fail(op, f"indices must be a 1-D int64 tensor, got {indices.dtype} of shape "
                  f"{tuple(indices.shape)}", TypeError)


def pack_tokens(x, indices):
    op = "pack_tokens"
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        _fail(op, "x must be a tensor with at least one dimension", TypeError)
    _indices(op, indices)
    index_tensor(op, "indices", indices, indices.shape, x.device, x.shape[0], "rows of x")


def unpack_tokens(x, indices, num_rows):
    op = "unpack_tokens"
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        _fail(op, "x must be a tensor with at least one dimension", TypeError)
    _indices(op, indices)
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 0:
        _fail(op, f"num_rows must be a non-negative integer, got {num_rows!r}")
    if indices.dim() != 1 or indices.dtype != torch.int64 or indices.shape[0] != x.shape[0]:
        _fail(op, f"indices must be 1-D int64 with {x.shape[0]} entries (one per row of x)",
              TypeError)
    index_tensor(op, "indices", indices, indices.shape, x.device, num_rows, "num_rows")
