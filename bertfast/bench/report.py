"""How benchmark results are shown.

``bertfast bench``
    its rows -> a Markdown table (:func:`format_table`), the providers' resident memory
    (:func:`format_memory`) and the JSON file (:func:`write_json`).

The suite in ``benchmarks/`` (``python benchmarks/make_report.py RESULTS.json [MORE.json
...] [--out DIR]``, which calls :func:`main`)
    pytest-benchmark JSON -> ``report.md``, ``e2e.png`` and ``kernels.png`` (whichever
    suites are present) under ``DIR`` (default ``benchmarks/results/<device>/``, the
    device name recorded in the runs); prints the report and ends it with the *targets*
    section: each tracked target met / not met / not measured, with the numbers behind
    it. Targets are tracked, never asserted. Ratios are recomputed here from the medians
    in the same JSON file (same run, same inputs): ``x B`` = median of baseline ``B`` /
    median of the row (> 1: faster than B). Int8 peers (rows with ``int8``: ONNX Runtime
    dynamic quantization, CTranslate2 int8) get a table of their own and are never in an
    fp32 ratio or target. The header names the CPU (model and SIMD flags recorded with
    the rows) and whether each provider ran in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import OrderedDict
from collections.abc import Sequence

from .registry import BASELINES
from .workload import suite_dir

__all__ = [
    "format_table",
    "format_memory",
    "FOOTNOTE",
    "write_json",
    "BASELINES",
    "FP32_PEERS",
    "load",
    "build",
    "main",
]

FOOTNOTE = (
    "ratios are speedups (baseline time / provider time), same run, same inputs; "
    "GFLOP/s counts real-token FLOPs only."
)


def format_table(rows: list[dict[str, object]], baselines: Sequence[str]) -> str:
    """One Markdown row per (shape, provider); a ``x <baseline>`` column per baseline."""
    head = (
        ["shape", "provider", "median ms", "IQR ms", "seq/s", "tok/s", "GFLOP/s", "% GEMM peak"]
        + [f"x {b}" for b in baselines]
        + ["parity"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["shape"],
            r["provider"],
            f"{r['median_ms']:.2f}",
            f"{r['iqr_ms']:.2f}",
            f"{r['seq_per_s']:.1f}",
            f"{r['tok_per_s']:.0f}",
            f"{r['gflops']:.1f}",
            f"{r['ceiling_share'] * 100:.0f}%" if r.get("ceiling_share") else "-",
        ]
        for b in baselines:
            v = r["ratios"].get(b)
            cells.append(f"{v:.2f}" if v else "-")
        cells.append(r["parity"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def format_memory(memory: dict[str, dict], checkpoint: int | None) -> str:
    """One line per provider: its resident-set growth (``LocalRunner.memory``) after
    the load and after its first call, in MB and as a multiple of the checkpoint's
    tensor bytes (MB = 2^20 bytes)."""

    def mb(v):
        return "?" if v is None else f"{v / 2**20:.1f} MB"

    def x(v):
        return "" if v is None or not checkpoint else f" ({v / checkpoint:.2f}x)"

    lines = [
        "resident memory over the process before the load"
        + (f" (checkpoint tensors: {checkpoint / 2**20:.1f} MB)" if checkpoint else "")
        + "; after the first call: freed heap returned first (malloc_trim), "
        "in brackets without that"
    ]
    for name, m in memory.items():
        first, raw = m.get("first_call"), m.get("first_call_untrimmed")
        shape = "x".join(map(str, m.get("first_call_shape") or ())) or "?"
        lines.append(
            f"  {name}: load {mb(m.get('load'))}{x(m.get('load'))}; after a first {shape} "
            f"call {mb(first)}{x(first)} [{mb(raw)}{x(raw)}]"
        )
    return "\n".join(lines)


def write_json(path: str, header: dict[str, object], rows: list[dict[str, object]]) -> None:
    with open(path, "w") as f:
        json.dump(dict(header, rows=rows), f, indent=1)


# ---------------------------------------------------------------- the suite
#: The fp32 peers a bertfast row must beat ("best fp32 peer" target).
FP32_PEERS = ("transformers-sdpa", "torch-compile", "onnxruntime", "openvino", "ctranslate2")
SHORT = {
    "transformers-eager": "eager",
    "transformers-sdpa": "sdpa",
    "torch-compile": "compile",
    "onnxruntime": "ORT",
    "openvino": "OV",
    "ctranslate2": "CT2",
    "pytorch": "pytorch",
}


def is_int8(r: dict) -> bool:
    return bool(r.get("int8")) or str(r.get("provider", "")).endswith("-int8")


def load(paths: list[str]):
    rows, machine = [], {}
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        machine = data.get("machine_info", machine)
        for b in data.get("benchmarks", []):
            info = dict(b.get("extra_info") or {})
            st = b.get("stats") or {}
            info.setdefault("median_s", st.get("median"))
            info.setdefault("iqr_s", st.get("iqr"))
            info["name"] = b.get("name")
            if info.get("suite") in ("e2e", "kernels") and info.get("median_s"):
                rows.append(info)
    return rows, machine


def _ms(s: float | None) -> str:
    return "-" if s is None else (f"{s * 1e3:.3f}" if s < 0.01 else f"{s * 1e3:.2f}")


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:.0f}"


# ---------------------------------------------------------------- end to end
def e2e_groups(rows, int8: bool = False):
    """OrderedDict (model, workload) -> {provider: row}: the fp32 rows (``int8``: the
    int8 peers' rows)."""
    groups: dict[tuple, dict[str, dict]] = OrderedDict()
    for r in rows:
        if r.get("suite") == "e2e" and is_int8(r) == int8:
            groups.setdefault((r["model"], r["workload"]), OrderedDict())[r["provider"]] = r
    return groups


def e2e_table(rows) -> str:
    groups = e2e_groups(rows)
    if not groups:
        return ""
    present = [b for b in BASELINES if any(b in g for g in groups.values())]
    gpu = any(r.get("ceiling_share") is None for g in groups.values() for r in g.values())
    head = (
        ["model", "workload", "provider", "median ms", "IQR ms", "seq/s", "tok/s", "GFLOP/s"]
        + ([] if gpu else ["% GEMM"])
        + [f"x {SHORT[b]}" for b in present]
        + ["parity (max err)", "peak MB"]
    )
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, wl), provs in groups.items():
        for name, r in provs.items():
            med = r["median_s"]
            cells = [
                model,
                wl
                + (
                    f" ({r['padding_fraction'] * 100:.0f}% pad)"
                    if r.get("padding_fraction")
                    else ""
                ),
                f"**{name}**" if r.get("is_bertfast") else name,
                _ms(med),
                _ms(r.get("iqr_s")),
                _num(r.get("seq_per_s")),
                _num(r.get("tok_per_s"), "{:.0f}"),
                _num(r.get("gflops")),
            ]
            if not gpu:
                cs = r.get("ceiling_share")
                cells.append("-" if cs is None else f"{cs * 100:.0f}%")
            for b in present:
                if b == name or b not in provs:
                    cells.append("-")
                else:
                    cells.append(f"{provs[b]['median_s'] / med:.2f}")
            err = r.get("parity_max_abs_err")
            ok = r.get("parity_ok", True)
            cells.append(("ok" if ok else "**WRONG**") + ("" if err is None else f" ({err:.0e})"))
            cells.append(_mb(r.get("peak_mem_bytes")))
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def int8_table(rows) -> str:
    """The low-precision rows (int8 and bf16, peers and bertfast's own), each against the
    best correct bertfast fp32 row of its workload (``x bertfast`` = bertfast median /
    this row's median: above 1, the row is faster)."""
    groups = e2e_groups(rows, int8=True)
    if not groups:
        return ""
    fp32 = e2e_groups(rows)
    head = [
        "model",
        "workload",
        "provider",
        "median ms",
        "IQR ms",
        "tok/s",
        "best bertfast fp32 ms / this ms",
        "max err vs fp32 ref (tol)",
        "peak MB",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, wl), provs in groups.items():
        bf = best_bertfast(fp32.get((model, wl), {}))
        for name, r in provs.items():
            med = r["median_s"]
            err = r.get("parity_max_abs_err")
            tol = r.get("parity_tol")
            cells = [
                model,
                wl,
                name,
                _ms(med),
                _ms(r.get("iqr_s")),
                _num(r.get("tok_per_s"), "{:.0f}"),
                "-" if bf is None else f"{bf['median_s'] / med:.2f} ({bf['provider']})",
                ("ok" if r.get("parity_ok", True) else "**WRONG**")
                + ("" if err is None else f" {err:.1e}")
                + ("" if tol is None else f" ({tol:g})"),
                _mb(r.get("peak_mem_bytes")),
            ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def memory_table(rows) -> str:
    """Per model and provider: resident-set growth of its worker process over the
    process before the load (``LocalRunner.memory``), in MB and as a multiple of the
    checkpoint's tensor bytes; empty when no row recorded it."""
    seen = {}
    for r in rows:
        m = r.get("memory")
        if m and (r.get("model"), r.get("provider")) not in seen:
            seen[(r.get("model"), r.get("provider"))] = (m, r.get("checkpoint_bytes"))
    if not seen:
        return ""

    def cell(v, ckpt):
        if v is None:
            return "-"
        return _mb(v) + (f" ({v / ckpt:.2f}x)" if ckpt else "")

    head = ["model", "provider", "checkpoint MB", "after load", "after first call", "untrimmed"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, name), (m, ckpt) in sorted(seen.items()):
        shape = "x".join(map(str, m.get("first_call_shape") or ())) or "?"
        out.append(
            f"| {model} | {name} | {_mb(ckpt)} | {cell(m.get('load'), ckpt)} | "
            f"{cell(m.get('first_call'), ckpt)} ({shape}) | "
            f"{cell(m.get('first_call_untrimmed'), ckpt)} |"
        )
    return "\n".join(out)


def best_bertfast(provs: dict[str, dict]) -> dict | None:
    cands = [r for n, r in provs.items() if r.get("is_bertfast") and r.get("parity_ok", True)]
    return min(cands, key=lambda r: r["median_s"]) if cands else None


# ---------------------------------------------------------------- targets
def _status(values: list[bool]) -> str:
    if not values:
        return "not measured"
    return "met" if all(values) else "not met"


def targets(rows) -> str:
    groups = e2e_groups(rows)
    lines = ["## Targets (tracked, never asserted)", ""]
    devs = {r.get("device", "") for r in rows if r.get("suite") == "e2e"}
    on_gpu = any(not d.startswith("cpu") for d in devs)
    if not groups:
        return "\n".join(lines + ["no end-to-end rows: nothing to judge"])
    models = list(OrderedDict.fromkeys(m for m, _ in groups))

    def ratio_vs(model, pred, base, need):
        """``base``: a provider name, or None for the fastest fp32 peer present."""
        evid, ok = [], []
        for (m, wl), provs in groups.items():
            if m != model or not pred(next(iter(provs.values()))):
                continue
            bf = best_bertfast(provs)
            if base is None:
                peers = [provs[p] for p in FP32_PEERS if p in provs]
                peer = min(peers, key=lambda r: r["median_s"]) if peers else None
            else:
                peer = provs.get(base)
            if bf is None or peer is None:
                continue
            r = peer["median_s"] / bf["median_s"]
            ok.append(r >= need)
            who = f" vs {SHORT.get(peer['provider'], peer['provider'])}" if base is None else ""
            evid.append(f"{wl} {r:.2f}x{who} ({bf['provider']})")
        return ok, evid

    if not on_gpu:
        lines.append(
            "CPU fp32 (threads as recorded); best bertfast provider with correct "
            "output per workload."
        )
        lines.append("")
        lines.append("| target | model | status | evidence |")
        lines.append("|---|---|---|---|")
        for model in models:
            if model not in ("minilm", "bert-base"):
                continue

            # Full batches: the grid, and padding-sweep batches with no padding.
            def full(r):
                return r.get("kind") == "grid" or (
                    r.get("kind") == "padding" and not r.get("padding_fraction")
                )

            ok, ev = ratio_vs(model, full, None, 1.0)
            lines.append(
                f"| best bertfast >= 1.0x the best fp32 peer (sdpa, compile, ORT, OV, CT2 "
                f"present), full batches | {model} | {_status(ok)} | {'; '.join(ev) or '-'} |"
            )
            ok, ev = ratio_vs(model, lambda r: r.get("kind") == "ragged", None, 2.5)
            lines.append(
                f"| >= 2.5x the best fp32 peer on ragged batches | {model} | {_status(ok)} | "
                f"{'; '.join(ev) or '-'} |"
            )
            ok, ev = ratio_vs(model, full, "onnxruntime", 1.0)
            lines.append(
                f"| best bertfast >= 1.0x ORT, full batches | {model} | {_status(ok)} | "
                f"{'; '.join(ev) or '-'} |"
            )
            ok, ev = ratio_vs(
                model, lambda r: r.get("workload") == "1x32", "transformers-eager", 1.5
            )
            lines.append(
                f"| >= 1.5x transformers eager at 1x32 | {model} | {_status(ok)} | "
                f"{'; '.join(ev) or '-'} |"
            )
            ok, ev = ratio_vs(model, lambda r: r.get("kind") == "ragged", "onnxruntime", 1.8)
            lines.append(
                f"| >= 1.8x ORT on ragged batches | {model} | {_status(ok)} | "
                f"{'; '.join(ev) or '-'} |"
            )
            ok, ev = [], []
            for (m, wl), provs in groups.items():
                first = next(iter(provs.values()))
                if m != model or first.get("kind") != "grid" or first.get("batch", 0) < 8:
                    continue
                bf = best_bertfast(provs)
                if bf is None or bf.get("ceiling_share") is None:
                    continue
                ok.append(bf["ceiling_share"] >= 0.85)
                ev.append(f"{wl} {bf['ceiling_share'] * 100:.0f}%")
            lines.append(
                f"| >= 85% of GEMM ceiling at batch >= 8 | {model} | {_status(ok)} | "
                f"{'; '.join(ev) or '-'} |"
            )
    else:
        lines.append("GPU, BERT-base (fp16 expected); best bertfast provider with correct output.")
        lines.append("")
        lines.append("| target | status | evidence |")
        lines.append("|---|---|---|")

        def wl_time(wl):
            provs = groups.get(("bert-base", wl))
            return (provs, best_bertfast(provs)) if provs else (None, None)

        for wl, limit in (
            ("32x128", 1.3e-3),
            ("1x128", 0.2e-3),
            ("ragged32-mean64-max128", 0.8e-3),
        ):
            provs, bf = wl_time(wl)
            st = "not measured" if bf is None else ("met" if bf["median_s"] <= limit else "not met")
            ev = (
                "-"
                if bf is None
                else f"{bf['median_s'] * 1e3:.3f} ms ({bf['provider']}, {bf['dtype']})"
            )
            lines.append(f"| {wl} <= {limit * 1e3:.1f} ms | {st} | {ev} |")
        provs, bf = wl_time("32x128")
        if bf is not None and "transformers-sdpa" in provs:
            r = provs["transformers-sdpa"]["median_s"] / bf["median_s"]
            lines.append(
                f"| >= 2x transformers SDPA at 32x128 | {'met' if r >= 2 else 'not met'} | "
                f"{r:.2f}x |"
            )
        else:
            lines.append("| >= 2x transformers SDPA at 32x128 | not measured | - |")
    loads = [r["load_avg_1min"] for r in rows if r.get("load_avg_1min") is not None]
    thr = max((r.get("threads") or 0) for r in rows) if rows else 0
    if loads and thr and max(loads) > 1.5 * thr:
        lines += [
            "",
            f"Caveat: the 1-minute load average reached {max(loads):.1f} while the "
            f"providers ran on {thr} threads: the machine was shared, so absolute times "
            "and shares of the ceiling are depressed and the verdicts are provisional; "
            "rerun on a quiet machine to confirm.",
        ]
    wrong = sorted(
        {r["name"] for r in rows if r.get("is_bertfast") and not r.get("parity_ok", True)}
    )
    if wrong:
        lines += ["", f"**Parity failures (excluded from targets):** {', '.join(wrong)}"]
    return "\n".join(lines)


# ---------------------------------------------------------------- kernels
def kernel_table(rows) -> str:
    ks = [r for r in rows if r.get("suite") == "kernels"]
    if not ks:
        return ""
    head = [
        "op",
        "tokens x hidden",
        "impl",
        "median ms",
        "IQR ms",
        "GB/s or GFLOP/s",
        "x pytorch",
        "parity (max err)",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = {
        (r["op"], r["tokens"], r["hidden"]): r["median_s"] for r in ks if r["provider"] == "pytorch"
    }
    for r in ks:
        key = (r["op"], r["tokens"], r["hidden"])
        rate = r.get("gbps") if r.get("unit") == "GB" else r.get("gflops")
        unit = "GB/s" if r.get("unit") == "GB" else "GFLOP/s"
        ratio = (
            "-"
            if r["provider"] == "pytorch" or key not in base
            else f"{base[key] / r['median_s']:.2f}"
        )
        cells = [
            r["op"],
            f"{r['tokens']}x{r['hidden']}",
            f"**{r['provider']}**" if r.get("is_bertfast") else r["provider"],
            _ms(r["median_s"]),
            _ms(r.get("iqr_s")),
            "-" if rate is None else f"{rate:.1f} {unit}",
            ratio,
            ("ok" if r.get("parity_ok", True) else "**WRONG**")
            + f" ({r.get('parity_max_abs_err', 0):.0e})",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------- plots
def plot_e2e(rows, path: str) -> bool:
    groups = e2e_groups(rows)
    if not groups:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(OrderedDict.fromkeys(m for m, _ in groups))
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 4.2 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        wls = [wl for (m, wl) in groups if m == model]
        provs = list(
            OrderedDict.fromkeys(p for (m, _), g in groups.items() if m == model for p in g)
        )
        width = 0.8 / max(len(provs), 1)
        for i, p in enumerate(provs):
            ys = [groups[(model, wl)].get(p, {}).get("tok_per_s") or 0 for wl in wls]
            xs = [j + (i - (len(provs) - 1) / 2) * width for j in range(len(wls))]
            ax.bar(xs, ys, width, label=p, hatch="//" if p.startswith("bertfast") else None)
        ax.set_xticks(range(len(wls)))
        ax.set_xticklabels(wls, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("real tokens / s (log)")
        dev = next(iter(groups[(model, wls[0])].values())).get("device", "")
        ax.set_title(f"{model} on {dev}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_kernels(rows, path: str) -> bool:
    ks = [r for r in rows if r.get("suite") == "kernels"]
    if not ks:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opsl = list(OrderedDict.fromkeys(r["op"] for r in ks))
    cols = 3
    nrow = (len(opsl) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(15, 4 * nrow), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, op in zip(axes.flat, opsl):
        rs = [r for r in ks if r["op"] == op]
        hiddens = sorted({r["hidden"] for r in rs})
        for impl in OrderedDict.fromkeys(r["provider"] for r in rs):
            for k, h in enumerate(hiddens):
                pts = sorted(
                    (r["tokens"], r.get("gbps") or r.get("gflops") or 0)
                    for r in rs
                    if r["provider"] == impl and r["hidden"] == h
                )
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        styles[k % 4],
                        marker="o",
                        label=f"{impl} H={h}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_title(op)
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s" if rs[0].get("unit") == "GB" else "GFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(opsl) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main
def build(rows, machine) -> str:
    parts = []
    e2e = [r for r in rows if r.get("suite") == "e2e"]
    dev = (e2e or rows)[0].get("device", "unknown") if rows else "unknown"
    parts.append(f"# bertfast benchmarks on `{dev}`")
    parts.append("")
    if e2e:
        ceils = [r["ceiling_gflops"] for r in e2e if r.get("ceiling_gflops")]
        ceil = max(ceils) if ceils else None
        probes = [r["probe_gflops"] for r in e2e if r.get("probe_gflops")]
        thr = e2e[0].get("threads")
        parts.append(
            f"- dtype {e2e[0].get('dtype')}"
            + (f", {thr} threads" if thr else "")
            + (
                f"; GEMM ceiling (best 2048^3 GEMM, timed inside each workload's "
                f"rounds): {min(ceils):.0f}..{ceil:.0f} GFLOP/s; `% GEMM` uses the "
                "ceiling of the row's own workload"
                if ceil
                else ""
            )
        )
        by_impl = {}
        for r in e2e:
            for k, v in (r.get("gemm_gflops_by_impl") or {}).items():
                by_impl.setdefault(k, []).append(v)
        if by_impl:
            parts.append(
                "- 2048^3 GEMM per implementation (median over workloads): "
                + ", ".join(f"{k} {sorted(v)[len(v) // 2]:.0f} GFLOP/s" for k, v in by_impl.items())
                + "; the ceiling is the best of them"
            )
        loads = [r["load_avg_1min"] for r in e2e if r.get("load_avg_1min") is not None]
        if loads:
            parts.append(
                f"- 1-minute load average during the run: {min(loads):.1f}..{max(loads):.1f}"
                " (other jobs shared the machine; timings are interleaved across "
                "providers so ratios see the same load)"
            )
        if probes:
            parts.append(
                f"- machine noise: a 512^3 GEMM probe before each case ranged "
                f"{min(probes):.0f}..{max(probes):.0f} GFLOP/s"
            )
        parts.append(
            "- GFLOP/s = useful FLOPs (real tokens only: 2 x tokens x GEMM weights "
            "+ 4 x L^2 x H attention, per layer) / median time; padded providers get no "
            "credit for padding, so GFLOP/s ratios equal speed ratios"
        )
        parts.append(
            "- `x B` = median of baseline B / median of the row, same run, same inputs; "
            "parity = max |out - transformers eager fp32| on real tokens"
        )
        parts.append(
            "- peak MB = resident-set growth over one call (CPU) or CUDA allocator "
            "peak growth (GPU)"
        )
        cpu = next((r["cpu"] for r in e2e if r.get("cpu")), None)
        if cpu:
            parts.append(
                f"- CPU: {cpu.get('model') or 'unknown'}, {cpu.get('logical_cpus')} logical "
                f"CPUs; SIMD flags: {' '.join(cpu.get('flags') or []) or 'unknown'}"
            )
        elif machine.get("cpu", {}).get("brand_raw"):
            parts.append(f"- CPU: {machine['cpu']['brand_raw']}")
        modes = sorted({r.get("isolation") or "inline (not recorded)" for r in e2e})
        parts.append(
            "- isolation: "
            + ", ".join(modes)
            + " (process: each provider loaded and timed in a worker process of its own, "
            "the rounds alternating between them)"
        )
        settles = sorted({r["settle_s"] for r in e2e if r.get("settle_s") is not None})
        if settles:
            parts.append(
                "- settle: "
                + ", ".join(f"{x * 1e3:.0f} ms" for x in settles)
                + " of untimed calls per provider before its timed block in every round "
                "(rounds rotate the provider order)"
            )
        hints = sorted(
            {
                (r.get("provider_info") or {}).get("hint")
                for r in e2e
                if str(r.get("provider", "")).startswith("openvino")
            }
            - {None}
        )
        if hints:
            parts.append(
                f"- OpenVINO performance hint used: {', '.join(hints)} (the faster of "
                "LATENCY / THROUGHPUT on an 8x64 probe at load, unless forced)"
            )
        parts.append("")
        parts.append("## End to end (fp32)")
        parts.append("")
        parts.append(e2e_table(rows))
        parts.append("")
        it = int8_table(rows)
        if it:
            parts.append(
                "## Low precision: int8 and bf16 rows (apart: never in the fp32 ratios or targets)"
            )
            parts.append("")
            parts.append(it)
            parts.append("")
        parts.append(targets(rows))
        parts.append("")
        mt = memory_table(rows)
        if mt:
            parts.append("## Resident memory")
            parts.append("")
            parts.append(
                "Growth of each provider's worker process over the process before the "
                "load (torch imported; the runtime's own imports count), in MB (2^20 "
                "bytes) and x the checkpoint's tensor bytes. *After first call*: after "
                "the worker's first call (its shape in brackets) with freed heap memory "
                "returned (`malloc_trim`), i.e. weights, caches and buffers the runtime "
                "keeps; *untrimmed*: without that, so glibc's cache of the freed "
                "activations of that call counts too."
            )
            parts.append("")
            parts.append(mt)
            parts.append("")
    kt = kernel_table(rows)
    if kt:
        parts.append("## Kernels (bertfast backends vs the PyTorch ops they replace)")
        parts.append("")
        parts.append(kt)
        parts.append("")
    return "\n".join(parts)


def _results_root() -> str:
    """The checkout's ``benchmarks/results/``, else ``benchmarks/results`` here."""
    d = suite_dir()
    return str(d / "results") if d is not None else os.path.join("benchmarks", "results")


def main(argv=None) -> int:
    """``python benchmarks/make_report.py RESULTS.json [MORE.json ...] [--out DIR]``."""
    p = argparse.ArgumentParser(
        prog="make_report.py",
        description="Turn pytest-benchmark JSON from the suite into a Markdown report and "
        "PNG plots.",
    )
    p.add_argument("json", nargs="+", help="pytest-benchmark --benchmark-json files")
    p.add_argument(
        "--out", default=None, help="output folder (default benchmarks/results/<device>/)"
    )
    args = p.parse_args(argv)
    rows, machine = load(args.json)
    if not rows:
        print("report: no rows from this suite with timings in", args.json, file=sys.stderr)
        return 1
    dev = next((r.get("device") for r in rows if r.get("device")), "unknown")
    out = args.out or os.path.join(_results_root(), dev)
    os.makedirs(out, exist_ok=True)
    text = build(rows, machine)
    pngs = []
    if plot_e2e(rows, os.path.join(out, "e2e.png")):
        pngs.append("e2e.png")
    if plot_kernels(rows, os.path.join(out, "kernels.png")):
        pngs.append("kernels.png")
    if pngs:
        text += "\n" + "\n".join(f"![{n}]({n})" for n in pngs) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"\nwrote {out}/report.md" + "".join(f", {n}" for n in pngs))
    return 0
