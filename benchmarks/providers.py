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
                          (worker spinning off, see ``load``)

Then one ``bertfast-<backend>`` per backend that ``bertfast.backends()`` reports usable
on the device (never the Triton interpreter on CPU).
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings

import torch
from workloads import CACHE

from bertfast.bench import (
    Batch,
    BertfastProvider,
    Provider,
    TransformersProvider,
    bertfast_backends,
    make_batch,
)

__all__ = ["providers", "CompileProvider", "OnnxRuntimeProvider", "BASELINES"]


class CompileProvider(TransformersProvider):
    """``torch.compile`` of the transformers SDPA model."""

    def __init__(self):
        super().__init__("sdpa", name="torch-compile")

    def unavailable(self, device, dtype):
        reason = super().unavailable(device, dtype)
        if reason:
            return reason
        if not hasattr(torch, "compile"):
            return "torch.compile not available in this torch"
        return None

    def load(self, model_path, device, dtype):
        model = self.load_module(model_path, device, dtype)
        compiled = torch.compile(model)

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
            run(make_batch([shape[1]] * shape[0], 1000, device=device))
        run.info = {"compile_s": round(time.perf_counter() - t0, 1)}
        return run


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


class OnnxRuntimeProvider(Provider):
    """ONNX Runtime on the exported, transformer-optimized graph."""

    name = "onnxruntime"

    def unavailable(self, device, dtype):
        try:
            import onnx  # noqa: F401
            import onnxruntime as ort
            from onnxruntime.transformers.optimizer import optimize_model  # noqa: F401
        except Exception as exc:
            return f"onnxruntime / onnx not installed ({type(exc).__name__}: {exc})"
        if torch.device(device).type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                return "this onnxruntime build has no CUDAExecutionProvider"
            if dtype == torch.bfloat16:
                return "the onnxruntime transformer optimizer converts to fp16 only"
        elif dtype != torch.float32:
            return f"CPU runs are fp32 only (asked {dtype})"
        return None

    # -- export + optimize (cached on disk per checkpoint, device type and dtype)
    def _onnx_file(self, model_path: str, device: str, dtype: torch.dtype) -> dict[str, object]:
        import json

        from onnxruntime.transformers.optimizer import optimize_model
        from transformers import AutoModel

        gpu = torch.device(device).type == "cuda"
        tag = f"{_sha(os.path.abspath(model_path))}-{'gpu' if gpu else 'cpu'}-{str(dtype)[6:]}"
        folder = os.path.join(CACHE, "onnx", tag)
        final = os.path.join(folder, "model_opt.onnx")
        meta_file = os.path.join(folder, "meta.json")
        if os.path.exists(final) and os.path.exists(meta_file):
            with open(meta_file) as f:
                return dict(json.load(f), path=final)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(model_path, "config.json")) as f:
            cfg = json.load(f)

        model = AutoModel.from_pretrained(
            model_path, attn_implementation="eager", dtype=torch.float32
        ).eval()

        class Encoder(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                return self.m(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    token_type_ids=token_type_ids,
                ).last_hidden_state

        # Trace with real padding so the mask path is in the graph (an all-ones mask
        # can be dropped by transformers at trace time and baked out).
        example = make_batch([16, 9], int(cfg["vocab_size"]))
        raw = os.path.join(folder, "model.onnx")
        names = ["input_ids", "attention_mask", "token_type_ids"]
        t0 = time.perf_counter()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Encoder(model).eval(),
                (example.input_ids, example.attention_mask, example.token_type_ids),
                raw,
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "seq"} for n in names + ["last_hidden_state"]},
                opset_version=17,
                dynamo=False,
            )
        export_s = time.perf_counter() - t0
        opt = optimize_model(
            raw,
            model_type="bert",
            num_heads=int(cfg["num_attention_heads"]),
            hidden_size=int(cfg["hidden_size"]),
            opt_level=0,
            use_gpu=gpu,
        )
        if dtype != torch.float32:
            opt.convert_float_to_float16(keep_io_types=False)
        opt.save_model_to_file(final)
        fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        meta = {"fusions": fused, "export_s": round(export_s, 1), "hidden": int(cfg["hidden_size"])}
        with open(meta_file, "w") as f:
            json.dump(meta, f)
        return dict(meta, path=final)

    def load(self, model_path, device, dtype):
        import numpy as np
        import onnxruntime as ort

        try:
            meta = self._onnx_file(model_path, device, dtype)
        except Exception as exc:
            raise RuntimeError(
                f"ONNX export / optimization failed: {type(exc).__name__}: {exc}"
            ) from exc
        gpu = torch.device(device).type == "cuda"
        so = ort.SessionOptions()
        so.intra_op_num_threads = torch.get_num_threads()
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # ORT's idle workers spin by default after each run; in interleaved timing they
        # would steal the cores from whichever provider runs next. Off, like torch's
        # OpenMP workers which sleep after a short spin.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        eps = ["CUDAExecutionProvider"] if gpu else ["CPUExecutionProvider"]
        session = ort.InferenceSession(meta["path"], so, providers=eps)
        in_names = {i.name for i in session.get_inputs()}
        info = {"fusions": meta.get("fusions"), "intra_op_threads": so.intra_op_num_threads}

        if not gpu:

            def run(batch: Batch):
                feeds = {
                    "input_ids": batch.input_ids.numpy(),
                    "attention_mask": batch.attention_mask.numpy(),
                    "token_type_ids": batch.token_type_ids.numpy(),
                }
                feeds = {k: v for k, v in feeds.items() if k in in_names}
                return torch.from_numpy(session.run(None, feeds)[0])
        else:  # IO binding on device memory: no host copies inside the timed call
            np_out = np.float32 if dtype == torch.float32 else np.float16
            hidden = int(meta["hidden"])

            def run(batch: Batch):
                binding = session.io_binding()
                for name in ("input_ids", "attention_mask", "token_type_ids"):
                    if name not in in_names:
                        continue
                    t = getattr(batch, name).contiguous()
                    binding.bind_input(
                        name, "cuda", t.device.index or 0, np.int64, tuple(t.shape), t.data_ptr()
                    )
                B, S = batch.shape
                out = torch.empty(
                    (B, S, hidden),
                    device=device,
                    dtype=torch.float32 if np_out is np.float32 else torch.float16,
                )
                binding.bind_output(
                    "last_hidden_state",
                    "cuda",
                    out.device.index or 0,
                    np_out,
                    tuple(out.shape),
                    out.data_ptr(),
                )
                session.run_with_iobinding(binding)
                return out

        run.info = info
        return run


#: Names of the baseline providers, in the order they are measured.
BASELINES = ("transformers-eager", "transformers-sdpa", "torch-compile", "onnxruntime")


def providers(device: str = "cpu") -> list[Provider]:
    """Every provider for ``device``: the baselines, then bertfast per usable backend."""
    out: list[Provider] = [
        TransformersProvider("eager"),
        TransformersProvider("sdpa"),
        CompileProvider(),
        OnnxRuntimeProvider(),
    ]
    backends = bertfast_backends(device)
    # With no usable backend listed, still show bertfast-torch (it then skips with the
    # reason from BertfastProvider.unavailable).
    out += [BertfastProvider(b) for b in (backends or ["torch"])]
    return out


def by_name(device: str = "cpu") -> dict[str, Provider]:
    return {p.name: p for p in providers(device)}
