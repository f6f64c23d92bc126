"""The ``cuda`` backend: CUDA C++ kernels in ``kernels/cuda/``, bound as ``bertfast._C.cuda``.

Three tiers per op: the raw kernel (``kernels/cuda/<kernel>.cu``), its host
launcher there plus the binding (``csrc/cuda/cuda_ops.cpp``: takes tensors, checks
every size the kernel relies on and the kernel's limits, allocates the output),
and the launcher here, which makes operands contiguous and passes them with
``torch.cuda.current_stream(device).cuda_stream``. The C++ side makes the tensors'
device current, enqueues on that stream and raises ``RuntimeError`` on a launch
error. The argument order is the ``cpu`` backend's plus that trailing stream.

Storage dtypes fp32, fp16 and bf16; statistics and accumulators in fp32 (fp32
attention runs on CUDA cores, never TF32). GEMMs stay with torch: ``linear_gelu``
is ``F.linear`` (cuBLAS, bias in its epilogue) followed by the in-place
activation kernel.

``attention`` and ``attention_varlen`` have a second kernel, the variant ``"flash"``
(``kernels/cuda/flash_attention.cu``: FlashAttention-2 style, mma.sync with the
scores, softmax and P in registers, cp.async double-buffered K/V; fp16 / bf16 on
sm_80+). The default stays ``attention.cu``; dispatch takes the flash kernel only
where the per-GPU winners table measured it faster with parity
(``bertfast.ops.winners``), or when a caller asks for the candidate ``cuda:flash``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cuda_epilogue
from .dispatch import Backend
from .native import (
    _C,
    DTYPES,
    IMPORT_ERROR,
    MAX_CUDA_ROWS,
    MAX_CUDA_SEQLEN,
    MAX_GRID_YZ,
    MAX_LAYERNORM_WIDTH,
    add_layernorm_operands,
    embed_operands,
    mask_operand,
    native_ops,
)
from .native import (
    CUDA_ATTENTION_HEAD_DIMS as ATTENTION_HEAD_DIMS,
)
from .native import (
    CUDA_FLASH_ATTENTION_HEAD_DIMS as FLASH_ATTENTION_HEAD_DIMS,
)
from .native import (
    contig as _c,
)

_kernels = getattr(_C, "cuda", None)


@functools.cache
def _unavailable_reason() -> str | None:
    if _C is None:
        return IMPORT_ERROR
    if _kernels is None:
        # the build's own reason: nvcc not found, BERTFAST_SKIP_CUDA, or a CPU-only torch
        why = _C.build_info().get("cuda_status") or "reason not recorded"
        return f"bertfast._C was built without CUDA kernels ({why})"
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return "no GPU: this torch build has no CUDA support"
        return "no GPU: torch sees no CUDA device"
    count = _kernels.device_count()
    if count < 0:
        return (
            f"no GPU usable by bertfast._C's CUDA runtime "
            f"({_kernels.error_name(-count)}, cudaError {-count})"
        )
    if count == 0:
        return "no GPU: bertfast._C's CUDA runtime sees no device"
    return None


def _unavailable(device_type: str) -> str | None:
    return _unavailable_reason()


def _stream(t: Tensor) -> int:
    """The handle of torch's current stream on t's device (the kernels enqueue on it)."""
    return torch.cuda.current_stream(t.device).cuda_stream


# ---------------------------------------------------------------- LayerNorm
def embed_layernorm(input_ids, position_ids, token_type_ids, word_embeddings, *tables_and_eps):
    *tables, eps = tables_and_eps  # position/token-type tables, weight, bias; then eps
    return _kernels.embed_layernorm(
        *embed_operands(input_ids, position_ids, token_type_ids, word_embeddings, *tables),
        float(eps),
        _stream(word_embeddings),
    )


def add_layernorm(x, residual, bias, weight, ln_bias, eps):
    return _kernels.add_layernorm(
        *add_layernorm_operands(x, residual, bias, weight, ln_bias), float(eps), _stream(x)
    )


def _supports_embed_layernorm(input_ids, position_ids, token_type_ids, word, *rest):
    if word.shape[1] > MAX_LAYERNORM_WIDTH:
        return f"embedding width {word.shape[1]} > {MAX_LAYERNORM_WIDTH}"
    if input_ids.numel() > MAX_CUDA_ROWS:
        return "more than 2^31 - 1 tokens"
    return None


def _supports_add_layernorm(x, *rest):
    if x.shape[-1] > MAX_LAYERNORM_WIDTH:
        return f"hidden size {x.shape[-1]} > {MAX_LAYERNORM_WIDTH}"
    if x.shape[-1] and x.numel() // x.shape[-1] > MAX_CUDA_ROWS:
        return "more than 2^31 - 1 rows"
    return None


# ---------------------------------------------------------------- bias + activation
def bias_gelu(x, bias, act):
    return _kernels.bias_act(x.contiguous(), _c(bias), act, False, _stream(x))


def bias_gelu_(x, bias, act):
    bias = _c(bias)
    if x.is_contiguous():
        _kernels.bias_act(x, bias, act, True, _stream(x))
    else:
        x.copy_(_kernels.bias_act(x.contiguous(), bias, act, True, _stream(x)))


def linear_gelu(x, weight, bias, act):
    # cuBLAS GEMM with the bias in its epilogue (one rounding, as the reference's
    # F.linear), then the activation in place (F.linear's output is contiguous).
    y = F.linear(x, weight, bias)
    return _kernels.bias_act(y, None, act, True, _stream(y))


# ---------------------------------------------------------------- attention
def _aligned(t: Tensor) -> Tensor:
    """t, or a fresh (16-byte aligned) copy when its data pointer is not 16-byte aligned."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _padded_attention(entry: str):
    """The launcher of the padded entry point ``entry`` of ``_C.cuda``."""

    def run(qkv, attention_mask, num_heads, scale):
        return getattr(_kernels, entry)(
            _aligned(qkv), mask_operand(attention_mask), int(num_heads), float(scale), _stream(qkv)
        )

    return run


def _varlen_attention(entry: str):
    """The launcher of the varlen entry point ``entry`` of ``_C.cuda``."""

    def run(qkv, cu_seqlens, max_seqlen, num_heads, scale):
        return getattr(_kernels, entry)(
            _aligned(qkv),
            cu_seqlens.contiguous(),
            int(max_seqlen),
            int(num_heads),
            float(scale),
            _stream(qkv),
        )

    return run


attention = _padded_attention("attention")
attention_varlen = _varlen_attention("attention_varlen")


def _attention_limits(
    head_dim: int,
    num_heads: int,
    batch: int,
    seqlen: int,
    head_dims=ATTENTION_HEAD_DIMS,
    kernel: str = "compiled",
) -> str | None:
    """Why an attention kernel with ``head_dims`` cannot take these sizes (None: it can)."""
    if head_dim not in head_dims:
        return (
            f"head_dim {head_dim} is not one of the {kernel} head dims "
            f"{', '.join(map(str, head_dims))}"
        )
    if num_heads > MAX_GRID_YZ:
        return f"num_heads {num_heads} > {MAX_GRID_YZ}"
    if batch > MAX_GRID_YZ:
        return f"batch {batch} > {MAX_GRID_YZ} sequences"
    if seqlen > MAX_CUDA_SEQLEN:
        return f"sequence length {seqlen} > {MAX_CUDA_SEQLEN}"
    return None


@functools.cache
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def _dtype_on_device(qkv: Tensor) -> str | None:
    # bf16 tensor-core fragments need sm_80+ (older archs in a build trap instead).
    if qkv.dtype == torch.bfloat16 and qkv.device.type == "cuda":
        index = qkv.device.index if qkv.device.index is not None else torch.cuda.current_device()
        major, minor = _capability(index)
        if major < 8:
            return f"bf16 attention needs compute capability 8.0+, device has {major}.{minor}"
    return None


def _supports_attention(qkv, attention_mask, num_heads, scale):
    B, S, H3 = qkv.shape
    return _attention_limits(H3 // 3 // num_heads, num_heads, B, S) or _dtype_on_device(qkv)


def _supports_attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return _attention_limits(
        qkv.shape[1] // 3 // num_heads, num_heads, cu_seqlens.numel() - 1, max_seqlen
    ) or _dtype_on_device(qkv)


# ---------------------------------------------------------------- attention, variant "flash"
flash_attention = _padded_attention("flash_attention")
flash_attention_varlen = _varlen_attention("flash_attention_varlen")

_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def _flash_device(device: torch.device) -> str | None:
    """Why the flash kernel cannot run on ``device`` (cp.async and bf16 mma: sm_80+)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = _capability(index)
    if major < 8:
        return f"the flash kernel needs compute capability 8.0+, device has {major}.{minor}"
    return None


def _flash_limits(qkv: Tensor, num_heads: int, batch: int, seqlen: int) -> str | None:
    if qkv.dtype not in _FLASH_DTYPES:
        return f"the flash kernel takes float16 / bfloat16, not {qkv.dtype} (the default runs it)"
    hidden = qkv.shape[-1] // 3
    if hidden * qkv.element_size() % 16:
        return (
            f"rows of hidden size {hidden} are not a multiple of 16 bytes "
            "(the flash kernel copies rows in 16-byte pieces)"
        )
    if getattr(_kernels, "flash_attention", None) is None:  # an extension built before it
        return "this build of bertfast._C has no flash attention kernel (rebuild it)"
    reason = _attention_limits(
        hidden // num_heads, num_heads, batch, seqlen, FLASH_ATTENTION_HEAD_DIMS, "flash kernel's"
    )
    if reason:
        return reason
    tokens = qkv.numel() // qkv.shape[-1] if qkv.shape[-1] else 0
    if tokens > MAX_CUDA_ROWS:
        return f"{tokens} tokens > {MAX_CUDA_ROWS}"
    return _flash_device(qkv.device)


def _supports_flash_attention(qkv, attention_mask, num_heads, scale):
    B, S, _ = qkv.shape
    return _flash_limits(qkv, num_heads, B, S)


def _supports_flash_attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return _flash_limits(qkv, num_heads, cu_seqlens.numel() - 1, max_seqlen)


# ---------------------------------------------------------------- pack / unpack
def pack_tokens(x, indices):
    return _kernels.pack_rows(x.contiguous(), indices.contiguous(), _stream(x))


def unpack_tokens(x, indices, num_rows):
    return _kernels.unpack_rows(x.contiguous(), indices.contiguous(), int(num_rows), _stream(x))


BACKEND = Backend(
    name="cuda",
    device_types=("cuda",),
    # A projection with nothing to fuse stays with the framework GEMM (cuBLAS).
    ops={"linear": torch.nn.functional.linear, **native_ops(globals())},
    supports={
        "embed_layernorm": _supports_embed_layernorm,
        "add_layernorm": _supports_add_layernorm,
        "attention": _supports_attention,
        "attention_varlen": _supports_attention_varlen,
    },
    dtypes=DTYPES,
    unavailable=_unavailable,
    variants={
        "attention": {"flash": flash_attention},
        "attention_varlen": {"flash": flash_attention_varlen},
        # cuBLASLt's bias + activation epilogue (only for the GELU form it computes).
        "linear_gelu": {"cublaslt": cuda_epilogue.linear_gelu_cublaslt},
    },
    variant_supports={
        ("attention", "flash"): _supports_flash_attention,
        ("attention_varlen", "flash"): _supports_flash_attention_varlen,
        ("linear_gelu", "cublaslt"): cuda_epilogue.supports_linear_gelu_cublaslt,
    },
)
