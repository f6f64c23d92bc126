"""The ``cpu`` backend: C++ kernels in ``kernels/cpu/``, bound as ``bertfast._C.cpu``.

Three tiers per op: the raw kernel (C++, one file per kernel), its binding
(``csrc/cpu_ops.cpp``: takes tensors, checks every size the kernel relies on,
allocates the output, runs on ``torch.get_num_threads()`` threads with the GIL
released), and the launcher here, which makes operands contiguous and passes them
on; the registered op is in ``bertfast/ops/__init__.py``.

Storage dtypes fp32, fp16 and bf16, math in fp32. ``linear_gelu`` in fp32 runs
the C++ GEMM with bias + activation fused in its epilogue; in fp16 / bf16 it is
``torch.matmul`` + the in-place bias/GELU kernel.
"""

from __future__ import annotations

import os
import threading
import weakref

import torch
from torch import Tensor

from .dispatch import Backend
from .native import (
    _C,
    ACTIVATIONS,
    DTYPES,
    IMPORT_ERROR,
    add_layernorm_operands,
    embed_operands,
    mask_operand,
)
from .native import (
    contig as _c,
)

_kernels = _C.cpu if _C is not None else None


# ---------------------------------------------------------------- LayerNorm
def embed_layernorm(
    input_ids,
    position_ids,
    token_type_ids,
    word_embeddings,
    position_embeddings,
    token_type_embeddings,
    weight,
    bias,
    eps,
):
    return _kernels.embed_layernorm(
        *embed_operands(
            input_ids,
            position_ids,
            token_type_ids,
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            weight,
            bias,
        ),
        float(eps),
    )


def add_layernorm(x, residual, bias, weight, ln_bias, eps):
    return _kernels.add_layernorm(
        *add_layernorm_operands(x, residual, bias, weight, ln_bias), float(eps)
    )


# ---------------------------------------------------------------- bias + activation
def bias_gelu(x, bias, act):
    return _kernels.bias_act(x.contiguous(), _c(bias), act, False)


def bias_gelu_(x, bias, act):
    bias = _c(bias)
    if x.is_contiguous():
        _kernels.bias_act(x, bias, act, True)
    else:  # compute on a contiguous copy, then write back through x's strides
        x.copy_(_kernels.bias_act(x.contiguous(), bias, act, True))


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, act: str | None = None
) -> Tensor:
    """fp32 ``act(x @ weight.T + bias)`` on the C++ GEMM (kernels/cpu/gemm.cpp), with
    bias and activation in its epilogue; ``act=None`` is a plain linear layer.

    On AVX-512 machines it runs at about ONNX Runtime's MLAS speed, roughly twice
    torch's MKL sgemm on AMD Zen (see the cpu backend notes), so a model may route
    its other fp32 linear layers here too.
    """
    return _kernels.linear_packed(
        x.contiguous(), _packed_weight(weight), _c(bias), weight.shape[0], act, True
    )


# Packed GEMM weights, per weight tensor (keyed by id, dropped by a weakref callback
# when the weight is freed) and repacked when the tensor is modified in place (its
# version counter moves) or its storage changes. Packing costs one pass over the
# weight; at batch 1 x 128 it was ~30% of the FFN GEMM when done per call.
_pack_cache: dict = {}
_pack_lock = threading.Lock()


def _packed_weight(weight: Tensor) -> Tensor:
    key = (weight._version, weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()))
    hit = _pack_cache.get(id(weight))
    if hit is not None and hit[0]() is weight and hit[1] == key:
        return hit[2]
    packed = _kernels.linear_pack(weight.contiguous(), True)
    if not torch.compiler.is_compiling():
        ident = id(weight)
        try:
            ref = weakref.ref(weight, lambda _r, i=ident: _pack_cache.pop(i, None))
        except TypeError:
            return packed
        with _pack_lock:
            _pack_cache[ident] = (ref, key, packed)
    return packed


#: ``BERTFAST_CPU_GEMM=torch`` sends fp32 GEMMs to torch instead of the C++ GEMM,
#: trading speed for memory: the C++ GEMM keeps a packed copy of each weight it has
#: multiplied with (``_pack_cache``), i.e. one more copy of the linear weights.
_OWN_GEMM = os.environ.get("BERTFAST_CPU_GEMM", "own").strip().lower() != "torch"


def linear_op(x, weight, bias):
    """The ``linear`` op: fp32 on the C++ GEMM, other dtypes on torch's."""
    if x.dtype == torch.float32 and _OWN_GEMM:
        return linear(x, weight, bias, None)
    return torch.nn.functional.linear(x, weight, bias)


def linear_gelu(x, weight, bias, act):
    if x.dtype == torch.float32 and _OWN_GEMM:  # own GEMM, bias + act in its epilogue
        return linear(x, weight, bias, act)
    # fp16 / bf16: torch's GEMM, then the bias + activation epilogue in place.
    y = torch.matmul(x, weight.t())
    bias_gelu_(y, bias, act)
    return y


# ---------------------------------------------------------------- attention
def attention(qkv, attention_mask, num_heads, scale):
    return _kernels.attention(
        qkv.contiguous(), mask_operand(attention_mask), int(num_heads), float(scale)
    )


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return _kernels.attention_varlen(
        qkv.contiguous(), cu_seqlens.contiguous(), int(max_seqlen), int(num_heads), float(scale)
    )


# ---------------------------------------------------------------- pack / unpack
def pack_tokens(x, indices):
    return _kernels.pack_rows(x.contiguous(), indices.contiguous())


def unpack_tokens(x, indices, num_rows):
    return _kernels.unpack_rows(x.contiguous(), indices.contiguous(), int(num_rows))


# ---------------------------------------------------------------- support checks
def _unavailable(device_type: str) -> str | None:
    return IMPORT_ERROR


def _dtype_ok(op: str, t: Tensor) -> str | None:
    if t.dtype not in DTYPES:
        return f"{op}: {t.dtype} storage is not supported (fp32, fp16, bf16)"
    return None


def _supports_embed(input_ids, position_ids, token_type_ids, word, pos, types, weight, bias, eps):
    return _dtype_ok("embed_layernorm", word)


def _supports_add_ln(x, residual, bias, weight, ln_bias, eps):
    return _dtype_ok("add_layernorm", x)


def _supports_bias_gelu(x, bias, act):
    if act not in ACTIVATIONS:
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
    dtypes=DTYPES,
    unavailable=_unavailable,
)
