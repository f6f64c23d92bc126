"""Provider registry of the end-to-end suite: every way of running the encoder.

Each entry of :func:`providers` is one ``Provider`` (see ``bertfast.bench``):
``unavailable(device, dtype)`` says why it cannot run here (the suite skips with that
reason), ``load(path, device, dtype)`` returns ``run(batch) -> last_hidden_state``.

Baselines (measured first on every workload, so bertfast rows can carry ratios):

- ``transformers-eager``  ``AutoModel(attn_implementation="eager")``
- ``transformers-sdpa``   ``AutoModel(attn_implementation="sdpa")``
- ``torch-compile``       ``torch.compile`` of the SDPA model (default mode; compile
                          time is excluded from timings and recorded in extra_info)
- ``onnxruntime``         the model exported with ``torch.onnx.export`` (dynamic batch
                          and sequence axes), fused by ``onnxruntime.transformers``'
                          optimizer (``model_type="bert"``: EmbedLayerNormalization,
                          Attention, SkipLayerNormalization, BiasGelu), run by an
                          InferenceSession with ``intra_op_num_threads`` = torch threads
                          (worker spinning off)
- ``openvino``            the same ONNX export, OpenVINO CPU plugin, fp32 inference
                          precision, the faster of the LATENCY / THROUGHPUT hints on a
                          probe batch (recorded in ``provider_info["hint"]``)
- ``ctranslate2``         the checkpoint converted by CTranslate2's transformers
                          converter (float32), its ``Encoder.forward_batch``

Int8 peers (reported in a table of their own, never in fp32 ratios):
``onnxruntime-int8`` (ORT dynamic quantization of the fused graph) and
``ctranslate2-int8``. All peers live in ``bertfast.bench.peers``; conversions are cached
under ``CACHE``. A peer whose package is missing skips with the reason.

Then one ``bertfast-<backend>`` per backend that ``bertfast.backends()`` reports usable
on the device (never the Triton interpreter on CPU).
"""

from __future__ import annotations

from workloads import CACHE

from bertfast.bench import (
    BertfastProvider,
    CompileProvider,
    CTranslate2Provider,
    OnnxRuntimeProvider,
    OpenVinoProvider,
    Provider,
    TransformersProvider,
    bertfast_backends,
)

__all__ = ["providers", "CompileProvider", "OnnxRuntimeProvider", "BASELINES", "INT8_PEERS"]


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


def providers(device: str = "cpu") -> list[Provider]:
    """Every provider for ``device``: the baselines, then bertfast per usable backend."""
    out: list[Provider] = [
        TransformersProvider("eager"),
        TransformersProvider("sdpa"),
        CompileProvider(),
        OnnxRuntimeProvider(cache_dir=CACHE),
        OpenVinoProvider(cache_dir=CACHE),
        CTranslate2Provider(cache_dir=CACHE),
        OnnxRuntimeProvider(int8=True, cache_dir=CACHE),
        CTranslate2Provider(int8=True, cache_dir=CACHE),
    ]
    backends = bertfast_backends(device)
    # With no usable backend listed, still show bertfast-torch (it then skips with the
    # reason from BertfastProvider.unavailable).
    out += [BertfastProvider(b) for b in (backends or ["torch"])]
    return out


def by_name(device: str = "cpu") -> dict[str, Provider]:
    """Every provider by name, plus ``openvino-latency`` / ``openvino-throughput`` (one
    hint forced) for ``--bench-providers``."""
    out = {p.name: p for p in providers(device)}
    for hint in OpenVinoProvider.HINTS:
        p = OpenVinoProvider(hint, cache_dir=CACHE)
        out[p.name] = p
    return out
