"""What this installation can run: the native build's contents and each backend's status."""

from __future__ import annotations

import os

import torch

from .ops.dispatch import backend_status


def build_info() -> dict[str, object]:
    """What ``bertfast._C`` was built with, or why it is missing."""
    try:
        from . import _C
    except ImportError as exc:  # pragma: no cover - only without a build
        return {"native": False, "error": str(exc)}
    info = dict(_C.build_info())
    info["native"] = True
    archs = [a for a in str(info.get("cuda_archs") or "").split(",") if a]
    info["cuda_archs"] = [f"sm_{a}" for a in archs]
    return info


def backends() -> dict[str, dict[str, str | None]]:
    """For each device type, each backend: ``None`` if usable, else the reason why not."""
    out = {"cpu": backend_status("cpu")}
    if torch.cuda.is_available():
        out["cuda"] = backend_status("cuda")
    else:
        out["cuda"] = {name: "no CUDA device visible to torch" for name in out["cpu"]}
    return out


#: The /proc/cpuinfo flags that decide which kernels a runtime can use.
_SIMD_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "vnni")


def cpu_info() -> dict:
    """The CPU model, its SIMD-relevant flags (AVX*, AMX*, FMA, F16C, SSE4*, VNNI) and
    logical CPU count, from ``/proc/cpuinfo`` (``model``/``flags`` None where it cannot
    be read): recorded with every result, since ratios move between machines."""
    model, flags = None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and flags is None:
                    flags = sorted(fl for fl in value.split() if fl.startswith(_SIMD_PREFIXES))
                if model is not None and flags is not None:
                    break
    except OSError:
        pass
    return {"model": model, "flags": flags, "logical_cpus": os.cpu_count()}
