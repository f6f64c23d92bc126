"""The ``cpu`` backend: C++ kernels in ``kernels/cpu/``, bound as ``bertfast._C.cpu``.

Three tiers per op: the raw kernel (C++, one file per kernel), the host launcher
here (makes inputs contiguous, allocates outputs with torch, passes
``data_ptr()`` addresses, sizes and ``torch.get_num_threads()``; the C++ side
releases the GIL), and the registered op in ``bertfast/ops/__init__.py``.

Storage dtypes fp32, fp16 and bf16, math in fp32. ``linear`` / ``linear_gelu`` in
fp32 run the C++ GEMM with bias + activation fused in its epilogue on weights a
loaded model owns packed (``cpu_weights.PackedWeight``), and ``F.linear`` + the
bias/activation kernel on any other weight, read afresh at every call (no cache;
see ``cpu_weights.py``); in fp16 / bf16 they are ``torch.matmul`` + that kernel.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor

from . import cpu_weights as _weights
from .dispatch import Backend
from .native import ACT_CODES as _ACT_CODES
from .native import DTYPE_CODES as _DTYPE_CODES
from .native import add_layernorm_operands, contig as _c, embed_operands, ptr as _ptr

try:  # the backend stays importable (and says why) without a native build
    from .. import _C as _native

    _kernels = _native.cpu
    _IMPORT_ERROR: Optional[str] = None
except (ImportError, AttributeError) as exc:  # pragma: no cover - only without a build
    _kernels = None
    _IMPORT_ERROR = f"bertfast._C CPU kernels are not built ({exc})"



def _threads() -> int:
    return max(1, torch.get_num_threads())





# ---------------------------------------------------------------- LayerNorm
def embed_layernorm(input_ids, position_ids, token_type_ids, word_embeddings,
                    position_embeddings, token_type_embeddings, weight, bias, eps):
    out, ids, pids, tids, word, pos, types, w, b = embed_operands(
        input_ids, position_ids, token_type_ids, word_embeddings, position_embeddings,
        token_type_embeddings, weight, bias)
    E = word.shape[1]
    if out.numel() == 0:
        return out
    _kernels.embed_layernorm(
        _DTYPE_CODES[word.dtype], out.data_ptr(), ids.data_ptr(), pids.data_ptr(), _ptr(tids),
        word.data_ptr(), word.shape[0], pos.data_ptr(), pos.shape[0], _ptr(types),
        0 if types is None else types.shape[0], w.data_ptr(), b.data_ptr(), ids.numel(), E,
        float(eps), _threads())
    return out


def add_layernorm(x, residual, bias, weight, ln_bias, eps):
    out, x, residual, bias, weight, ln_bias = add_layernorm_operands(x, residual, bias, weight,
                                                                    ln_bias)
    H = x.shape[-1]
    if x.numel() == 0:
        return out
    _kernels.add_layernorm(
        _DTYPE_CODES[x.dtype], out.data_ptr(), x.data_ptr(), residual.data_ptr(), _ptr(bias),
        weight.data_ptr(), ln_bias.data_ptr(), x.numel() // H, H, float(eps), _threads())
    return out


# ---------------------------------------------------------------- bias + activation
def _bias_act(out: Tensor, x: Tensor, bias: Optional[Tensor], act: str) -> None:
    N = x.shape[-1]
    if x.numel() == 0:
        return
    _kernels.bias_act(_DTYPE_CODES[x.dtype], out.data_ptr(), x.data_ptr(), _ptr(bias),
                      x.numel() // N, N, _ACT_CODES[act], _threads())


def bias_gelu(x, bias, act):
    x, bias = x.contiguous(), _c(bias)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _bias_act(out, x, bias, act)
    return out


def bias_gelu_(x, bias, act):
    bias = _c(bias)
    if x.is_contiguous():
        _bias_act(x, x, bias, act)
    else:  # compute on a contiguous copy, then write back through x's strides
        tmp = x.contiguous()
        _bias_act(tmp, tmp, bias, act)
        x.copy_(tmp)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
           act: Optional[str] = None) -> Tensor:
    """fp32 ``act(x @ weight.T + bias)``; ``act=None`` is a plain linear layer.

    A :class:`~bertfast.ops.cpu_weights.PackedWeight` (owned by a model bertfast
    loaded, packed once) runs on the C++ GEMM (kernels/cpu/gemm.cpp) with bias and
    activation in its epilogue. Any other weight is read as it is at this call, never
    cached: ``F.linear`` + the C++ bias/activation epilogue, or packed for this call
    from ``cpu_weights.PACK_MIN_ROWS`` rows (see bertfast/ops/cpu_weights.py).
    """
    x, bias = x.contiguous(), _c(bias)
    N, K = weight.shape
    M = x.numel() // K if K else 0
    packed = _weights.packed_for_call(weight, M)
    if packed is None:
        out = torch.nn.functional.linear(x, weight, None if act is not None else bias)
        if act is not None and out.numel():
            _bias_act(out, out, bias, act)
        return out
    out = x.new_empty(tuple(x.shape[:-1]) + (N,))
    if out.numel() == 0:
        return out
    _kernels.linear_packed(out.data_ptr(), x.data_ptr(), packed.data_ptr(), _ptr(bias),
                           out.numel() // N, N, K, -1 if act is None else _ACT_CODES[act],
                           True, _threads())
    return out


#: ``BERTFAST_CPU_GEMM=torch`` sends every fp32 GEMM to torch (``F.linear``), and
#: ``from_pretrained`` then keeps its weights unpacked.
_OWN_GEMM = os.environ.get("BERTFAST_CPU_GEMM", "own").strip().lower() != "torch"


def linear_op(x, weight, bias):
    """The ``linear`` op: fp32 on the C++ GEMM or F.linear (see ``linear``), other
    dtypes on torch's."""
    if x.dtype == torch.float32 and (_OWN_GEMM or _weights.is_packed(weight)):
        return linear(x, weight, bias, None)
    return torch.nn.functional.linear(x, weight, bias)


def linear_gelu(x, weight, bias, act):
    if x.dtype == torch.float32 and (_OWN_GEMM or _weights.is_packed(weight)):
        return linear(x, weight, bias, act)  # bias + act in the C++ epilogue
    # fp16 / bf16: torch's GEMM, then the bias + activation epilogue in place.
    y = torch.matmul(x, weight.t())
    bias_gelu_(y, bias, act)
    return y


# ---------------------------------------------------------------- attention
def attention(qkv, attention_mask, num_heads, scale):
    B, S, H3 = qkv.shape
    qkv = qkv.contiguous()
    out = qkv.new_empty((B, S, H3 // 3))
    if out.numel() == 0:
        return out
    mask = None
    if attention_mask is not None:
        mask = (attention_mask != 0).contiguous().view(torch.uint8)
    _kernels.attention(_DTYPE_CODES[qkv.dtype], out.data_ptr(), qkv.data_ptr(), _ptr(mask),
                       B, S, int(num_heads), H3 // 3, float(scale), _threads())
    return out


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    T, H3 = qkv.shape
    qkv = qkv.contiguous()
    cu = cu_seqlens.contiguous()
    out = qkv.new_empty((T, H3 // 3))
    if H3 == 0:
        return out
    _kernels.attention_varlen(_DTYPE_CODES[qkv.dtype], out.data_ptr(), qkv.data_ptr(),
                              cu.data_ptr(), cu.numel() - 1, T, int(num_heads), H3 // 3,
                              float(scale), _threads())
    return out


# ---------------------------------------------------------------- pack / unpack
def _row_bytes(x: Tensor) -> int:
    return x[0].numel() * x.element_size() if x.shape[0] else 0


def pack_tokens(x, indices):
    x, idx = x.contiguous(), indices.contiguous()
    out = x.new_empty((idx.shape[0],) + tuple(x.shape[1:]))
    if out.numel() == 0:
        return out
    _kernels.pack_rows(out.data_ptr(), x.data_ptr(), idx.data_ptr(), idx.shape[0], x.shape[0],
                       _row_bytes(x), _threads())
    return out


def unpack_tokens(x, indices, num_rows):
    x, idx = x.contiguous(), indices.contiguous()
    out = x.new_empty((num_rows,) + tuple(x.shape[1:]))
    if out.numel() == 0:
        return out
    row_bytes = out[0].numel() * out.element_size()
    _kernels.unpack_rows(out.data_ptr(), x.data_ptr(), idx.data_ptr(), idx.shape[0], num_rows,
                         row_bytes, _threads())
    return out


# ---------------------------------------------------------------- support checks
def _unavailable(device_type: str) -> Optional[str]:
    return _IMPORT_ERROR


def _dtype_ok(op: str, t: Tensor) -> Optional[str]:
    if t.dtype not in _DTYPE_CODES:
        return f"{op}: {t.dtype} storage is not supported (fp32, fp16, bf16)"
    return None


def _supports_embed(input_ids, position_ids, token_type_ids, word, pos, types, weight, bias,
                    eps):
    return _dtype_ok("embed_layernorm", word)


def _supports_add_ln(x, residual, bias, weight, ln_bias, eps):
    return _dtype_ok("add_layernorm", x)


def _supports_bias_gelu(x, bias, act):
    if act not in _ACT_CODES:
        return f"activation {act!r} has no C++ kernel"
    return _dtype_ok("bias_gelu", x)


def _supports_linear_gelu(x, weight, bias, act):
    return _supports_bias_gelu(x, bias, act)


def _supports_attention(qkv, attention_mask, num_heads, scale):
    return _dtype_ok("attention", qkv)


def _supports_attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return _dtype_ok("attention_varlen", qkv)


BACKEND = Backend(
    name="cpu",
    device_types=("cpu",),
    ops={
        "linear": linear_op,
        "embed_layernorm": embed_layernorm,
        "add_layernorm": add_layernorm,
        "bias_gelu": bias_gelu,
        "bias_gelu_": bias_gelu_,
        "linear_gelu": linear_gelu,
        "attention": attention,
        "attention_varlen": attention_varlen,
        "pack_tokens": pack_tokens,
        "unpack_tokens": unpack_tokens,
    },
    supports={
        "embed_layernorm": _supports_embed,
        "add_layernorm": _supports_add_ln,
        "bias_gelu": _supports_bias_gelu,
        "bias_gelu_": _supports_bias_gelu,
        "linear_gelu": _supports_linear_gelu,
        "attention": _supports_attention,
        "attention_varlen": _supports_attention_varlen,
    },
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
    unavailable=_unavailable,
)
