"""Benchmark primitives shared by ``bertfast bench`` and the suite in ``benchmarks/``.

One job per module (all names are re-exported here):

==================  ==================================================================
``workload.py``     what runs: model dimensions and FLOP counts (:func:`encoder_flops`),
                    ragged / padded sequence lengths, batches (:func:`make_batch`); the
                    suite's models (:func:`~workload.model_path`), workloads and
                    profiles (:func:`~workload.select`)
``timing.py``       how it is timed: :func:`measure` and :class:`Stats`, peak memory of
                    one call, the resident set (:func:`resident_bytes`) and a
                    checkpoint's tensor bytes, the machine's GEMM ceiling, its name
``parity.py``       whether the output is right: :data:`PARITY_TOL`, :func:`parity_error`
``providers.py``    the :class:`Provider` interface and the in-process providers
                    (bertfast per backend, transformers eager / SDPA, torch.compile)
``peers.py``        the other runtimes: ONNX Runtime, OpenVINO, CTranslate2 (fp32; int8
                    variants reported apart)
``registry.py``     every provider by name (:func:`provider_by_name`), the default lists
                    of ``bertfast bench`` (:func:`builtin_providers`) and of the suite
                    (:func:`suite_providers`); imports ``providers.py`` and ``peers.py``,
                    imported by neither
``isolated.py``     each provider in its own worker process (:class:`Worker`), so
                    runtimes do not fight over the cores
``report.py``       the Markdown table and JSON of a ``bertfast bench`` run; the suite's
                    report (tables, targets, plots: ``benchmarks/make_report.py``)
``sweep.py``        the GPU sweeps' launch timing, device facts and JSON-line rows
``accuracy.py``     the accuracy contract of bf16 / int8 (``CONTRACT``), measured and
                    reported
``main_job.py``     the main job: ``Embedder.encode`` on real text vs
                    sentence-transformers, a worker process per provider
                    (``benchmarks/main_job.py``; not re-exported here)
==================  ==================================================================

Models come from :mod:`bertfast.presets` when no checkpoint folder is given (built-in
BERT-base / BERT-large / MiniLM-L6 architectures with random weights): nothing here
needs a download or the packaged MiniLM. The suites and tools that use this library
live in ``benchmarks/`` (``pytest benchmarks``: torch.compile, the peers, kernels;
``benchmarks/make_report.py``; the GPU check), one-off experiments in
``benchmarks/experiments/`` (see ``benchmarks/README.md``).
"""

from __future__ import annotations

from .isolated import ISOLATION_MODES, LocalRunner, Worker, open_runner
from .parity import INT8_PARITY_TOL, PARITY_TOL, parity_error
from .peers import CTranslate2Provider, OnnxRuntimeProvider, OpenVinoProvider, peer_providers
from .providers import (
    BertfastProvider,
    CompileProvider,
    Provider,
    TransformersProvider,
    bertfast_backends,
)
from .registry import (
    BASELINES,
    INT8_PEERS,
    builtin_providers,
    known_providers,
    provider_by_name,
    suite_providers,
)
from .report import FOOTNOTE, format_memory, format_table, write_json
from .timing import (
    SETTLE_S,
    Stats,
    block_size,
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
    "suite_providers",
    "known_providers",
    "provider_by_name",
    "BASELINES",
    "INT8_PEERS",
    "format_table",
    "format_memory",
    "FOOTNOTE",
    "write_json",
    "ISOLATION_MODES",
    "SETTLE_S",
    "block_size",
]
