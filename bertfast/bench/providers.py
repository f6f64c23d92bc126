"""The :class:`Provider` interface and the in-process providers: bertfast per backend
(and its int8 / bf16 rows), transformers eager / SDPA, ``torch.compile``. The other
runtimes (ONNX Runtime, OpenVINO, CTranslate2) subclass :class:`Provider` in
:mod:`bertfast.bench.peers`; :mod:`bertfast.bench.registry` lists them all by name.
This module imports neither of those."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .workload import Batch
from .workload import make_batch as _make_batch

__all__ = [
    "Provider",
    "BertfastProvider",
    "BertfastInt8Provider",
    "BertfastBf16Provider",
    "TransformersProvider",
    "CompileProvider",
    "bertfast_backends",
]


class Provider:
    """One way of running the encoder. ``load`` returns a callable taking a
    :class:`Batch` and returning the last hidden state ``[B, S, H]``."""

    name = "provider"
    is_bertfast = False
    #: Baselines are measured first on every workload so bertfast rows can carry ratios.
    is_baseline = True
    #: Low-precision rows (int8 peers and bertfast int8 / bf16): no ratios against the
    #: fp32 rows, reported apart from them; int8 ones are checked against INT8_PARITY_TOL.
    int8 = False
    #: What the row computes in, when not the run's dtype ("int8", "bfloat16").
    precision: str | None = None

    def parity_tol(self, dtype: torch.dtype) -> float:
        """Largest max-abs error on real tokens that still counts as correct: the
        tolerance of the precision the row computes in (``precision`` bf16: the bf16
        one; other low-precision rows: the int8 one), else of the run's dtype."""
        from .parity import INT8_PARITY_TOL, PARITY_TOL

        if self.precision == "bfloat16":
            return PARITY_TOL.get(torch.bfloat16, 5e-2)
        return INT8_PARITY_TOL if self.int8 else PARITY_TOL.get(dtype, 5e-2)

    def unavailable(self, device: str, dtype: torch.dtype) -> str | None:
        return None

    def load(self, model_path: str, device: str, dtype: torch.dtype) -> Callable:
        raise NotImplementedError


class BertfastProvider(Provider):
    is_bertfast = True
    is_baseline = False
    #: Extra ``from_pretrained`` arguments (``quantize`` for the int8 row).
    load_kwargs: dict = {}

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"bertfast-{backend}"

    def unavailable(self, device, dtype):
        from ..info import backends

        dev = torch.device(device).type
        status = backends().get(dev, {})
        reason = status.get(self.backend, f"unknown backend {self.backend}")
        if reason is None and dev == "cpu" and self.backend == "triton":
            return "triton on CPU runs only under the interpreter (not benchmarked)"
        return reason

    def load(self, model_path, device, dtype):
        from ..model import from_pretrained

        model = from_pretrained(
            model_path, device=device, dtype=dtype, backend=self.backend, **self.load_kwargs
        )
        model.eval()

        @torch.inference_mode()
        def run(batch: Batch):
            return model(
                batch.input_ids,
                attention_mask=batch.attention_mask,
                token_type_ids=batch.token_type_ids,
            ).last_hidden_state

        return run


class BertfastInt8Provider(BertfastProvider):
    """``bertfast-cpu-int8``: ``from_pretrained(..., backend="cpu", quantize="int8")``
    (int8 encoder weights, activations quantized per token; bertfast/ops/cpu/int8.py).
    An int8 row: checked against INT8_PARITY_TOL, reported with the int8 peers
    (``onnxruntime-int8``, ``ctranslate2-int8``), never in fp32 ratios."""

    NAME = "bertfast-cpu-int8"
    load_kwargs = {"quantize": "int8"}
    is_bertfast = False  # not one of the fp32 bertfast rows (--backend leaves it alone)
    int8 = True
    precision = "int8"

    def __init__(self):
        self.backend = "cpu"
        self.name = self.NAME

    def unavailable(self, device, dtype):
        from ..ops.cpu import int8 as quant

        return super().unavailable(device, dtype) or quant.unsupported_reason(
            device, dtype, self.backend
        )


class BertfastBf16Provider(BertfastProvider):
    """``bertfast-cpu-bf16``: ``from_pretrained(..., backend="cpu",
    dtype=torch.bfloat16)`` in a float32 run, so its time sits beside bertfast fp32 and
    the int8 rows of the same run (bf16 GEMMs on oneDNN, attention on AMX /
    ``vdpbf16ps`` where the CPU has them). A low-precision row: no fp32 ratios, parity
    within the bf16 tolerance."""

    NAME = "bertfast-cpu-bf16"
    is_bertfast = False
    int8 = True  # reported apart from the fp32 rows
    precision = "bfloat16"

    def __init__(self):
        self.backend = "cpu"
        self.name = self.NAME

    def unavailable(self, device, dtype):
        return super().unavailable(device, torch.bfloat16)

    def load(self, model_path, device, dtype):
        run = super().load(model_path, device, torch.bfloat16)
        return lambda batch: run(batch).float()


class TransformersProvider(Provider):
    """transformers ``AutoModel`` with the given attention implementation."""

    def __init__(self, attn: str, name: str | None = None):
        self.attn = attn
        self.name = name or f"transformers-{attn}"

    def unavailable(self, device, dtype):
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            return f"transformers not installed ({exc})"
        return None

    def load_module(self, model_path, device, dtype):
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_path, attn_implementation=self.attn, dtype=dtype)
        return model.to(device).eval()

    def load(self, model_path, device, dtype):
        model = self.load_module(model_path, device, dtype)

        @torch.inference_mode()
        def run(batch: Batch):
            return model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                token_type_ids=batch.token_type_ids,
            ).last_hidden_state

        return run


class CompileProvider(TransformersProvider):
    """``torch.compile`` of the transformers SDPA model (``mode``: torch.compile's, e.g.
    ``"max-autotune"``; the provider is then ``torch-compile-<mode>``)."""

    def __init__(self, mode: str | None = None):
        super().__init__("sdpa", name="torch-compile" if mode is None else f"torch-compile-{mode}")
        self.mode = mode

    def unavailable(self, device, dtype):
        reason = super().unavailable(device, dtype)
        if reason:
            return reason
        if not hasattr(torch, "compile"):
            return "torch.compile not available in this torch"
        return None

    def load(self, model_path, device, dtype):
        model = self.load_module(model_path, device, dtype)
        compiled = (
            torch.compile(model) if self.mode is None else torch.compile(model, mode=self.mode)
        )

        @torch.inference_mode()
        def run(batch: Batch):
            return compiled(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                token_type_ids=batch.token_type_ids,
            ).last_hidden_state

        # Compile now (static, then dynamic shapes after the second shape), so a
        # compiler failure is a load failure and compile time stays out of timings.
        t0 = time.perf_counter()
        for shape in ((2, 16), (3, 24)):
            run(_make_batch([shape[1]] * shape[0], 1000, device=device))
        run.info = {"compile_s": round(time.perf_counter() - t0, 1)}
        if self.mode is not None:
            run.info["mode"] = self.mode
        return run


def bertfast_backends(device: str) -> list[str]:
    """Backends bertfast can run on ``device`` (never the Triton interpreter on CPU)."""
    try:
        from ..info import backends

        status = backends().get(torch.device(device).type, {})
    except Exception:
        return []
    dev = torch.device(device).type
    return [b for b, why in status.items() if why is None and not (dev == "cpu" and b == "triton")]
