"""How a ``bertfast bench`` run is shown: rows -> a Markdown table, and the JSON file."""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["format_table", "format_memory", "FOOTNOTE", "write_json"]

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
