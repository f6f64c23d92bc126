"""The ``cuda`` backend: CUDA C++ kernels in ``kernels/cuda/``, bound as ``bertfast._C.cuda``.

Three tiers per op: the raw kernel (``kernels/cuda/<kernel>.cu``), the host launcher
there plus its pybind11 binding (``csrc/cuda/cuda_ops.cpp``), and the launcher
here, which makes inputs contiguous, allocates outputs with torch and passes
``data_ptr()`` addresses, sizes, a dtype code, the device index and
``torch.cuda.current_stream().cuda_stream``. The C++ side makes that device
current, enqueues on that stream and raises ``RuntimeError`` on a launch error.

Storage dtypes fp32, fp16 and bf16; statistics and accumulators in fp32 (fp32
attention runs on CUDA cores, never TF32). GEMMs stay with torch: ``linear_gelu``
is ``F.linear`` (cuBLAS, bias in its epilogue) followed by the in-place
activation kernel.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .dispatch import Backend
from .native import ACT_CODES as _ACT_CODES
from .native import DTYPE_CODES as _DTYPE_CODES
from .native import add_layernorm_operands, contig as _c, embed_operands, ptr as _ptr

try:  # the backend stays importable (and says why) without a native build
    from .. import _C as _native

    _IMPORT_ERROR: Optional[str] = None
except ImportError as exc:  # pragma: no cover - only without a build
    _native = None
    _IMPORT_ERROR = f"bertfast._C is not built ({exc})"

_kernels = getattr(_native, "cuda", None) if _native is not None else None


#: Head dims the attention kernel is instantiated for (kernels/cuda/attention.cu).
ATTENTION_HEAD_DIMS = (32, 64, 80, 96, 128)
#: Widest LayerNorm row the kernels hold in registers (512 threads x 32 floats).
MAX_LAYERNORM_WIDTH = 16384
_MAX_GRID_YZ = 65535


@functools.lru_cache(maxsize=None)
def _unavailable_reason() -> Optional[str]:
    if _native is None:
        return _IMPORT_ERROR
    if not _native.build_info().get("cuda") or _kernels is None:
        return ("bertfast._C was built without CUDA kernels (nvcc not found at build time, "
                "or BERTFAST_SKIP_CUDA set)")
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return "no GPU: this torch build has no CUDA support"
        return "no GPU: torch sees no CUDA device"
    count = _native.cuda_device_count()
    if count < 0:
        return (f"no GPU usable by bertfast._C's CUDA runtime "
                f"({_kernels.error_name(-count)}, cudaError {-count})")
    if count == 0:
        return "no GPU: bertfast._C's CUDA runtime sees no device"
    return None


def _unavailable(device_type: str) -> Optional[str]:
    return _unavailable_reason()





def _where(t: Tensor):
    """(device index, current stream handle) for launches on t's device."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(index).cuda_stream


# ---------------------------------------------------------------- LayerNorm
def embed_layernorm(input_ids, position_ids, token_type_ids, word_embeddings,
                    position_embeddings, token_type_embeddings, weight, bias, eps):
    out, ids, pids, tids, word, pos, types, w, b = embed_operands(
        input_ids, position_ids, token_type_ids, word_embeddings, position_embeddings,
        token_type_embeddings, weight, bias)
    E = word.shape[1]
    if out.numel() == 0:
        return out
    device, stream = _where(out)
    _kernels.embed_layernorm(
        out.data_ptr(), ids.data_ptr(), pids.data_ptr(), _ptr(tids), word.data_ptr(),
        pos.data_ptr(), _ptr(types), w.data_ptr(), b.data_ptr(), ids.numel(), E, word.shape[0],
        pos.shape[0], 0 if types is None else types.shape[0], float(eps),
        _DTYPE_CODES[word.dtype], device, stream)
    return out


def add_layernorm(x, residual, bias, weight, ln_bias, eps):
    out, x, residual, bias, weight, ln_bias = add_layernorm_operands(x, residual, bias, weight,
                                                                    ln_bias)
    if x.numel() == 0:
        return out
    H = x.shape[-1]
    device, stream = _where(x)
    _kernels.add_layernorm(
        out.data_ptr(), x.data_ptr(), residual.data_ptr(), _ptr(bias), weight.data_ptr(),
        ln_bias.data_ptr(), x.numel() // H, H, float(eps), _DTYPE_CODES[x.dtype], device, stream)
    return out


def _supports_embed_layernorm(input_ids, position_ids, token_type_ids, word, *rest):
    if word.shape[1] > MAX_LAYERNORM_WIDTH:
        return f"embedding width {word.shape[1]} > {MAX_LAYERNORM_WIDTH}"
    if input_ids.numel() >= 2**31:
        return "more than 2^31 - 1 tokens"
    return None


def _supports_add_layernorm(x, *rest):
    if x.shape[-1] > MAX_LAYERNORM_WIDTH:
        return f"hidden size {x.shape[-1]} > {MAX_LAYERNORM_WIDTH}"
    if x.shape[-1] and x.numel() // x.shape[-1] >= 2**31:
        return "more than 2^31 - 1 rows"
    return None


# ---------------------------------------------------------------- bias + activation
def _bias_act(out: Tensor, x: Tensor, bias: Optional[Tensor], act: str) -> None:
    if x.numel() == 0:
        return
    N = x.shape[-1]
    bias = _c(bias)
    device, stream = _where(x)
    _kernels.bias_act(out.data_ptr(), x.data_ptr(), _ptr(bias), x.numel() // N, N,
                      _ACT_CODES[act], _DTYPE_CODES[x.dtype], device, stream)


def bias_gelu(x, bias, act):
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _bias_act(out, x, bias, act)
    return out


def bias_gelu_(x, bias, act):
    if x.is_contiguous():
        _bias_act(x, x, bias, act)
    else:
        tmp = x.contiguous()
        _bias_act(tmp, tmp, bias, act)
        x.copy_(tmp)


def linear_gelu(x, weight, bias, act):
    # cuBLAS GEMM with the bias in its epilogue (one rounding, as the reference's
    # F.linear), then the activation in place.
    y = F.linear(x, weight, bias)
    if not y.is_contiguous():  # pragma: no cover - F.linear returns contiguous
        y = y.contiguous()
    _bias_act(y, y, None, act)
    return y


# ---------------------------------------------------------------- attention
def _aligned(t: Tensor) -> Tensor:
    """t, or a fresh (16-byte aligned) copy when its data pointer is not 16-byte aligned."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def attention(qkv, attention_mask, num_heads, scale):
    B, S, H3 = qkv.shape
    H = H3 // 3
    out = qkv.new_empty((B, S, H))
    if out.numel() == 0:
        return out
    qkv = _aligned(qkv)
    mask = None if attention_mask is None else (attention_mask != 0).contiguous()
    device, stream = _where(qkv)
    _kernels.attention(out.data_ptr(), qkv.data_ptr(), _ptr(mask), 0, B, S, B * S, num_heads,
                       H // num_heads, float(scale), _DTYPE_CODES[qkv.dtype], device, stream)
    return out


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    T, H3 = qkv.shape
    H = H3 // 3
    B = cu_seqlens.numel() - 1
    if T == 0 or H == 0:
        return qkv.new_empty((T, H))
    if B <= 0 or max_seqlen <= 0:
        return qkv.new_zeros((T, H))  # no sequence covers any token
    out = qkv.new_empty((T, H))
    qkv = _aligned(qkv)
    cu = cu_seqlens.contiguous()
    device, stream = _where(qkv)
    _kernels.attention(out.data_ptr(), qkv.data_ptr(), 0, cu.data_ptr(), B, int(max_seqlen), T,
                       num_heads, H // num_heads, float(scale), _DTYPE_CODES[qkv.dtype], device,
                       stream)
    return out


def _attention_limits(head_dim: int, num_heads: int, batch: int, seqlen: int) -> Optional[str]:
    if head_dim not in ATTENTION_HEAD_DIMS:
        return (f"head_dim {head_dim} is not one of the compiled head dims "
                f"{', '.join(map(str, ATTENTION_HEAD_DIMS))}")
    if num_heads > _MAX_GRID_YZ:
        return f"num_heads {num_heads} > {_MAX_GRID_YZ}"
    if batch > _MAX_GRID_YZ:
        return f"batch {batch} > {_MAX_GRID_YZ} sequences"
    if seqlen > 2**30:
        return f"sequence length {seqlen} > 2^30"
    return None


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def _dtype_on_device(qkv: Tensor) -> Optional[str]:
    # bf16 tensor-core fragments need sm_80+ (older archs in a build trap instead).
    if qkv.dtype == torch.bfloat16 and qkv.device.type == "cuda":
        index = qkv.device.index if qkv.device.index is not None else torch.cuda.current_device()
        major, minor = _capability(index)
        if major < 8:
            return f"bf16 attention needs compute capability 8.0+, device has {major}.{minor}"
    return None


def _supports_attention(qkv, attention_mask, num_heads, scale):
    B, S, H3 = qkv.shape
    return (_attention_limits(H3 // 3 // num_heads, num_heads, B, S)
            or _dtype_on_device(qkv))


def _supports_attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return (_attention_limits(qkv.shape[1] // 3 // num_heads, num_heads, cu_seqlens.numel() - 1,
                              max_seqlen)
            or _dtype_on_device(qkv))


# ---------------------------------------------------------------- pack / unpack
def _row_bytes(x: Tensor) -> int:
    return math.prod(x.shape[1:]) * x.element_size()


def pack_tokens(x, indices):
    x, idx = x.contiguous(), indices.contiguous()
    out = x.new_empty((idx.shape[0],) + tuple(x.shape[1:]))
    if out.numel() == 0:
        return out
    device, stream = _where(x)
    _kernels.pack_rows(out.data_ptr(), x.data_ptr(), idx.data_ptr(), idx.shape[0], x.shape[0],
                       _row_bytes(x), device, stream)
    return out


def unpack_tokens(x, indices, num_rows):
    x, idx = x.contiguous(), indices.contiguous()
    out = x.new_empty((num_rows,) + tuple(x.shape[1:]))
    if out.numel() == 0:
        return out
    device, stream = _where(x)
    _kernels.unpack_rows(out.data_ptr(), x.data_ptr(), idx.data_ptr(), idx.shape[0], num_rows,
                         _row_bytes(x), device, stream)
    return out


BACKEND = Backend(
    name="cuda",
    device_types=("cuda",),
    ops={
        # A projection with nothing to fuse stays with the framework GEMM (cuBLAS).
        "linear": torch.nn.functional.linear,
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
        "embed_layernorm": _supports_embed_layernorm,
        "add_layernorm": _supports_add_layernorm,
        "attention": _supports_attention,
        "attention_varlen": _supports_attention_varlen,
    },
    unavailable=_unavailable,
)
