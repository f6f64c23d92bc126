"""``bertfast info``: the build, the CPU's features, backends per device, versions."""

from __future__ import annotations

import json
from importlib import metadata

NAME = "info"


def add_parser(sub) -> None:
    p = sub.add_parser(NAME, help="build contents, backends per device, versions")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def run(args) -> int:
    """Print what this installation can run (--json: as JSON)."""
    import platform

    import torch

    from .. import __version__
    from ..info import (
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
        print(
            f"  built with   : torch {build.get('torch_built') or 'unknown'} headers, "
            f"loads with torch >= {build.get('torch_min') or 'unknown'} (stable ABI)"
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
