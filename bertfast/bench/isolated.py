"""Time each provider in its own process.

Runtimes that share a process slow each other down: their OpenMP / TBB thread pools
fight over the cores (on 2 cores, both torch-based providers ran about 2x slower with
ONNX Runtime, OpenVINO and CTranslate2 loaded beside them). So each provider gets a
:class:`Worker`: a subprocess that loads the model once (with the parent's thread
count) and then, on request, runs a batch for parity, times calls of it, or measures
its peak memory. The parent keeps the order of the rounds (alternating between
providers, one at a time, the others asleep on their pipe), so load spikes still hit
every provider alike. Each round starts with untimed calls for ``settle_s`` seconds
(:data:`~bertfast.bench.timing.SETTLE_S`): a runtime whose process was idle while
another ran is up to 2x slower for its next 20-30 ms, whoever it is.

:class:`LocalRunner` offers the same methods for a provider run in the calling process
(``isolation="inline"``). :func:`open_runner` picks one.

Messages are pickled over two private pipes (the worker's stdout and stderr go to a
log file whose tail explains a crash).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

import torch

from .timing import peak_memory, resident_bytes, settle, synchronize
from .workload import Batch

__all__ = ["Worker", "LocalRunner", "open_runner", "ISOLATION_MODES"]

ISOLATION_MODES = ("process", "inline")


class LocalRunner:
    """A provider loaded in this process, behind the :class:`Worker` interface."""

    def __init__(self, provider, model_path: str, device: str, dtype: torch.dtype):
        self.name = provider.name
        self.device = device
        rss0 = resident_bytes()
        self.run = provider.load(model_path, device, dtype)
        self.info = getattr(self.run, "info", None)
        self._batch: Batch | None = None
        self._memory = {"rss_before_load": rss0, "load": _growth(resident_bytes(), rss0)}

    def prepare(self, batch: Batch) -> tuple[torch.Tensor, float]:
        """Two warm calls on ``batch`` (kept for :meth:`timed`): the first one's output
        (for parity) and the second one's time (to plan the rounds)."""
        self._batch = batch
        out = self.run(batch)
        synchronize(self.device)
        if "first_call" not in self._memory:  # see memory()
            rss0 = self._memory["rss_before_load"]
            self._memory["first_call_untrimmed"] = _growth(resident_bytes(), rss0)
            self._memory["first_call"] = _growth(resident_bytes(trim=True), rss0)
            self._memory["first_call_shape"] = tuple(batch.input_ids.shape)
        t0 = time.perf_counter()
        self.run(batch)
        synchronize(self.device)
        return out, time.perf_counter() - t0

    def timed(self, n: int = 1, settle_s: float = 0.0) -> list[float]:
        """``n`` timed calls on the prepared batch, synchronized around each; with
        ``settle_s`` > 0, after untimed calls for that long (at least one)."""
        if settle_s > 0:
            settle(lambda: self.run(self._batch), self.device, settle_s)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.run(self._batch)
            synchronize(self.device)
            times.append(time.perf_counter() - t0)
        return times

    def peak(self) -> int | None:
        return peak_memory(lambda: self.run(self._batch), self.device)

    def memory(self) -> dict:
        """Resident-set growth (bytes, CPU; None where unknown) over the process as it
        was before the load: ``load`` right after it, ``first_call`` after the first
        call (of shape ``first_call_shape``) with freed heap memory returned first
        (``malloc_trim``; what the runtime keeps: weights, caches, buffers), and
        ``first_call_untrimmed`` without that (plus the freed activations glibc keeps
        for reuse). Meaningful in a worker process of its own."""
        return dict(self._memory)

    def close(self) -> None:
        self.run = None


class Worker:
    """A provider loaded in a subprocess of its own (see the module doc). Raises
    ``RuntimeError`` with the worker's reason (and its log's tail on a crash)."""

    def __init__(
        self,
        provider,
        model_path: str,
        device: str,
        dtype: torch.dtype,
        threads: int | None = None,
        timeout_s: float | None = None,
    ):
        self.name = provider.name
        self.info = None
        threads = threads or torch.get_num_threads()
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self._log = tempfile.NamedTemporaryFile(
            prefix=f"bertfast-worker-{provider.name}-", suffix=".log", delete=False
        )
        env = dict(os.environ)
        # The parent's import path, so providers defined next to the caller (e.g.
        # benchmarks/gpu_e2e.py's AutoProvider) unpickle in the worker.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
        code = "import sys; from bertfast.bench.isolated import _serve; _serve(*sys.argv[1:3])"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._w = os.fdopen(to_child_w, "wb")
        self._r = os.fdopen(from_child_r, "rb")
        self.info = self._call("load", provider, model_path, device, dtype, threads)

    def _tail(self) -> str:
        try:
            with open(self._log.name, errors="replace") as f:
                lines = [ln for ln in f.read().splitlines() if ln.strip()]
            return " | ".join(lines[-5:])[-600:]
        except OSError:
            return ""

    def _call(self, *msg):
        try:
            pickle.dump(msg, self._w, protocol=pickle.HIGHEST_PROTOCOL)
            self._w.flush()
            status, value = pickle.load(self._r)
        except (EOFError, BrokenPipeError, OSError) as exc:
            code = self._proc.poll()
            raise RuntimeError(
                f"{self.name} worker process died ({type(exc).__name__}, exit code {code}): "
                f"{self._tail()}"
            ) from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def prepare(self, batch: Batch) -> tuple[torch.Tensor, float]:
        return self._call("prepare", batch)

    def timed(self, n: int = 1, settle_s: float = 0.0) -> list[float]:
        return self._call("timed", n, settle_s)

    def peak(self) -> int | None:
        return self._call("peak")

    def memory(self) -> dict:
        return self._call("memory")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                pickle.dump(("quit",), self._w)
                self._w.flush()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for f in (self._w, self._r):
            try:
                f.close()
            except OSError:
                pass
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass


def _growth(now: int | None, before: int | None) -> int | None:
    return None if now is None or before is None else now - before


def open_runner(
    provider, model_path: str, device: str, dtype: torch.dtype, isolation: str = "process"
):
    """A :class:`Worker` (``isolation="process"``) or a :class:`LocalRunner`."""
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, not {isolation!r}")
    if isolation == "inline":
        return LocalRunner(provider, model_path, device, dtype)
    return Worker(provider, model_path, device, dtype)


def _serve(read_fd: str, write_fd: str) -> None:
    """The worker's loop: one request at a time until ``quit`` or the pipe closes."""
    r = os.fdopen(int(read_fd), "rb")
    w = os.fdopen(int(write_fd), "wb")
    runner: LocalRunner | None = None

    def reply(status, value):
        pickle.dump((status, value), w, protocol=pickle.HIGHEST_PROTOCOL)
        w.flush()

    handlers: dict[str, Callable] = {}

    def load(provider, model_path, device, dtype, threads):
        nonlocal runner
        torch.set_num_threads(int(threads))
        runner = LocalRunner(provider, model_path, device, dtype)
        return runner.info

    def prepare(batch):
        out, seconds = runner.prepare(batch)
        return out.detach().to("cpu", torch.float32), seconds

    handlers.update(
        load=load,
        prepare=prepare,
        timed=lambda n, settle_s=0.0: runner.timed(n, settle_s),
        peak=lambda: runner.peak(),
        memory=lambda: runner.memory(),
    )
    while True:
        try:
            msg = pickle.load(r)
        except EOFError:
            return
        if msg[0] == "quit":
            return
        try:
            reply("ok", handlers[msg[0]](*msg[1:]))
        except Exception as exc:
            traceback.print_exc()
            sys.stdout.flush()
            reply("err", f"{type(exc).__name__}: {exc}"[:500])
