"""End-to-end encoder benchmarks: bertfast against transformers (eager, SDPA),
torch.compile and ONNX Runtime, on the same inputs in the same run.

Each case is (model, workload, provider); see ``conftest.py`` for the options and
``workloads.py`` / ``providers.py`` for what runs. Per case, ``extra_info`` holds:

- ``median_s``, ``iqr_s``, ``seq_per_s``, ``tok_per_s`` (real tokens per second);
- ``gflops``: useful (real-token) FLOPs / median; ``flops_useful`` and ``flops_padded``
  (what a padded implementation computes) beside it; ``ceiling_gflops`` (a large GEMM
  via torch in this run) and ``ceiling_share`` = gflops / ceiling;
- ``ratios``: speedup of this provider over each baseline already measured on this
  workload in this run (baseline median / this median; > 1 = faster);
- ``parity_max_abs_err`` / ``parity_ok``: max |out - ref| on real tokens against
  transformers eager fp32, so a fast-but-wrong provider is flagged (never asserted);
- ``peak_mem_bytes``: CUDA allocator peak growth (GPU) or resident-set growth (CPU) over
  one call; ``probe_gflops``: a small GEMM timed just before the case (machine noise).

Nothing here asserts a speed: targets are tracked by ``report.py``.
"""
from __future__ import annotations

import pytest
import torch

import workloads
from bertfast.bench import (TransformersProvider, encoder_flops, gemm_ceiling, parity_error,
                            peak_memory, rounds_for, synchronize)

REFERENCE = "transformers-eager"


def _reference(bench, model, w, batch, path):
    key = (model, w.id)
    if key not in bench.refs:
        run = bench.runners.get(REFERENCE) if bench.s.dtype == torch.float32 else None
        if run is None:
            run = bench.runners.get("_reference")
        if run is None:
            run = TransformersProvider("eager").load(path, bench.s.device, torch.float32)
            bench.runners["_reference"] = run
        bench.refs.clear()  # one workload's reference at a time
        bench.refs[key] = run(batch).float()
    return bench.refs[key]


def test_e2e(benchmark, bench, e2e_case):
    model, w, provider = e2e_case
    s = bench.s
    why = provider.unavailable(s.device, s.dtype)
    if why:
        pytest.skip(f"{provider.name}: {why}")
    bench.use_model(model)
    path = workloads.model_path(model)
    cfg = workloads.model_config(model)
    dims = workloads.model_dims(model)
    run = bench.runner(provider, path)
    batch = w.make(int(cfg["vocab_size"]), s.device)

    # Parity (also the first warmup call).
    ref = _reference(bench, model, w, batch, path)
    out = run(batch)
    err = parity_error(out, ref, batch.attention_mask)
    del out

    # One more call sizes the number of rounds for the time budget.
    def call():
        r = run(batch)
        synchronize(s.device)
        return r

    import time

    t0 = time.perf_counter()
    call()
    one = time.perf_counter() - t0
    if s.smoke:
        rounds, warmup = 1, 0
    else:
        rounds, warmup = rounds_for(one, s.budget, min_rounds=5), 1
    probe = gemm_ceiling(s.device, s.dtype, n=512 if not s.smoke else 64, budget_s=0.05)
    peak = peak_memory(call, s.device)

    benchmark.group = f"{model} {w.id}"
    benchmark.name = f"{model}-{w.id}-{provider.name}"
    benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=warmup)

    useful = encoder_flops(dims, w.lengths)
    padded = encoder_flops(dims, [w.seq] * w.batch)
    info = benchmark.extra_info
    info.update({
        "suite": "e2e", "model": model, "workload": w.id, "kind": w.kind,
        "provider": provider.name, "is_bertfast": provider.is_bertfast,
        "is_baseline": provider.is_baseline,
        "device": bench.device_name, "dtype": str(s.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads() if not s.gpu else None,
        "batch": w.batch, "seq": w.seq, "real_tokens": w.real_tokens,
        "padding_fraction": round(w.padding_fraction, 4), "lengths_note": w.note,
        "flops_useful": useful, "flops_padded": padded,
        "ceiling_gflops": round(bench.ceiling, 2), "probe_gflops": round(probe, 2),
        "parity_max_abs_err": err, "parity_ok": bool(err <= s.tol), "parity_tol": s.tol,
        "parity_ref": f"{REFERENCE} fp32", "peak_mem_bytes": peak,
        "provider_info": getattr(run, "info", None),
    })
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable
        return
    st = stats.stats
    med = st.median
    bench.medians.setdefault((model, w.id), {})[provider.name] = med
    gflops = useful / med / 1e9
    ratios = {b: m / med for b, m in bench.medians[(model, w.id)].items()
              if b != provider.name and not b.startswith("bertfast-")}
    info.update({
        "median_s": med, "iqr_s": st.iqr, "rounds": st.rounds,
        "seq_per_s": w.batch / med, "tok_per_s": w.real_tokens / med,
        "gflops": gflops, "ceiling_share": gflops / bench.ceiling if not s.gpu else None,
        "ratios": ratios,
    })
    line = (f"\n  {provider.name:20s} {model} {w.id}: {med * 1e3:9.2f} ms (IQR {st.iqr * 1e3:.2f})"
            f"  {gflops:7.1f} GFLOP/s")
    if not s.gpu:
        line += f" = {gflops / bench.ceiling * 100:4.0f}% of GEMM {bench.ceiling:.0f}"
    if ratios:
        line += "  " + " ".join(f"x{v:.2f} vs {k}" for k, v in ratios.items())
    if err > s.tol:
        line += f"  PARITY FAIL (max err {err:.2e} > {s.tol:.0e})"
    print(line)
