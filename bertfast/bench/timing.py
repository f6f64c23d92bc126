"""How a benchmark times: warmup and robust statistics, peak memory of one call, the
machine's GEMM ceiling, and a short name for the machine."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..checkpoint import release_freed_memory
from ..info import cpu_info

__all__ = [
    "Stats",
    "synchronize",
    "call_times",
    "measure",
    "rounds_for",
    "SETTLE_S",
    "settle",
    "block_size",
    "peak_memory",
    "resident_bytes",
    "checkpoint_bytes",
    "gemm_ceiling",
    "packed_gemms",
    "device_name",
    "cpu_info",
]


@dataclass
class Stats:
    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def iqr(self) -> float:
        if len(self.times) < 4:
            return max(self.times) - min(self.times)
        q = statistics.quantiles(self.times, n=4)
        return q[2] - q[0]

    @property
    def min(self) -> float:
        return min(self.times)


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def call_times(owner, name: str) -> Iterator[list[float]]:
    """While open, ``owner.name`` is wrapped so that each call's wall time (seconds)
    is appended to the yielded list; the original is put back on exit. For the
    experiments that time one function the code reaches by name (the one native
    forward, ``cpu.encoder_forward``; a oneDNN or C++ op) inside a whole forward."""
    real = getattr(owner, name)
    times: list[float] = []

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - t0)

    setattr(owner, name, timed)
    try:
        yield times
    finally:
        setattr(owner, name, real)


def measure(
    fn: Callable[[], object],
    device="cpu",
    warmup: int = 2,
    min_rounds: int = 5,
    max_rounds: int = 200,
    budget_s: float = 2.0,
) -> Stats:
    """Run ``fn`` ``warmup`` times, then time it until ``budget_s`` is spent (at least
    ``min_rounds`` and at most ``max_rounds`` calls), synchronizing around each call."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_rounds and (
        len(times) < min_rounds or time.perf_counter() - start < budget_s
    ):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return Stats(times)


def rounds_for(
    seconds_per_call: float, budget_s: float, min_rounds: int = 3, max_rounds: int = 200
) -> int:
    """How many rounds fit ``budget_s`` given one call's time."""
    if seconds_per_call <= 0:
        return max_rounds
    return int(min(max(budget_s / seconds_per_call, min_rounds), max_rounds))


#: Seconds of untimed calls a provider runs before its timed calls in each round of an
#: interleaved benchmark. Measured on a 2-core Xeon VM (MiniLM 1x16, ~3 ms a call):
#: after its process has been idle for >= 20 ms, or after another runtime's process
#: ran, every runtime's calls are up to 2x slower and settle back over 20-30 ms
#: (bertfast 6.2 -> 2.9 ms, OpenVINO 6.1 -> 2.3, ONNX Runtime 4.9 -> 3.3 over 8
#: calls), with no other process using the cores meanwhile (idle workers spend no CPU
#: time). One warm call, as before, left bertfast 1.9x and OpenVINO 1.7x above their
#: times alone. Every provider gets the same settle time, so each is timed in the
#: steady state a user serving requests back to back sees.
SETTLE_S = 0.05


def settle(fn: Callable[[], object], device="cpu", settle_s: float = SETTLE_S) -> int:
    """Run ``fn`` untimed (synchronized) until ``settle_s`` seconds have passed, at
    least once; return the number of calls."""
    calls = 0
    start = time.perf_counter()
    while calls == 0 or time.perf_counter() - start < settle_s:
        fn()
        synchronize(device)
        calls += 1
    return calls


def block_size(seconds_per_call: float, settle_s: float = SETTLE_S, max_calls: int = 16) -> int:
    """Timed calls per round after a settle: about ``settle_s`` worth (at least one), so
    the settle time is not most of the round."""
    if seconds_per_call <= 0:
        return max_calls
    return int(min(max(settle_s / seconds_per_call, 1), max_calls))


def _proc_status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def resident_bytes(trim: bool = False) -> int | None:
    """The process's resident set (``VmRSS``) in bytes after a garbage collection;
    with ``trim``, after ``malloc_trim`` too, so heap memory glibc keeps after a
    ``free`` (the freed activations of a call, mostly) is left out. ``None`` where
    ``/proc`` is not available."""
    gc.collect()
    if trim:
        release_freed_memory()  # the next call's working set shows up as growth
    try:
        kb = _proc_status_kb("VmRSS")
    except OSError:
        return None
    return kb * 1024 if kb else None


def checkpoint_bytes(folder) -> int | None:
    """The bytes of the tensors in a checkpoint folder's weight files (what the
    model's resident growth is compared with), read from the safetensors headers or
    the state dict; ``None`` when the folder has no weights bertfast can read."""
    import math

    from ..checkpoint import find_weight_files

    try:
        fmt, files = find_weight_files(str(folder))
    except (OSError, ValueError):
        return None
    total = 0
    for path in files:
        if fmt == "safetensors":
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    total += math.prod(sl.get_shape()) * _SAFETENSORS_SIZES.get(sl.get_dtype(), 0)
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            total += sum(t.numel() * t.element_size() for t in sd.values())
    return total


#: Bytes per element of the safetensors dtype names.
_SAFETENSORS_SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2}
_SAFETENSORS_SIZES.update(BF16=2, I16=2, U16=2, I8=1, U8=1, BOOL=1, F8_E4M3=1, F8_E5M2=1)


def peak_memory(fn: Callable[[], object], device="cpu") -> int | None:
    """Bytes of memory one call of ``fn`` needs beyond what was held before it.

    CUDA: ``torch.cuda.max_memory_allocated`` growth over the call. CPU (Linux): growth
    of the resident set's high-water mark (VmHWM, reset through
    ``/proc/self/clear_refs``) over the resident set before the call, after
    ``malloc_trim`` has returned freed heap memory to the OS. ``None`` where
    neither is available.
    """
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        del out
        return int(torch.cuda.max_memory_allocated() - before)
    try:
        gc.collect()
        release_freed_memory()  # the next call's working set shows up as growth
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _proc_status_kb("VmRSS")
        out = fn()
        peak = _proc_status_kb("VmHWM")
        del out
        return max(peak - before, 0) * 1024
    except OSError:
        return None


def gemm_ceiling(
    device="cpu",
    dtype=torch.float32,
    n: int = 2048,
    budget_s: float = 2.0,
    with_bertfast: bool = False,
) -> float:
    """The machine's achievable GEMM throughput (GFLOP/s): an ``n x n x n`` matmul via
    ``torch.mm``, or with ``with_bertfast`` the best of that, ``bertfast.ops.linear``
    on each usable backend, and (on the CPU) the GEMMs a loaded model runs: the weight
    packed as ``from_pretrained`` packs it, in each form this machine has (oneDNN's
    blocked layout, the C++ GEMM's panels). Torch's sgemm alone can understate the
    machine: on AMD EPYC Zen 4 (2 threads) it reached 198 GFLOP/s where oneDNN's packed
    inner product reached 227, so a model's GEMMs read as over 100% of the ceiling."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    fns = [lambda: torch.mm(a, b)]
    if with_bertfast:
        from .. import ops
        from .providers import bertfast_backends

        fns += [
            lambda be=be: ops.linear(a, b, None, backend=be) for be in bertfast_backends(device)
        ]
        if a.device.type == "cpu":
            fns += list(packed_gemms(a, b).values())
    best = 0.0
    for fn in fns:
        try:
            stats = measure(fn, device, warmup=3, min_rounds=5, budget_s=budget_s)
        except Exception:  # a backend without a kernel for this input
            continue
        best = max(best, 2 * n**3 / stats.median / 1e9)
    return best


def packed_gemms(a: torch.Tensor, b: torch.Tensor) -> dict:
    """``a @ b.T`` (CPU tensors) on ``b`` packed as a model bertfast loads packs its
    weights: ``{"bertfast.ops.linear[packed, <form>]": callable}`` for each packed
    form the machine has (oneDNN's blocked layout, the C++ GEMM's panels; none where
    bertfast's C++ part is missing or the dtype has no packed form)."""
    try:
        from ..ops import cpu as cpu_ops
        from ..ops.cpu import weights as cpu_weights
    except ImportError:
        return {}
    fns = {}
    for storage in ("onednn", "own"):
        try:
            packed = cpu_weights.PackedWeight.of(b, storage)
        except Exception:  # no such form for this dtype, or no C++ part / oneDNN in this build
            continue
        fns[f"bertfast.ops.linear[packed, {storage}]"] = lambda p=packed: cpu_ops.linear(
            a, p, None, None
        )
    return fns


def device_name(device="cpu") -> str:
    """A short, path-safe name for the machine: ``cpu-<model>-<threads>t`` or the GPU."""
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
        name = name.replace("NVIDIA", "").strip()
    else:
        name = "cpu"
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        name = f"cpu-{name}-{torch.get_num_threads()}t"
    slug = "".join(c.lower() if c.isalnum() else "-" for c in name)
    while "--" in slug:
        slug = slug.replace("--", "-")
    return slug.strip("-")
