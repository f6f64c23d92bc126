"""Benchmark primitives shared by ``bertfast bench`` and the suite in ``benchmarks/``.

One job per module (all names are re-exported here):

==================  ==================================================================
``workload.py``     what runs: model dimensions and FLOP counts (:func:`encoder_flops`),
                    ragged / padded sequence lengths, batches (:func:`make_batch`)
``timing.py``       how it is timed: :func:`measure` and :class:`Stats`, peak memory of
                    one call, the resident set (:func:`resident_bytes`) and a
                    checkpoint's tensor bytes, the machine's GEMM ceiling, its name
``parity.py``       whether the output is right: :data:`PARITY_TOL`, :func:`parity_error`
``providers.py``    the in-process providers (bertfast per backend, transformers eager /
                    SDPA) behind one interface
``peers.py``        the other runtimes: ONNX Runtime, OpenVINO, CTranslate2 (fp32; int8
                    variants reported apart)
``isolated.py``     each provider in its own worker process (:class:`Worker`), so
                    runtimes do not fight over the cores
``report.py``       the Markdown table and JSON of a ``bertfast bench`` run
``cli.py``          :func:`main`, the ``bertfast bench`` command
``accuracy.py``     the accuracy contract of bf16 / int8 (``CONTRACT``) and the
                    ``bertfast accuracy`` command
==================  ==================================================================

Models come from :mod:`bertfast.presets` when no checkpoint folder is given (built-in
BERT-base / BERT-large / MiniLM-L6 architectures with random weights): nothing here
needs a download or the packaged MiniLM. The full suite (torch.compile, ONNX Runtime,
kernels, report) is ``pytest benchmarks`` (see ``benchmarks/README.md``).
"""

from __future__ import annotations

from .cli import main
from .isolated import LocalRunner, Worker, open_runner
from .parity import INT8_PARITY_TOL, PARITY_TOL, parity_error
from .peers import CTranslate2Provider, OnnxRuntimeProvider, OpenVinoProvider, peer_providers
from .providers import (
    BertfastProvider,
    CompileProvider,
    Provider,
    TransformersProvider,
    bertfast_backends,
    builtin_providers,
    provider_by_name,
)
from .report import format_table
from .timing import (
    Stats,
    checkpoint_bytes,
    cpu_info,
    device_name,
    gemm_ceiling,
    measure,
    peak_memory,
    resident_bytes,
    rounds_for,
    synchronize,
)
from .workload import (
    Batch,
    ModelDims,
    encoder_flops,
    make_batch,
    padding_lengths,
    parse_shape,
    ragged_lengths,
)

__all__ = [
    "ModelDims",
    "encoder_flops",
    "ragged_lengths",
    "padding_lengths",
    "parse_shape",
    "Batch",
    "make_batch",
    "Stats",
    "measure",
    "rounds_for",
    "synchronize",
    "peak_memory",
    "resident_bytes",
    "checkpoint_bytes",
    "gemm_ceiling",
    "device_name",
    "cpu_info",
    "PARITY_TOL",
    "INT8_PARITY_TOL",
    "OnnxRuntimeProvider",
    "OpenVinoProvider",
    "CTranslate2Provider",
    "peer_providers",
    "Worker",
    "LocalRunner",
    "open_runner",
    "parity_error",
    "Provider",
    "BertfastProvider",
    "CompileProvider",
    "TransformersProvider",
    "bertfast_backends",
    "builtin_providers",
    "provider_by_name",
    "format_table",
    "main",
]
