"""What this installation can run: the native build's contents and each backend's status."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch

from .ops.dispatch import backend_status


def git_revision(mark_dirty: bool = False) -> str | None:
    """The short commit of the git checkout bertfast runs from, with ``-dirty`` where
    ``mark_dirty`` and tracked files differ from it; None outside a checkout (an
    installed wheel) or without git. What benchmark results and tuned tables record."""
    here = str(Path(__file__).resolve().parent)

    def git(*args: str) -> str | None:
        out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None

    try:
        rev = git("rev-parse", "--short", "HEAD")
        if rev and mark_dirty and git("status", "--porcelain", "--untracked-files=no"):
            rev += "-dirty"
        return rev or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_info() -> dict[str, object]:
    """What ``bertfast._C`` was built with (``torch_built``: the torch whose headers
    compiled it; ``torch_min``: the oldest torch it loads with, its stable-ABI target),
    or why it cannot be loaded."""
    from .ops import native

    if native.IMPORT_ERROR is not None:  # pragma: no cover - only without a usable build
        return {"native": False, "error": native.IMPORT_ERROR}
    info = dict(native._C.build_info())
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
    from .ops import native

    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                    break
    except OSError:
        pass
    have = native.cpu_flags()
    flags = None if have is None else sorted(f for f in have if f.startswith(_SIMD_PREFIXES))
    return {"model": model, "flags": flags, "logical_cpus": os.cpu_count()}


def winners_table() -> str:
    """Which winners table ``backend="auto"`` follows on cuda:0 (``bertfast.ops.winners``)."""
    if not torch.cuda.is_available():
        return "none (no CUDA device visible)"
    from .ops.winners import table_summary

    return table_summary(0) or "none found (auto walks the preference order)"


# ---------------------------------------------------------------- low precision on CPU
#: The CPU flags (as /proc/cpuinfo names them) that give native dot products per
#: low-precision type: the one place bertfast decides what a CPU can do in bf16 / int8.
NATIVE_DOT_FLAGS = {
    "bf16": ("avx512_bf16", "amx_bf16"),
    "int8": ("avx512_vnni", "avx_vnni", "amx_int8"),
}
_AVX512 = ("avx512f", "avx512dq", "avx512vl", "avx512bw")


def _flag_set(flags: list[str] | None) -> set[str]:
    if flags is None:
        flags = cpu_info()["flags"]
    return set(flags or [])


def native_dot_products(flags: list[str] | None = None) -> dict[str, list[str]]:
    """For ``"bf16"`` and ``"int8"``: the native dot-product flags this CPU has (empty:
    none, the fallback paths run). ``flags`` defaults to :func:`cpu_info`'s."""
    have = _flag_set(flags)
    return {kind: [f for f in names if f in have] for kind, names in NATIVE_DOT_FLAGS.items()}


def _bf16_small_rows() -> str:
    """``cpu_weights.BF16_SMALL_ROWS`` as text, or "a few" where the C++ part is missing."""
    try:
        from .ops.cpu.weights import BF16_SMALL_ROWS
    except Exception:  # no bertfast._C (or no torch oneDNN) in this install
        return "a few"
    return str(BF16_SMALL_ROWS)


def low_precision_paths(flags: list[str] | None = None) -> dict[str, str]:
    """What bf16 and int8 models run on with this CPU's flags (``cpu_info()``'s by
    default): ``bf16_attention``, ``bf16_gemm``, ``int8``, each a short description.

    The C++ attention picks its micro-kernels from the same facts at run time
    (``__builtin_cpu_supports`` / cpuid; ``BERTFAST_CPU_ATTENTION_ISA=avx512bf16``,
    ``avx512`` or ``avx2`` forces a lesser path, and is honoured here too)."""
    have = _flag_set(flags)
    forced = os.environ.get("BERTFAST_CPU_ATTENTION_ISA", "").strip()
    avx512 = all(f in have for f in _AVX512) and forced != "avx2"
    bf16_dot = avx512 and "avx512_bf16" in have and forced != "avx512"
    if bf16_dot and "amx_bf16" in have and forced != "avx512bf16":
        attention = "AMX tiles (amx_bf16): bf16 products, fp32 sums and softmax"
    elif bf16_dot:
        why = f"; BERTFAST_CPU_ATTENTION_ISA={forced}" if forced else ""
        attention = f"vdpbf16ps (avx512_bf16{why}): bf16 products, fp32 sums and softmax"
    else:
        why = f"BERTFAST_CPU_ATTENTION_ISA={forced}" if forced else "no avx512_bf16"
        isa = "AVX-512" if avx512 else "AVX2"
        attention = f"fp32 math on bf16 storage ({isa}; {why}), slower than fp32"
    if "amx_bf16" in have:  # where the OS grants the tiles: cpu_weights.BF16_PANELS
        rows = _bf16_small_rows()
        gemm = f"bertfast's AMX GEMM up to {rows} rows, oneDNN bf16 on AMX above (amx_bf16)"
    elif "avx512_bf16" in have:
        gemm = "oneDNN bf16 on avx512_bf16"
    else:
        gemm = "torch's bf16 matmul (no avx512_bf16 / amx_bf16), slower than fp32"
    # kernels/cpu/qgemm.cpp: AMX tiles when amx_int8 (and the OS grants the tiles) for
    # K % 64 == 0, vpdpbusd with AVX-512 VNNI, else the exact AVX2 kernel;
    # BERTFAST_CPU_INT8_ISA=vnni / avx2 forces a lesser one.
    forced8 = os.environ.get("BERTFAST_CPU_INT8_ISA", "").strip().lower()
    vnni = all(f in have for f in _AVX512) and "avx512_vnni" in have and forced8 != "avx2"
    if vnni and "amx_int8" in have and forced8 not in ("vnni", "avx2"):
        int8 = "AMX tiles (amx_int8; vpdpbusd where K % 64 != 0), int32 sums"
    elif vnni:
        why = f"; BERTFAST_CPU_INT8_ISA={forced8}" if forced8 else ""
        int8 = f"vpdpbusd (avx512_vnni{why}), int32 sums"
    else:
        why = f"BERTFAST_CPU_INT8_ISA={forced8}" if forced8 else "no AVX-512 VNNI"
        int8 = f"exact AVX2 integer kernel ({why}), slower than the fp32 GEMM"
    return {"bf16_attention": attention, "bf16_gemm": gemm, "int8": int8}


_BF16_WARNED = False


def warn_if_slow_bf16(device: torch.device, dtype: torch.dtype) -> bool:
    """Once per process: a ``warnings.warn`` when a bf16 model is loaded on a CPU
    without native bf16 dot products (no avx512_bf16 / amx_bf16), naming the slow
    path it will run. Returns whether it warned (now)."""
    global _BF16_WARNED
    if _BF16_WARNED or dtype != torch.bfloat16 or torch.device(device).type != "cpu":
        return False
    if native_dot_products()["bf16"]:
        return False
    _BF16_WARNED = True
    import warnings

    paths = low_precision_paths()
    warnings.warn(
        "bertfast: this CPU has no native bf16 dot products (avx512_bf16 / amx_bf16), so a "
        f"bf16 model runs slower than fp32 here: GEMMs on {paths['bf16_gemm']}, attention on "
        f"{paths['bf16_attention']}; load it with dtype=torch.float32 for speed",
        RuntimeWarning,
        stacklevel=3,
    )
    return True
