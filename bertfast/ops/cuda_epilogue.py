"""``linear_gelu`` with the bias and the activation in cuBLASLt's GEMM epilogue.

``torch._addmm_activation(bias, x, weight.t(), use_gelu=...)`` runs, on CUDA, one
cuBLASLt matmul whose epilogue adds the bias and applies GELU (``use_gelu=True``) or
ReLU (``use_gelu=False``) before the single rounding to the storage dtype. This module
offers it as the ``cuda`` backend's ``linear_gelu`` variant ``"cublaslt"`` (a
candidate the sweeps time and the winners table may choose; never the default).

**Which GELU.** bertfast's ``"gelu"`` is the exact (erf) form and ``"gelu_tanh"`` the
tanh approximation (docs/design.md, numerics); the two differ by up to 4.7e-4 (at
|x| = 2.70), small enough to pass unnoticed in a loose check and wrong for a model
trained with the other. cuBLASLt documents its epilogue only as "GELU"; PyTorch takes
it to be the tanh form (its non-Lt fallback in Blas.cpp applies
``gelu_(approximate="tanh")`` to match, pytorch/pytorch#104061), while
``_addmm_activation`` on the CPU applies the erf form (``at::gelu_`` with its default).
So the form is never assumed: :func:`epilogue_gelu_form` *measures* it once per
(device, dtype) (:func:`probe_gelu_form`) and the variant serves an activation only
when the measured form is the one asked for. ReLU needs no probe.

**When torch takes the cuBLASLt path** (``isInputCompliesAddmmCudaLt`` in
aten/src/ATen/native/cuda/Blas.cpp): a 1-D contiguous bias of length N, beta == 1, a
2-D contiguous output, fp32/fp16/bf16, every dimension of both matrices > 1 (and
< 65535 * 32 before CUDA 12.1), ``DISABLE_ADDMM_CUDA_LT`` unset. Otherwise, or when
cuBLASLt finds no algorithm for the layout, torch runs a plain GEMM and then a
separate tanh GELU kernel: not this candidate, and never erf. The supports check below
keeps to inputs that take the Lt path: M, N, K > 1, N and K whole 16-byte rows,
16-byte aligned contiguous operands, a bias. fp32 runs only with TF32 matmuls off:
cuBLASLt computes fp32 in ``CUBLAS_COMPUTE_32F_FAST_TF32`` whenever torch allows TF32
for cuBLAS (``torch.backends.cuda.matmul.allow_tf32``), which the parity rule's fp32
does not allow for.

The ``cuda`` backend (``bertfast/ops/cuda.py``) lists it as ``linear_gelu``'s variant
``cublaslt``, with :func:`supports_linear_gelu_cublaslt` as its check.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "linear_gelu_cublaslt",
    "supports_linear_gelu_cublaslt",
    "epilogue_gelu_form",
    "epilogue_probe",
    "probe_gelu_form",
    "GeluProbe",
]

#: The GELU form each activation name needs.
NEEDED_FORM = {"gelu": "erf", "gelu_tanh": "tanh"}
#: Storage dtypes the epilogue takes.
EPILOGUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Torch sends a matrix dimension this large or larger past cuBLASLt before CUDA 12.1.
_OLD_CUDA_DIM_LIMIT = 65535 * 32
_ALIGN = 16  # bytes: cuBLASLt's widest vector access, what its fast kernels assume


def _epilogue(bias: Tensor, mat1: Tensor, mat2: Tensor, *, use_gelu: bool) -> Tensor:
    """``act(bias + mat1 @ mat2)``: torch's cuBLASLt bias + activation epilogue."""
    return torch._addmm_activation(bias, mat1, mat2, use_gelu=use_gelu)


# ------------------------------------------------------------------ the probe
#: Probe grid: x = k / 16 for k in [-64, 64): every value and every bias below has at
#: most 7 significant bits, so the GEMM and the bias add are exact in fp32, TF32, fp16
#: and bf16 alike, and the activation's input is known exactly.
_GRID = 128
#: (M, N = K) of the probe calls: a small one, and one the size of a BERT GEMM (cuBLASLt
#: picks its kernel by shape; each kernel has its own epilogue code), which must agree.
PROBE_SHAPES = ((64, 128), (2048, 1024))
#: A point decides between erf and tanh when the two forms differ there by at least this
#: many units in the last place of the storage dtype.
_DECISIVE_ULPS = 8
#: Fewest decisive points a valid probe must have (per dtype it has many more).
_MIN_DECISIVE = 8


@dataclass(frozen=True)
class GeluProbe:
    """What :func:`probe_gelu_form` measured.

    ``form`` is "erf" or "tanh" when the output is within a third of the erf/tanh
    separation of that form at every decisive point and within :func:`_slack` of it
    everywhere, and not so for the other form; otherwise "other". ``err_erf`` /
    ``err_tanh``: the largest distance to each form over the decisive points, in units
    of the separation there. A correctly rounded implementation of one form scores
    <= 1/16 on it (half an ulp of >= 8) and >= 15/16 on the other; the acceptance
    threshold is 1/3, so no output can be accepted as both."""

    form: str
    dtype: str
    decisive: int
    err_erf: float
    err_tanh: float
    note: str = ""


def _ulp(v: Tensor, dtype: torch.dtype) -> Tensor:
    """Spacing of ``dtype`` values at |v| (float64 tensor in, float64 out)."""
    fi = torch.finfo(dtype)
    mag = v.abs().clamp_min(fi.tiny)
    spacing = torch.exp2(torch.floor(torch.log2(mag))) * fi.eps
    return spacing.clamp_min(fi.tiny * fi.eps)  # subnormal spacing below tiny


def _probe_operands(
    dtype: torch.dtype, device, m: int = 64, n: int = _GRID
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(bias [n], x [m, n], weight [n, n] identity, pre-activation [m, n] float64)."""
    grid = torch.arange(-_GRID // 2, _GRID // 2, dtype=torch.float64) / 16
    cols = torch.arange(n)
    bias = ((cols % 5) - 2).to(torch.float64) / 8  # -0.25 .. 0.25: exercises the bias add
    rows = torch.arange(m)
    # Row r holds the grid rolled by 3r, so every value meets every bias column.
    pre = grid[(cols[None, :] + 3 * rows[:, None]) % _GRID]
    x = pre - bias[None, :]
    weight = torch.eye(n, dtype=torch.float64)
    as_dtype = [t.to(dtype=dtype, device=device) for t in (bias, x, weight)]
    for t, exact in zip(as_dtype, (bias, x, weight)):
        if not torch.equal(t.double().cpu(), exact):
            raise AssertionError("probe operands must be exact in the probed dtype")
    return (*as_dtype, pre)


def _slack(ref: Tensor, pre: Tensor, dtype: torch.dtype) -> Tensor:
    """How far an implementation of a GELU form may be from it at any point and still
    count as that form: two roundings to ``dtype``, 2^-10 relative (an approximate
    tanh or erf), and |x| 2^-20 for the cancellation in 1 + erf / 1 + tanh of the
    far negative tail in fp32 (torch's own fp32 CPU GELU is off by 2.6e-3 relative,
    |x| 1.1e-7, at x = -3.94)."""
    return 2 * _ulp(ref, dtype) + ref.abs() * 2.0**-10 + pre.abs() * 2.0**-20


def probe_gelu_form(
    epilogue: Callable[..., Tensor], device, dtype: torch.dtype, shapes=PROBE_SHAPES
) -> GeluProbe:
    """Classify the GELU that ``epilogue(bias, mat1, mat2, use_gelu=True)`` (the
    signature of ``torch._addmm_activation``) applies, on ``device`` in ``dtype``.

    One call per (M, N = K) in ``shapes`` whose pre-activation values are known exactly
    (an identity weight, inputs and biases of at most 7 significant bits); each result
    is compared with the erf and the tanh GELU computed in float64. The decisive points
    are those where the two forms differ by >= 8 ulps of ``dtype``: on the negative side
    (x in about [-4, -2.2]) the outputs are small (|GELU| < 0.03) while the difference
    is 1e-4..4.7e-4, so the points decide in fp16 and bf16 as well as in fp32; on the
    positive side (outputs ~x) only fp32 resolves it. Every shape must give the same
    form, else "other". Reads the results back to the host: not for use while a CUDA
    graph is being captured."""
    device = torch.device(device)
    found = [_probe_once(epilogue, device, dtype, m, n) for m, n in shapes]
    forms = {p.form for p in found}
    note = "; ".join(p.note for p in found if p.note)
    if len(forms) > 1:
        detail = ", ".join(f"{p.form} at {m}x{n}x{n}" for p, (m, n) in zip(found, shapes))
        note = f"forms differ by shape: {detail}" + (f"; {note}" if note else "")
    return GeluProbe(
        forms.pop() if len(forms) == 1 else "other",
        found[0].dtype,
        sum(p.decisive for p in found),
        max(p.err_erf for p in found),
        max(p.err_tanh for p in found),
        note,
    )


def _probe_once(epilogue, device, dtype, m: int, n: int) -> GeluProbe:
    bias, x, weight, pre = _probe_operands(dtype, device, m, n)
    y = epilogue(bias, x, weight.t(), use_gelu=True)
    y = y.detach().to(device="cpu", dtype=torch.float64)
    name = str(dtype).replace("torch.", "")
    if y.shape != pre.shape:
        return GeluProbe("other", name, 0, math.inf, math.inf, f"shape {tuple(y.shape)}")
    if not torch.isfinite(y).all():
        return GeluProbe("other", name, 0, math.inf, math.inf, "non-finite output")
    refs = {"erf": F.gelu(pre), "tanh": F.gelu(pre, approximate="tanh")}
    sep = (refs["erf"] - refs["tanh"]).abs()
    scale = torch.maximum(refs["erf"].abs(), refs["tanh"].abs())
    decisive = sep >= _DECISIVE_ULPS * _ulp(scale, dtype)
    count = int(decisive.sum())
    if count < _MIN_DECISIVE:  # cannot happen for fp32/fp16/bf16; guards a new dtype
        return GeluProbe("other", name, count, math.nan, math.nan, "too few decisive points")
    errs, matches = {}, {}
    for form, ref in refs.items():
        dist = (y - ref).abs()
        errs[form] = float((dist[decisive] / sep[decisive]).max())
        close_everywhere = bool((dist <= _slack(ref, pre, dtype)).all())
        matches[form] = errs[form] < 1 / 3 and close_everywhere
    if matches["erf"] != matches["tanh"]:
        form = "erf" if matches["erf"] else "tanh"
    else:  # neither (at the decisive points both cannot be within a third)
        form = "other"
    return GeluProbe(form, name, count, errs["erf"], errs["tanh"])


_probe_lock = threading.Lock()
_probed: dict[tuple, GeluProbe] = {}


def _device_key(device) -> tuple:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return (device.type, device.index)


def epilogue_probe(device, dtype: torch.dtype) -> GeluProbe:
    """:func:`probe_gelu_form` of torch's real epilogue, once per (device, dtype)."""
    key = (*_device_key(device), dtype)
    found = _probed.get(key)
    if found is None:
        with _probe_lock:
            found = _probed.get(key)
            if found is None:
                dev = torch.device(key[0], key[1]) if key[1] is not None else key[0]
                found = probe_gelu_form(_epilogue, dev, dtype)
                _probed[key] = found
    return found


def epilogue_gelu_form(device, dtype: torch.dtype) -> str:
    """The GELU form, "erf", "tanh" or "other", that ``torch._addmm_activation``
    computes on ``device`` in ``dtype`` (measured once, then cached)."""
    return epilogue_probe(device, dtype).form


def _capturing(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # a torch without CUDA support: nothing is being captured
        return False


def _form_reason(device: torch.device, dtype: torch.dtype, activation: str) -> str | None:
    """None when the epilogue computes ``activation`` on ``device`` in ``dtype``."""
    if activation == "relu":
        return None
    need = NEEDED_FORM.get(activation)
    if need is None:
        return f"no cuBLASLt epilogue for activation {activation!r}"
    key = (*_device_key(device), dtype)
    if key not in _probed and _capturing(device):
        return "the cuBLASLt GELU form is not probed yet (a CUDA graph is being captured)"
    form = epilogue_gelu_form(device, dtype)
    if form != need:
        return (
            f"cuBLASLt's GELU epilogue computes the {form} form here ({dtype}); "
            f"{activation!r} needs {need}"
        )
    return None


# ------------------------------------------------------------------ the variant
def supports_linear_gelu_cublaslt(x: Tensor, weight: Tensor, bias, activation: str):
    """None when :func:`linear_gelu_cublaslt` runs this input through the cuBLASLt
    epilogue and computes ``activation`` exactly as the op defines it; else why not."""
    if x.device.type != "cuda":
        return "cuBLASLt epilogue is CUDA-only"
    if os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1":
        return "DISABLE_ADDMM_CUDA_LT=1: torch runs a plain GEMM, then a separate activation"
    if x.dtype not in EPILOGUE_DTYPES:
        return f"the cuBLASLt epilogue does not take {x.dtype}"
    if x.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "fp32 with TF32 matmuls allowed: cuBLASLt would multiply in TF32"
    if bias is None:
        return "no bias (torch's cuBLASLt path needs a bias vector)"
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.numel() // K if K else 0
    if min(M, N, K) < 2:
        return f"M, N, K = {M}, {N}, {K}: torch takes the cuBLASLt path only when all are > 1"
    if max(M, N, K) >= _OLD_CUDA_DIM_LIMIT and _cuda_before_12_1():
        return f"a dimension >= {_OLD_CUDA_DIM_LIMIT}: torch skips cuBLASLt before CUDA 12.1"
    per_row = _ALIGN // x.element_size()
    if N % per_row or K % per_row:
        return f"N = {N}, K = {K}: not whole {_ALIGN}-byte rows (multiples of {per_row})"
    if not (x.is_contiguous() and weight.is_contiguous() and bias.is_contiguous()):
        return "non-contiguous operands"
    if any(t.data_ptr() % _ALIGN for t in (x, weight, bias)):
        return f"an operand is not {_ALIGN}-byte aligned"
    return _form_reason(x.device, x.dtype, activation)


@functools.cache
def _cuda_before_12_1() -> bool:
    version = torch.version.cuda
    if not version:
        return False
    major, minor = (int(p) for p in version.split(".")[:2])
    return (major, minor) < (12, 1)


def linear_gelu_cublaslt(x: Tensor, weight: Tensor, bias, activation: str) -> Tensor:
    """``activation(x @ weight.T + bias)`` for ``x [..., K]``: one cuBLASLt matmul with
    the bias and the activation in its epilogue. Refuses (``RuntimeError``) a GELU whose
    measured form is not the one asked for, even when called without the supports
    check (a forced candidate); for the erf form it also refuses inputs off the cuBLASLt
    path, where torch's fallback would apply the tanh form."""
    reason = _form_reason(x.device, x.dtype, activation)
    if reason is None and activation == "gelu" and x.device.type == "cuda":
        reason = supports_linear_gelu_cublaslt(x, weight, bias, activation)
    if reason is not None:
        raise RuntimeError(f"linear_gelu[cuda:cublaslt]: {reason}")
    lead = x.shape[:-1]
    x2d = x.reshape(-1, x.shape[-1])
    out = _epilogue(bias, x2d, weight.t(), use_gelu=activation != "relu")
    return out.view(*lead, weight.shape[0])
