"""What the native backends (``cpu.py``, ``cuda.py``) share: the built extension,
its constants, and the operand preparation both launchers do the same way.

``bertfast._C`` is a pybind11 module of tensor-free functions (``build_info``,
``constants``, ``cpu.linear_panel_width``, ``cpu.int8_isa``, ``cuda.device_count``,
``cuda.error_name``). Loading it registers the tensor entry points as torch operators
through the LibTorch stable ABI (``torch.ops.bertfast_cpu.*``,
``torch.ops.bertfast_cuda.*``; csrc/binding.h), which is why one build loads with
every torch from :data:`TORCH_MIN` on. The module's init puts each operator on
``_C.cpu`` / ``_C.cuda`` (``bertfast/_operators.py``), so a backend calls
``_C.cpu.<op>(...)``. The
entry points check their tensors themselves (device, dtype, contiguity, every size
their kernel relies on) and allocate the output, so a launcher only makes its
operands contiguous, converts ids to int64 and passes them on. An error comes out
of torch tagged with its kind ("ValueError: bertfast._C.cpu.<op>: ...");
``_C.cpu.<op>`` raises it as that exception (:func:`python_error`).

The constants (dtype and activation names, CUDA head dims, size limits) are defined
once, in ``kernels/constants.h``, and read here through ``bertfast._C.constants()``
(:data:`CONSTANTS`: what the loaded build was compiled with). :data:`HEADER_CONSTANTS`
restates the header for code that must not need a build (the Triton backend reads
its limits and codes there); ``tests/ops/test_native_constants.py`` parses the header
and checks both against it.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import re

import torch
from torch import Tensor

from .._operators import python_error  # noqa: F401  (part of this module's interface)

#: The oldest torch ``bertfast._C`` loads with: its stable-ABI target
#: (BERTFAST_TORCH_MIN_* in CMakeLists.txt; tests/test_build.py checks they agree).
TORCH_MIN = (2, 11)


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a torch version string such as '2.13.0+cpu'."""
    parts = re.findall(r"\d+", version.split("+")[0])[:2]
    return tuple(int(p) for p in parts)


def import_problem(exc: BaseException, origin: str | None, running: str) -> str:
    """Why ``bertfast._C`` did not load, in one line: not built, a torch older than
    the build's stable-ABI target (the loader then misses symbols), or the loader's
    own message."""
    if origin is None:
        return f"bertfast._C is not built ({exc})"
    if _release(running) < TORCH_MIN:
        need = ".".join(map(str, TORCH_MIN))
        return (
            f"bertfast._C needs torch >= {need}, but torch {running} is running: "
            f"install a newer torch (pip install 'torch>={need}')"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"bertfast._C cannot be loaded ({first})"


def parse_cpu_flags(cpuinfo: str | None) -> frozenset[str] | None:
    """The ``flags`` of /proc/cpuinfo's text (its first CPU), None when unknown."""
    if not cpuinfo:
        return None
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    return frozenset(m.group(1).split()) if m else None


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's /proc/cpuinfo flags (read once), None where they cannot be read: what
    every question about the CPU's instruction sets asks (here, the cpu backend's GEMM
    and oneDNN choices, ``bertfast info``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpu_flags(f.read())
    except OSError:
        return None


def missing_cpu_features(machine: str, flags: frozenset[str] | None) -> str | None:
    """Why this x86-64 CPU cannot run ``bertfast._C`` (compiled for AVX2 + FMA + F16C,
    x86-64-v3: loading it on an older CPU would stop the process with an illegal
    instruction), or None. ``flags``: :func:`cpu_flags` (None: unknown, assumed able)."""
    if machine.lower() not in ("x86_64", "amd64") or flags is None:
        return None
    missing = [f for f in ("avx2", "fma", "f16c") if f not in flags]
    if not missing:
        return None
    return (
        f"this CPU has no {'/'.join(m.upper() for m in missing)}, which bertfast._C's "
        f"kernels are compiled for (x86-64-v3); the torch backend runs without them"
    )


_ORIGIN = getattr(importlib.util.find_spec(f"{__package__.rsplit('.', 1)[0]}._C"), "origin", None)
IMPORT_ERROR: str | None = missing_cpu_features(platform.machine(), cpu_flags())
_C = None
if IMPORT_ERROR is None:
    try:  # the backends stay importable (and say why) without a native build
        from .. import _C
    except ImportError as exc:
        IMPORT_ERROR = import_problem(exc, _ORIGIN, torch.__version__)

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
