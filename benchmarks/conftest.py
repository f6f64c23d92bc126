"""pytest configuration of the benchmark suite (``pytest benchmarks``).

Options (each also readable from an environment variable, handy for subprocesses):

``--bench-profile``    smoke | quick | full (``BERTFAST_BENCH_PROFILE``; ``smoke`` when
                       ``BERTFAST_BENCH_SMOKE=1``; default ``quick`` on CPU, ``full`` on GPU)
``--bench-models``     comma list overriding the profile's models (``BERTFAST_BENCH_MODELS``)
``--bench-kinds``      comma list of workload kinds: grid, ragged, padding
``--bench-providers``  comma list of provider names (``BERTFAST_BENCH_PROVIDERS``)
``--bench-device``     cpu | cuda (default: cuda when available)
``--bench-dtype``      float32 | float16 | bfloat16 (default: fp32 on CPU, fp16 on GPU)
``--bench-threads``    torch / ORT CPU threads (default 2)
``--bench-budget``     seconds of timed calls per case (default 3; smoke: one round)
``--bench-isolation``  process | inline (``BERTFAST_BENCH_ISOLATION``; default process):
                       each end-to-end provider loads and runs in a worker process of
                       its own (``bertfast.bench.Worker``), so runtimes do not fight over
                       the cores through their thread pools; ``inline`` loads them all in
                       the pytest process (faster to start, biased timings)

Every end-to-end case is (model, workload, provider). They run model by model and,
within a workload, baselines first, so a bertfast row can store its speedup over each
baseline measured in the same run (``extra_info["ratios"]``). Every row records the CPU
(``extra_info["cpu"]``: model, SIMD flags, logical CPUs) and the isolation mode.
"""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # conftest imports test_bench_kernels (its case table)
    sys.path.insert(0, HERE)

from bertfast.bench import (  # noqa: E402
    PARITY_TOL,
    cpu_info,
    device_name,
    gemm_ceiling,
    open_runner,
    registry,
    workload,
)


def _env(name: str) -> str | None:
    v = os.environ.get(name, "").strip()
    return v or None


def pytest_addoption(parser):
    g = parser.getgroup("bertfast-bench")
    g.addoption("--bench-profile", default=None)
    g.addoption("--bench-models", default=None)
    g.addoption("--bench-kinds", default=None)
    g.addoption("--bench-providers", default=None)
    g.addoption("--bench-device", default=None)
    g.addoption("--bench-dtype", default=None)
    g.addoption("--bench-threads", type=int, default=None)
    g.addoption("--bench-budget", type=float, default=None)
    g.addoption("--bench-isolation", default=None, choices=("process", "inline"))


def _csv(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


class Settings:
    def __init__(self, config):
        opt = config.getoption
        self.device = (
            opt("--bench-device")
            or _env("BERTFAST_BENCH_DEVICE")
            or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.gpu = torch.device(self.device).type == "cuda"
        self.smoke = workload.smoke()
        self.profile = (
            opt("--bench-profile")
            or _env("BERTFAST_BENCH_PROFILE")
            or ("smoke" if self.smoke else ("full" if self.gpu else "quick"))
        )
        if self.profile == "smoke":
            self.smoke = True
        dtype = opt("--bench-dtype") or _env("BERTFAST_BENCH_DTYPE")
        self.dtype = (
            getattr(torch, dtype) if dtype else (torch.float16 if self.gpu else torch.float32)
        )
        self.threads = opt("--bench-threads") or int(_env("BERTFAST_BENCH_THREADS") or 2)
        budget = opt("--bench-budget")
        if budget is None and _env("BERTFAST_BENCH_BUDGET"):
            budget = float(_env("BERTFAST_BENCH_BUDGET"))
        self.budget = (
            0.0 if (self.smoke and budget is None) else (3.0 if budget is None else budget)
        )
        self.isolation = opt("--bench-isolation") or _env("BERTFAST_BENCH_ISOLATION") or "process"
        if self.isolation not in ("process", "inline"):
            raise pytest.UsageError(
                f"BERTFAST_BENCH_ISOLATION must be process or inline, not {self.isolation!r}"
            )
        self.models = _csv(opt("--bench-models") or _env("BERTFAST_BENCH_MODELS"))
        self.kinds = _csv(opt("--bench-kinds") or _env("BERTFAST_BENCH_KINDS"))
        names = _csv(opt("--bench-providers") or _env("BERTFAST_BENCH_PROVIDERS"))
        if names is None and self.smoke:
            # torch.compile takes minutes on 2 cores: out of the smoke run unless asked.
            names = [p for p in self._all_provider_names() if p != "torch-compile"]
        self.provider_names = names

    def _all_provider_names(self):
        return [p.name for p in registry.suite_providers(self.device)]

    @property
    def tol(self) -> float:
        return PARITY_TOL.get(self.dtype, 5e-2)


def pytest_configure(config):
    config._bench = Settings(config)
    s = config._bench
    if not s.gpu:
        torch.set_num_threads(s.threads)


def _e2e_cases(config):
    s = config._bench
    plan = workload.select(s.profile, s.models, s.kinds)
    cache = workload.suite_cache()
    provs = registry.suite_providers(s.device, cache)
    if s.provider_names:
        known = registry.known_providers(s.device, cache)
        for n in s.provider_names:
            if n not in known and n.startswith("bertfast-"):
                known[n] = registry.provider_by_name(n, s.device, cache)
        provs = [known[n] for n in s.provider_names if n in known]
    provs = sorted(provs, key=lambda p: 0 if p.is_baseline else 1)  # stable: baselines first
    cases = []
    for model, wls in plan.items():
        for w in wls:
            for p in provs:
                cases.append(pytest.param((model, w, p), id=f"{model}-{w.id}-{p.name}"))
    return cases


def pytest_generate_tests(metafunc):
    if "e2e_case" in metafunc.fixturenames:
        metafunc.parametrize("e2e_case", _e2e_cases(metafunc.config))
    if "kernel_case" in metafunc.fixturenames:
        import test_bench_kernels

        metafunc.parametrize("kernel_case", test_bench_kernels.cases(metafunc.config._bench))


def pytest_collection_modifyitems(session, config, items):
    """Record, per (model, workload), the providers whose cases were selected: they are
    timed together, interleaved round by round (see ``Context.measure_workload``)."""
    groups: dict[tuple, list] = {}
    kgroups: dict[tuple, list] = {}
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is None:
            continue
        if "e2e_case" in spec.params:
            model, w, provider = spec.params["e2e_case"]
            groups.setdefault((model, w.id), []).append(provider)
        if "kernel_case" in spec.params:
            op, tokens, hidden, impl = spec.params["kernel_case"]
            kgroups.setdefault((op, tokens, hidden), []).append(impl)
    config._bench.groups = groups
    config._bench.kernel_groups = kgroups


class Context:
    """Session state: the machine's ceiling, loaded providers of the current model
    (``runners``: a ``bertfast.bench.Worker`` per provider, or a ``LocalRunner`` with
    ``--bench-isolation inline``), reference outputs, and the medians measured so far
    (for ratios)."""

    def __init__(self, settings: Settings):
        self.s = settings
        self._ceiling: float | None = None
        self.model: str | None = None
        self.runners: dict[str, object] = {}
        self.load_errors: dict[str, str] = {}
        self.refs: dict[tuple, torch.Tensor] = {}
        self.medians: dict[tuple, dict[str, float]] = {}
        self.measured: dict[tuple, dict] = {}
        self.device_name = device_name(settings.device)
        self.cpu = cpu_info()

    @property
    def ceiling(self) -> float:
        if self._ceiling is None:
            n = 256 if self.s.smoke else 2048
            self._ceiling = gemm_ceiling(
                self.s.device, self.s.dtype, n=n, budget_s=0.2 if self.s.smoke else 3.0
            )
        return self._ceiling

    def close(self):
        for r in self.runners.values():
            close = getattr(r, "close", None)
            if close is not None:
                close()
        self.runners.clear()

    def use_model(self, model: str):
        if model != self.model:
            self.close()
            self.load_errors.clear()
            self.refs.clear()
            gc.collect()
            if self.s.gpu:
                torch.cuda.empty_cache()
            self.model = model

    def load(self, provider, path: str):
        """The provider's runner (``prepare`` / ``timed`` / ``peak`` / ``info``), or an
        exception whose message says why not."""
        if provider.name in self.load_errors:
            raise RuntimeError(self.load_errors[provider.name])
        if provider.name not in self.runners:
            try:
                self.runners[provider.name] = open_runner(
                    provider, path, self.s.device, self.s.dtype, self.s.isolation
                )
            except Exception as exc:
                self.load_errors[provider.name] = (
                    f"{provider.name} failed to load: {type(exc).__name__}: {exc}"[:500]
                )
                raise RuntimeError(self.load_errors[provider.name]) from None
        return self.runners[provider.name]


def record_rounds(benchmark, times) -> bool:
    """Hand externally timed rounds (interleaved across providers) to pytest-benchmark,
    so its JSON, tables and comparisons work as usual. Uses its stats object (private
    API); returns False where that is unavailable or benchmarking is disabled, and the
    caller then times the case on its own with ``benchmark.pedantic``."""
    if getattr(benchmark, "disabled", False) or not times:
        return False
    try:
        stats = benchmark._make_stats(1)
        for t in times:
            stats.update(t)
        benchmark._mode = "interleaved"
        return True
    except AttributeError:
        return False


def interleave(
    calls: dict[str, object],
    one: dict[str, float],
    budget_s: float,
    smoke: bool,
    self_timed: frozenset = frozenset(),
) -> dict[str, list[float]]:
    """Time ``calls`` (name -> synchronized call) round-robin: round r runs every call
    once in an order rotated by r, until ``budget_s x len(calls)`` seconds are spent
    (at least 5 rounds, 3 when one round takes over 3 s; 1 in smoke runs). A call named
    in ``self_timed`` times itself and returns its seconds, or a list of them (a provider
    in its worker process: the pipe round trip stays out of its time; ``one`` then holds
    its whole round's seconds)."""
    import time

    from bertfast.bench import rounds_for

    times: dict[str, list[float]] = {n: [] for n in calls}
    if not calls:
        return times
    per_round = sum(one.values())
    rounds = (
        1
        if smoke
        else rounds_for(per_round, budget_s * len(calls), min_rounds=3 if per_round > 3.0 else 5)
    )
    order = list(calls)
    for r in range(rounds):
        k = r % len(order)
        for n in order[k:] + order[:k]:
            if n in self_timed:
                got = calls[n]()
                times[n] += [float(t) for t in got] if isinstance(got, list) else [float(got)]
                continue
            t0 = time.perf_counter()
            calls[n]()
            times[n].append(time.perf_counter() - t0)
    return times


@pytest.fixture(scope="session")
def timing():
    """The interleaved-timing helpers above, for the test modules."""
    import types

    return types.SimpleNamespace(record=record_rounds, interleave=interleave)


@pytest.fixture(scope="session")
def bench(request):
    ctx = Context(request.config._bench)
    yield ctx
    ctx.close()
