"""Weights of the CPU GEMM (kernels/cpu/gemm.cpp): who packs them, and when.

The C++ GEMM reads its weight packed in panels (``[N / NR][K][NR]``). There is no
cache of packed copies (a cache keyed on a tensor's identity and version counter
misses writes through ``.data``, through views under ``no_grad`` and through NumPy
arrays sharing the memory, and inference tensors have no version counter). Two
kinds of weight reach ``cpu.linear``:

- :class:`PackedWeight`: a weight *owned* by a model bertfast loaded itself
  (``from_pretrained``), packed once at load. It is the only copy of that weight:
  a read-only ``[N, K]`` tensor whose values torch ops read by unpacking (slow;
  only the GEMM reads the packed panels directly); writes through any route raise
  (NumPy cannot see it at all). ``BertfastModel.unpack_weights()`` turns them back
  into plain tensors for editing, ``refresh()`` packs again.
- any other tensor (``optimize()`` shares the user's parameters, direct op calls):
  read as it is at every call, never copied across calls. Rows
  >= ``PACK_MIN_ROWS`` (``BERTFAST_CPU_PACK_MIN_ROWS``; default: never) pack it
  into a temporary and run the C++ GEMM; otherwise torch's ``F.linear`` (MKL /
  oneDNN) runs it, with the bias + activation epilogue of the C++ kernels. On the
  Intel Xeon this was measured on (``benchmarks/pack_crossover.py``) packing per
  call lost to ``F.linear`` at every row count up to 2048, so it is off by default;
  machines where the C++ GEMM is well ahead of the vendor BLAS (AMD Zen) may set it.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

try:
    from .. import _C as _native

    _kernels = _native.cpu
except (ImportError, AttributeError):  # pragma: no cover - only without a build
    _kernels = None


def _env_rows() -> Optional[int]:
    raw = os.environ.get("BERTFAST_CPU_PACK_MIN_ROWS", "").strip().lower()
    if raw in ("", "never", "off", "none"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"BERTFAST_CPU_PACK_MIN_ROWS={raw!r} is not a row count (an integer, "
                         f"or 'never')") from None
    if value < 0:
        raise ValueError(f"BERTFAST_CPU_PACK_MIN_ROWS={value} must be >= 0")
    return value


#: Rows from which a plain (unowned) fp32 weight is packed per call for the C++
#: GEMM instead of going to ``F.linear``; None: never (see the module notes).
PACK_MIN_ROWS: Optional[int] = _env_rows()


def panel_width() -> int:
    return _kernels.linear_panel_width(True)


def pack(weight: Tensor) -> Tensor:
    """The packed panels of an fp32 ``[N, K]`` weight: a new flat tensor."""
    return _kernels.linear_pack(weight.detach().contiguous(), True)


def unpack(packed: Tensor, N: int, K: int, nr: int) -> Tensor:
    """The ``[N, K]`` weight held in packed panels (a new tensor)."""
    panels = packed.view(-1, K, nr)  # [P, K, NR]
    return panels.transpose(1, 2).reshape(-1, K)[:N].clone()


def packed_for_call(weight: Tensor, rows: int) -> Optional[Tensor]:
    """The packed panels the C++ GEMM should use for ``weight`` at ``rows`` rows,
    or None for ``F.linear``. Never cached: a plain weight is read at every call."""
    if isinstance(weight, PackedWeight):
        return weight._packed
    if PACK_MIN_ROWS is not None and rows >= PACK_MIN_ROWS:
        return pack(weight)
    return None


def linear_panels(x: Tensor, packed: Tensor, bias: Optional[Tensor], out_features: int,
                  activation: Optional[str]) -> Tensor:
    """``activation(x @ W.T + bias)`` for W held as ``packed`` panels (the C++ GEMM)."""
    b = None if bias is None else bias.contiguous()
    return _kernels.linear_packed(x.contiguous(), packed, b, out_features, activation, True)


_READ_ONLY = ("bertfast: this weight is packed for the CPU GEMM and owned by the model "
              "(one copy, read-only); call model.unpack_weights(), edit the weights, then "
              "model.refresh() (see README, 'Weights')")


class PackedWeight(Tensor):
    """A read-only fp32 ``[N, K]`` weight stored only as the C++ GEMM's packed panels.

    ``cpu.linear`` multiplies with the panels directly; any other torch op sees the
    ``[N, K]`` values (unpacked for that op). Ops that write into it, or into a view
    of it, raise ``RuntimeError`` naming the way to edit weights.
    """

    _packed: Tensor
    _nr: int

    @staticmethod
    def __new__(cls, packed: Tensor, shape, nr: int):
        out = Tensor._make_wrapper_subclass(cls, tuple(shape), dtype=torch.float32,
                                            device=packed.device, requires_grad=False)
        out._packed = packed
        out._nr = int(nr)
        out._out_features = int(shape[0])
        return out

    def __init__(self, packed, shape, nr):  # state is set in __new__
        super().__init__()

    @classmethod
    def of(cls, weight: Tensor) -> "PackedWeight":
        return cls(pack(weight), weight.shape, panel_width())

    def dense(self) -> Tensor:
        """The weight as a plain (new, writable) ``[N, K]`` tensor."""
        N, K = self.shape
        return unpack(self._packed, N, K, self._nr)

    @property
    def packed_nbytes(self) -> int:
        return self._packed.numel() * self._packed.element_size()

    def __repr__(self, *, tensor_contents=None):
        return f"PackedWeight(shape={tuple(self.shape)}, panel_width={self._nr})"

    def __deepcopy__(self, memo):
        return PackedWeight(self._packed.clone(), self.shape, self._nr)

    def __reduce_ex__(self, proto):  # pickles / saves as the plain weight
        return self.dense().__reduce_ex__(proto)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            raise RuntimeError(_READ_ONLY)
        if func in _SAME_WEIGHT and isinstance(args[0], PackedWeight):
            # w.detach(), w.data, nn.Parameter(w): the same packed weight
            w = args[0]
            return PackedWeight(w._packed, w.shape, w._nr)

        def unwrap(t):
            return t.dense() if isinstance(t, PackedWeight) else (
                t._dense if isinstance(t, _ReadOnlyView) else t)

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if any(r.alias_info is not None for r in schema.returns):
            # a view (w[0], w.t(), w.data, w.detach()...) reads the values but must
            # not take writes that would land in a temporary
            return tree_map(lambda t: _ReadOnlyView(t) if isinstance(t, Tensor) else t, out)
        return out


_SAME_WEIGHT = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


class _ReadOnlyView(Tensor):
    """A view of a :class:`PackedWeight`: readable, refuses writes."""

    @staticmethod
    def __new__(cls, dense: Tensor):
        out = Tensor._make_wrapper_subclass(cls, dense.shape, strides=dense.stride(),
                                            dtype=dense.dtype, device=dense.device,
                                            requires_grad=False)
        out._dense = dense
        return out

    def __init__(self, dense):
        super().__init__()

    def __repr__(self, *, tensor_contents=None):
        return f"ReadOnlyWeightView({self._dense!r})"

    __torch_dispatch__ = PackedWeight.__dict__["__torch_dispatch__"]


def is_packed(t) -> bool:
    return isinstance(t, PackedWeight)


def tensor_bytes(t: Tensor) -> int:
    """Bytes a tensor holds (its packed panels for a :class:`PackedWeight`)."""
    if isinstance(t, PackedWeight):
        return t.packed_nbytes
    return t.untyped_storage().nbytes()


def can_pack(backend: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on ``device``/``dtype`` with ``backend`` runs its fp32 linear
    layers on the C++ GEMM (then ``from_pretrained`` packs them at load)."""
    if _kernels is None or torch.device(device).type != "cpu" or dtype != torch.float32:
        return False
    from . import cpu
    from .dispatch import PREFERENCE, _requested

    if not cpu._OWN_GEMM:
        return False
    name = _requested(backend)
    if name == "auto":
        name = next((n for n in PREFERENCE["cpu"]
                     if n != "cpu" or cpu.IMPORT_ERROR is None), "torch")
    return name == "cpu"
