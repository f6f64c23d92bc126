"""The fused ops: contracts, torch custom-op registration, and the public entry points.

Each op is a ``torch.library.custom_op`` in the ``bertfast::`` namespace with a
fake (meta) implementation, so it composes with ``torch.compile``, CUDA graphs and
export. Its real implementation validates the arguments (``checks.py``) and then
dispatches to a backend (``dispatch.py``); the ``torch`` backend in
``reference.py`` is the specification every other backend is tested against.

Contracts (``H`` hidden, ``E`` embedding width, ``T`` tokens):

``embed_layernorm(input_ids, position_ids, token_type_ids?, word_embeddings[V,E],
position_embeddings[P,E], token_type_embeddings?[Tt,E], weight[E], bias[E], eps)``
    LayerNorm of the summed embedding rows; ids of any (shared) shape -> shape + [E].
``add_layernorm(x[...,H], residual[...,H], bias?[H], weight[H], ln_bias[H], eps)``
    LayerNorm((x + bias) + residual).
``bias_gelu(x[...,N], bias?[N], activation)`` / ``bias_gelu_`` (in place)
    activation(x + bias); activation is "gelu" (erf), "gelu_tanh" or "relu".
``linear(x[...,K], weight[N,K], bias?[N])``
    x @ weight.T + bias, for projections with nothing to fuse; backends whose own
    GEMM beats the framework's (the C++ one on CPU) take it, others call F.linear.
``linear_gelu(x[...,K], weight[N,K], bias?[N], activation)``
    activation(x @ weight.T + bias): the FFN up-projection with its epilogue.
``attention(qkv[B,S,3H], attention_mask?[B,S], num_heads, scale)``
    softmax(scale * Q K^T, key-padding mask) V per head, heads merged -> [B,S,H];
    padded query rows are zero.
``attention_varlen(qkv[T,3H], cu_seqlens[B+1] int32, max_seqlen, num_heads, scale)``
    the same over packed sequences -> [T,H].
``pack_tokens(x[N,...], indices[T])`` / ``unpack_tokens(x[T,...], indices[T], num_rows)``
    gather real tokens / scatter them back with zeros at padded rows (integer
    tensors, e.g. token ids, always take the reference gather/scatter).

Every entry point takes ``backend="auto"``; see ``dispatch.py`` for how it chooses.

Validation: every call checks its arguments (``checks.py``). The ops whose checks
read tensor values back to the host (id ranges of ``embed_layernorm``,
``pack_tokens``, ``unpack_tokens``; ``cu_seqlens`` of ``attention_varlen``) also
take ``validate=True``; ``validate=False`` skips those value checks (shapes,
dtypes and devices are still checked) for a caller that has checked the values
itself. The model does so: it validates its inputs once per forward with a single
device-to-host read, and its internal op calls pass ``validate=False``, so the
forward pass does not sync per layer.

On the ``cpu`` backend in plain eager mode the model goes one step further and
runs its encoder on the backend's encoder runner (``encoder_runner`` below:
``cpu/encoder.py``), which calls the backend's implementations directly, skipping
these entry points altogether; every other caller gets the checks above.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import checks, cpu, dispatch, reference
from .cpu import encoder as _cpu_encoder
from .cpu import int8 as _int8
from .cpu import weights as _cpu_weights
from .dispatch import BACKEND_NAMES, BackendError, backend_status
from .padding import PackInfo, pack_info, pack_info_from_counts

__all__ = [
    "embed_layernorm",
    "add_layernorm",
    "bias_gelu",
    "bias_gelu_",
    "linear",
    "linear_gelu",
    "attention",
    "attention_varlen",
    "pack_tokens",
    "unpack_tokens",
    "PackInfo",
    "pack_info",
    "pack_info_from_counts",
    "BackendError",
    "BACKEND_NAMES",
    "backend_status",
]


def _run(op: str, backend: str, like: Tensor, *args):
    return dispatch.call(op, backend, like.device.type, like.dtype, *args)


def _check(check, validate: bool, *args) -> None:
    """Run ``check(*args)``; with ``validate=False`` its value checks are skipped."""
    if validate:
        check(*args)
    else:
        with checks.values_checked():
            check(*args)


def _int(n):
    """``int(n)``, leaving a symbolic size (torch.compile) symbolic."""
    return n if isinstance(n, torch.SymInt) else int(n)


def _eager(x: Tensor) -> bool:
    """True when a call may skip the custom-op dispatcher and run the implementation
    directly: plain tensors, no tracing, no torch_dispatch mode active. This saves
    ~20 us per op in eager mode (it matters at batch 1); under torch.compile, export,
    FakeTensor or any dispatch mode the registered custom op runs as usual."""
    return type(x) is Tensor and not torch.compiler.is_compiling() and _dispatch_stack_len() == 0


class _op:
    """Registers ``fn`` as the custom op ``bertfast::<name>`` and calls it.

    In plain eager mode (see ``_eager``) the call runs ``fn`` directly; otherwise it
    goes through the registered op, so tracing, export and fake tensors see it."""

    def __init__(self, name: str, mutates_args=()):
        self.name = name
        self.mutates_args = mutates_args

    def __call__(self, fn):
        self.impl = fn
        self.op = torch.library.custom_op(f"bertfast::{self.name}", mutates_args=self.mutates_args)(
            fn
        )
        return self

    def register_fake(self, fake):
        self.op.register_fake(fake)
        return fake

    def run(self, *args):
        if _eager(args[0]) or not isinstance(args[0], Tensor):
            return self.impl(*args)  # a non-tensor input: its check raises a clear TypeError
        return self.op(*args)


try:  # private but long-standing; without it, always go through the dispatcher
    _dispatch_stack_len = torch._C._len_torch_dispatch_stack
except AttributeError:  # pragma: no cover

    def _dispatch_stack_len():
        return 1


# ---------------------------------------------------------------- embed_layernorm
@_op("embed_layernorm", ())
def _embed_layernorm(
    input_ids: Tensor,
    position_ids: Tensor,
    token_type_ids: Optional[Tensor],
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Optional[Tensor],
    weight: Tensor,
    bias: Tensor,
    eps: float,
    backend: str,
    validate: bool = True,
) -> Tensor:
    args = (
        input_ids,
        position_ids,
        token_type_ids,
        word_embeddings,
        position_embeddings,
        token_type_embeddings,
        weight,
        bias,
        eps,
    )
    _check(checks.embed_layernorm, validate, *args)
    return _run("embed_layernorm", backend, word_embeddings, *args)


@_embed_layernorm.register_fake
def _(input_ids, position_ids, token_type_ids, word_embeddings, *rest):
    return word_embeddings.new_empty(tuple(input_ids.shape) + (word_embeddings.shape[1],))


def embed_layernorm(
    input_ids,
    position_ids,
    token_type_ids,
    word_embeddings,
    position_embeddings,
    token_type_embeddings,
    weight,
    bias,
    eps: float = 1e-12,
    backend: str = "auto",
    *,
    validate: bool = True,
) -> Tensor:
    return _embed_layernorm.run(
        input_ids,
        position_ids,
        token_type_ids,
        word_embeddings,
        position_embeddings,
        token_type_embeddings,
        weight,
        bias,
        float(eps),
        backend,
        bool(validate),
    )


# ---------------------------------------------------------------- add_layernorm
@_op("add_layernorm", ())
def _add_layernorm(
    x: Tensor,
    residual: Tensor,
    bias: Optional[Tensor],
    weight: Tensor,
    ln_bias: Tensor,
    eps: float,
    backend: str,
) -> Tensor:
    checks.add_layernorm(x, residual, bias, weight, ln_bias, eps)
    return _run("add_layernorm", backend, x, x, residual, bias, weight, ln_bias, eps)


@_add_layernorm.register_fake
def _(x, *rest):
    return torch.empty_like(x)


def add_layernorm(
    x, residual, bias, weight, ln_bias, eps: float = 1e-12, backend: str = "auto"
) -> Tensor:
    return _add_layernorm.run(x, residual, bias, weight, ln_bias, float(eps), backend)


# ---------------------------------------------------------------- bias_gelu
@_op("bias_gelu", ())
def _bias_gelu(x: Tensor, bias: Optional[Tensor], activation: str, backend: str) -> Tensor:
    checks.bias_gelu(x, bias, activation)
    return _run("bias_gelu", backend, x, x, bias, activation)


@_bias_gelu.register_fake
def _(x, *rest):
    return torch.empty_like(x)


@_op("bias_gelu_", ("x",))
def _bias_gelu_(x: Tensor, bias: Optional[Tensor], activation: str, backend: str) -> None:
    checks.bias_gelu(x, bias, activation)
    _run("bias_gelu_", backend, x, x, bias, activation)


@_bias_gelu_.register_fake
def _(x, *rest):
    return None


def bias_gelu(x, bias=None, activation: str = "gelu", backend: str = "auto") -> Tensor:
    return _bias_gelu.run(x, bias, activation, backend)


def bias_gelu_(x, bias=None, activation: str = "gelu", backend: str = "auto") -> Tensor:
    """In place; returns ``x``."""
    _bias_gelu_.run(x, bias, activation, backend)
    return x


# ---------------------------------------------------------------- linear
@_op("linear", ())
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], backend: str) -> Tensor:
    checks.linear(x, weight, bias)
    return _run("linear", backend, x, x, weight, bias)


@_linear.register_fake
def _(x, weight, *rest):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


def linear(x, weight, bias=None, backend: str = "auto") -> Tensor:
    if torch.compiler.is_compiling() and _cpu_weights.is_packed(weight):
        return _linear_packed.op(x, weight._packed, bias, weight._out_features, None)
    if torch.compiler.is_compiling() and _int8.is_quantized(weight):
        return _linear_int8.op(
            x, weight._packed, weight._colsum, weight._scale, bias, None, weight._split
        )
    return _linear.run(x, weight, bias, backend)


# ---------------------------------------------------------------- linear_gelu
@_op("linear_gelu", ())
def _linear_gelu(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str, backend: str
) -> Tensor:
    checks.linear_gelu(x, weight, bias, activation)
    return _run("linear_gelu", backend, x, x, weight, bias, activation)


@_linear_gelu.register_fake
def _(x, weight, *rest):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


def linear_gelu(x, weight, bias=None, activation: str = "gelu", backend: str = "auto") -> Tensor:
    if torch.compiler.is_compiling() and _cpu_weights.is_packed(weight):
        return _linear_packed.op(x, weight._packed, bias, weight._out_features, activation)
    if torch.compiler.is_compiling() and _int8.is_quantized(weight):
        return _linear_int8.op(
            x, weight._packed, weight._colsum, weight._scale, bias, activation, weight._split
        )
    return _linear_gelu.run(x, weight, bias, activation, backend)


# ---------------------------------------------------------------- linear_packed
# Under torch.compile a model-owned PackedWeight (cpu/weights.py) cannot enter the
# graph as a tensor subclass; its plain panel tensor goes to this op instead. In
# eager mode ``linear``/``linear_gelu`` take the PackedWeight directly.
@_op("linear_packed", ())
def _linear_packed(
    x: Tensor, packed: Tensor, bias: Optional[Tensor], out_features: int, activation: Optional[str]
) -> Tensor:
    return _cpu_weights.linear_panels(x, packed, bias, out_features, activation)


@_linear_packed.register_fake
def _(x, packed, bias, out_features, activation):
    return x.new_empty(tuple(x.shape[:-1]) + (out_features,))


# The same for an int8 QuantizedWeight (cpu/int8.py): its plain tensors enter the graph.
@_op("linear_int8", ())
def _linear_int8(
    x: Tensor,
    packed: Tensor,
    colsum: Tensor,
    scale: Tensor,
    bias: Optional[Tensor],
    activation: Optional[str],
    split: bool,
) -> Tensor:
    return _int8.linear_parts(x, packed, colsum, scale, bias, activation, split)


@_linear_int8.register_fake
def _(x, packed, colsum, scale, bias, activation, split):
    return x.new_empty(tuple(x.shape[:-1]) + (scale.shape[0],))


# ---------------------------------------------------------------- attention
@_op("attention", ())
def _attention(
    qkv: Tensor, attention_mask: Optional[Tensor], num_heads: int, scale: float, backend: str
) -> Tensor:
    checks.attention(qkv, attention_mask, num_heads, scale)
    return _run("attention", backend, qkv, qkv, attention_mask, num_heads, scale)


@_attention.register_fake
def _(qkv, *rest):
    return qkv.new_empty(tuple(qkv.shape[:-1]) + (qkv.shape[-1] // 3,))


def attention(
    qkv,
    attention_mask=None,
    num_heads: int = 1,
    scale: Optional[float] = None,
    backend: str = "auto",
) -> Tensor:
    num_heads, scale = checks.attention_args("attention", qkv, num_heads, scale)
    return _attention.run(qkv, attention_mask, num_heads, scale, backend)


@_op("attention_varlen", ())
def _attention_varlen(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    num_heads: int,
    scale: float,
    backend: str,
    validate: bool = True,
) -> Tensor:
    _check(checks.attention_varlen, validate, qkv, cu_seqlens, max_seqlen, num_heads, scale)
    return _run("attention_varlen", backend, qkv, qkv, cu_seqlens, max_seqlen, num_heads, scale)


@_attention_varlen.register_fake
def _(qkv, *rest):
    return qkv.new_empty((qkv.shape[0], qkv.shape[1] // 3))


def attention_varlen(
    qkv,
    cu_seqlens,
    max_seqlen: int,
    num_heads: int,
    scale: Optional[float] = None,
    backend: str = "auto",
    *,
    validate: bool = True,
) -> Tensor:
    """``max_seqlen`` may exceed the longest sequence (it is an upper bound, e.g. the
    padded length); it must not be smaller."""
    num_heads, scale = checks.attention_args("attention_varlen", qkv, num_heads, scale)
    return _attention_varlen.run(
        qkv, cu_seqlens, _int(max_seqlen), num_heads, scale, backend, bool(validate)
    )


# ---------------------------------------------------------------- pack / unpack
@_op("pack_tokens", ())
def _pack_tokens(x: Tensor, indices: Tensor, backend: str, validate: bool = True) -> Tensor:
    _check(checks.pack_tokens, validate, x, indices)
    if not x.is_floating_point():  # integer rows (token ids): a plain gather, every backend
        return reference.pack_tokens(x, indices)
    return _run("pack_tokens", backend, x, x, indices)


@_pack_tokens.register_fake
def _(x, indices, backend, validate=True):
    return x.new_empty((indices.shape[0],) + tuple(x.shape[1:]))


def pack_tokens(x, indices, backend: str = "auto", *, validate: bool = True) -> Tensor:
    return _pack_tokens.run(x, indices, backend, bool(validate))


@_op("unpack_tokens", ())
def _unpack_tokens(
    x: Tensor, indices: Tensor, num_rows: int, backend: str, validate: bool = True
) -> Tensor:
    _check(checks.unpack_tokens, validate, x, indices, num_rows)
    if not x.is_floating_point():
        return reference.unpack_tokens(x, indices, num_rows)
    return _run("unpack_tokens", backend, x, x, indices, num_rows)


@_unpack_tokens.register_fake
def _(x, indices, num_rows, backend, validate=True):
    return x.new_empty((num_rows,) + tuple(x.shape[1:]))


def unpack_tokens(
    x, indices, num_rows: int, backend: str = "auto", *, validate: bool = True
) -> Tensor:
    return _unpack_tokens.run(x, indices, _int(num_rows), backend, bool(validate))


# ---------------------------------------------------------------- input scan
def scan_inputs(input_ids, attention_mask, token_type_ids, position_ids):
    """A forward's input values and real-token layout read in one pass, where a backend
    reads these tensors on the host (the cpu backend: CPU tensors, ``cpu.scan_inputs``):
    ``(stats, cu_seqlens, indices)``, ``stats`` an int64 tensor ``[ids min, ids max, token
    types min, max, positions min, max, real tokens, longest row]`` for the caller's one
    host read. None otherwise: the caller computes the same with torch ops
    (``padding.mask_lengths``, ``pack_info_from_counts``)."""
    return cpu.scan_inputs(input_ids, attention_mask, token_type_ids, position_ids)


# ---------------------------------------------------------------- encoder runners
def encoder_runner(backend: str, config, embeddings, layers, parameters):
    """A runner for a model's whole encoder on ``backend``'s own functions, or None:
    run the ops through their entry points. Only the cpu backend has one
    (``cpu.encoder.CpuEncoder``: ``embed(ids, pos, types)`` and ``layers(h, info,
    states, attention_dtype)`` on packed tokens); it is offered where ``backend``
    resolves to ``cpu`` for every encoder op, on one device and dtype. The caller
    takes it in plain eager mode only and has validated the inputs (no checks run)."""
    return _cpu_encoder.runner(backend, config, embeddings, layers, parameters)


# ---------------------------------------------------------------- model weights
# What a model needs to hold its weights in a backend's own form: the cpu backend
# keeps owned fp32 (and bf16 on oneDNN) linear weights packed (``cpu.weights``) and
# int8 models' encoder weights quantized (``cpu.int8``). The model asks here, so that it
# never reaches a backend module itself.
def is_packed_weight(t) -> bool:
    """``t`` is a weight the cpu backend holds packed (``cpu.weights.PackedWeight``:
    read-only; ``t.dense()`` is a plain copy)."""
    return _cpu_weights.is_packed(t)


def is_int8_weight(t) -> bool:
    """``t`` is an int8 weight (``cpu.int8.QuantizedWeight``)."""
    return _int8.is_quantized(t)


def weight_packer(backend: str, device, dtype: torch.dtype):
    """The function that packs one linear weight a model owns for the GEMM it runs
    on (returns the packed weight, or None: keep it plain), or None where a model on
    ``device``/``dtype`` with ``backend`` keeps its weights plain."""
    return _cpu_weights.pack_owned if _cpu_weights.can_pack(backend, device, dtype) else None


def check_quantize(quantize) -> str | None:
    """``quantize`` itself: None or "int8" (ValueError listing the choices)."""
    return _int8.check_quantize(quantize)


def check_int8_supported(device, dtype: torch.dtype, backend: str = "auto") -> None:
    """ValueError, with the reason, where an int8 model cannot run on ``device`` /
    ``dtype`` / ``backend`` (never a silent fp32 model)."""
    _int8.check_supported(device, dtype, backend)


def int8_attention_dtype() -> torch.dtype | None:
    """The dtype an int8 model runs attention in (``cpu.int8.attention_dtype``)."""
    return _int8.attention_dtype()


def quantize_int8(weight: Tensor, split: bool = False) -> Tensor:
    """An int8 copy of a linear weight, per output channel (``split``: two-part
    activations, for QKV)."""
    return _int8.QuantizedWeight.of(weight.detach(), split=split)


def check_int8_apply(fn) -> None:
    """``nn.Module._apply`` on an int8 model: ValueError for a move or a cast."""
    _int8.check_apply(fn)


def weight_nbytes(tensors) -> int:
    """Bytes held by ``tensors`` (storage shared between them counted once; packed
    weights by their packed form, int8 ones by their panels, column sums and scales)."""
    seen, total = set(), 0
    for t in tensors:
        if _int8.is_quantized(t):
            key, size = id(t._packed), t.packed_nbytes
        elif _cpu_weights.is_packed(t):
            key, size = id(t._packed), _cpu_weights.tensor_bytes(t)
        else:
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        if key not in seen:
            seen.add(key)
            total += size
    return total
