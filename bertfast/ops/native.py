"""What the pybind11 backends (``cpu.py``, ``cuda.py``) share: the built extension,
its constants, and the operand preparation both launchers do the same way.

``bertfast._C`` takes torch tensors and checks them itself (device, dtype,
contiguity, every size its kernel relies on), so a launcher only makes its operands
contiguous, converts ids to int64 and passes them on; the extension allocates the
output. The constants (dtype and activation names, CUDA head dims, size limits)
are defined once, in ``kernels/constants.h``, and read here through
``bertfast._C.constants()`` (:data:`CONSTANTS`: what the loaded build was compiled
with). :data:`HEADER_CONSTANTS` restates the header for code that must not need a
build (the Triton backend reads its limits and codes there);
``tests/ops/test_native_constants.py`` parses the header and checks both against it.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor


def built_torch_version(origin: str | None) -> str | None:
    """The torch version the extension at ``origin`` was built against (the
    ``_C.torch-version`` file the build installs beside it), None when unknown."""
    if not origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(origin), "_C.torch-version")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def import_problem(exc: BaseException, origin: str | None, built: str | None, running: str):
    """Why ``bertfast._C`` did not load, in one line: not built, built against another
    torch (which a pybind11 extension cannot load with: it links torch's C++ symbols),
    or the loader's own message."""
    if origin is None:
        return f"bertfast._C is not built ({exc})"
    if built is not None and built.split("+")[0] != running.split("+")[0]:
        return (
            f"bertfast._C was built against torch {built}, but torch {running} is running: "
            f"rebuild bertfast with this torch (pip install --no-build-isolation "
            f"--force-reinstall --no-deps bertfast, or the same from a clone) or install "
            f"torch=={built.split('+')[0]}"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"bertfast._C cannot be loaded ({first}; built against torch {built or '?'})"


_ORIGIN = getattr(importlib.util.find_spec(f"{__package__.rsplit('.', 1)[0]}._C"), "origin", None)
try:  # the backends stay importable (and say why) without a native build
    from .. import _C
except ImportError as exc:
    _C = None
    IMPORT_ERROR: str | None = import_problem(
        exc, _ORIGIN, built_torch_version(_ORIGIN), torch.__version__
    )
else:
    IMPORT_ERROR = None
#: The torch version the extension was built against (None: unknown, or no build).
BUILT_TORCH = built_torch_version(_ORIGIN)

#: kernels/constants.h restated, in the shape of ``bertfast._C.constants()``: the source
#: tree's values, there without a build (the Triton backend's limits and codes).
HEADER_CONSTANTS: dict = {
    "dtypes": ("float32", "float16", "bfloat16"),  # DType, code = index
    "activations": ("gelu", "gelu_tanh", "relu"),  # Activation, code = index
    "no_activation": -1,  # kNoActivation
    "cuda_attention_head_dims": (32, 64, 80, 96, 128),  # CudaAttentionHeadDims
    "cuda_flash_attention_head_dims": (32, 64, 80, 96, 128),  # CudaFlashAttentionHeadDims
    "max_layernorm_width": 16384,  # kMaxLayerNormWidth
    "max_grid_yz": 65535,  # kMaxGridYZ
    "max_cuda_seqlen": 1 << 30,  # kMaxCudaSeqLen
    "max_cuda_rows": 0x7FFFFFFF,  # kMaxCudaRows
}

#: kernels/constants.h as the loaded build exports it (``bertfast._C.constants()``;
#: {} without a build): what the C++ and CUDA kernels were compiled with.
CONSTANTS: dict = dict(_C.constants()) if _C is not None else {}

#: Storage dtypes the C++ and CUDA kernels take (math in fp32).
DTYPES = tuple(getattr(torch, name) for name in CONSTANTS.get("dtypes", ()))
#: Activation epilogues of the kernels, by name.
ACTIVATIONS = tuple(CONSTANTS.get("activations", ()))
#: Head dims the CUDA attention kernel is compiled for.
CUDA_ATTENTION_HEAD_DIMS = tuple(CONSTANTS.get("cuda_attention_head_dims", ()))
#: Head dims of the FlashAttention-2-style CUDA kernel (the cuda backend's "flash" variant).
CUDA_FLASH_ATTENTION_HEAD_DIMS = tuple(CONSTANTS.get("cuda_flash_attention_head_dims", ()))
#: Widest LayerNorm row the CUDA kernels hold in registers.
MAX_LAYERNORM_WIDTH = CONSTANTS.get("max_layernorm_width", 0)
#: CUDA grid y / z limit (attention: heads on y, sequences on z).
MAX_GRID_YZ = CONSTANTS.get("max_grid_yz", 0)
#: Longest sequence of the CUDA attention kernel.
MAX_CUDA_SEQLEN = CONSTANTS.get("max_cuda_seqlen", 0)
#: Most rows a CUDA LayerNorm launch covers.
MAX_CUDA_ROWS = CONSTANTS.get("max_cuda_rows", 0)


#: The ops both native backends implement, each by a module-level function of the op's
#: name (``linear`` differs: the C++ GEMM on CPU, the framework's cuBLAS on CUDA).
NATIVE_OPS = (
    "embed_layernorm",
    "add_layernorm",
    "bias_gelu",
    "bias_gelu_",
    "linear_gelu",
    "attention",
    "attention_varlen",
    "pack_tokens",
    "unpack_tokens",
)


def native_ops(namespace: dict) -> dict:
    """``{op: namespace[op]}`` for every op of NATIVE_OPS (a backend passes its
    ``globals()``)."""
    return {name: namespace[name] for name in NATIVE_OPS}


def contig(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.contiguous()


def ids64(t: Tensor | None) -> Tensor | None:
    """Integer ids as contiguous int64 (what the kernels index with)."""
    return None if t is None else t.to(torch.int64).contiguous()


def embed_operands(
    input_ids,
    position_ids,
    token_type_ids,
    word_embeddings,
    position_embeddings,
    token_type_embeddings,
    weight,
    bias,
):
    """The embed_layernorm arguments, contiguous, ids int64 (``token_type_ids`` dropped
    for families without token-type embeddings)."""
    types = contig(token_type_embeddings)
    return (
        ids64(input_ids),
        ids64(position_ids),
        ids64(token_type_ids) if types is not None else None,
        word_embeddings.contiguous(),
        position_embeddings.contiguous(),
        types,
        weight.contiguous(),
        bias.contiguous(),
    )


def add_layernorm_operands(x, residual, bias, weight, ln_bias):
    """The add_layernorm arguments, contiguous."""
    return (
        x.contiguous(),
        residual.contiguous(),
        contig(bias),
        weight.contiguous(),
        ln_bias.contiguous(),
    )


def mask_operand(attention_mask: Tensor | None) -> Tensor | None:
    """A key mask as the kernels read it: bool (or uint8) bytes, nonzero = real token."""
    if attention_mask is None:
        return None
    if attention_mask.dtype in (torch.bool, torch.uint8):
        return attention_mask.contiguous()
    return (attention_mask != 0).contiguous()
