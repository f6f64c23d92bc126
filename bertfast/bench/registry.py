"""Every way of running the encoder, by name: the one provider registry of ``bertfast
bench`` and of the suite in ``benchmarks/``.

The provider classes stay where they are defined: the in-process ones in
:mod:`bertfast.bench.providers` (the :class:`Provider` interface, bertfast per backend,
transformers eager / SDPA, ``torch.compile``), the other runtimes in
:mod:`bertfast.bench.peers`. This module imports both and neither imports it, so the
peers can subclass :class:`Provider` without an import circle.

=============================  ===========================================================
``transformers-eager``         ``AutoModel(attn_implementation="eager")`` (the parity
                               reference)
``transformers-sdpa``          ``AutoModel(attn_implementation="sdpa")``
``torch-compile``              ``torch.compile`` of the SDPA model (default mode; compile
                               time excluded from timings, recorded in the row's info)
``onnxruntime``                ``torch.onnx.export`` + ``onnxruntime.transformers``'
                               fusions, an InferenceSession (``bertfast.bench.peers``)
``openvino``                   the same ONNX export on OpenVINO's CPU plugin, the faster
                               hint at load; ``openvino-latency`` /
                               ``openvino-throughput`` force one
``ctranslate2``                CTranslate2's ``Encoder`` on the converted checkpoint
``onnxruntime-int8``,          the int8 peers: reported apart, never in fp32 ratios
``ctranslate2-int8``
``openvino-bf16``              the bf16 peer (OpenVINO's bf16 inference precision):
                               reported apart likewise
``bertfast-<backend>``         ``bertfast.from_pretrained(..., backend=<backend>)``: one
                               per backend ``bertfast.backends()`` reports usable (never
                               the Triton interpreter on CPU); any backend name is
                               accepted and reports why it cannot run through
                               ``unavailable``
``bertfast-cpu-int8``,         bertfast's int8 and bf16 rows in a float32 run (reported
``bertfast-cpu-bf16``          with the int8 peers)
=============================  ===========================================================

The peers convert the checkpoint once and cache the result under ``cache_dir`` (the
suite passes ``bertfast.bench.workload.suite_cache()``; ``None``: the peers' default,
``BERTFAST_BENCH_CACHE`` or ``~/.cache/bertfast/bench``).
"""

from __future__ import annotations

from .peers import OpenVinoProvider, peer_providers
from .providers import (
    BertfastBf16Provider,
    BertfastInt8Provider,
    BertfastProvider,
    CompileProvider,
    Provider,
    TransformersProvider,
    bertfast_backends,
)

__all__ = [
    "BASELINES",
    "INT8_PEERS",
    "BF16_PEERS",
    "builtin_providers",
    "suite_providers",
    "known_providers",
    "provider_by_name",
]

#: Names of the baseline providers, in the order they are measured.
BASELINES = (
    "transformers-eager",
    "transformers-sdpa",
    "torch-compile",
    "onnxruntime",
    "openvino",
    "ctranslate2",
)
#: Int8 peers: timed with the others, reported apart, never in fp32 ratios.
INT8_PEERS = ("onnxruntime-int8", "ctranslate2-int8")
#: bf16 peers: likewise (beside ``bertfast-cpu-bf16``).
BF16_PEERS = ("openvino-bf16",)


def _bertfast_rows(device: str) -> list[Provider]:
    # With no usable backend listed, still show bertfast-torch (it then skips with the
    # reason from BertfastProvider.unavailable).
    return [BertfastProvider(b) for b in (bertfast_backends(device) or ["torch"])]


def builtin_providers(device: str) -> list[Provider]:
    """``bertfast bench``'s default: the transformers baselines first, then one bertfast
    provider per usable backend."""
    return [TransformersProvider("eager"), TransformersProvider("sdpa"), *_bertfast_rows(device)]


def suite_providers(device: str = "cpu", cache_dir: str | None = None) -> list[Provider]:
    """The suite's default: every baseline (transformers, ``torch-compile``, the fp32
    peers), the int8 peers, the bf16 peer, then one bertfast provider per usable
    backend."""
    return [
        TransformersProvider("eager"),
        TransformersProvider("sdpa"),
        CompileProvider(),
        *peer_providers(device, cache_dir=cache_dir),
        *_bertfast_rows(device),
    ]


def known_providers(device: str = "cpu", cache_dir: str | None = None) -> dict[str, Provider]:
    """Every named provider: :func:`suite_providers`, the forced OpenVINO hints and the
    bertfast int8 / bf16 rows (any other ``bertfast-<backend>`` is made on demand by
    :func:`provider_by_name`)."""
    out = {p.name: p for p in suite_providers(device, cache_dir)}
    for hint in OpenVinoProvider.HINTS:
        p = OpenVinoProvider(hint, cache_dir=cache_dir)
        out[p.name] = p
    out[BertfastInt8Provider.NAME] = BertfastInt8Provider()
    out[BertfastBf16Provider.NAME] = BertfastBf16Provider()
    return out


def provider_by_name(name: str, device: str, cache_dir: str | None = None) -> Provider:
    """The provider called ``name`` (table above). Any ``bertfast-<backend>`` is
    accepted, also for a backend that cannot run here: it then reports why through
    ``unavailable``. ``ValueError`` lists the known names."""
    known = known_providers(device, cache_dir)
    if name in known:
        return known[name]
    if name.startswith("bertfast-"):
        return BertfastProvider(name[len("bertfast-") :])
    raise ValueError(f"unknown provider {name!r}; known: {sorted(known)} or bertfast-<backend>")
