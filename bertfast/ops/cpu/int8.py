"""int8 linear layers on CPU (``quantize="int8"``): weights, routing, checks.

Weights: int8 with one symmetric scale per output channel, ``scale[n] =
max_k |w[n, k]| / 127``, ``q = round(w / scale)`` in [-127, 127], quantized once
when a model is loaded and held only as a :class:`QuantizedWeight` (the C++
kernel's packed panels, column sums and scales; read-only, like
``cpu.weights.PackedWeight``). Activations: quantized per row (token) at every
call to uint8 with a scale and zero point, int32 dot products (AMX ``tdpbusd``, AVX512-VNNI
``vpdpbusd``, or an exact AVX2 fallback), then bias and activation in fp32
(``kernels/cpu/qgemm.h`` has the formulas). ``BERTFAST_CPU_INT8_ISA=auto|amx|vnni|avx2``
picks the micro-kernel.

What a model quantizes: the encoder layers' four linear layers (QKV, attention
output, FFN in, FFN out), nearly all of its multiply-adds. The embedding tables,
the ALBERT/ELECTRA embedding projection, the pooler and the task heads stay fp32
(small, run on few rows, and closest to the output), as do LayerNorm, bias, GELU
and residuals. Attention runs on bf16 copies of Q, K, V (fp32 scores, softmax
statistics and output) where the CPU has native bf16 dot products: see
:func:`attention_dtype`.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from .. import dispatch, native
from . import weights as _cpu_weights

# The extension as native.py loaded it (None without a usable build or on a CPU it
# cannot run on).
_kernels = native._C.cpu if native._C is not None else None

#: Values of the ``quantize`` argument (None: no quantization).
QUANTIZE_CHOICES = (None, "int8")

__all__ = [
    "ATTENTION_CHOICES",
    "QUANTIZE_CHOICES",
    "attention_dtype",
    "QuantizedWeight",
    "check_quantize",
    "is_quantized",
    "linear",
    "quantize_weight",
    "unsupported_reason",
]


#: Values of ``BERTFAST_CPU_INT8_ATTENTION``: what an int8 model's attention computes in.
ATTENTION_CHOICES = ("auto", "bf16", "fp32")


def attention_dtype() -> torch.dtype | None:
    """The dtype an int8 model runs attention in: ``torch.bfloat16`` or None (fp32,
    the model's own dtype). ``BERTFAST_CPU_INT8_ATTENTION``: ``bf16``, ``fp32``, or
    ``auto`` (the default: bf16 where the CPU has native bf16 dot products,
    ``cpu.weights.NATIVE_BF16``; elsewhere the bf16 kernel is slower than fp32).

    Why: with the linear layers in int8, fp32 attention was about a tenth of an int8
    forward. In bf16 (the QKV output rounded to bf16, the cpu backend's
    ``vdpbf16ps`` / AMX attention: products exact, sums, softmax statistics and the
    output in fp32) it takes a third less (AMD EPYC Zen 4, 2 threads, BERT-base
    widths, 128 tokens: 346 -> 227 us per layer, the two conversions included), and
    the accuracy contract is unchanged (all-MiniLM-L6-v2 on the shipped corpus, int8
    vs fp32 sentence vectors: min cosine 0.9907 -> 0.9928, mean 0.99911 -> 0.99910).
    The error it adds, a relative 2^-9 per element of Q, K, V and P, is below the
    int8 activations' own."""
    raw = os.environ.get("BERTFAST_CPU_INT8_ATTENTION", "auto").strip().lower() or "auto"
    if raw not in ATTENTION_CHOICES:
        raise ValueError(
            f"BERTFAST_CPU_INT8_ATTENTION={raw!r}: choose one of {', '.join(ATTENTION_CHOICES)}"
        )
    if raw == "auto":
        raw = "bf16" if _cpu_weights.NATIVE_BF16 else "fp32"
    return torch.bfloat16 if raw == "bf16" else None


def check_quantize(quantize) -> str | None:
    """``quantize`` itself: None or "int8" (ValueError listing the choices)."""
    if quantize is None or (isinstance(quantize, str) and quantize == "int8"):
        return quantize
    raise ValueError(f"quantize must be one of None, 'int8', got {quantize!r}")


def unsupported_reason(device, dtype: torch.dtype, backend: str = "auto") -> str | None:
    """Why an int8 model cannot run on ``device`` / ``dtype`` / ``backend``, or None.

    The int8 kernels are C++ CPU kernels (kernels/cpu/qgemm.cpp) behind the ``cpu``
    backend, with fp32 activations around them."""
    device = torch.device(device)
    if device.type != "cpu":
        return (
            f"quantize='int8' runs on CPU only (the int8 kernels are C++ CPU kernels); "
            f"the model is on {device}"
        )
    if dtype != torch.float32:
        return (
            f"quantize='int8' needs dtype=torch.float32 (fp32 activations around int8 "
            f"weights), got {dtype}"
        )
    if _kernels is None or not hasattr(_kernels, "qlinear"):
        return "quantize='int8' needs bertfast's compiled CPU kernels (bertfast._C), not built"
    resolved = dispatch.resolve(backend, "cpu")
    if resolved.requested not in ("auto", "cpu"):
        return (
            f"quantize='int8' runs on the 'cpu' backend (C++ int8 kernels); backend "
            f"{resolved.requested!r} has no int8 kernels"
        )
    if resolved.name != "cpu":
        reason = resolved.reasons.get("cpu", f"'auto' resolves to {resolved.name!r}")
        return f"quantize='int8' needs the 'cpu' backend, which is unavailable: {reason}"
    return None


def check_supported(device, dtype: torch.dtype, backend: str = "auto") -> None:
    reason = unsupported_reason(device, dtype, backend)
    if reason is not None:
        raise ValueError(reason)


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)``: int8 ``[N, K]`` and fp32 ``[N]`` with ``weight ~ q * scale[:, None]``.

    Symmetric per output channel (row); an all-zero row gets scale 1; a row holding
    NaN or inf gets scale NaN (q 0), so its outputs are NaN as in fp32."""
    w = weight.detach().to(torch.float32)
    if w.dim() != 2:
        raise ValueError(
            f"quantize_weight takes a 2-D [out, in] weight, got shape {tuple(w.shape)}"
        )
    finite = torch.isfinite(w).all(dim=1)
    amax = w.abs().nan_to_num(0.0, 0.0, 0.0).amax(dim=1) if w.shape[1] else w.new_zeros(len(w))
    scale = amax / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127)
    q = torch.where(finite[:, None], q, torch.zeros_like(q)).to(torch.int8)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    return q, scale


_READ_ONLY = (
    "bertfast: this weight is quantized to int8 and owned by the model (read-only); "
    "load the model again without quantize= to edit weights"
)


class QuantizedWeight(Tensor):
    """A read-only ``[N, K]`` linear weight held as int8 (packed for the C++ kernel)
    with fp32 per-output-channel scales.

    ``cpu.int8.linear`` (what the ``cpu`` backend's linear ops route it to) runs the int8
    kernel; any other torch op sees the dequantized fp32 values ``q * scale``
    (:meth:`dense`). Writes into it or into a view of it raise ``RuntimeError``."""

    _packed: Tensor
    _colsum: Tensor
    _scale: Tensor

    @staticmethod
    def __new__(cls, packed: Tensor, colsum: Tensor, scale: Tensor, shape, split: bool = False):
        out = Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=torch.float32, device=packed.device, requires_grad=False
        )
        out._packed = packed
        out._colsum = colsum
        out._scale = scale
        out._split = bool(split)
        return out

    def __init__(self, packed, colsum, scale, shape, split=False):  # state is set in __new__
        super().__init__()

    @classmethod
    def of(cls, weight: Tensor, split: bool = False) -> QuantizedWeight:
        """Quantize an fp32 ``[N, K]`` weight (``weight`` itself is not modified).

        ``split=True``: :func:`linear` quantizes the activations in two parts (the
        uint8 rows, then what they miss), two int8 GEMMs summed in fp32: ~16-bit
        activations for the layers most sensitive to them (the model's QKV)."""
        if _kernels is None:
            raise RuntimeError("bertfast: int8 weights need bertfast's compiled CPU kernels")
        if isinstance(weight, QuantizedWeight):
            return weight
        if isinstance(weight, _cpu_weights.PackedWeight):
            weight = weight.dense()
        q, scale = quantize_weight(weight)
        packed, colsum = _kernels.qgemm_pack(q.contiguous())
        return cls(packed, colsum, scale.contiguous(), weight.shape, split)

    def int8(self) -> Tensor:
        """The int8 values ``q`` as a new ``[N, K]`` tensor."""
        N, K = self.shape
        P, K4, NR, four = self._packed.shape
        full = self._packed.permute(0, 2, 1, 3).reshape(P * NR, K4 * four)
        return full[:N, :K].clone()

    def scale(self) -> Tensor:
        """The per-output-channel scales, a new fp32 ``[N]`` tensor."""
        return self._scale.clone()

    def dense(self) -> Tensor:
        """The dequantized weight ``q * scale[:, None]``, a new plain fp32 tensor."""
        return self.int8().to(torch.float32) * self._scale[:, None]

    @property
    def packed_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._packed, self._colsum, self._scale))

    def __repr__(self, *, tensor_contents=None):
        return f"QuantizedWeight(shape={tuple(self.shape)}, int8, per-channel scales)"

    def __deepcopy__(self, memo):
        return QuantizedWeight(
            self._packed.clone(), self._colsum.clone(), self._scale.clone(), self.shape, self._split
        )

    def __reduce_ex__(self, proto):  # pickles / saves as the dequantized weight
        return self.dense().__reduce_ex__(proto)

    def _same(self) -> QuantizedWeight:
        """Another handle on the same int8 weight (``detach``, ``.data``)."""
        return QuantizedWeight(self._packed, self._colsum, self._scale, self.shape, self._split)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _cpu_weights.read_only_dispatch(
            QuantizedWeight, _QuantizedView, _READ_ONLY, func, args, kwargs
        )


class _QuantizedView(_cpu_weights._ReadOnlyView):
    """A view of a :class:`QuantizedWeight`: readable, refuses writes."""

    __torch_dispatch__ = QuantizedWeight.__dict__["__torch_dispatch__"]


def is_quantized(t) -> bool:
    return isinstance(t, QuantizedWeight)


def linear(x: Tensor, weight: QuantizedWeight, bias: Tensor | None = None, act=None) -> Tensor:
    """``act(x @ W.T + bias)`` with W int8 and x quantized per row (fp32 in and out)."""
    return linear_parts(x, weight._packed, weight._colsum, weight._scale, bias, act, weight._split)


def linear_parts(x, packed, colsum, scale, bias=None, act=None, split=False) -> Tensor:
    """:func:`linear` on a QuantizedWeight's tensors (what torch.compile graphs hold)."""
    if x.dtype != torch.float32:
        raise TypeError(f"bertfast int8 linear: x must be float32, got {x.dtype}")
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    # split: x = deq(q) + r, r (what uint8 misses, |r| <= scale / 2) quantized per row
    # in turn; act(W deq(q) + W deq(q_r) + b) in fp32, in one C++ call. A NaN/inf row
    # stays NaN (scale NaN).
    return _kernels.qlinear(x.contiguous(), packed, colsum, scale, b, act, None, bool(split))


def gemm_operands(weights, biases):
    """A layer's four int8 GEMMs as the native layer calls take them: ``(tensors,
    biases, split)``, ``tensors`` each weight's packed panels, column sums and scales
    (12, contiguous), ``biases`` fp32 (None kept), ``split`` the 4-bit mask of their
    split flags; None where a weight is not a :class:`QuantizedWeight`."""
    if not all(is_quantized(w) for w in weights):
        return None
    c = native.contig
    tensors = [c(t) for w in weights for t in (w._packed, w._colsum, w._scale)]
    fp32 = [None if b is None else c(b.detach().to(torch.float32)) for b in biases]
    return tensors, fp32, sum(1 << g for g, w in enumerate(weights) if w._split)


def encoder_layer(
    h, cu_seqlens, max_seqlen, num_heads, scale, weights, biases, ln, act, eps,
    attention_bf16=False,
):  # fmt: skip
    """``cpu.encoder_layer`` for int8 weights: one encoder layer of packed tokens ``h``
    in one native call (``_C.cpu.encoder_layer_int8``: each linear layer is
    :func:`linear`'s kernel, attention in fp32, or on bf16 copies of Q, K, V when
    ``attention_bf16``), or None where a GEMM weight is not a
    :class:`QuantizedWeight`. The same kernels in the same order as the op-by-op
    layer, so the same result bit for bit (``tests/ops/test_cpu_encoder_layer.py``)."""
    operands = gemm_operands(weights, biases)
    if operands is None:
        return None
    t, b, split = operands
    c = native.contig
    return _kernels.encoder_layer_int8(
        h, cu_seqlens.contiguous(), int(max_seqlen), int(num_heads), float(scale),
        *t[0:3], b[0], *t[3:6], b[1], c(ln[0]), c(ln[1]), *t[6:9], b[2], act,
        *t[9:12], b[3], c(ln[2]), c(ln[3]), float(eps), split,
        bool(attention_bf16),
    )  # fmt: skip


def check_apply(fn) -> None:
    """``nn.Module._apply`` on an int8 model: a move or a cast (``.to(...)``,
    ``.half()``, ``.cuda()``) raises ValueError; ``.cpu()`` / ``.float()`` /
    ``.to("cpu")`` leave it as it is."""
    probe = fn(torch.zeros(1, dtype=torch.float32))
    if probe.device.type != "cpu" or probe.dtype != torch.float32:
        raise ValueError(
            f"an int8 model (quantize='int8') runs on CPU in float32 only; it cannot be "
            f"moved or cast to {probe.device} / {probe.dtype}: load it again without "
            f"quantize= (or with the device and dtype you want)"
        )
