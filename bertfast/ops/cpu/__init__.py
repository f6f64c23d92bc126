"""The ``cpu`` backend: C++ kernels in ``kernels/cpu/``, bound as ``bertfast._C.cpu``.

Three tiers per op: the raw kernel (C++, one file per kernel), its binding
(``csrc/cpu_ops.cpp``: takes tensors, checks every size the kernel relies on,
allocates the output, runs on ``torch.get_num_threads()`` threads with the GIL
released), and the launcher here, which makes operands contiguous and passes them
on; the registered op is in ``bertfast/ops/__init__.py``.

Storage dtypes fp32, fp16 and bf16, math in fp32. ``linear`` / ``linear_gelu`` run
on the weights a loaded model owns packed (``cpu.weights.PackedWeight``) on oneDNN
(fp32, and bf16 on CPUs with native bf16) or the C++ GEMM (fp32), bias + activation
fused; on any other weight, read afresh at every call (no cache; see
``cpu/weights.py``), torch's GEMM + the C++ bias/activation kernel.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import Tensor

from ..dispatch import Backend
from . import weights as _weights

try:  # int8 weights (helper module; absent in builds without it)
    from . import int8 as _quant
except ImportError:
    _quant = None
from ..native import (
    _C,
    ACTIVATIONS,
    DTYPES,
    IMPORT_ERROR,
    add_layernorm_operands,
    embed_operands,
    mask_operand,
    native_ops,
)
from ..native import (
    contig as _c,
)

_kernels = _C.cpu if _C is not None else None


# ---------------------------------------------------------------- LayerNorm
def embed_layernorm(*args):
    *operands, eps = args  # the op's arguments (see bertfast/ops/__init__.py), then eps
    return _kernels.embed_layernorm(*embed_operands(*operands), float(eps))


def add_layernorm(x, residual, bias, weight, ln_bias, eps, *, out=None):
    """The ``add_layernorm`` op; ``out`` (cpu backend only, for the model's fast path):
    a contiguous tensor of ``x``'s shape and dtype to write into, ``x`` or
    ``residual`` themselves or one overlapping neither (ValueError otherwise)."""
    return _kernels.add_layernorm(
        *add_layernorm_operands(x, residual, bias, weight, ln_bias), float(eps), out
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


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, act: str | None = None) -> Tensor:
    """``act(x @ weight.T + bias)``; ``act=None`` is a plain linear layer. The one
    place every CPU GEMM is routed (``linear`` and ``linear_gelu`` ops alike).

    A :class:`~bertfast.ops.cpu.weights.PackedWeight` (owned by a model bertfast
    loaded, packed once) runs on the GEMM it was packed for, oneDNN (fp32 / bf16) or
    the C++ one (fp32), bias and activation fused (see bertfast/ops/cpu/weights.py).
    Any other weight is read as it is at this call, never cached: torch's GEMM +
    the C++ bias/activation epilogue, or, in fp32 from
    ``cpu.weights.PACK_MIN_ROWS`` rows, packed for this call for the C++ GEMM.
    """
    # int8 weights (the ``cpu.int8`` module of this package, where present) take their own kernels.
    if _quant is not None and _quant.is_quantized(weight):
        return _quant.linear(x, weight, bias, act)
    bias = _c(bias)
    N, K = weight.shape
    M = math.prod(x.shape[:-1])
    packed = _weights.packed_for_call(weight, M)
    if packed is not None:
        out = _weights.linear_panels(x.reshape(M, K), packed, bias, N, act)
        return out.view(*x.shape[:-1], N)
    out = torch.nn.functional.linear(x.contiguous(), weight, None if act is not None else bias)
    if act is not None and out.numel():
        _kernels.bias_act(out, bias, act, True)
    return out


def linear_op(x, weight, bias):
    """The ``linear`` op (see ``linear``)."""
    return linear(x, weight, bias, None)


def linear_gelu(x, weight, bias, act):
    """The ``linear_gelu`` op: bias + activation fused in the GEMM or its epilogue."""
    return linear(x, weight, bias, act)


#: Whether a model's few-rows layers run as one native call (``encoder_layer``);
#: False runs them op by op (the same kernels, the same result: for A/B runs).
FUSED_LAYER = True


def encoder_layer(
    h, cu_seqlens, max_seqlen, num_heads, scale, weights, biases, ln, act, eps,
    attention_dtype=None,
):  # fmt: skip
    """One encoder layer of packed tokens ``h`` ``[T, H]`` in one native call (no
    Python between its ops), or None where it does not apply: ``FUSED_LAYER`` off, or
    a GEMM weight not on the C++ GEMM at ``T`` rows (``cpu.weights.layer_panels``).
    int8 weights (``quantize="int8"``) take ``cpu.int8.encoder_layer``, attention in
    ``attention_dtype`` (None: fp32; ``torch.bfloat16``: ``cpu.int8.attention_dtype``'s
    choice); fp32 weights take attention in fp32 only (None otherwise).

    ``weights``/``biases``: QKV, attention output, FFN in, FFN out (biases may be
    None); ``ln``: attention LayerNorm weight, bias, FFN LayerNorm weight, bias. The
    same kernels in the same order as the model's op-by-op layer, so the same result
    bit for bit (``tests/ops/test_cpu_encoder_layer.py``)."""
    if not FUSED_LAYER:
        return None
    bf16 = _attention_bf16(attention_dtype)
    if _quant is not None and _quant.is_quantized(weights[0]):
        return _quant.encoder_layer(
            h, cu_seqlens, max_seqlen, num_heads, scale, weights, biases, ln, act, eps, bf16
        )
    if bf16:
        return None
    panels = _weights.layer_panels(weights, h.shape[0])
    if panels is None:
        return None
    qkv, proj, ffn_in, ffn_out = panels
    return _kernels.encoder_layer(
        h, cu_seqlens, int(max_seqlen), int(num_heads), float(scale),
        qkv, _c(biases[0]), proj, _c(biases[1]), _c(ln[0]), _c(ln[1]),
        ffn_in, _c(biases[2]), weights[2].shape[0], act, ffn_out, _c(biases[3]),
        _c(ln[2]), _c(ln[3]), float(eps), True,
    )  # fmt: skip


def _attention_bf16(attention_dtype) -> bool:
    """Whether an int8 layer's attention runs on bf16 copies of Q, K, V:
    ``attention_dtype`` None (fp32) or ``torch.bfloat16``; ValueError otherwise."""
    if attention_dtype is None:
        return False
    if attention_dtype == torch.bfloat16:
        return True
    raise ValueError(
        f"attention_dtype must be None (fp32) or torch.bfloat16, not {attention_dtype!r}"
    )


#: Whether a model's few-rows forward runs its embeddings and every layer as one
#: native call (``encoder_forward``); False: one call per layer (``encoder_layer``),
#: the same kernels, the same result (for A/B runs).
FUSED_FORWARD = True


class HeldOperands:
    """``encoder_forward``'s operands (``embedding``, ``layers``) held on the C++ side
    under a handle (``_C.cpu.encoder_hold``): a call then passes the handle, not the
    80-125 tensors whose boxing at every call cost about 0.4 us each. Dropped there
    (``encoder_release``) when this object is collected."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, embedding, layers):
        word, pos, types, ln_w, ln_b, project, project_bias = embedding[:7]
        self.handle = _kernels.encoder_hold(
            word, pos, types, ln_w, ln_b, project, project_bias, layers.gemms, layers.biases,
            layers.norms, layers.splits,
        )  # fmt: skip
        # not at interpreter exit: the table goes with the process
        weakref.finalize(self, _kernels.encoder_release, self.handle).atexit = False


def encoder_forward(
    ids, pos, types, embedding, cu_seqlens, max_seqlen, num_heads, scale, layers,
    attention_dtype=None, held=None,
):  # fmt: skip
    """The embeddings and every encoder layer of packed tokens in one native call
    (``_C.cpu.encoder_forward``, or ``encoder_forward_int8`` for int8 weights): the
    kernels of ``embed_layernorm`` (+ the projection) and of :func:`encoder_layer` per
    layer, in the same order, so the same result bit for bit. ``ids``, ``pos``,
    ``types``: packed int64 ids (``types`` None where the model has no token-type
    table); ``embedding`` and ``layers``: the operands the cpu encoder runner made
    for them (``CpuEncoder._forward_operands``: a tuple, ``cpu.encoder.LayerOperands``);
    ``attention_dtype``: int8 weights' attention dtype (None: fp32, or
    ``torch.bfloat16``); fp32 weights take None only (ValueError); ``held``: the same
    operands as a :class:`HeldOperands` (the call passes its handle)."""
    cu, n, sc = cu_seqlens.contiguous(), int(max_seqlen), float(scale)
    bf16 = _attention_bf16(attention_dtype)
    if held is not None:
        return _kernels.encoder_forward_held(
            ids, pos, types, held.handle, embedding[7], cu, n, int(num_heads), sc,
            layers.intermediate, layers.act, layers.eps, bf16, True,
        )  # fmt: skip
    if layers.splits is not None:
        return _kernels.encoder_forward_int8(
            ids, pos, types, *embedding, cu, n, int(num_heads), sc, layers.gemms,
            layers.biases, layers.norms, layers.splits, layers.act, layers.eps, bf16,
        )  # fmt: skip
    if bf16:
        raise ValueError("encoder_forward: attention in bfloat16 is for int8 weights only")
    return _kernels.encoder_forward(
        ids, pos, types, *embedding, cu, n, int(num_heads), sc, layers.gemms, layers.biases,
        layers.norms, layers.intermediate, layers.act, layers.eps, True,
    )  # fmt: skip


#: The mask dtypes :func:`scan_inputs` reads (nonzero = a real token).
SCAN_MASK_DTYPES = (torch.int64, torch.int32, torch.bool)


def scan_inputs(input_ids, attention_mask, token_type_ids, position_ids):
    """A forward's CPU inputs ``[B, S]`` read in one native pass (``_C.cpu.scan_inputs``,
    kernels/cpu/pack.cpp): ``(stats, cu_seqlens, indices)``, ``stats`` int64 ``[ids min,
    ids max, token types min, max, positions min, max, real tokens, longest row]`` (the
    types and positions pairs 0 where not given; the caller reads it), ``cu_seqlens``
    int32 ``[B + 1]`` of the real tokens (nonzero mask entries; every position without
    a mask) and ``indices`` int64 their flat positions ``b * S + s``. None where the
    tensors are not what it reads (CPU, contiguous, int64 ids / types / positions, an
    int64 / int32 / bool mask) or the extension is missing: the caller then computes
    the same with torch ops."""
    if _kernels is None:
        return None
    for t in (input_ids, token_type_ids, position_ids):
        if t is not None and not (
            t.device.type == "cpu" and t.dtype == torch.int64 and t.is_contiguous()
        ):
            return None
    m = attention_mask
    if m is not None and not (
        m.device.type == "cpu" and m.dtype in SCAN_MASK_DTYPES and m.is_contiguous()
    ):
        return None
    return _kernels.scan_inputs(input_ids, m, token_type_ids, position_ids)


#: The poolings :func:`pool_packed` computes (``kernels/cpu/pool.cpp``).
POOLINGS = ("cls", "mean", "mean_sqrt_len", "lasttoken")


def pool_packed(h, cu_seqlens, mode: str, normalize: bool):
    """One fp32 vector per sequence of packed fp32 rows ``h`` ``[T, H]`` (every sequence
    at least one row): ``mode`` from :data:`POOLINGS`, then L2-normalised (``x /
    max(||x||, 1e-12)``, as ``F.normalize``) when ``normalize``; ``[B, H]``."""
    return _kernels.pool_packed(h.contiguous(), cu_seqlens.contiguous(), mode, bool(normalize))


# ---------------------------------------------------------------- attention
def attention(qkv, attention_mask, num_heads, scale):
    return _kernels.attention(
        qkv.contiguous(), mask_operand(attention_mask), int(num_heads), float(scale)
    )


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    return _kernels.attention_varlen(
        qkv.contiguous(), cu_seqlens.contiguous(), int(max_seqlen), int(num_heads), float(scale)
    )


def attention_varlen_bf16(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    """``attention_varlen`` of fp32 ``qkv`` rounded to bf16, the output widened back
    to fp32: an int8 model's attention (``cpu.int8.attention_dtype``), op by op as in
    ``encoder_layer_int8``."""
    return _kernels.attention_varlen_bf16(
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
    ops={"linear": linear_op, **native_ops(globals())},
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
