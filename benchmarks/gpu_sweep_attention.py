"""Stage (b) of ``benchmarks/gpu_check.sh``: every attention candidate, timed and checked.

    python benchmarks/gpu_sweep_attention.py --out rows.jsonl [--budget-s 480]
        [--dtypes float16,bfloat16] [--models bert-base,bert-large] [--device cuda]
    python benchmarks/gpu_sweep_attention.py --out rows.jsonl --dry-run

For each case (batch shape x model x dtype x op), every candidate that
``bertfast.ops.dispatch.candidates(op, device, dtype, args, with_configs=True)`` lists
(each backend variant, and each Triton launch config forced) is

- checked against ``bertfast.ops.reference`` with the project's parity rule
  (``bertfast.ops.parity.verdict``: max abs error <= 2 x the reference's own error in that
  dtype + ``ATOL[op][dtype]``), the reference run in float32 as the gold;
- timed with ``bertfast.bench.sweep.time_launches`` (CUDA events over back-to-back
  launches; the first call, which compiles or autotunes, is timed apart as
  ``first_call_s``);
- written as one JSON line (``bertfast.bench.sweep.append_row``, fsynced) as soon as it
  is measured, with ``bucket`` = ``bertfast.ops.winners.bucket_key(op, args)``.

Cases: full batches S = 128/256/512 x B = 1/32/64; ragged batches at B = 32/64,
"uniform" (lengths uniform in [S/8, S], about 44 % padding) and "heavy" (uniform in
[S/8, S/2], about 67 % padding), row 0 always full so the padded length is S; both ops
on each (``attention`` on the padded batch with its mask, ``attention_varlen`` on the
packed tokens); BERT-base (12 heads) and BERT-large (16 heads), head_dim 64; fp16 and
bf16. The most important shapes come first (S=128 B=32, S=512 B=32, S=256 B=64, the
ragged ones, B=1, then the rest), so a run cut by ``--budget-s`` or a timeout keeps
them. ``--budget-s``: no new row starts once it is spent (the plan printed first says
how many rows it expects to fit).

``--dry-run``: the same code on the CPU with tiny shapes (2 heads of 16, S <= 32), the
candidates the CPU has (``torch`` and its variants, ``cpu``; ``triton`` only when
``TRITON_INTERPRET=1``), one launch per round: it checks this script, not a kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

from bertfast.bench import sweep

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OPS = ("attention", "attention_varlen")
#: name -> (heads, head_dim)
MODELS = {"bert-base": (12, 64), "bert-large": (16, 64)}
DRY_MODELS = {"tiny": (2, 16)}
STAGE = "b"


# ---------------------------------------------------------------- the parity rule


# ---------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Point:
    """One batch shape: ``lengths`` of the sequences, padded to ``seqlen``."""

    label: str
    kind: str  # "full", "ragged-uniform", "ragged-heavy"
    batch: int
    seqlen: int
    lengths: tuple

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding(self) -> float:
        return 1.0 - self.tokens / (self.batch * self.seqlen)


def ragged(kind: str, batch: int, seqlen: int, seed: int = 0) -> Point:
    lo = max(seqlen // 8, 1)
    hi = seqlen if kind == "ragged-uniform" else max(seqlen // 2, lo)
    g = torch.Generator().manual_seed(seed + 1000 * seqlen + batch)
    rest = torch.randint(lo, hi + 1, (batch - 1,), generator=g).tolist()
    tag = "u" if kind == "ragged-uniform" else "h"
    return Point(f"r{batch}x{seqlen}{tag}", kind, batch, seqlen, tuple([seqlen] + rest))


def full(batch: int, seqlen: int) -> Point:
    return Point(f"{batch}x{seqlen}", "full", batch, seqlen, tuple([seqlen] * batch))


def points(dry: bool) -> list[Point]:
    """Every batch shape, the most important first."""
    if dry:
        return [full(3, 32), ragged("ragged-heavy", 3, 32)]
    first = [
        full(32, 128),
        full(32, 512),
        full(64, 256),
        ragged("ragged-uniform", 32, 128),
        ragged("ragged-heavy", 32, 512),
        ragged("ragged-uniform", 64, 256),
        ragged("ragged-heavy", 32, 128),
        ragged("ragged-uniform", 32, 512),
        ragged("ragged-heavy", 64, 256),
        full(1, 128),
        full(1, 512),
        full(1, 256),
    ]
    everything = [full(b, s) for s in (128, 256, 512) for b in (1, 32, 64)]
    everything += [
        ragged(k, b, s)
        for s in (128, 256, 512)
        for b in (32, 64)
        for k in ("ragged-uniform", "ragged-heavy")
    ]
    seen = {p.label for p in first}
    return first + [p for p in everything if p.label not in seen]


@dataclass(frozen=True)
class Case:
    priority: int
    point: Point
    model: str
    heads: int
    head_dim: int
    dtype: torch.dtype
    op: str

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    def describe(self) -> str:
        return f"{self.op} {self.model} {str(self.dtype)[6:]} {self.point.label}"

    def flops(self) -> float:
        """Useful FLOPs (Q K^T and P V over real tokens): 4 * L^2 * H per sequence."""
        return float(sum(4 * n * n * self.hidden for n in self.point.lengths))

    def inputs(self, device, fill: bool = True):
        """The op's positional arguments (qkv random when ``fill``, else uninitialised)."""
        p, H3 = self.point, 3 * self.hidden
        make = torch.randn if fill else torch.empty
        scale = self.head_dim**-0.5
        if self.op == "attention":
            qkv = make(p.batch, p.seqlen, H3, device=device, dtype=self.dtype)
            mask = torch.zeros(p.batch, p.seqlen, dtype=torch.long)
            for i, n in enumerate(p.lengths):
                mask[i, :n] = 1
            return (qkv, mask.to(device), self.heads, scale)
        qkv = make(p.tokens, H3, device=device, dtype=self.dtype)
        cu = torch.tensor([0, *torch.tensor(p.lengths).cumsum(0).tolist()], dtype=torch.int32)
        return (qkv, cu.to(device), max(p.lengths), self.heads, scale)


def cases(dry: bool, models: list[str], dtypes: list[torch.dtype]) -> list[Case]:
    """Shape first (most important first), then model, dtype, op."""
    table = DRY_MODELS if dry else MODELS
    out = []
    for i, pt in enumerate(points(dry)):
        for m in models:
            heads, d = table[m]
            for dt in dtypes:
                for op in OPS:
                    out.append(Case(i, pt, m, heads, d, dt, op))
    return out


# ---------------------------------------------------------------- the plan
#: Planning guesses (seconds): a forced or autotuned Triton config compiles on first use;
#: every row pays a parity check and a few synchronisations.
TRITON_COMPILE_S = 2.5
ROW_OVERHEAD_S = 0.05


def estimate_row(case: Case, candidate, device_type: str, compiled: set, timing_s: float) -> float:
    """A rough guess of one row's seconds, for the plan and the budget."""
    if device_type == "cuda":
        # the reference (fp32 math) is far slower than a fused kernel
        rate = 20e12 if candidate.backend == "torch" and candidate.variant == "default" else 150e12
        per_launch = case.flops() / rate + 15e-6
        # 7 rounds of >= 10 ms (>= 3 launches), at least 3 rounds once timing_s is spent
        rounds = 7 * max(0.01, 3 * per_launch)
        timing = 7 * per_launch + min(rounds, max(timing_s, 3 * max(0.01, 3 * per_launch)))
    else:
        timing = 0.05 if candidate.backend != "triton" else 0.6
    key = (candidate.label, case.op, case.dtype, case.head_dim)
    compile_s = 0.0
    if candidate.backend == "triton" and device_type == "cuda" and key not in compiled:
        compiled.add(key)
        compile_s = TRITON_COMPILE_S
    return ROW_OVERHEAD_S + timing + compile_s


# ---------------------------------------------------------------- one row
def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(case, candidate, args, gold, same, device, dispatch, timing, dry) -> dict:
    """One candidate on one case: parity on its first call, then timed launches."""
    fn = dispatch.implementation(candidate)
    call = lambda: fn(*args)  # noqa: E731
    t0 = time.perf_counter()
    out = call()
    sync(device)
    first = time.perf_counter() - t0
    result, err, bound = sweep.parity_text(case.op, out, gold, same, case.dtype)
    del out
    t0 = time.perf_counter()
    call()
    sync(device)
    one = time.perf_counter() - t0
    if dry:
        launches, rounds, warmup = 1, 3, 1
    else:  # about 10 ms of launches per round, 3..20 of them
        launches, rounds, warmup = int(min(20, max(3, 0.01 / max(one, 1e-6)))), 7, 2
    stats = sweep.time_launches(
        call, device, warmup=warmup, launches=launches, rounds=rounds, budget_s=timing
    )
    median = stats.median
    return {
        **sweep.timing_fields(stats, launches),
        "first_call_s": round(first, 4),
        "parity": result,
        "parity_err": err,
        "parity_bound": bound,
        "tflops": case.flops() / (median * 1e-3) / 1e12 if median > 0 else None,
    }


def base_row(case: Case, candidate, bucket, facts, rank) -> dict:
    p = case.point
    return {
        "stage": STAGE,
        "op": case.op,
        "dtype": str(case.dtype).replace("torch.", ""),
        "model": case.model,
        "point": p.label,
        "priority": case.priority,
        "shape": {
            "batch": p.batch,
            "seqlen": p.seqlen,
            "max_seqlen": max(p.lengths),
            "tokens": p.tokens,
            "padding": round(p.padding, 4),
            "kind": p.kind,
            "heads": case.heads,
            "head_dim": case.head_dim,
            "hidden": case.hidden,
        },
        "bucket": bucket,
        "candidate": candidate.label,
        "backend": candidate.backend,
        "variant": candidate.variant,
        "config": dict(candidate.config),
        # the first candidate is what backend="auto" takes without a winners table
        "rank": rank,
        "auto": rank == 0,
        "device": facts,
    }


# ---------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = sweep.sweep_parser(
        "Time and check every attention candidate (stage (b) of gpu_check.sh).",
        timing_help="timing budget per row (0.3; 0.05 dry)",
    )
    p.add_argument(
        "--dtypes",
        default=None,
        help="default float16,bfloat16 (float16,float32 in a dry run: the Triton interpreter "
        "computes tl.dot wrongly in bf16, tests/ops/harness.py)",
    )
    p.add_argument("--models", default=None, help="bert-base,bert-large (tiny in a dry run)")
    p.add_argument("--ops", default=",".join(OPS))
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.perf_counter()
    dry = args.dry_run
    device = sweep.sweep_device(args.device, dry, "gpu_sweep_attention")
    if device is None:
        return 3
    from bertfast.ops import dispatch, reference

    names = args.dtypes or ("float16,float32" if dry else "float16,bfloat16")
    dtypes = [getattr(torch, d) for d in sweep.split_names(names)]
    models = sweep.split_names(args.models or ",".join(DRY_MODELS if dry else MODELS))
    ops = sweep.split_names(args.ops)
    timing = args.timing_s if args.timing_s is not None else (0.05 if dry else 0.3)
    facts = sweep.device_facts(device)
    all_cases = [c for c in cases(dry, models, dtypes) if c.op in ops]

    planned, estimates = sweep.plan_sweep(all_cases, device, estimate_row, timing)
    n_rows = sum(len(c) for _, c in planned)
    total = sum(sum(e) for e in estimates)
    fit, acc = 0, 0.0
    for est in (e for row in estimates for e in row):
        if acc + est > args.budget_s:
            break
        acc += est
        fit += 1
    headline = (
        f"plan: {len(planned)} cases, {n_rows} rows, about {total:.0f} s in all "
        f"(guessed); budget {args.budget_s:.0f} s: about {fit} rows fit; device "
        f"{facts.get('gpu') or facts.get('cpu')}; out {args.out}"
    )
    sweep.print_plan(headline, planned, shown=len(planned) if dry else 8)

    def golds(case, inputs):
        ref = getattr(reference, case.op)
        as_fp32 = tuple(
            a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in inputs
        )
        return ref(*as_fp32), ref(*inputs)

    def progress(case, cand, row):
        return (
            f"  {case.describe():42s} {cand.label:40s} {row['median_ms']:9.4f} ms {row['parity']}"
        )

    result = sweep.run_sweep(
        planned,
        estimates,
        args,
        script="gpu_sweep_attention",
        device=device,
        t_start=t_start,
        golds=golds,
        base_row=lambda case, cand, bucket, rank: base_row(case, cand, bucket, facts, rank),
        measure=lambda case, cand, inputs, gold, same: measure(
            case, cand, inputs, gold, same, device, dispatch, timing, dry
        ),
        progress=progress,
        fit_each=False,
    )
    if result.lost:
        return 2
    print(result.done_line(f"{result.measured} rows", t_start))
    return 1 if result.errors and not result.measured else 0


if __name__ == "__main__":
    sys.exit(main())
