"""``bertfast bench``: a short end-to-end run of the providers on a few shapes, printed
as a Markdown table (the full suite is ``pytest benchmarks``).

Each provider loads and runs in a worker process of its own (``--isolation process``,
the default; see :mod:`bertfast.bench.isolated`), the timed rounds alternating between
providers. Peers (``onnxruntime``, ``openvino``, ``ctranslate2`` and the int8
``onnxruntime-int8`` / ``ctranslate2-int8``) are asked for by name or all at once with
``--providers peers``; int8 rows carry no ratios and are not in the fp32 ones."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence

from . import options
from ._common import UserError, model_folder

__all__ = ["main", "build_parser", "measure_rows"]

NAME = "bench"
#: ``bertfast bench ARGS``: the top-level parser hands ARGS over unparsed to :func:`run`.
RAW_ARGS = True

DEFAULT_SHAPES = "1x32,8x128,r32x64x128"


def add_parser(sub) -> None:
    sub.add_parser(
        NAME, help="benchmarks (`bertfast bench --help` lists the options)", add_help=False
    )


def run(argv: Sequence[str]) -> int:
    if importlib.util.find_spec("bertfast.bench") is None:
        raise UserError(
            "`bertfast bench` is not available in this installation "
            "(the module bertfast.bench is missing); the pytest-benchmark suites under "
            "benchmarks/ in the source tree run with `pytest benchmarks`"
        )
    return int(main(list(argv)) or 0)


def build_parser() -> argparse.ArgumentParser:
    import torch

    from ..bench import ISOLATION_MODES

    p = argparse.ArgumentParser(
        prog="bertfast bench",
        description="Time bertfast against transformers on a few shapes and print a table. "
        "The full suite (torch.compile, ONNX Runtime, kernels, plots) is "
        "`pytest benchmarks` (benchmarks/README.md).",
    )
    options.add_model(p)
    p.add_argument(
        "--shapes",
        default=DEFAULT_SHAPES,
        help="comma list of BxS (full) or rBxMEANxMAX (ragged, log-normal lengths) "
        f"(default: {DEFAULT_SHAPES})",
    )
    options.add_device(
        p,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device (default: cuda when torch sees a GPU, else cpu)",
    )
    options.add_dtype(
        p, default=None, help="weights and activations (default: float32 on CPU, float16 on GPU)"
    )
    options.add_threads(p)
    p.add_argument(
        "--providers",
        default=None,
        help="comma list (default: transformers-eager, transformers-sdpa and "
        "bertfast-<backend> for each usable backend); peers: onnxruntime, openvino "
        "(openvino-latency / openvino-throughput force a hint), ctranslate2, "
        "onnxruntime-int8, ctranslate2-int8; bertfast int8 / bf16: bertfast-cpu-int8, "
        "bertfast-cpu-bf16; torch-compile (the SDPA model compiled); "
        "'builtin' and 'peers' name each group",
    )
    p.add_argument(
        "--isolation",
        default="process",
        choices=ISOLATION_MODES,
        help="process: each provider in a worker process of its own (runtimes sharing a "
        "process fight over the cores); inline: all in this process (default: process)",
    )
    p.add_argument(
        "--seconds", type=float, default=1.0, help="timing budget per case (default: 1.0)"
    )
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    options.add_backend(
        p, default=None, help="time only this bertfast backend (default: each usable one)"
    )
    return p


def _usage_error(message: str) -> int:
    print(f"bertfast bench: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """``bertfast bench``: a short end-to-end run, printed as a Markdown table."""
    import torch

    from ..bench import (
        FOOTNOTE,
        SETTLE_S,
        ModelDims,
        builtin_providers,
        checkpoint_bytes,
        cpu_info,
        device_name,
        format_memory,
        format_table,
        gemm_ceiling,
        open_runner,
        parse_shape,
        peer_providers,
        provider_by_name,
        write_json,
    )
    from ..ops.dispatch import BackendError
    from ..presets import display_name
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
        path = args.path = model_folder(args.model)
        names = [n.strip() for n in (args.providers or "").split(",") if n.strip()]
        providers = []
        for n in names or ["builtin"]:
            if n == "builtin":
                providers += builtin_providers(args.device)
            elif n == "peers":
                providers += peer_providers(args.device)
            else:
                providers.append(provider_by_name(n, args.device))
        seen: set[str] = set()
        providers = [pr for pr in providers if not (pr.name in seen or seen.add(pr.name))]
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
    cpu = cpu_info() if device.type == "cpu" else None
    print(
        f"# bertfast bench: {display_name(path)} on "
        f"{device_name(args.device)}, {dtype}, {torch.get_num_threads()} threads; "
        f"GEMM ceiling {ceiling:.0f} GFLOP/s (best 2048^3 of torch.mm and bertfast.ops.linear, "
        f"plain and packed as a loaded model's weights)"
    )
    if cpu:
        print(f"# CPU: {cpu['model']}; flags: {' '.join(cpu['flags'] or []) or 'unknown'}")
    print(
        f"# isolation: {args.isolation}; rounds rotate the provider order, each provider "
        f"settles {SETTLE_S * 1e3:.0f} ms of untimed calls before its timed block"
    )

    runners = {}
    try:
        for pr in providers:
            why = pr.unavailable(args.device, dtype)
            if why:
                print(f"  skip {pr.name}: {why}")
                continue
            try:
                runners[pr.name] = (pr, open_runner(pr, path, args.device, dtype, args.isolation))
            except Exception as exc:  # a provider that cannot load is reported, not fatal
                print(f"  skip {pr.name}: failed to load ({type(exc).__name__}: {exc})")
        if not runners:
            print("bertfast bench: no provider could run", file=sys.stderr)
            return 1
        for pr, r in runners.values():
            if pr.name.startswith("openvino") and r.info:
                print(f"  {pr.name}: performance hint {r.info.get('hint')}")
        rows, parity_ref = measure_rows(runners, shapes, dims, vocab, args, ceiling, dtype)
        memory = {n: r.memory() for n, (_, r) in runners.items()}
    finally:
        for _, r in runners.values():
            r.close()
    baselines = [n for n, (pr, _) in runners.items() if not pr.is_bertfast and not pr.int8]
    print(format_table(rows, baselines))
    print("\n" + FOOTNOTE)
    ckpt = checkpoint_bytes(path)
    print("\n" + format_memory(memory, ckpt))
    if args.json:
        write_json(
            args.json,
            {
                "device": device_name(args.device),
                "model": display_name(path),
                "dtype": str(dtype).replace("torch.", ""),
                "ceiling_gflops": ceiling,
                "cpu": cpu,
                "isolation": args.isolation,
                "settle_s": SETTLE_S,
                "parity_ref": parity_ref,
                "checkpoint_bytes": ckpt,
                "memory": memory,
            },
            rows,
        )
    return 0


def measure_rows(runners, shapes, dims, vocab, args, ceiling, dtype) -> tuple[list[dict], str]:
    """Every shape: two warm calls per provider (parity on the first), then rounds
    alternating between the providers (order rotated every round), each provider
    settling ``SETTLE_S`` of untimed calls before its block of timed ones.

    ``runners``: provider name -> (provider, runner from ``bertfast.bench.open_runner``);
    ``args``: ``device``, ``path`` (the checkpoint folder) and ``seconds`` (timing
    budget per case). Returns the table's rows and the name of the parity reference
    (``benchmarks/gpu_e2e.py`` calls this too)."""
    from ..bench import (
        SETTLE_S,
        Stats,
        TransformersProvider,
        block_size,
        encoder_flops,
        make_batch,
        parity_error,
        rounds_for,
    )

    fp32 = [n for n, (pr, _) in runners.items() if not pr.is_bertfast and not pr.int8]
    ref_name = "transformers-eager"
    reference = None  # transformers eager, loaded here when it is not among the providers
    if ref_name not in runners:
        pr = TransformersProvider("eager")
        if pr.unavailable(args.device, dtype) is None:
            reference = pr.load(args.path, args.device, dtype)
        else:  # no transformers: compare with the first provider
            ref_name = next(iter(runners))
            print(f"  parity is against {ref_name} (transformers is not installed)")
    rows: list[dict] = []
    for label, lengths in shapes:
        batch = make_batch(lengths, vocab, device=args.device)
        useful = encoder_flops(dims, lengths)
        outs, one, failed = {}, {}, {}
        for name, (_, r) in runners.items():
            try:
                outs[name], one[name] = r.prepare(batch)
            except Exception as exc:
                failed[name] = f"{type(exc).__name__}: {exc}"
                print(f"  {name} failed on {label}: {failed[name]}")
        if reference is not None:
            ref = reference(batch).float().cpu()
        elif ref_name in outs:
            ref = outs[ref_name].float()
        else:
            continue
        mask = batch.attention_mask.cpu()
        errs = {n: parity_error(o, ref, mask) for n, o in outs.items()}
        outs.clear()
        names = list(one)
        # Each round gives every provider (order rotated) SETTLE_S of untimed calls,
        # then a block of timed ones: a runtime's first calls after another process ran
        # are up to 2x slower, whoever it is (bertfast.bench.timing.SETTLE_S).
        block = {n: block_size(one[n]) for n in names}
        per_round = sum(max(SETTLE_S, one[n]) + block[n] * one[n] for n in names)
        rounds = rounds_for(per_round, args.seconds * len(names), min_rounds=3)
        times: dict[str, list[float]] = {n: [] for n in names}
        for k in range(rounds):
            j = k % len(names)
            for n in names[j:] + names[:j]:
                times[n] += runners[n][1].timed(block[n], settle_s=SETTLE_S)
        medians = {n: Stats(t).median for n, t in times.items()}
        for n in names:
            pr = runners[n][0]
            st = Stats(times[n])
            gflops = useful / st.median / 1e9
            tol = pr.parity_tol(dtype)
            ratios = {} if pr.int8 else {b: medians[b] / st.median for b in fp32 if b in medians}
            rows.append(
                {
                    "shape": label,
                    "provider": n,
                    "int8": pr.int8,
                    "precision": pr.precision or ("int8" if pr.int8 else str(dtype)[6:]),
                    "median_ms": st.median * 1e3,
                    "iqr_ms": st.iqr * 1e3,
                    "seq_per_s": len(lengths) / st.median,
                    "tok_per_s": sum(lengths) / st.median,
                    "gflops": gflops,
                    "ceiling_share": gflops / ceiling if args.device == "cpu" else None,
                    "ratios": ratios,
                    "parity": "ok" if errs[n] <= tol else f"WRONG ({errs[n]:.1e})",
                    "max_abs_err": errs[n],
                    "parity_tol": tol,
                    "provider_info": runners[n][1].info,
                }
            )
    return rows, ref_name
