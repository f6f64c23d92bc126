"""``bertfast bench``: a short end-to-end run of the providers on a few shapes, printed
as a Markdown table (the full suite is ``pytest benchmarks``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import torch

from .parity import PARITY_TOL, parity_error
from .providers import builtin_providers, provider_by_name
from .report import FOOTNOTE, format_table, write_json
from .timing import device_name, gemm_ceiling, measure
from .workload import ModelDims, encoder_flops, make_batch, parse_shape

__all__ = ["main", "build_parser"]

DEFAULT_SHAPES = "1x32,8x128,r32x64x128"


def build_parser() -> argparse.ArgumentParser:
    from ..presets import PRESETS

    p = argparse.ArgumentParser(
        prog="bertfast bench",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Time bertfast against transformers on a few shapes and print a table. "
        "The full suite (torch.compile, ONNX Runtime, kernels, plots) is "
        "`pytest benchmarks` (benchmarks/README.md).",
    )
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder, 'minilm' (the packaged all-MiniLM-L6-v2) or a "
        f"built-in architecture with random weights ({', '.join(PRESETS)}); "
        "default: the packaged MiniLM when installed, else minilm-l6",
    )
    p.add_argument(
        "--shapes",
        default=DEFAULT_SHAPES,
        help="comma list of BxS (full) or rBxMEANxMAX (ragged, log-normal lengths)",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float16", "bfloat16"],
        help="default: float32 on CPU, float16 on GPU",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--providers",
        default=None,
        help="comma list (default: transformers-eager, transformers-sdpa and "
        "bertfast-<backend> for each usable backend)",
    )
    p.add_argument("--seconds", type=float, default=1.0, help="timing budget per case")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument(
        "--backend",
        default=None,
        choices=("auto", "torch", "cpu", "cuda", "triton"),
        help="time only this bertfast backend (default: each usable one)",
    )
    return p


def _usage_error(message: str) -> int:
    print(f"bertfast bench: error: {message}", file=sys.stderr)
    return 2


def _model_folder(model: str | None) -> str:
    """--model: a built-in name (bertfast.presets) or a checkpoint folder, checked."""
    from ..presets import PRESETS, resolve
    from ..validate import checkpoint_folder

    if model is None or model == "minilm" or model in PRESETS:
        return str(resolve(model))
    return checkpoint_folder(model)


def _model_name(path) -> str:
    marker = os.path.join(path, "bertfast_preset.json")
    name = os.path.basename(os.path.normpath(path))
    if os.path.isfile(marker):
        return f"{name.split('-seed')[0]} (random weights)"
    if name == "model":  # packaged checkpoints live in <package>/model
        name = os.path.basename(os.path.dirname(os.path.normpath(path)))
    return name


def main(argv: Sequence[str] | None = None) -> int:
    """``bertfast bench``: a short end-to-end run, printed as a Markdown table."""
    from ..ops.dispatch import BackendError
    from ..validate import CheckpointError, check_backend, resolve_device

    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:  # every argument is checked before anything runs: one line, status 2
        device = resolve_device(args.device)
        shapes = [parse_shape(s.strip()) for s in args.shapes.split(",") if s.strip()]
        if not shapes:
            raise ValueError("--shapes names no shape")
        dtype = (
            getattr(torch, args.dtype)
            if args.dtype
            else (torch.float32 if device.type == "cpu" else torch.float16)
        )
        if args.backend is not None:
            check_backend(args.backend, device, dtype)
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be at least 1, not {args.threads}")
        args.device = str(device)
        path = _model_folder(args.model)
        names = [n.strip() for n in (args.providers or "").split(",") if n.strip()]
        providers = (
            [provider_by_name(n, args.device) for n in names]
            if names
            else builtin_providers(args.device)
        )
        if args.backend not in (None, "auto"):
            providers = [pr for pr in providers if not pr.is_bertfast]
            providers.append(provider_by_name(f"bertfast-{args.backend}", args.device))
    except (ValueError, BackendError, CheckpointError) as exc:
        return _usage_error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)
    dims = ModelDims.from_path(path)
    with open(os.path.join(path, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])

    ceiling = gemm_ceiling(args.device, dtype, budget_s=min(args.seconds, 1.0), with_bertfast=True)
    print(
        f"# bertfast bench: {_model_name(path)} on "
        f"{device_name(args.device)}, {dtype}, {torch.get_num_threads()} threads; "
        f"GEMM ceiling {ceiling:.0f} GFLOP/s (best 2048^3 of torch.mm and bertfast.ops.linear)"
    )

    runners = {}
    for pr in providers:
        why = pr.unavailable(args.device, dtype)
        if why:
            print(f"  skip {pr.name}: {why}")
            continue
        try:
            runners[pr.name] = pr.load(path, args.device, dtype)
        except Exception as exc:  # a provider that cannot load is reported, not fatal
            print(f"  skip {pr.name}: failed to load ({type(exc).__name__}: {exc})")
    if not runners:
        print("bertfast bench: no provider could run", file=sys.stderr)
        return 1
    baselines = [n for n in runners if not n.startswith("bertfast-")]
    ref_name = "transformers-eager" if "transformers-eager" in runners else next(iter(runners))
    tol = PARITY_TOL.get(dtype, 5e-2)

    rows: list[dict] = []
    for label, lengths in shapes:
        batch = make_batch(lengths, vocab, device=args.device)
        useful = encoder_flops(dims, lengths)
        ref = runners[ref_name](batch).float()
        medians = {}
        for name, run in runners.items():
            err = parity_error(run(batch), ref, batch.attention_mask)
            stats = measure(
                lambda run=run, batch=batch: run(batch),
                args.device,
                warmup=1,
                min_rounds=3,
                budget_s=args.seconds,
            )
            medians[name] = stats.median
            gflops = useful / stats.median / 1e9
            rows.append(
                {
                    "shape": label,
                    "provider": name,
                    "median_ms": stats.median * 1e3,
                    "iqr_ms": stats.iqr * 1e3,
                    "seq_per_s": len(lengths) / stats.median,
                    "tok_per_s": sum(lengths) / stats.median,
                    "gflops": gflops,
                    "ceiling_share": gflops / ceiling if args.device == "cpu" else None,
                    "ratios": {},
                    "parity": "ok" if err <= tol else f"WRONG ({err:.1e})",
                    "max_abs_err": err,
                }
            )
        for r in rows:
            if r["shape"] == label:
                for b in baselines:
                    r["ratios"][b] = medians[b] / medians[r["provider"]]
    print(format_table(rows, baselines))
    print("\n" + FOOTNOTE)
    if args.json:
        write_json(
            args.json,
            {
                "device": device_name(args.device),
                "model": _model_name(path),
                "dtype": str(dtype).replace("torch.", ""),
                "ceiling_gflops": ceiling,
            },
            rows,
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
