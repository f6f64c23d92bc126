"""Stage (c) of ``benchmarks/gpu_check.sh``: the GEMM / epilogue and LayerNorm candidates,
timed and checked, against a cuBLAS GEMM ceiling measured in the same run.

    python benchmarks/gpu_sweep_ops.py --out rows.jsonl [--budget-s 480] [--fp32]
        [--dtypes float16,bfloat16] [--models bert-base,bert-large] [--rows 4096,16384,128]
    python benchmarks/gpu_sweep_ops.py --out rows.jsonl --dry-run

Cases, at BERT-base (H 768, FFN 3072) and BERT-large (1024, 4096), M = 4096 / 16384 /
128 token rows, fp16 and bf16 (``--fp32`` adds fp32, run with TF32 off):

=================  ===========================================  =====================
op                 what                                         arguments
=================  ===========================================  =====================
``linear_gelu``    FFN in, erf GELU and tanh GELU               x [M,H], W [FFN,H]
``linear``         QKV [3H,H], attention out [H,H], FFN out     x [M,K], W [N,K]
                   [H,FFN]
``add_layernorm``  bias + residual + LayerNorm at width H       x, residual [M,H]
``bias_gelu_``     in-place bias + erf GELU at width FFN        x [M,FFN]
``embed_layernorm``  BERT's three tables, packed ids            ids [M], word [30522,H]
=================  ===========================================  =====================

For each case every candidate ``bertfast.ops.dispatch.candidates(op, device, dtype,
args, with_configs=True)`` lists (each backend and variant, each Triton launch config
forced, the ``cuda:cublaslt`` epilogue of ``bertfast/ops/cuda_epilogue.py`` where the
probed GELU form allows; the ``torch`` backend, plain ``F.linear`` then the activation,
is the reference path and is always listed) is

- checked against ``bertfast.ops.reference`` with the project's parity rule
  (``bertfast.ops.parity.verdict``: max abs error <= 2 x the reference's own error in that
  dtype + ``ATOL[op][dtype]``; the gold is the reference in fp32, in fp64 for fp32
  rows). The rule lives in test code, which the package does not ship: it is imported by
  path (pytest must be installed) and called through :func:`parity`, the function to
  move into ``bertfast.bench`` with the rule;
- timed with ``bertfast.bench.sweep.time_launches`` (CUDA events over back-to-back
  launches; the first call, which compiles or autotunes, is timed apart as
  ``first_call_s``);
- written at once as one JSON line (``append_row``, fsynced): the fields of
  ``bertfast/bench/sweep.py``'s docstring, stage "c", plus ``tflops``,
  ``ceiling_tflops`` and ``ceiling_fraction`` for the GEMMs, ``gbps`` for the
  memory-bound ops, ``rank`` / ``auto`` (the first candidate is what the preference
  order gives), ``reference`` (the torch backend's row), and on a GPU ``kernels`` (the
  CUDA kernels one call of a ``linear_gelu`` candidate launches, at M = 4096: the
  cuBLASLt epilogue must be one kernel).

Before the GEMM candidates of a shape, ``torch.mm`` of the same M, N, K and dtype is
timed the same way: one ``gemm_ceiling`` row (``parity`` "n/a"), the ceiling of that
shape's GEMM rows. The cuBLASLt GELU form probed per dtype is one ``epilogue_probe`` row.
Cases run M = 4096 first, then 16384, then 128 (BERT-base before large, fp16 before
bf16, ``linear_gelu`` first), so a run cut by ``--budget-s`` or a timeout keeps the
most useful rows; no row starts once the budget is spent. The plan printed first gives
the row count and the guessed seconds. The end prints a Markdown summary per op and
shape: winner, its ms, ratio to the runner-up, % of the GEMM ceiling.

``--dry-run``: the same code on the CPU with tiny shapes (H 64, FFN 256, M 16; ``cpu``
and ``torch`` candidates, ``triton`` when ``TRITON_INTERPRET=1``), two launches per
round: it checks this script, not a kernel.
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
STAGE = "c"
#: name -> (hidden, ffn, vocab, positions)
MODELS = {"bert-base": (768, 3072, 30522, 512), "bert-large": (1024, 4096, 30522, 512)}
DRY_MODELS = {"tiny": (64, 256, 100, 32)}
ROWS = (4096, 16384, 128)
DRY_ROWS = (16,)
#: (op, projection or activation), in the order a case's ops run.
KINDS = (
    ("linear_gelu", "gelu"),
    ("linear_gelu", "gelu_tanh"),
    ("linear", "qkv"),
    ("linear", "attn_out"),
    ("linear", "ffn_out"),
    ("add_layernorm", "hidden"),
    ("bias_gelu_", "gelu"),
    ("embed_layernorm", "hidden"),
)
GEMM_OPS = ("linear", "linear_gelu")
#: M at which a GPU run lists the kernels each linear_gelu candidate launches.
KERNELS_AT_ROWS = 4096


# ---------------------------------------------------------------- the parity rule


# ---------------------------------------------------------------- the cases
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Case:
    priority: int
    op: str
    kind: str  # projection (linear), activation (linear_gelu, bias_gelu_), "hidden"
    model: str
    hidden: int
    ffn: int
    vocab: int
    positions: int
    rows: int
    dtype: torch.dtype

    def describe(self) -> str:
        return f"{self.op}[{self.kind}] {self.model} M={self.rows} {_dtype_name(self.dtype)}"

    @property
    def gemm(self) -> tuple[int, int, int] | None:
        """(M, N, K) of a GEMM case."""
        H, FFN, M = self.hidden, self.ffn, self.rows
        if self.op == "linear_gelu":
            return (M, FFN, H)
        if self.op == "linear":
            return {"qkv": (M, 3 * H, H), "attn_out": (M, H, H), "ffn_out": (M, H, FFN)}[self.kind]
        return None

    def flops(self) -> float:
        M, N, K = self.gemm or (0, 0, 0)
        return 2.0 * M * N * K

    def bytes_moved(self) -> float:
        """Bytes a memory-bound op must read and write (tables' rows read once each)."""
        e = torch.tensor([], dtype=self.dtype).element_size()
        M, H, FFN = self.rows, self.hidden, self.ffn
        if self.op == "add_layernorm":
            return float(e * (3 * M * H + 3 * H))
        if self.op == "bias_gelu_":
            return float(e * (2 * M * FFN + FFN))
        if self.op == "embed_layernorm":
            return float(e * (4 * M * H + 2 * H) + 3 * 8 * M)
        return 0.0

    def shape(self) -> dict:
        out = {"model": self.model, "rows": self.rows, "hidden": self.hidden, "ffn": self.ffn}
        if self.gemm:
            out.update(zip(("M", "N", "K"), self.gemm))
        if self.op == "linear":
            out["proj"] = self.kind
        elif self.op in ("linear_gelu", "bias_gelu_"):
            out["activation"] = self.kind
        if self.op == "bias_gelu_":
            out["width"] = self.ffn
        elif self.op in ("add_layernorm", "embed_layernorm"):
            out["width"] = self.hidden
        if self.op == "embed_layernorm":
            out["vocab"] = self.vocab
        return out

    def inputs(self, device, fill: bool = True) -> tuple:
        """The op's positional arguments (random when ``fill``, else uninitialised)."""
        dt, M, H, FFN = self.dtype, self.rows, self.hidden, self.ffn

        def t(*shape, scale=1.0, offset=0.0):
            if not fill:
                return torch.empty(*shape, device=device, dtype=dt)
            return (torch.randn(*shape, device=device) * scale + offset).to(dt)

        if self.op in GEMM_OPS:
            _, N, K = self.gemm
            args = (t(M, K), t(N, K, scale=K**-0.5), t(N, scale=0.1))
            return args + ((self.kind,) if self.op == "linear_gelu" else ())
        if self.op == "add_layernorm":
            return (t(M, H), t(M, H), t(H, scale=0.1), t(H, scale=0.1, offset=1.0), t(H), 1e-12)
        if self.op == "bias_gelu_":
            return (t(M, FFN, scale=3.0), t(FFN), self.kind)
        if self.op == "embed_layernorm":
            ids = torch.randint(0, self.vocab, (M,), device=device)
            pos = torch.arange(M, device=device) % self.positions
            types = torch.randint(0, 2, (M,), device=device)
            return (
                ids,
                pos,
                types,
                t(self.vocab, H),
                t(self.positions, H),
                t(2, H),
                t(H, scale=0.1, offset=1.0),
                t(H),
                1e-12,
            )
        raise ValueError(self.op)


def cases(dry: bool, models, dtypes, rows, ops) -> list[Case]:
    """M first (in ``rows`` order), then model, dtype, op."""
    table = DRY_MODELS if dry else MODELS
    out = []
    for M in rows:
        for m in models:
            H, FFN, V, P = table[m]
            for dt in dtypes:
                for op, kind in KINDS:
                    if op in ops:
                        out.append(Case(len(out), op, kind, m, H, FFN, V, P, M, dt))
    return out


# ---------------------------------------------------------------- the plan
#: Planning guesses (seconds): a forced or autotuned Triton config compiles on first use
#: (an autotuned one benchmarks its whole list per shape); every row pays a parity check
#: and a few synchronisations; fp32 reference GEMMs run on CUDA cores.
TRITON_COMPILE_S = 2.5
AUTOTUNE_S = 1.5
ROW_OVERHEAD_S = 0.05


def _per_launch_s(case: Case, backend: str) -> float:
    if case.gemm:
        rate = 40e12 if backend == "torch" else 300e12  # the reference: fp32 math
        return case.flops() / rate + 10e-6
    return case.bytes_moved() / 1.5e12 + 8e-6


def estimate_row(case: Case, candidate, device_type: str, compiled: set, timing_s: float) -> float:
    """A rough guess of one row's seconds, for the plan and the budget."""
    if device_type != "cuda":
        return 0.05 if candidate.backend != "triton" else 1.0
    per = _per_launch_s(case, candidate.backend)
    launches = min(20, max(3, int(0.01 / per)))
    timing = min(7 * launches * per + 0.002, max(timing_s, 3 * launches * per))
    extra = 0.0
    if candidate.backend == "triton":
        key = (candidate.label, case.op, case.dtype)
        if key not in compiled:
            compiled.add(key)
            extra += TRITON_COMPILE_S
        if not candidate.config and case.op == "linear_gelu":
            extra += AUTOTUNE_S
    return ROW_OVERHEAD_S + 3 * per + timing + extra


# ---------------------------------------------------------------- the cuBLASLt variant
def cublaslt_variant(device: torch.device, dtypes, dispatch) -> tuple[list[dict], str]:
    """Probe the cuBLASLt epilogue's GELU form per dtype (the ``cuda`` backend's
    ``linear_gelu`` variant ``cublaslt`` serves only that form): the ``epilogue_probe``
    rows and a note."""
    from bertfast.ops import cuda_epilogue

    note = ""
    backend = dispatch.get_backend("cuda")
    if not hasattr(backend, "variants"):
        note = f"cuda backend unavailable: {getattr(backend, 'error', '?')}"
    rows = []
    for dt in dtypes:
        try:
            probe = cuda_epilogue.epilogue_probe(device, dt)
        except Exception as exc:  # an epilogue that cannot run in this dtype here
            rows.append({"dtype": _dtype_name(dt), "form": None, "error": f"{exc}"[:300]})
            continue
        rows.append(
            {
                "dtype": _dtype_name(dt),
                "form": probe.form,
                "err_erf": probe.err_erf,
                "err_tanh": probe.err_tanh,
                "decisive": probe.decisive,
                "probe_note": probe.note,
            }
        )
    return rows, note


# ---------------------------------------------------------------- one row
def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_names(call, device) -> list[str] | None:
    """The CUDA kernels one ``call()`` launches (torch.profiler), or None."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        sync(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            sync(device)
        names = [
            e.name
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
        ]
        return [n[:160] for n in names]
    except Exception:  # profiler unavailable (CUPTI missing...): the row says null
        return None


def timing_call(case: Case, fn, args):
    """The call to time: in-place ops write into a scratch copy of the input."""
    if case.op == "bias_gelu_":
        scratch = args[0].clone()
        return lambda: fn(scratch, *args[1:])
    return lambda: fn(*args)


def first_output(case: Case, fn, args):
    if case.op == "bias_gelu_":
        x = args[0].clone()
        fn(x, *args[1:])
        return x
    return fn(*args)


def time_call(call, device, timing_s: float, dry: bool) -> tuple:
    """(Stats, launches per round): about 10 ms of launches per round, 3..20 of them."""
    t0 = time.perf_counter()
    call()
    sync(device)
    one = time.perf_counter() - t0
    if dry:
        launches, rounds, warmup = 2, 3, 0
    else:
        launches, rounds, warmup = int(min(20, max(3, 0.01 / max(one, 1e-6)))), 7, 2
    stats = sweep.time_launches(
        call, device, warmup=warmup, launches=launches, rounds=rounds, budget_s=timing_s
    )
    return stats, launches


def measure(case, candidate, args, gold, same, device, dispatch, timing_s, dry) -> dict:
    """One candidate on one case: parity on its first call, then timed launches."""
    fn = dispatch.implementation(candidate)
    t0 = time.perf_counter()
    out = first_output(case, fn, args)
    sync(device)
    first = time.perf_counter() - t0
    result, err, bound = sweep.parity_text(case.op, out, gold, same, case.dtype)
    del out
    call = timing_call(case, fn, args)
    stats, launches = time_call(call, device, timing_s, dry)
    median = stats.median
    row = {
        **sweep.timing_fields(stats, launches),
        "first_call_s": round(first, 4),
        "parity": result,
        "parity_err": err,
        "parity_bound": bound,
    }
    if case.gemm:
        row["tflops"] = case.flops() / (median * 1e-3) / 1e12 if median > 0 else None
    else:
        row["gbps"] = case.bytes_moved() / (median * 1e-3) / 1e9 if median > 0 else None
    if (
        device.type == "cuda"
        and case.op == "linear_gelu"
        and case.rows == KERNELS_AT_ROWS
        and not candidate.config
    ):
        row["kernels"] = kernel_names(call, device)
    return row


def ceiling_row(case: Case, device, timing_s: float, dry: bool) -> dict:
    """``torch.mm`` of the case's M, N, K in its dtype: the GEMM ceiling of the shape."""
    M, N, K = case.gemm
    a = torch.randn(M, K, device=device).to(case.dtype)
    b = torch.randn(K, N, device=device).to(case.dtype)
    stats, launches = time_call(lambda: torch.mm(a, b), device, timing_s, dry)
    median = stats.median
    return {
        **sweep.timing_fields(stats, launches),
        "parity": "n/a",
        "tflops": case.flops() / (median * 1e-3) / 1e12 if median > 0 else None,
    }


def base_row(case: Case, label, backend, variant, config, bucket, facts, rank=None) -> dict:
    return {
        "stage": STAGE,
        "op": case.op,
        "dtype": _dtype_name(case.dtype),
        "model": case.model,
        "priority": case.priority,
        "shape": case.shape(),
        "bucket": bucket,
        "candidate": label,
        "backend": backend,
        "variant": variant,
        "config": dict(config),
        "rank": rank,
        # the first candidate is what the preference order gives backend="auto"
        "auto": rank == 0,
        "reference": backend == "torch" and variant == "default",
        "device": facts,
    }


def gold_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float32 else torch.float32


def references(case: Case, inputs, reference):
    """(gold, same-dtype reference) of the case: the reference in fp32 (fp64 for fp32
    rows) and in the case's dtype."""
    op = "bias_gelu" if case.op == "bias_gelu_" else case.op
    ref = getattr(reference, op)
    wide = gold_dtype(case.dtype)
    as_wide = tuple(
        a.to(wide) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs
    )
    return ref(*as_wide), ref(*inputs)


# ---------------------------------------------------------------- the summary
def summary(rows: list[dict]) -> str:
    """Markdown: per op and shape, the fastest candidate that passes parity."""
    groups: dict[tuple, list[dict]] = {}
    ceilings: dict[tuple, float] = {}
    for r in rows:
        if r.get("median_ms") is None or r["op"] == "epilogue_probe":
            continue
        s = r["shape"]
        kind = s.get("proj") or s.get("activation") or f"width {s.get('width')}"
        key = (r["op"], kind, r["model"], s["rows"], r["dtype"])
        if r["op"] == "gemm_ceiling":
            ceilings[(s.get("M"), s.get("N"), s.get("K"), r["dtype"])] = r.get("tflops")
            continue
        groups.setdefault(key, []).append(r)
    lines = [
        "| op | kind | model | M | dtype | winner | ms | runner-up | ratio | % ceiling | pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, rs in groups.items():
        op, kind, model, m, dtype = key
        ok = sorted((r for r in rs if r["parity"] == "pass"), key=lambda r: r["median_ms"])
        if not ok:
            lines.append(
                f"| {op} | {kind} | {model} | {m} | {dtype} | (none pass) | | | | | 0/{len(rs)} |"
            )
            continue
        win = ok[0]
        runner = ok[1] if len(ok) > 1 else None
        ratio = f"{runner['median_ms'] / win['median_ms']:.2f}x" if runner else ""
        pct = ""
        if win.get("tflops"):
            s = win["shape"]
            ceil = ceilings.get((s.get("M"), s.get("N"), s.get("K"), dtype))
            if ceil:
                pct = f"{100 * win['tflops'] / ceil:.0f}%"
        lines.append(
            f"| {op} | {kind} | {model} | {m} | {dtype} | {win['candidate']} | "
            f"{win['median_ms']:.4f} | {runner['candidate'] if runner else ''} | {ratio} | "
            f"{pct} | {len(ok)}/{len(rs)} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = sweep.sweep_parser(
        "Time and check every GEMM / epilogue / LayerNorm candidate (stage (c) of gpu_check.sh).",
        timing_help="timing budget per row (0.25; 0.02 dry)",
    )
    p.add_argument("--dtypes", default=None, help="default float16,bfloat16 (float32,float16 dry)")
    p.add_argument("--fp32", action="store_true", help="add float32 (TF32 off)")
    p.add_argument("--models", default=None, help="bert-base,bert-large (tiny in a dry run)")
    p.add_argument("--rows", default=None, help="token rows M, default 4096,16384,128 (16 dry)")
    p.add_argument("--ops", default=",".join(dict.fromkeys(op for op, _ in KINDS)))
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.perf_counter()
    dry = args.dry_run
    device = sweep.sweep_device(args.device, dry, "gpu_sweep_ops")
    if device is None:
        return 3
    # The golds and the fp32 rows are fp32 GEMMs: never TF32 (docs/design.md, numerics).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from bertfast.ops import dispatch, reference

    names = args.dtypes or ("float32,float16" if dry else "float16,bfloat16")
    dtypes = [getattr(torch, d) for d in sweep.split_names(names)]
    if args.fp32 and torch.float32 not in dtypes:
        dtypes.append(torch.float32)
    models = sweep.split_names(args.models or ",".join(DRY_MODELS if dry else MODELS))
    rows_m = (
        [int(r) for r in sweep.split_names(args.rows)]
        if args.rows
        else list(DRY_ROWS if dry else ROWS)
    )
    ops = sweep.split_names(args.ops)
    timing = args.timing_s if args.timing_s is not None else (0.02 if dry else 0.25)
    facts = sweep.device_facts(device)

    probes, note = cublaslt_variant(device, dtypes, dispatch) if "linear_gelu" in ops else ([], "")
    all_cases = cases(dry, models, dtypes, rows_m, ops)
    planned, estimates = sweep.plan_sweep(all_cases, device, estimate_row, timing)
    shapes = {(c.gemm, c.dtype) for c, _ in planned if c.gemm}
    ceiling_s = len(shapes) * (0.1 if device.type == "cuda" else 0.02)
    n_rows = sum(len(c) for _, c in planned)
    total = sum(sum(e) for e in estimates) + ceiling_s
    headline = (
        f"plan: {len(planned)} cases, {n_rows} candidate rows + {len(shapes)} ceiling rows, "
        f"about {total:.0f} s in all (guessed); budget {args.budget_s:.0f} s; timing "
        f"{timing:.2f} s per row; device {facts.get('gpu') or facts.get('cpu')}; out {args.out}"
    )
    notes = [note] if note else []
    notes += [f"cuBLASLt GELU epilogue probe, {p['dtype']}: {p}" for p in probes]
    sweep.print_plan(headline, planned, shown=len(planned) if dry else len(KINDS) * 2, notes=notes)

    written: list[dict] = []
    for p in probes:
        row = {
            "stage": STAGE,
            "op": "epilogue_probe",
            "model": None,
            "shape": {"M": 64, "N": 128, "K": 128},
            "bucket": None,
            "candidate": "torch._addmm_activation",
            "backend": "torch",
            "variant": "addmm_activation",
            "config": {},
            "median_ms": None,
            "iqr_ms": None,
            "launches": 0,
            "parity": "n/a",
            "device": facts,
            **p,
        }
        sweep.append_row(args.out, row)
        written.append(row)

    ceilings: dict[tuple, float] = {}

    def ceiling_first(case, inputs, bucket):
        """The ``gemm_ceiling`` row of a GEMM shape, before its first candidate."""
        key = (case.gemm, case.dtype)
        if not case.gemm or key in ceilings:
            return
        row = base_row(case, "torch.mm", "torch", "mm", {}, bucket, facts)
        row["op"] = "gemm_ceiling"
        M, N, K = case.gemm
        row["shape"] = {"model": case.model, "rows": M, "M": M, "N": N, "K": K}
        row.update(ceiling_row(case, device, timing, dry))
        sweep.append_row(args.out, row)
        written.append(row)
        ceilings[key] = row["tflops"]
        print(
            f"  {case.describe():48s} {'ceiling torch.mm':40s} "
            f"{row['median_ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s",
            flush=True,
        )

    def measure_vs_ceiling(case, cand, inputs, gold, same):
        row = measure(case, cand, inputs, gold, same, device, dispatch, timing, dry)
        ceiling = ceilings.get((case.gemm, case.dtype)) if case.gemm else None
        if ceiling and row.get("tflops"):
            row["ceiling_tflops"] = ceiling
            row["ceiling_fraction"] = row["tflops"] / ceiling
        return row

    def progress(case, cand, row):
        rate = (
            f"{row['tflops']:8.2f} TFLOP/s"
            if row.get("tflops") is not None
            else f"{row.get('gbps') or 0:8.1f} GB/s"
        )
        return (
            f"  {case.describe():48s} {cand.label:40s} {row['median_ms']:9.4f} ms {rate} "
            f"{row['parity']}"
        )

    result = sweep.run_sweep(
        planned,
        estimates,
        args,
        script="gpu_sweep_ops",
        device=device,
        t_start=t_start,
        before_case=ceiling_first,
        golds=lambda case, inputs: references(case, inputs, reference),
        base_row=lambda case, cand, bucket, rank: base_row(
            case, cand.label, cand.backend, cand.variant, cand.config, bucket, facts, rank
        ),
        measure=measure_vs_ceiling,
        progress=progress,
    )
    if result.lost:
        return 2
    written += result.rows
    timed = len(result.rows)
    print(result.done_line(f"{timed} candidate rows", t_start))
    print()
    print(summary(written))
    return 1 if result.errors and not result.measured else 0


if __name__ == "__main__":
    sys.exit(main())
