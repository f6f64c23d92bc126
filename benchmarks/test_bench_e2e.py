"""End-to-end encoder benchmarks: bertfast against transformers (eager, SDPA),
torch.compile, ONNX Runtime, OpenVINO and CTranslate2 (fp32; int8 variants of ORT and
CTranslate2 reported apart), on the same inputs in the same run.

Each case is (model, workload, provider); see ``conftest.py`` for the options,
``bertfast/bench/workload.py`` (models, workloads, profiles) and
``bertfast/bench/registry.py`` (providers) for what runs.

How a workload is timed (this machine is shared and noisy): the first case of a
workload loads every selected provider, **each in a worker process of its own**
(``--bench-isolation process``, the default: runtimes sharing a process fight over the
cores through their thread pools), checks parity and warms each up twice, then times
them **interleaved**, the parent process deciding the order and one worker running at a
time: round r calls every provider once, in an order rotated by
r, until ``budget x providers`` seconds are spent (at least 5 rounds; 3 when one round
takes over 3 s). Load spikes then hit every provider alike and the ratios stay
meaningful. Each case then reports its own times to pytest-benchmark.

Per case ``extra_info`` holds:

- ``median_s``, ``iqr_s``, ``seq_per_s``, ``tok_per_s`` (real tokens per second);
- ``gflops``: useful (real-token) FLOPs / median; ``flops_useful`` and ``flops_padded``
  (what a padded implementation computes) beside it; ``ceiling_gflops``: the best of a
  2048^3 GEMM via ``torch.mm``, via ``bertfast.ops.linear`` on each usable backend and,
  on the CPU, on the weight packed as a loaded model packs it (oneDNN, C++ GEMM; same
  dtype and threads; ``gemm_gflops_by_impl`` keeps each), timed *inside the same
  interleaved rounds* so it saw the same load; ``ceiling_share`` = gflops / ceiling.
  Why not torch's alone: on this AMD Zen CPU torch's sgemm (MKL) reaches about half of
  what an AVX-512 packed GEMM does, so it is not the machine's ceiling;
- ``ratios``: speedup of this provider over each fp32 baseline timed with it (baseline
  median / this median; > 1 = faster); int8 peers (``int8``: true) are in no ratio and
  carry none;
- ``parity_max_abs_err`` / ``parity_ok``: max |out - ref| on real tokens against
  transformers eager fp32, so a fast-but-wrong provider is flagged (never asserted);
  ``parity_tol`` is ``PARITY_TOL`` of the dtype, ``INT8_PARITY_TOL`` for int8 peers;
- ``cpu``: the CPU model, SIMD flags and logical CPUs; ``isolation``: process | inline;
- ``peak_mem_bytes``: CUDA allocator peak growth (GPU) or resident-set growth (CPU) over
  one call; ``probe_gflops``: a 512^3 GEMM timed just before the workload and
  ``load_avg_1min``: the machine's load average then (noise indicators);
- ``memory``: the provider's resident-set growth over its worker process before the
  load (``LocalRunner.memory``: after the load, after its first call with freed heap
  returned, and without that), ``checkpoint_bytes`` the checkpoint's tensor bytes.

Nothing here asserts a speed: targets are tracked by the report
(``benchmarks/make_report.py``).
"""

from __future__ import annotations

import os
import statistics
import time

import pytest
import torch

from bertfast import ops as bf_ops
from bertfast.bench import (
    TransformersProvider,
    bertfast_backends,
    checkpoint_bytes,
    encoder_flops,
    gemm_ceiling,
    parity_error,
    synchronize,
    workload,
)
from bertfast.bench.timing import SETTLE_S, block_size, packed_gemms

REFERENCE = "transformers-eager"
GEMM = "__gemm_ceiling__"


def _reference(bench, batch, path, outs):
    """transformers eager fp32 on ``batch``: that provider's own output when it ran in
    fp32, else the model loaded in this process (kept for the model's workloads)."""
    if bench.s.dtype == torch.float32 and REFERENCE in outs:
        return outs[REFERENCE].float()
    run = bench.refs.get("_run")
    if run is None:
        run = TransformersProvider("eager").load(path, bench.s.device, torch.float32)
        bench.refs["_run"] = run
    return run(batch).float().cpu()


def measure_workload(bench, timing, model, w, provs) -> dict:
    """Time every provider of ``provs`` on workload ``w``, interleaved (see module doc)."""
    key = (model, w.id)
    if key in bench.measured:
        return bench.measured[key]
    s = bench.s
    bench.measured.clear()  # keep one workload's results at a time
    path = workload.model_path(model)
    cfg = workload.model_config(model)
    batch = w.make(int(cfg["vocab_size"]), s.device)
    skips, runs = {}, {}
    for p in provs:
        why = p.unavailable(s.device, s.dtype)
        if why:
            skips[p.name] = f"{p.name}: {why}"
            continue
        try:
            runs[p.name] = bench.load(p, path)
        except Exception as exc:
            skips[p.name] = str(exc)

    errs, one, peaks, outs = {}, {}, {}, {}
    for n, r in list(runs.items()):
        try:  # two warm calls: the first one's output for parity, the second one's time
            outs[n], one[n] = r.prepare(batch)
        except Exception as exc:  # a provider that cannot run this input skips
            skips[n] = f"{n} failed on {w.id}: {type(exc).__name__}: {exc}"[:500]
            del runs[n]
    if runs:
        ref = _reference(bench, batch, path, outs)
        mask = batch.attention_mask.cpu()
        errs = {n: parity_error(o, ref, mask) for n, o in outs.items()}
        del ref
    outs.clear()
    # Each provider times itself (in its worker process, the pipe round trip left out):
    # SETTLE_S of untimed calls, then a block of timed ones; a runtime's first calls
    # after another process ran are up to 2x slower (bertfast.bench.timing.SETTLE_S).
    blocks = {n: block_size(one[n]) for n in runs}
    calls = {n: (lambda r=r, b=blocks[n]: r.timed(b, settle_s=SETTLE_S)) for n, r in runs.items()}
    one = {n: max(SETTLE_S, one[n]) + blocks[n] * one[n] for n in runs}  # per round
    self_timed = frozenset(calls)
    probe = gemm_ceiling(s.device, s.dtype, n=64 if s.smoke else 512, budget_s=0.05)
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for n, r in runs.items():
        try:
            peaks[n] = r.peak()
        except Exception:
            peaks[n] = None
    # The machine's GEMM ceiling is timed inside the same rounds, so each workload's
    # "% of ceiling" compares against the machine as loaded while it ran.
    n_gemm = 128 if s.smoke else 2048
    ga = torch.randn(n_gemm, n_gemm).to(device=s.device, dtype=s.dtype)
    gb = torch.randn(n_gemm, n_gemm).to(device=s.device, dtype=s.dtype)
    gemms = {GEMM + "torch.mm": lambda: (torch.mm(ga, gb), synchronize(s.device))}
    # bertfast's own GEMMs (the cpu backend's kernels outrun torch's sgemm on some CPUs),
    # on a plain weight and, on the CPU, packed as a loaded model packs its weights
    # (oneDNN's blocked layout, the C++ GEMM's panels): the ceiling is the best of them.
    for b in bertfast_backends(s.device):
        gemms[GEMM + "bertfast.ops.linear[" + b + "]"] = lambda b=b: (
            bf_ops.linear(ga, gb, None, backend=b),
            synchronize(s.device),
        )
    if torch.device(s.device).type == "cpu":
        gemms.update({GEMM + name: fn for name, fn in packed_gemms(ga, gb).items()})
    if calls:
        for name, g in gemms.items():
            try:
                g()
                t0 = time.perf_counter()
                g()
                one[name] = time.perf_counter() - t0
                calls[name] = g
            except Exception:  # that backend has no linear for this input: no entry
                pass
    times = timing.interleave(calls, one, s.budget, s.smoke, self_timed)
    gemm_rates = {
        name[len(GEMM) :]: 2 * n_gemm**3 / statistics.median(times.pop(name)) / 1e9
        for name in list(times)
        if name.startswith(GEMM)
    }
    ceiling_rounds = max(gemm_rates.values()) if gemm_rates else None
    result = {
        "times": times,
        "errs": errs,
        "peaks": peaks,
        "skips": skips,
        "ceiling_rounds": ceiling_rounds,
        "gemm_rates": gemm_rates,
        "probe": probe,
        "load_avg": load_avg,
    }
    bench.measured[key] = result
    return result


def test_e2e(benchmark, bench, timing, e2e_case):
    model, w, provider = e2e_case
    s = bench.s
    why = provider.unavailable(s.device, s.dtype)
    if why:
        pytest.skip(f"{provider.name}: {why}")
    bench.use_model(model)
    provs = s.groups.get((model, w.id), [provider])
    res = measure_workload(bench, timing, model, w, provs)
    if provider.name in res["skips"]:
        pytest.skip(res["skips"][provider.name])
    times = res["times"][provider.name]

    benchmark.group = f"{model} {w.id}"
    benchmark.name = f"{model}-{w.id}-{provider.name}"
    runner = bench.runners[provider.name]
    if not timing.record(benchmark, times):  # fallback: time this provider on its own
        # (its runner still holds this workload's batch from measure_workload)
        benchmark.pedantic(
            lambda: runner.timed(1),
            rounds=max(len(times), 1),
            iterations=1,
            warmup_rounds=1,
        )

    dims = workload.model_dims(model)
    useful = encoder_flops(dims, w.lengths)
    padded = encoder_flops(dims, [w.seq] * w.batch)
    err = res["errs"][provider.name]
    tol = provider.parity_tol(s.dtype)
    info = benchmark.extra_info
    info.update(
        {
            "suite": "e2e",
            "model": model,
            "weights": workload.weights(model),
            "workload": w.id,
            "kind": w.kind,
            "provider": provider.name,
            "is_bertfast": provider.is_bertfast,
            "is_baseline": provider.is_baseline,
            "int8": provider.int8,
            "timing": "interleaved",
            "settle_s": SETTLE_S,
            "isolation": s.isolation,
            "cpu": bench.cpu if not s.gpu else None,
            "device": bench.device_name,
            "dtype": str(s.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads() if not s.gpu else None,
            "batch": w.batch,
            "seq": w.seq,
            "real_tokens": w.real_tokens,
            "padding_fraction": round(w.padding_fraction, 4),
            "lengths_note": w.note,
            "flops_useful": useful,
            "flops_padded": padded,
            "ceiling_gflops": round(res["ceiling_rounds"] or bench.ceiling, 2),
            "ceiling_gflops_session_start": round(bench.ceiling, 2),
            "gemm_gflops_by_impl": {k: round(v, 1) for k, v in res["gemm_rates"].items()},
            "probe_gflops": round(res["probe"], 2),
            "load_avg_1min": res["load_avg"],
            "parity_max_abs_err": err,
            "parity_ok": bool(err <= tol),
            "parity_tol": tol,
            "parity_ref": f"{REFERENCE} fp32",
            "peak_mem_bytes": res["peaks"].get(provider.name),
            "memory": runner.memory(),
            "checkpoint_bytes": checkpoint_bytes(workload.model_path(model)),
            "provider_info": runner.info,
        }
    )
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable
        return
    st = stats.stats
    med = st.median
    gflops = useful / med / 1e9
    medians = {n: statistics.median(t) for n, t in res["times"].items() if t}
    int8 = {p.name for p in s.groups.get((model, w.id), []) if p.int8}
    ratios = (
        {}
        if provider.int8
        else {
            b: m / med
            for b, m in medians.items()
            if b != provider.name and not b.startswith("bertfast-") and b not in int8
        }
    )
    info.update(
        {
            "median_s": med,
            "iqr_s": st.iqr,
            "rounds": st.rounds,
            "seq_per_s": w.batch / med,
            "tok_per_s": w.real_tokens / med,
            "gflops": gflops,
            "ceiling_share": gflops / info["ceiling_gflops"] if not s.gpu else None,
            "ratios": ratios,
        }
    )
    line = (
        f"\n  {provider.name:20s} {model} {w.id}: {med * 1e3:9.2f} ms (IQR {st.iqr * 1e3:.2f})"
        f"  {gflops:7.1f} GFLOP/s"
    )
    if not s.gpu:
        line += f" = {info['ceiling_share'] * 100:4.0f}% of GEMM {info['ceiling_gflops']:.0f}"
    if ratios:
        line += "  " + " ".join(f"x{v:.2f} vs {k}" for k, v in ratios.items())
    if err > tol:
        line += f"  PARITY FAIL (max err {err:.2e} > {tol:.0e})"
    print(line)
