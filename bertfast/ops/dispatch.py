"""Backend registry and per-call dispatch.

Every fused op (see ``bertfast/ops/__init__.py`` for the contracts) has up to four
implementations, one per backend:

=========  ===========================  ======================================
backend    device                       module
=========  ===========================  ======================================
``torch``  any                          ``bertfast.ops.reference`` (the spec)
``cpu``    CPU                          ``bertfast.ops.cpu`` (C++ in kernels/cpu)
``cuda``   NVIDIA GPU                   ``bertfast.ops.cuda`` (CUDA in kernels/cuda)
``triton`` NVIDIA GPU; CPU when          ``bertfast.ops.triton``
           ``TRITON_INTERPRET=1``
=========  ===========================  ======================================

A backend module defines ``BACKEND = Backend(...)``. Dispatch imports the modules
lazily; an import that fails makes that backend unavailable with the import error
as its reason.

Per call, ``backend="auto"`` (or the ``BERTFAST_BACKEND`` environment variable,
which overrides "auto") picks the first backend in the device's preference order
that supports the input. Naming a backend forces it; if it cannot run the input,
the error says why. When no backend fits, :class:`BackendError` lists every
backend's reason.

**Candidates.** A backend may hold more than one implementation of an op: named
*variants* (``Backend.variants``, e.g. the ``cuda`` backend's two attention kernels,
the ``torch`` backend's SDPA attention) and, for Triton kernels, *configs* a caller
may force instead of autotuning (``Backend.configs``). A :class:`Candidate` names one
(backend, variant, config); :func:`candidates` lists those that can run an input (what
a sweep or ``bertfast tune`` times) and :func:`implementation` returns the function
of one. On CUDA, ``backend="auto"`` first asks the per-GPU winners table
(``bertfast.ops.winners``) which candidate won for the op and shape bucket, and takes
it when it can run the input; otherwise it walks the preference order.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch

__all__ = [
    "Backend",
    "BackendError",
    "Candidate",
    "candidates",
    "implementation",
    "BACKEND_NAMES",
    "get_backend",
    "select",
    "call",
    "backend_status",
    "resolve",
    "Resolved",
]

#: Every backend bertfast knows, in no particular order.
BACKEND_NAMES = ("torch", "cpu", "cuda", "triton")

_MODULES = {
    "torch": "bertfast.ops.reference",
    "cpu": "bertfast.ops.cpu",
    "cuda": "bertfast.ops.cuda",
    "triton": "bertfast.ops.triton",
}
#: The per-GPU winners table, loaded by name like the backends: it imports this module
#: (``Candidate``, ``get_backend``), so this module never imports it.
_WINNERS_MODULE = "bertfast.ops.winners"

#: Preference order of ``backend="auto"`` per device type. Triton on CPU runs
#: only through the interpreter (tests), so it is never picked automatically there.
PREFERENCE = {
    "cpu": ("cpu", "torch"),
    "cuda": ("cuda", "triton", "torch"),
}


class BackendError(RuntimeError):
    """No backend can run this input (or the one that was asked for cannot)."""


Reason = Optional[str]  # noqa: UP045 (a runtime alias: str | None needs 3.10 eval)

#: The variant name of a backend's own ``ops[op]`` implementation.
DEFAULT = "default"


@dataclass(frozen=True)
class Candidate:
    """One way to run ``op``: a backend, a variant of its kernel and (Triton) a forced
    launch config, as sorted ``(name, value)`` pairs (empty: the backend's own choice,
    e.g. autotuning)."""

    op: str
    backend: str
    variant: str = DEFAULT
    config: tuple = ()

    @property
    def label(self) -> str:
        """``backend:variant`` plus ``[k=v,...]`` for a forced config (for tables)."""
        out = self.backend if self.variant == DEFAULT else f"{self.backend}:{self.variant}"
        if self.config:
            out += "[" + ",".join(f"{k}={v}" for k, v in self.config) + "]"
        return out

    @staticmethod
    def make(op: str, backend: str, variant: str = DEFAULT, config=None) -> Candidate:
        return Candidate(op, backend, variant, tuple(sorted(dict(config or {}).items())))


@dataclass
class Backend:
    """One implementation of (some of) the ops.

    ``ops`` maps an op name to a function with the op's signature (without the
    ``backend`` argument). ``supports`` optionally maps an op name to a function
    taking the same arguments and returning ``None`` when it can run them, or a
    short reason when it cannot. ``unavailable`` returns a reason when the backend
    cannot run at all on ``device_type`` (library missing, no GPU...).
    """

    name: str
    device_types: tuple
    ops: dict[str, Callable] = field(default_factory=dict)
    supports: dict[str, Callable[..., Reason]] = field(default_factory=dict)
    dtypes: tuple = (torch.float32, torch.float16, torch.bfloat16)
    unavailable: Callable[[str], Reason] = lambda device_type: None
    #: op -> {variant name -> function}: implementations other than ``ops[op]`` (which
    #: is the variant ``"default"``), each with the op's signature.
    variants: dict[str, dict[str, Callable]] = field(default_factory=dict)
    #: ``(op, variant)`` -> supports-style check of a variant; without one, a variant
    #: is held to the op's ``supports`` check.
    variant_supports: dict[tuple, Callable[..., Reason]] = field(default_factory=dict)
    #: op, or ``(op, variant)`` for one variant only -> ``configs(*args) -> list[dict]``:
    #: the launch configs a caller may force for this input (Triton: the autotuner's
    #: list, pruned as it would prune it; SDPA: torch's kernels). A function listed
    #: here takes ``config=`` (a dict, or None for the backend's choice) as a keyword.
    configs: dict = field(default_factory=dict)

    def configs_for(self, op: str, variant: str = DEFAULT) -> Callable[..., list] | None:
        """The ``configs(*args)`` function of one variant of ``op``, or None when it
        takes no forced config."""
        return self.configs.get((op, variant), self.configs.get(op))

    def variant_names(self, op: str) -> tuple:
        if op not in self.ops:
            return ()
        return (DEFAULT, *self.variants.get(op, {}))

    def why_not_variant(
        self, op: str, variant: str, device_type: str, dtype: torch.dtype, args
    ) -> Reason:
        """Like :meth:`why_not`, for one variant of ``op``."""
        if variant == DEFAULT:
            return self.why_not(op, device_type, dtype, args)
        if variant not in self.variants.get(op, {}):
            return f"has no {op} variant {variant!r}"
        check = self.variant_supports.get((op, variant), self.supports.get(op))
        return self._why_not_at_all(op, device_type, dtype) or (check(*args) if check else None)

    def why_not(self, op: str, device_type: str, dtype: torch.dtype, args) -> Reason:
        """None when ``ops[op]`` can run ``args``, else a short reason."""
        reason = self._why_not_at_all(op, device_type, dtype)
        if reason:
            return reason
        check = self.supports.get(op)
        return check(*args) if check is not None else None

    def _why_not_at_all(self, op: str, device_type: str, dtype: torch.dtype) -> Reason:
        if device_type not in self.device_types:
            return f"runs on {'/'.join(self.device_types)} tensors, got {device_type}"
        reason = self.unavailable(device_type)
        if reason:
            return reason
        if op not in self.ops:
            return f"has no {op} kernel"
        if dtype not in self.dtypes:
            return f"does not support {dtype}"
        return None

    def function(self, op: str, variant: str = DEFAULT, config=None) -> Callable:
        """The function of one variant, with ``config`` (a dict) bound when given."""
        fn = self.ops[op] if variant == DEFAULT else self.variants[op][variant]
        if config:
            if self.configs_for(op, variant) is None:
                raise ValueError(f"backend {self.name!r} takes no launch config for {op}")
            return functools.partial(fn, config=dict(config))
        return fn


class _Unimportable:
    """Stands in for a backend whose module failed to import."""

    def __init__(self, name: str, error: BaseException):
        self.name = name
        self.error = f"could not be imported ({type(error).__name__}: {error})"

    def why_not(self, op, device_type, dtype, args) -> Reason:
        return self.error


_lock = threading.Lock()
_backends: dict[str, object] = {}


def get_backend(name: str):
    """The backend object registered under ``name`` (imported on first use)."""
    if name not in _MODULES:
        raise ValueError(
            f"unknown backend {name!r}; choose one of {', '.join(('auto',) + BACKEND_NAMES)}"
        )
    backend = _backends.get(name)
    if backend is None:
        with _lock:
            backend = _backends.get(name)
            if backend is None:
                try:
                    backend = importlib.import_module(_MODULES[name]).BACKEND
                except Exception as exc:  # ImportError, missing _C, broken triton...
                    backend = _Unimportable(name, exc)
                _backends[name] = backend
    return backend


def _requested(backend: str) -> str:
    if backend == "auto":
        env = os.environ.get("BERTFAST_BACKEND", "").strip()
        if env and env != "auto":
            if env not in _MODULES:
                raise ValueError(
                    f"BERTFAST_BACKEND={env!r} is not a backend; choose one of "
                    f"{', '.join(('auto',) + BACKEND_NAMES)}"
                )
            return env
    elif backend not in _MODULES:
        raise ValueError(
            f"unknown backend {backend!r}; choose one of {', '.join(('auto',) + BACKEND_NAMES)}"
        )
    return backend


class Resolved(NamedTuple):
    """What :func:`resolve` answers."""

    #: "auto" or the backend asked for (``BERTFAST_BACKEND`` overrides "auto").
    requested: str
    #: The backend that runs here: the one asked for, or for "auto" the first of the
    #: device's preference order that can run there at all; None when it cannot / none can.
    name: str | None
    #: Backend -> why it cannot run here, for each one passed over (or the one asked for).
    reasons: dict[str, str]


def resolve(backend: str, device_type: str) -> Resolved:
    """Which backend runs a model on ``device_type`` for ``backend`` ("auto" or a
    name; ``BERTFAST_BACKEND`` overrides "auto"), and why not the ones passed over.

    The one answer to "will this model run on the cpu backend here?" (what
    ``cpu.weights.can_pack``, ``cpu.int8.unsupported_reason`` and the model's fast-path
    plan ask), made by name, so a module of one backend never imports another. Only
    whether a backend runs on the device at all (:func:`backend_status`'s reasons) is
    asked: each call's input is still checked per op by :func:`select`. Imports only
    the backends it asks about; ValueError for a name bertfast does not know."""
    requested = _requested(backend)
    reasons = {}
    for name in PREFERENCE.get(device_type, ("torch",)) if requested == "auto" else (requested,):
        reason = why_not_here(name, device_type)
        if reason is None:
            return Resolved(requested, name, reasons)
        reasons[name] = reason
    return Resolved(requested, None, reasons)


def select(op: str, backend: str, device_type: str, dtype: torch.dtype, args) -> Callable:
    """The implementation of ``op`` that will run ``args``, or a BackendError.

    For ``"auto"`` on CUDA the winners table of the GPU (``bertfast.ops.winners``)
    is asked first; its candidate is taken when it can run ``args``. On the CPU the
    table is never consulted (nor its module imported)."""
    name = _requested(backend)
    if name != "auto":
        impl = get_backend(name)
        reason = impl.why_not(op, device_type, dtype, args)
        if reason is None:
            return impl.ops[op]
        raise BackendError(f"bertfast.{op}: backend {name!r} cannot run this input: {reason}")
    if device_type == "cuda":
        impl = _winner(op, dtype, args)
        if impl is not None:
            return impl
    reasons = []
    for candidate in PREFERENCE.get(device_type, ("torch",)):
        impl = get_backend(candidate)
        reason = impl.why_not(op, device_type, dtype, args)
        if reason is None:
            return impl.ops[op]
        reasons.append(f"  {candidate}: {reason}")
    raise BackendError(
        f"bertfast.{op}: no backend can run this input ({device_type}, {dtype}):\n"
        + "\n".join(reasons)
    )


_winners = None  # bertfast.ops.winners, imported at the first CUDA "auto" selection


def _winner(op: str, dtype: torch.dtype, args) -> Callable | None:
    """The function of the candidate the winners table names for this input, when it
    can run it (``why_not_variant``); None otherwise (and for ops it does not tune)."""
    global _winners
    winners = _winners
    if winners is None:
        winners = _winners = importlib.import_module(_WINNERS_MODULE)
    candidate = winners.lookup(op, args[0].get_device(), dtype, args)  # the CUDA index
    if candidate is None:
        return None
    impl = get_backend(candidate.backend)
    if isinstance(impl, _Unimportable):
        return None
    if impl.why_not_variant(op, candidate.variant, "cuda", dtype, args) is not None:
        return None
    return impl.function(op, candidate.variant, dict(candidate.config) or None)


def implementation(candidate: Candidate) -> Callable:
    """The function that runs ``candidate`` (no check that it can run an input: use
    :func:`candidates` or ``why_not_variant`` for that)."""
    impl = get_backend(candidate.backend)
    if isinstance(impl, _Unimportable):
        raise BackendError(f"backend {candidate.backend!r} {impl.error}")
    return impl.function(candidate.op, candidate.variant, dict(candidate.config))


def candidates(
    op: str, device_type: str, dtype: torch.dtype, args, with_configs: bool = False
) -> list[Candidate]:
    """Every (backend, variant) that can run ``args`` on ``device_type``, in preference
    order then the other backends; with ``with_configs``, one candidate per launch
    config a backend lets a caller force (plus its own choice, config empty). Triton
    on CPU (the interpreter) is listed only when ``device_type`` is "cpu" and the
    interpreter is on, as for a named backend."""
    order = list(PREFERENCE.get(device_type, ("torch",)))
    order += [n for n in BACKEND_NAMES if n not in order]
    out = []
    for name in order:
        impl = get_backend(name)
        if isinstance(impl, _Unimportable):
            continue
        for variant in impl.variant_names(op):
            if impl.why_not_variant(op, variant, device_type, dtype, args) is not None:
                continue
            out.append(Candidate(op, name, variant))
            listing = impl.configs_for(op, variant) if with_configs else None
            if listing is not None:
                out.extend(Candidate.make(op, name, variant, c) for c in listing(*args))
    return out


def call(op: str, backend: str, device_type: str, dtype: torch.dtype, *args):
    return select(op, backend, device_type, dtype, args)(*args)


def backend_status(device_type: str) -> dict[str, Reason]:
    """For each backend: None if it can run on ``device_type``, else why not."""
    return {name: why_not_here(name, device_type) for name in BACKEND_NAMES}


def why_not_here(name: str, device_type: str) -> Reason:
    """None if backend ``name`` can run on ``device_type`` at all, else why not (the one
    answer of :func:`resolve`, :func:`backend_status` and the load-time check)."""
    impl = get_backend(name)
    if isinstance(impl, _Unimportable):
        return impl.error
    if device_type not in impl.device_types:
        return f"runs on {'/'.join(impl.device_types)} tensors only"
    return impl.unavailable(device_type)
