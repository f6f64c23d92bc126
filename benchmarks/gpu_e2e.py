"""Stage (d) of ``benchmarks/gpu_check.sh``: the encoder end to end, winners applied.

    python benchmarks/gpu_e2e.py --out e2e.jsonl [--budget-s 480] [--model bert-base]
        [--dtype float16] [--shapes 1x128,32x128,64x256,32x512,r64x63x256]
    python benchmarks/gpu_e2e.py --out e2e.jsonl --dry-run

The measurement is the suite's (``bertfast bench``'s ``_measure``: every provider
loaded in a worker process of its own, two warm calls with parity against
transformers eager on the first, then rounds alternating between the providers), run
one shape at a time so that each shape's rows are appended to ``--out`` (one JSON line
each, ``bertfast.bench.sweep.append_row``) as soon as they exist.

Groups, each loaded then measured over every shape while the budget lasts; every
group has transformers eager (the parity reference) and SDPA, so each group's ratios
come from its own rounds. The headline pair loads in seconds and goes first: the H200
run gave the stage 130 s, and one group of all six providers spent 107 s loading
(``torch.compile`` alone 63 s) and measured nothing.

1. ``bertfast-auto`` (the ``backend="auto"`` model: on CUDA it takes the winners table
   ``BERTFAST_WINNERS`` names, see ``bertfast/ops/winners.py``).
2. a ``torch.profiler`` kernel table of ``bertfast-auto`` at ``--profile-shape``: the top
   kernels by GPU time and the kernels per forward (rows ``kind: profile``).
3. ``torch-compile`` (the SDPA model, default mode), ``bertfast-cuda``,
   ``bertfast-triton``.
4. ``torch-compile-max-autotune`` (``mode="max-autotune"``, which compiles for
   minutes).

Shapes: ``BxS`` (full) or ``rBxMEANxMAX`` (log-normal lengths, ``bertfast bench``'s
syntax); the default ragged batch ``r64x63x256`` has about 75 % padding, the batch
of the first GPU run. ``--budget-s``: no shape (and no group) starts once it is spent.

``--dry-run``: a tiny random BERT (2 layers, hidden 64) on the CPU, float32, two small
shapes, providers ``bertfast-auto``, ``bertfast-torch`` and transformers SDPA (no
torch.compile: its compiles take minutes on 2 cores), in this process; the profile
counts CPU ops instead of kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE = "d"
DEFAULT_SHAPES = "1x128,32x128,64x256,32x512,r64x63x256"

from bertfast.bench.providers import (  # noqa: E402
    BertfastProvider,
    CompileProvider,
)
from bertfast.bench.workload import make_batch  # noqa: E402


class AutoProvider(BertfastProvider):
    """``bertfast-auto``: ``from_pretrained(..., backend="auto")``, the model a user
    gets (on CUDA: the winners table's choice per op and shape, else the preference
    order)."""

    def __init__(self):
        super().__init__("auto")

    def unavailable(self, device, dtype):
        return None


def tiny_model(folder: str) -> str:
    """A 2-layer random BERT (hidden 64, 4 heads) for the dry run."""
    from bertfast.presets import Preset, materialize

    p = Preset(64, 2, 4, 128, vocab_size=1000, max_position_embeddings=128)
    return str(materialize(p, folder))


def providers(names: list[str], device: str):
    from bertfast.bench.registry import provider_by_name

    out = []
    for n in names:
        if n == "bertfast-auto":
            out.append(AutoProvider())
        elif n == "torch-compile-max-autotune":
            out.append(CompileProvider(mode="max-autotune"))
        else:
            out.append(provider_by_name(n, device))
    return out


# ---------------------------------------------------------------- the kernel profile
def kernel_profile(path, device, dtype, lengths, vocab, forwards=10, top=15) -> list[dict]:
    """Rows of a ``torch.profiler`` table of ``bertfast-auto`` on one batch: per kernel
    name its calls and GPU milliseconds per forward (CPU ops on a CPU), then a
    ``profile-summary`` row (kernels per forward, GPU and wall ms per forward)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    run = AutoProvider().load(path, device, dtype)
    batch = make_batch(lengths, vocab, device=device)
    for _ in range(3):
        run(batch)
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(forwards):
            run(batch)
        if cuda:
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / forwards
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    kernels = copies = 0
    for e in prof.events():
        if cuda:
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            if e.name.startswith(("Memcpy", "Memset")):
                copies += 1
            else:
                kernels += 1
            us = e.time_range.elapsed_us()
        else:  # CPU: the ops the forward called (top level), timed by their own time
            if e.cpu_parent is not None or not e.name.startswith(("aten::", "bertfast::")):
                continue
            kernels += 1
            us = e.self_cpu_time_total
        by_name[e.name][0] += 1
        by_name[e.name][1] += us
    total_us = sum(v[1] for v in by_name.values()) or 1.0
    shape = f"{len(lengths)}x{max(lengths)}"
    rows = []
    for name, (calls, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
        rows.append(
            {
                "kind": "profile",
                "shape": shape,
                "name": name[:200],
                "calls_per_forward": calls / forwards,
                "ms_per_forward": us / 1e3 / forwards,
                "share": us / total_us,
            }
        )
    rows.append(
        {
            "kind": "profile-summary",
            "shape": shape,
            "what": "CUDA kernels" if cuda else "CPU ops (top level)",
            "kernels_per_forward": kernels / forwards,
            "copies_per_forward": copies / forwards,
            "device_ms_per_forward": total_us / 1e3 / forwards,
            "wall_ms_per_forward": wall * 1e3,
            "forwards": forwards,
        }
    )
    return rows


# ---------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="End to end with the winners applied (stage (d)).")
    p.add_argument("--out", required=True, help="JSON-lines file the rows are appended to")
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--model", default=None, help="preset or folder (default bert-base)")
    p.add_argument("--dtype", default=None, help="default float16 (float32 in a dry run)")
    p.add_argument("--device", default=None, help="default cuda (cpu in a dry run)")
    p.add_argument("--shapes", default=None, help=f"default {DEFAULT_SHAPES}")
    p.add_argument("--seconds", type=float, default=None, help="timing per case (1; 0.05 dry)")
    p.add_argument("--isolation", default=None, help="process (default) or inline (dry run)")
    p.add_argument("--profile-shape", default=None, help="default 32x128")
    p.add_argument("--no-max-autotune", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model: checks the script")
    return p


def main(argv=None) -> int:
    from bertfast.bench.isolated import open_runner
    from bertfast.bench.sweep import append_row, device_facts
    from bertfast.bench.timing import gemm_ceiling
    from bertfast.bench.workload import ModelDims, parse_shape
    from bertfast.cli.bench import measure_rows as _measure
    from bertfast.presets import resolve

    args = build_parser().parse_args(argv)
    t_start = time.perf_counter()
    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        print("gpu_e2e: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
        return 3
    dtype = getattr(torch, args.dtype or ("float32" if dry else "float16"))
    shapes = [
        parse_shape(s.strip())
        for s in (args.shapes or ("1x16,r4x12x32" if dry else DEFAULT_SHAPES)).split(",")
        if s.strip()
    ]
    isolation = args.isolation or ("inline" if dry else "process")
    seconds = args.seconds if args.seconds is not None else (0.05 if dry else 1.0)
    profile_shape = parse_shape(args.profile_shape or ("4x32" if dry else "32x128"))
    scratch = tempfile.TemporaryDirectory(prefix="bertfast-e2e-") if dry else None
    path = tiny_model(scratch.name) if dry else str(resolve(args.model or "bert-base"))
    model_name = "tiny (dry run)" if dry else (args.model or "bert-base")
    dims = ModelDims.from_path(path)
    with open(os.path.join(path, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    facts = device_facts(device)
    winners = os.environ.get("BERTFAST_WINNERS") or None
    from bertfast.ops import winners as w

    table = w.table_summary(torch.device(device)) if torch.device(device).type == "cuda" else None
    print(
        f"e2e: {model_name} {str(dtype)[6:]} on {facts.get('gpu') or facts.get('cpu')}; "
        f"BERTFAST_WINNERS={winners}; table in use: {table}; isolation {isolation}"
    )
    for label, lengths in shapes:
        pad = 1 - sum(lengths) / (len(lengths) * max(lengths))
        print(f"  shape {label}: batch {len(lengths)}, padded to {max(lengths)}, {pad:.0%} padding")
    ceiling = gemm_ceiling(device, dtype, budget_s=0.2 if dry else 0.5)
    ns = argparse.Namespace(device=device, path=path, seconds=seconds)
    common = {
        "stage": STAGE,
        "model": model_name,
        "dtype": str(dtype)[6:],
        "device": facts,
        "winners": winners,
        "winners_table": table,
        "isolation": isolation,
    }

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_start)

    def run_group(group: int, names: list[str]) -> int:
        """Load the group's providers, then measure shape by shape; rows as they come."""
        runners = {}
        n = 0
        try:
            for pr in providers(names, device):
                why = pr.unavailable(device, dtype)
                if why:
                    print(f"  skip {pr.name}: {why}")
                    append_row(args.out, dict(common, kind="skip", provider=pr.name, why=why))
                    continue
                t0 = time.perf_counter()
                try:
                    runners[pr.name] = (pr, open_runner(pr, path, device, dtype, isolation))
                except Exception as exc:  # a provider that cannot load is a row, not the end
                    why = f"failed to load ({type(exc).__name__}: {exc})"[:400]
                    print(f"  skip {pr.name}: {why}")
                    append_row(args.out, dict(common, kind="skip", provider=pr.name, why=why))
                    continue
                print(f"  loaded {pr.name} in {time.perf_counter() - t0:.1f} s", flush=True)
            if not runners:
                return 0
            for label, lengths in shapes:
                if left() <= 0:
                    print(f"  budget spent before group {group} shape {label}")
                    break
                rows, ref = _measure(runners, [(label, lengths)], dims, vocab, ns, ceiling, dtype)
                pad = 1 - sum(lengths) / (len(lengths) * max(lengths))
                for r in rows:
                    r.update(common, kind="e2e", group=group, parity_ref=ref)
                    r.update(batch=len(lengths), seqlen=max(lengths), padding=round(pad, 4))
                    append_row(args.out, r)
                    n += 1
                    print(
                        f"  {label:12s} {r['provider']:28s} {r['median_ms']:9.3f} ms {r['parity']}",
                        flush=True,
                    )
        finally:
            for _, r in runners.values():
                r.close()
        return n

    if dry:
        group1 = ["bertfast-auto", "bertfast-torch", "transformers-sdpa"]
    else:
        group1 = ["transformers-eager", "transformers-sdpa", "bertfast-auto"]
    written = run_group(1, group1)

    if left() > 0:
        try:
            rows = kernel_profile(path, device, dtype, profile_shape[1], vocab)
        except Exception as exc:  # the profiler is a report, never the end of the run
            print(f"  profile failed: {type(exc).__name__}: {exc}")
            rows = []
        for r in rows:
            append_row(args.out, dict(common, **r))
        if rows:
            s = rows[-1]
            print(
                f"  profile {s['shape']}: {s['kernels_per_forward']:.0f} {s['what']} per "
                f"forward, {s['device_ms_per_forward']:.3f} ms of them, wall "
                f"{s['wall_ms_per_forward']:.3f} ms"
            )
            for r in rows[:-1]:
                print(
                    f"    {r['ms_per_forward']:8.3f} ms {r['share']:6.1%} "
                    f"{r['calls_per_forward']:6.1f}x  {r['name'][:90]}"
                )

    later = [] if dry else [(2, ["torch-compile", "bertfast-cuda", "bertfast-triton"])]
    if not dry and not args.no_max_autotune:
        later.append((3, ["torch-compile-max-autotune"]))
    for group, names in later:
        if left() > 60:
            written += run_group(group, ["transformers-eager", "transformers-sdpa", *names])
        else:
            what = ", ".join(names)
            print(f"  group {group} ({what}) skipped: {left():.0f} s of the budget left")
    if scratch is not None:
        scratch.cleanup()
    print(f"done: {written} e2e rows in {time.perf_counter() - t_start:.0f} s -> {args.out}")
    return 0 if written else 1


if __name__ == "__main__":
    # Run as the module ``gpu_e2e`` so its provider classes unpickle in worker processes.
    sys.path.insert(0, HERE)
    import gpu_e2e

    sys.exit(gpu_e2e.main())
