"""Where a CPU forward's time goes, step by step, against the machine's GEMM ceiling.

A forward the cpu encoder runner runs as one native call (``_C.cpu.encoder_forward``
or ``encoder_forward_int8``) is timed inside that call by the step profile
(``_C.cpu.step_profile_start`` / ``step_profile_stop``, csrc/step_profile.cpp): each
step's wall time (embeddings, each GEMM, attention, each LayerNorm), summed over the
layers. Around it: the native call's wall time and the whole forward's (the model's
Python and torch work is the difference, "host"). Each GEMM step is also given as
GFLOP/s and as a share of the machine's GEMM ceiling for its precision, measured in
the same process (``bench.timing.gemm_ceiling``: the best 2048^3 GEMM of torch and of
bertfast's packed weights; int8: ``torch._int_mm`` and bertfast's ``qlinear``). A
forward that runs op by op (rows above the C++ GEMM's limit) is split by
``torch.profiler`` instead: each operator's own CPU time. Usage::

    python benchmarks/experiments/forward_split.py [--model minilm|bert-base|FOLDER] \
        [--dtype fp32|bf16] [--quantize int8] [--shapes 1x16,1x128,8x128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import bertfast
from bertfast import _C, presets
from bertfast.bench.timing import call_times, gemm_ceiling, measure
from bertfast.ops import cpu as cpu_ops

#: A step's GEMM as (N, K) from the config, by the step profile's names.
GEMM_STEPS = {
    "embedding projection": lambda c: (c.hidden_size, c.embedding_size),
    "QKV projection": lambda c: (3 * c.hidden_size, c.hidden_size),
    "attention output projection": lambda c: (c.hidden_size, c.hidden_size),
    "FFN in": lambda c: (c.intermediate_size, c.hidden_size),
    "FFN out": lambda c: (c.hidden_size, c.intermediate_size),
}


def int8_ceiling(n: int = 2048, budget_s: float = 2.0) -> float:
    """The best of ``torch._int_mm`` and bertfast's ``qlinear`` on an n^3 GEMM (GOP/s)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=g)
    w8 = torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8)
    packed, colsum = _C.cpu.qgemm_pack(w8)
    scale = torch.full((n,), 0.01)
    fns = [lambda: _C.cpu.qlinear(x, packed, colsum, scale, None)]
    if hasattr(torch, "_int_mm"):
        a8 = torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8)
        fns.append(lambda: torch._int_mm(a8, w8.t()))
    best = 0.0
    for fn in fns:
        try:
            stats = measure(fn, "cpu", warmup=2, min_rounds=5, budget_s=budget_s)
        except RuntimeError:  # torch without an int8 mm on this CPU
            continue
        best = max(best, 2 * n**3 / stats.median / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="minilm", help="minilm, a preset name, or a folder")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--quantize", choices=["int8"], default=None)
    ap.add_argument("--shapes", default="1x16,1x128,8x128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="per shape")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    folder = presets.resolve(args.model)
    model = bertfast.from_pretrained(folder, backend="cpu", dtype=dtype, quantize=args.quantize)
    kind = args.quantize or args.dtype
    ceiling = int8_ceiling() if args.quantize else gemm_ceiling("cpu", dtype, with_bertfast=True)
    print(f"{folder} ({kind}), {args.threads} threads; {kind} GEMM ceiling {ceiling:.0f} GFLOP/s")
    # The one native call's wall time (cpu_encoder calls cpu.encoder_forward by name).
    with call_times(cpu_ops, "encoder_forward") as native_calls:
        for shape in args.shapes.split(","):
            _split_shape(model, args, shape, native_calls, ceiling)


def _split_shape(model, args, shape, native_calls, ceiling) -> None:
    """Time forwards of one ``BxS`` shape and print their split."""
    cfg = model.config
    B, S = (int(v) for v in shape.split("x"))
    ids = torch.randint(1000, cfg.vocab_size, (B, S))

    def run(ids=ids):
        with torch.inference_mode():
            return model(ids).last_hidden_state

    for _ in range(3):
        run()
    native_calls.clear()
    times = []
    _C.cpu.step_profile_start()
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    steps = _C.cpu.step_profile_stop()
    forwards = len(times)
    wall = statistics.mean(times) * 1e3
    median = statistics.median(times) * 1e3
    print(f"\n{shape}: {wall:.3f} ms a forward (mean of {forwards}; median {median:.3f})")
    if steps and len(native_calls) == forwards:
        _print_steps(steps, native_calls, forwards, wall, cfg, B * S, ceiling)
    else:
        _print_ops(run, forwards=20, wall=wall)


def _print_steps(steps, native_calls, forwards, wall, cfg, tokens, ceiling) -> None:
    native = sum(native_calls) / forwards * 1e3
    print("  one native call; ms a forward (means over the same forwards):")
    print(f"  {'step':30s} {'ms':>8s} {'share':>6s} {'GFLOP/s':>8s} {'x ceiling':>9s}")
    total = 0.0
    for name, seconds, _calls in steps:
        ms = seconds / forwards * 1e3
        total += ms
        cells = f"  {name:30s} {ms:8.3f} {ms / wall:6.1%}"
        if name in GEMM_STEPS:
            N, K = GEMM_STEPS[name](cfg)
            layers = len(cfg.layer_schedule())
            gflops = 2 * tokens * N * K * layers / (ms / 1e3) / 1e9
            cells += f" {gflops:8.0f} {gflops / ceiling:9.2f}"
        print(cells)
    print(f"  {'native, between steps':30s} {native - total:8.3f} {(native - total) / wall:6.1%}")
    print(f"  {'host (Python, torch)':30s} {wall - native:8.3f} {(wall - native) / wall:6.1%}")


def _print_ops(run, forwards: int, wall: float) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(forwards):
            run()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    print("  op by op (torch.profiler, each op's own CPU time, ms a forward):")
    for e in events[:10]:
        ms = e.self_cpu_time_total / forwards / 1e3
        print(f"  {e.key:40s} {ms:8.3f} {ms / wall:6.1%}  x{e.count // forwards}")


if __name__ == "__main__":
    main()
