"""What this installation can run: the native build's contents and each backend's status."""

from __future__ import annotations

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
