"""Other runtimes a user would try for a fast encoder, behind the :class:`Provider`
interface: ONNX Runtime, OpenVINO and CTranslate2 (fp32), and their int8 variants.

==========================  ==============================================================
``onnxruntime``             the model exported with ``torch.onnx.export`` (dynamic batch
                            and sequence axes, opset 17), fused by
                            ``onnxruntime.transformers``' optimizer (``model_type="bert"``),
                            run by an InferenceSession (intra-op threads = torch threads,
                            worker spinning off)
``onnxruntime-int8``        that fused graph through ``onnxruntime.quantization.
                            quantize_dynamic`` (int8 weights per output channel,
                            activations quantized per call; per-tensor weights lose
                            twice the accuracy on MiniLM, see ``INT8_PARITY_TOL``)
``openvino``                the same raw ONNX export read by ``openvino.Core().read_model``,
                            compiled for CPU with ``INFERENCE_PRECISION_HINT=f32`` and
                            ``INFERENCE_NUM_THREADS`` = torch threads; both
                            ``PERFORMANCE_HINT`` values (LATENCY, THROUGHPUT) are compiled
                            and timed on a probe batch at load, the faster one is kept and
                            recorded (``info["hint"]``, ``info["hint_probe_ms"]``);
                            ``openvino-latency`` / ``openvino-throughput`` force one
``openvino-bf16``           the same with ``INFERENCE_PRECISION_HINT=bf16`` (a low-precision
                            row, beside bertfast's bf16 one)
``ctranslate2``             the checkpoint folder converted by ``ctranslate2.converters.
                            TransformersConverter`` (``quantization="float32"``), run by
                            ``ctranslate2.Encoder.forward_batch`` with the real tokens of
                            each row (intra threads = torch threads)
``ctranslate2-int8``        the same with ``quantization="int8"`` / ``compute_type="int8"``
==========================  ==============================================================

Conversions are cached on disk per checkpoint (``cache_dir``: the ``BERTFAST_BENCH_CACHE``
folder, else ``~/.cache/bertfast/bench``). A runtime that is not installed makes its
provider report why through ``unavailable`` (callers skip it with that line).

Int8 providers set ``int8 = True``: their outputs are checked against
:data:`INT8_PARITY_TOL` and they are reported apart from the fp32 rows, never in fp32
ratios.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings

import torch

from .providers import Provider
from .workload import Batch, make_batch

__all__ = [
    "OnnxRuntimeProvider",
    "OpenVinoProvider",
    "CTranslate2Provider",
    "peer_providers",
    "default_cache_dir",
    "onnx_export",
]


def default_cache_dir() -> str:
    env = os.environ.get("BERTFAST_BENCH_CACHE", "").strip()
    return env or os.path.join(os.path.expanduser("~"), ".cache", "bertfast", "bench")


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _cache_tag(model_path: str) -> str:
    """Per checkpoint folder and its weights' modification time (a rewritten
    checkpoint gets a fresh conversion)."""
    stamp = ""
    for name in sorted(os.listdir(model_path)):
        if name.endswith((".safetensors", ".bin", "config.json")):
            stamp += f"{name}:{os.path.getmtime(os.path.join(model_path, name)):.0f};"
    return _sha(os.path.abspath(model_path) + stamp)


def _config(model_path: str) -> dict:
    with open(os.path.join(model_path, "config.json")) as f:
        return json.load(f)


def _cpu_only(device, dtype, what: str) -> str | None:
    if torch.device(device).type != "cpu":
        return f"{what} is benchmarked on CPU only"
    if dtype != torch.float32:
        return f"CPU runs are fp32 only (asked {dtype})"
    return None


def onnx_export(model_path: str, cache_dir: str | None = None) -> str:
    """The checkpoint exported to ONNX (fp32, dynamic batch and sequence axes; inputs
    ``input_ids``, ``attention_mask``, ``token_type_ids``; output
    ``last_hidden_state``), cached: the file every ONNX-based provider starts from."""
    from transformers import AutoModel

    folder = os.path.join(cache_dir or default_cache_dir(), "onnx", _cache_tag(model_path))
    raw = os.path.join(folder, "model.onnx")
    if os.path.exists(raw):
        return raw
    os.makedirs(folder, exist_ok=True)
    cfg = _config(model_path)
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

    # Trace with real padding so the mask path is in the graph (an all-ones mask can be
    # dropped by transformers at trace time and baked out).
    example = make_batch([16, 9], int(cfg["vocab_size"]))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    tmp = raw + f".tmp{os.getpid()}"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder(model).eval(),
            (example.input_ids, example.attention_mask, example.token_type_ids),
            tmp,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in names + ["last_hidden_state"]},
            opset_version=17,
            dynamo=False,
        )
    os.replace(tmp, raw)
    return raw


def _feeds(batch: Batch, in_names) -> dict:
    feeds = {
        "input_ids": batch.input_ids.numpy(),
        "attention_mask": batch.attention_mask.numpy(),
        "token_type_ids": batch.token_type_ids.numpy(),
    }
    return {k: v for k, v in feeds.items() if k in in_names}


class OnnxRuntimeProvider(Provider):
    """ONNX Runtime on the exported, transformer-optimized graph (``int8``: that graph
    dynamically quantized)."""

    def __init__(self, int8: bool = False, cache_dir: str | None = None):
        self.int8 = int8
        self.name = "onnxruntime-int8" if int8 else "onnxruntime"
        self.cache_dir = cache_dir

    def unavailable(self, device, dtype):
        try:
            import onnx  # noqa: F401
            import onnxruntime as ort
            from onnxruntime.transformers.optimizer import optimize_model  # noqa: F401

            if self.int8:
                from onnxruntime.quantization import quantize_dynamic  # noqa: F401
        except Exception as exc:
            return f"onnxruntime / onnx not installed ({type(exc).__name__}: {exc})"
        if torch.device(device).type == "cuda":
            if self.int8:
                return "the int8 peer is benchmarked on CPU only"
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                return "this onnxruntime build has no CUDAExecutionProvider"
            if dtype == torch.bfloat16:
                return "the onnxruntime transformer optimizer converts to fp16 only"
        elif dtype != torch.float32:
            return f"CPU runs are fp32 only (asked {dtype})"
        return None

    def model_file(self, model_path: str, device: str, dtype: torch.dtype) -> dict:
        """Export + optimize (+ quantize), cached per checkpoint, device type and dtype."""
        from onnxruntime.transformers.optimizer import optimize_model

        cache = self.cache_dir or default_cache_dir()
        gpu = torch.device(device).type == "cuda"
        raw = onnx_export(model_path, cache)
        folder = os.path.dirname(raw)
        tag = f"{'gpu' if gpu else 'cpu'}-{str(dtype)[6:]}"
        final = os.path.join(folder, f"model_opt-{tag}.onnx")
        meta_file = os.path.join(folder, f"meta-{tag}.json")
        if not (os.path.exists(final) and os.path.exists(meta_file)):
            cfg = _config(model_path)
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
            with open(meta_file, "w") as f:
                json.dump({"fusions": fused, "hidden": int(cfg["hidden_size"])}, f)
        with open(meta_file) as f:
            meta = dict(json.load(f), path=final)
        if self.int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            q = os.path.join(folder, f"model_int8pc-{tag}.onnx")
            if not os.path.exists(q):
                tmp = q + f".tmp{os.getpid()}.onnx"
                import onnx

                # The fused contrib ops carry no type information for shape inference:
                # their outputs are fp32.
                quantize_dynamic(
                    final,
                    tmp,
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                )
                os.replace(tmp, q)
            meta["path"] = q
        return meta

    def load(self, model_path, device, dtype):
        import numpy as np
        import onnxruntime as ort

        try:
            meta = self.model_file(model_path, device, dtype)
        except Exception as exc:
            raise RuntimeError(
                f"ONNX export / optimization failed: {type(exc).__name__}: {exc}"
            ) from exc
        gpu = torch.device(device).type == "cuda"
        so = ort.SessionOptions()
        so.intra_op_num_threads = torch.get_num_threads()
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # ORT's idle workers spin by default after each run; off, like torch's OpenMP
        # workers which sleep after a short spin.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        eps = ["CUDAExecutionProvider"] if gpu else ["CPUExecutionProvider"]
        session = ort.InferenceSession(meta["path"], so, providers=eps)
        in_names = {i.name for i in session.get_inputs()}
        info = {
            "fusions": meta.get("fusions"),
            "intra_op_threads": so.intra_op_num_threads,
            "version": ort.__version__,
            "quantization": "dynamic int8 (QInt8 per-channel weights)" if self.int8 else None,
        }

        if not gpu:

            def run(batch: Batch):
                return torch.from_numpy(session.run(None, _feeds(batch, in_names))[0])
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


class OpenVinoProvider(Provider):
    """OpenVINO (CPU plugin) on the raw ONNX export: fp32 inference precision, or with
    ``bf16=True`` OpenVINO's bf16 (``INFERENCE_PRECISION_HINT=bf16``: what a user of
    OpenVINO turns on for speed on a CPU with AMX / AVX512-BF16), a low-precision row
    like bertfast's bf16 one: reported apart from the fp32 rows, parity within the bf16
    tolerance. The precision OpenVINO ran is recorded (``info["inference_precision_hint"]``:
    on a CPU without native bf16 it may keep f32)."""

    HINTS = ("LATENCY", "THROUGHPUT")

    def __init__(self, hint: str | None = None, cache_dir: str | None = None, bf16: bool = False):
        if hint is not None and hint not in self.HINTS:
            raise ValueError(f"OpenVINO performance hint must be one of {self.HINTS}, not {hint!r}")
        self.hint = hint
        self.bf16 = bf16
        self.name = "openvino" if hint is None else f"openvino-{hint.lower()}"
        if bf16:
            self.name += "-bf16"
            self.int8 = True  # a low-precision row: reported apart, no fp32 ratios
            self.precision = "bfloat16"
        self.cache_dir = cache_dir

    def unavailable(self, device, dtype):
        try:
            import openvino  # noqa: F401
            import transformers  # noqa: F401
        except Exception as exc:
            return f"openvino not installed ({type(exc).__name__}: {exc})"
        return _cpu_only(device, dtype, "OpenVINO")

    def load(self, model_path, device, dtype):
        import openvino as ov

        path = onnx_export(model_path, self.cache_dir)
        core = ov.Core()
        model = core.read_model(path)
        threads = torch.get_num_threads()
        compiled = {}
        for hint in [self.hint] if self.hint else self.HINTS:
            compiled[hint] = core.compile_model(
                model,
                "CPU",
                {
                    "INFERENCE_PRECISION_HINT": "bf16" if self.bf16 else "f32",
                    "PERFORMANCE_HINT": hint,
                    "INFERENCE_NUM_THREADS": threads,
                },
            )
        in_names = {p.any_name for p in model.inputs}

        def runner(cm):
            request = cm.create_infer_request()

            def run(batch: Batch):
                request.infer(_feeds(batch, in_names))
                # copy: the output tensor's memory is reused by the next call
                return torch.from_numpy(request.get_output_tensor(0).data.copy())

            return run

        runs = {h: runner(cm) for h, cm in compiled.items()}
        probe_ms = {}
        if len(runs) > 1:  # the faster hint on a mid-size probe batch (8 x 64)
            cfg = _config(model_path)
            seq = min(64, int(cfg.get("max_position_embeddings", 64)))
            probe = make_batch([seq] * 8, int(cfg["vocab_size"]))
            for h, run in runs.items():
                run(probe)
                t0 = time.perf_counter()
                for _ in range(3):
                    run(probe)
                probe_ms[h] = round((time.perf_counter() - t0) / 3 * 1e3, 2)
            hint = min(probe_ms, key=probe_ms.get)
        else:
            hint = next(iter(runs))
        run = runs[hint]
        cm = compiled[hint]
        info = {"hint": hint, "hint_probe_ms": probe_ms or None, "version": ov.__version__}
        for key in ("NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT"):
            try:
                info[key.lower()] = str(cm.get_property(key))
            except Exception:  # a property this version does not report
                pass
        run.info = info
        return run


class _VocabStub:
    """Stands in for the tokenizer of a checkpoint folder that has none (the converter
    reads only its vocabulary and unknown token; the encoder takes ids)."""

    unk_token = "[UNK]"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def get_vocab(self) -> dict[str, int]:
        return {f"[unused{i}]": i for i in range(self.vocab_size)}


def _converter_class(ctranslate2):
    """ctranslate2's transformers converter, adapted to what it cannot know:

    - transformers 5 dropped ``BertConfig.position_embedding_type`` (absolute positions
      only) which the converter's BERT loader asserts on: set to ``"absolute"`` when
      missing;
    - a checkpoint folder without tokenizer files gets a stub vocabulary of
      ``vocab_size`` entries.
    """

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            cfg = model.config
            try:
                cfg.position_embedding_type  # noqa: B018
            except AttributeError:
                cfg.position_embedding_type = "absolute"
            return model

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            try:
                return super().load_tokenizer(tokenizer_class, model_name_or_path, **kwargs)
            except Exception:  # no tokenizer files in the folder
                return _VocabStub(int(_config(model_name_or_path)["vocab_size"]))

    return Converter


class CTranslate2Provider(Provider):
    """CTranslate2's Encoder on the checkpoint converted by its transformers converter."""

    def __init__(self, int8: bool = False, cache_dir: str | None = None):
        self.int8 = int8
        self.name = "ctranslate2-int8" if int8 else "ctranslate2"
        self.cache_dir = cache_dir

    def unavailable(self, device, dtype):
        try:
            import ctranslate2  # noqa: F401
            import transformers  # noqa: F401
        except Exception as exc:
            return f"ctranslate2 not installed ({type(exc).__name__}: {exc})"
        return _cpu_only(device, dtype, "CTranslate2")

    def converted(self, model_path: str) -> str:
        import ctranslate2

        quant = "int8" if self.int8 else "float32"
        out = os.path.join(
            self.cache_dir or default_cache_dir(), "ct2", f"{_cache_tag(model_path)}-{quant}"
        )
        if not os.path.exists(os.path.join(out, "model.bin")):
            tmp = out + f".tmp{os.getpid()}"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                conv = _converter_class(ctranslate2)(model_path)
                conv.convert(tmp, quantization=quant, force=True)
            if os.path.exists(out):  # a half-written folder of an earlier, killed run
                import shutil

                shutil.rmtree(out)
            os.replace(tmp, out)
        return out

    def load(self, model_path, device, dtype):
        import ctranslate2
        import numpy as np

        folder = self.converted(model_path)
        compute = "int8" if self.int8 else "float32"
        enc = ctranslate2.Encoder(
            folder,
            device="cpu",
            compute_type=compute,
            inter_threads=1,
            intra_threads=torch.get_num_threads(),
        )

        def run(batch: Batch):
            # Dense ids + per-row lengths: each row's real tokens only (right padding).
            ids = ctranslate2.StorageView.from_array(batch.input_ids.to(torch.int32).numpy())
            lens = ctranslate2.StorageView.from_array(np.asarray(batch.lengths, dtype=np.int32))
            types = None
            if bool(batch.token_type_ids.any()):
                types = [row[:n] for row, n in zip(batch.token_type_ids.tolist(), batch.lengths)]
            out = enc.forward_batch(ids, lens, types)
            hidden = torch.from_numpy(np.array(out.last_hidden_state))
            S = batch.shape[1]
            if hidden.shape[1] < S:  # output stops at the longest row
                hidden = torch.nn.functional.pad(hidden, (0, 0, 0, S - hidden.shape[1]))
            return hidden

        run.info = {
            "compute_type": compute,
            "intra_threads": torch.get_num_threads(),
            "version": ctranslate2.__version__,
        }
        return run


def peer_providers(device: str = "cpu", cache_dir: str | None = None) -> list[Provider]:
    """The other runtimes, fp32 first, then the int8 ones, then the bf16 one."""
    return [
        OnnxRuntimeProvider(cache_dir=cache_dir),
        OpenVinoProvider(cache_dir=cache_dir),
        CTranslate2Provider(cache_dir=cache_dir),
        OnnxRuntimeProvider(int8=True, cache_dir=cache_dir),
        CTranslate2Provider(int8=True, cache_dir=cache_dir),
        OpenVinoProvider(cache_dir=cache_dir, bf16=True),
    ]
