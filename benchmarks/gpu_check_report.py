"""The report of ``benchmarks/gpu_check.sh``, and its winners table.

    python benchmarks/gpu_check_report.py OUTDIR STATEDIR
    python benchmarks/gpu_check_report.py --winners TABLE.json [--dry-run] ROWS.jsonl...

The first form writes ``OUTDIR/summary.md`` (device, driver, versions, commit, the
stages, then a section per stage: test counts per file group, the sanitizers' ERROR
SUMMARY lines, the best candidate per sweep case, the winners table, the end-to-end
table and kernel profile, the checks' verdicts) and, when the tests or the sanitizers
ran, ``OUTDIR/gpu-tests.md`` (their part alone); it keeps ``OUTDIR`` within what a
device run may bring back: at most 8 files, each under 16 MiB (a longer log keeps its
head and its tail). ``STATEDIR`` holds the script's scratch files (``stages.tsv``,
``test-groups.tsv``, the JUnit XML of each test group).

The second form is stage (e): the winners table from sweep rows (stages b and c; the
files that exist) by ``bertfast.ops.winners.table_from_rows``, written with
``write_table`` (exit status 4 when there is no row at all). The table is for the GPU
the rows name (the one most of them name, if several: a device call may land on
another kind of machine than the one before), whatever machine builds it, so it also
runs without a GPU on rows brought back; ``--dry-run`` marks the table as a dry run's
(used only when forced).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MAX_FILES = 8
MAX_BYTES = 16 * 1024 * 1024
KEEP_HEAD = 2 * 1024 * 1024
KEEP_TAIL = 12 * 1024 * 1024
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
#: ``--winners``' exit status when there is no sweep row to build a table from.
NO_ROWS = 4
#: Cases shown per sweep table in summary.md (every row stays in rows.jsonl).
SWEEP_CASES_SHOWN = 60
E2E_BASELINES = (
    "transformers-eager",
    "transformers-sdpa",
    "torch-compile",
    "torch-compile-max-autotune",
)


# ---------------------------------------------------------------- helpers
def _cmd(args: list[str]) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _read(path: str) -> str:
    """The text of ``path`` ("" when it cannot be read); ``*.gz`` is unpacked (the rows
    committed under benchmarks/results/<gpu>/ are gzipped)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    except (OSError, EOFError):
        return ""


def versions() -> dict[str, str]:
    info: dict[str, str] = {}
    info["python"] = sys.version.split()[0]
    for mod in ("torch", "triton", "transformers", "tokenizers", "numpy", "bertfast"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", "?")
        except Exception as exc:  # a missing or broken package is reported, not fatal
            info[mod] = f"not importable ({type(exc).__name__})"
    try:
        import torch

        info["torch CUDA"] = str(torch.version.cuda)
        if torch.cuda.is_available():
            cap = torch.cuda.get_device_capability()
            info["device (torch)"] = f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})"
    except Exception:
        pass
    cpu = _host_cpu()
    if cpu:  # the CPU tests' paths depend on it (oneDNN's weight layout, AMX, AVX-512)
        info["host CPU"] = cpu
    nvcc = _cmd(["nvcc", "--version"])
    if nvcc:
        info["nvcc"] = nvcc.splitlines()[-1]
    san = _cmd(["compute-sanitizer", "--version"])
    if san:
        info["compute-sanitizer"] = san.splitlines()[-1]
    smi = _cmd(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,compute_cap",
            "--format=csv,noheader",
        ]
    )
    if smi:
        info["nvidia-smi"] = smi.splitlines()[0]
    return info


def _host_cpu() -> str:
    """The host CPU's model name and its widest vector / matrix extensions."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return ""
    name = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
        "?",
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    ext = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({os.cpu_count()} CPUs; {' '.join(ext) or 'no AVX2'})"


def commit() -> str:
    if os.environ.get("GPU_CHECK_COMMIT"):  # a copy without .git: the caller names it
        return os.environ["GPU_CHECK_COMMIT"]
    head = _cmd(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"])
    if not head:
        return "unknown (no git metadata in this copy)"
    dirty = _cmd(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    return head + (" (with uncommitted changes)" if dirty else "")


def stage_rows(state: str) -> list[list[str]]:
    rows = []
    for line in _read(os.path.join(state, "stages.tsv")).splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            rows.append(parts)
    return rows


def read_rows(path: str) -> list[dict]:
    """The JSON lines of ``path`` (none when it is missing; a cut last line skipped)."""
    rows = []
    for line in _read(path).splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _ms(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


# ---------------------------------------------------------------- tests
def _junit(path: str):
    try:
        return ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None


def _group_log(log: str, n: str, name: str) -> str:
    """The part of tests.log that group ``n`` wrote."""
    parts = re.split(r"^########## tests group (\S+) (\S+)\n", log, flags=re.M)
    for i in range(1, len(parts) - 1, 3):
        if parts[i] == n and parts[i + 1] == name:
            return parts[i + 2]
    return ""


_EARLY = re.compile(r"^EARLY FAILED (\S+) \((\w+)\)$", re.M)


def early_failures(part: str) -> list[str]:
    """The failures a group printed as they happened (``EARLY FAILED <nodeid> (<phase>)``
    and its first ``E`` line, from tests/conftest.py): what a run cut before
    its summary still says."""
    found = []
    for m in _EARLY.finditer(part):
        tb = []
        for ln in part[m.end() :].split("\n")[1:]:
            if not ln.startswith("    "):
                break
            tb.append(ln.strip())
        errors = [ln for ln in tb if ln.startswith("E ")]  # pytest's error lines
        why = (errors[0][1:].strip() if errors else (tb[-1] if tb else ""))[:160]
        found.append(f"{m.group(1)} ({m.group(2)}): {why}")
    return found


def test_groups(state: str, log: str) -> list[str]:
    """A table of the pytest runs, one per file group, and the failures of each."""
    groups = [
        ln.split("\t")
        for ln in _read(os.path.join(state, "test-groups.tsv")).splitlines()
        if ln.count("\t") >= 4
    ]
    if not groups:
        return ["- not run"]
    lines = [
        "| group | result | passed | failed | errors | skipped | seconds | files |",
        "|---|---|---|---|---|---|---|---|",
    ]
    details: list[str] = []
    for n, name, rc, seconds, args in groups:
        verdict = {"0": "PASS", "124": "TIMEOUT", "137": "TIMEOUT"}.get(rc, f"FAIL (exit {rc})")
        if rc == "5":
            verdict = "no tests collected"
        files = " ".join(a for a in args.split() if not a.startswith("--ignore="))
        if rc == "none":
            lines.append(
                f"| {n} {name} | NOT RUN (the stage's time was spent) | | | | | 0 | `{files}` |"
            )
            continue
        files = " ".join(a for a in args.split() if not a.startswith("--ignore="))
        root = _junit(os.path.join(state, f"tests-{n}.xml"))
        if root is None:
            part = _group_log(log, n, name)
            pct = re.findall(r"\[\s*(\d+)%\]", part)
            where = f"cut at {pct[-1]}%" if pct else "no progress line"
            early = early_failures(part)
            lines.append(
                f"| {n} {name} | {verdict} | ? | {len(early) if early else '?'} | ? | ? "
                f"| {seconds} | `{files}` |"
            )
            details.append(f"- group {n} {name}: no JUnit XML ({where}; see tests.log)")
            if early:
                details.append(f"- group {n} {name}, failed before the cut:")
                details += [f"  - `{f}`" for f in early[:40]]
                if len(early) > 40:
                    details.append(f"  - ... and {len(early) - 40} more (tests.log)")
            continue
        suites = [root] if root.tag == "testsuite" else list(root)
        total = {
            k: sum(int(s.get(k, 0)) for s in suites)
            for k in ("tests", "failures", "errors", "skipped")
        }
        passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
        lines.append(
            f"| {n} {name} | {verdict} | {passed} | {total['failures']} | {total['errors']} | "
            f"{total['skipped']} | {seconds} | `{files}` |"
        )
        failed, skipped = [], Counter()
        for case in root.iter("testcase"):
            label = f"{case.get('classname', '')}::{case.get('name', '')}"
            for tag in ("failure", "error"):
                el = case.find(tag)
                if el is not None:
                    msg = (el.get("message") or "").splitlines()[:1]
                    msg = msg[0][:160] if msg else ""
                    failed.append(f"{label}: {msg}")
            el = case.find("skipped")
            if el is not None:
                skipped[(el.get("message") or "")[:120]] += 1
        if failed:
            details.append(f"- group {n} {name}, failed:")
            details += [f"  - `{f}`" for f in failed[:40]]
            if len(failed) > 40:
                details.append(f"  - ... and {len(failed) - 40} more (tests.log)")
        if skipped:
            details.append(f"- group {n} {name}, skip reasons (count):")
            details += [f"  - {k} x {reason}" for reason, k in skipped.most_common(8)]
    return lines + ([""] + details if details else [])


_HEADLINE = re.compile(
    r"^========= ((?:Invalid|Uninitialized|Race|Barrier|Error|Program hit|"
    r"Warning|WARN|Misaligned|Out of range|Malloc|Free|Leaked|Unspecified|"
    r"Address)[^\n]*?)(?: at 0x[0-9a-f]+)?$"
)
_FRAME = re.compile(r"^=========\s+at (?:0x[0-9a-f]+ in )?(.+?)(?:\+0x[0-9a-f]+| in /|$)")


def _error_kinds(body: str) -> list[str]:
    """One entry per reported error: its headline and the kernel it was found in (the
    first ``at`` frame), so errors in bertfast's kernels stand apart from others'."""
    lines = body.splitlines()
    kinds = []
    for i, line in enumerate(lines):
        m = _HEADLINE.match(line)
        if not m:
            continue
        where = ""
        for nxt in lines[i + 1 : i + 3]:
            f = _FRAME.match(nxt)
            if f:
                where = f" in {f.group(1).strip()}"
                break
        kinds.append(m.group(1).strip() + where)
    return kinds


def sanitizer_summary(log: str) -> list[str]:
    lines = []
    sections = re.split(r"^########## compute-sanitizer --tool (\w+)\n", log, flags=re.M)
    # sections: [before, tool1, body1, tool2, body2, ...]
    for tool, body in zip(sections[1::2], sections[2::2]):
        status = re.search(r"^########## \w+ exit status (\d+)", body, re.M)
        summary = re.findall(r"^========= (?:ERROR|RACECHECK) SUMMARY: .*$", body, re.M)
        pytest_line = [
            ln
            for ln in body.splitlines()
            if not ln.startswith("=========")
            and re.search(r"\d+ (passed|failed|errors?|skipped|deselected)\b", ln)
        ]
        kinds = Counter(_error_kinds(body))
        rc = status.group(1) if status else "?"
        verdict = (
            "clean"
            if rc == "0"
            else "ERRORS FOUND"
            if rc == "86"
            else "timed out"
            if rc in ("124", "137")
            else f"failed (exit {rc})"
        )
        lines.append(
            f"- **{tool}**: {verdict}; "
            + ("; ".join(s.replace("=========", "").strip() for s in summary) or "no summary line")
            + (f"; pytest: {pytest_line[-1].strip('= ')}" if pytest_line else "")
        )
        for kind, n in kinds.most_common(6):
            lines.append(f"  - {n} x {kind[:150]}")
    return lines or ["- not run"]


def check_summary(log: str) -> list[str]:
    """The verdict of each ``bertfast check`` command in ``log`` (gpu_check.log, which
    holds the other stages' commands too)."""
    lines = []
    for chunk in log.split("\n$ ")[1:]:
        cmd = chunk.splitlines()[0]
        if " bertfast check " not in f" {cmd} ":
            continue
        dtype = re.search(r"--dtype (\w+)", cmd)
        verdict = [ln for ln in chunk.splitlines() if ln.startswith(("PASS:", "FAIL:"))]
        err = [ln for ln in chunk.splitlines() if ln.startswith("bertfast: error")]
        rows = [ln.strip() for ln in chunk.splitlines() if re.match(r"\s+\S+\s+(PASS|FAIL)\s", ln)]
        lines.append(
            f"- {dtype.group(1) if dtype else cmd}: "
            + (verdict[-1] if verdict else err[-1] if err else "no verdict (see gpu_check.log)")
        )
        lines += [f"  - {r}" for r in rows if " FAIL " in f" {r} "]
    return lines or ["- not run"]


# ---------------------------------------------------------------- sweeps (b, c)
def _shape_text(r: dict) -> str:
    if r.get("point"):
        return str(r["point"])
    shape = r.get("shape")
    if isinstance(shape, dict):
        return ",".join(f"{k}={v}" for k, v in shape.items())
    return str(shape)


def sweep_section(rows: list[dict], stage: str) -> list[str]:
    """Per case (op, model, dtype, shape): the fastest candidate that passed parity,
    what ``backend="auto"`` takes without a table (``auto``), and how much faster the
    best is; then the reference rows (parity "n/a": a GEMM ceiling, a probe) and the
    candidates that failed parity or raised."""
    rows = [r for r in rows if r.get("stage") == stage]
    if not rows:
        return ["- no rows"]
    refs = [r for r in rows if r.get("parity") == "n/a"]
    rows = [r for r in rows if r.get("parity") != "n/a"]
    cases: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r.get("op"), r.get("model") or "", r.get("dtype"), _shape_text(r))
        cases.setdefault(key, []).append(r)
    bad = [r for r in rows if r.get("parity") != "pass"]
    lines = [
        f"{len(rows)} candidate rows over {len(cases)} cases, {len(refs)} reference rows; "
        f"{len(bad)} candidates failing parity or raising (never a winner). Times: median "
        "ms of one launch (CUDA events over back-to-back launches).",
        "",
        "`sdpa ms`: the fastest torch SDPA candidate (`torch:sdpa`, each SDPA kernel "
        "forced); `sdpa / ours`: it over the fastest of bertfast's own kernels (> 1: ours "
        "faster).",
        "",
        "| op | model | dtype | shape | best candidate | ms | TFLOP/s | auto | auto ms "
        "| auto / best | sdpa ms | sdpa / ours | passing |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fastest(rs):
        return min(rs, key=lambda r: r["median_ms"]) if rs else None

    for (op, model, dtype, shape), rs in list(cases.items())[:SWEEP_CASES_SHOWN]:
        ok = [r for r in rs if r.get("parity") == "pass" and _ms(r.get("median_ms"))]
        best = fastest(ok)
        ours = fastest([r for r in ok if not str(r.get("candidate")).startswith("torch")])
        sdpa = fastest([r for r in ok if str(r.get("candidate")).startswith("torch:sdpa")])
        auto = next((r for r in rs if r.get("auto")), None)
        auto_ms = _ms(auto.get("median_ms")) if auto else None
        gain = f"{auto_ms / best['median_ms']:.2f}x" if best and auto_ms else "-"
        tflops = _ms(best.get("tflops")) if best else None
        vs = f"{sdpa['median_ms'] / ours['median_ms']:.2f}x" if sdpa and ours else "-"
        lines.append(
            f"| {op} | {model} | {dtype} | {shape} | "
            + (f"`{best['candidate']}` | {best['median_ms']:.4f}" if best else "none | -")
            + (f" | {tflops:.1f}" if tflops else " | -")
            + f" | {'`' + str(auto['candidate']) + '`' if auto else '-'} | "
            + (f"{auto_ms:.4f}" if auto_ms else "-")
            + f" | {gain} | "
            + (f"{sdpa['median_ms']:.4f}" if sdpa else "-")
            + f" | {vs} | {len(ok)}/{len(rs)} |"
        )
    if len(cases) > SWEEP_CASES_SHOWN:
        lines.append(f"\n({len(cases) - SWEEP_CASES_SHOWN} more cases in rows.jsonl)")
    if refs:
        lines += ["", "Reference rows:"]
        for r in refs[:20]:
            ms = _ms(r.get("median_ms"))
            extra = {
                k: v
                for k, v in r.items()
                if k in ("form", "tflops", "probe_note", "err_erf", "err_tanh")
                and v not in ("", None)
            }
            lines.append(
                f"- {r.get('op')} {r.get('dtype')} {_shape_text(r)} `{r.get('candidate')}`"
                + (f": {ms:.4f} ms" if ms else "")
                + "".join(
                    f", {k} {v:.3g}" if isinstance(v, float) else f", {k} {v}"
                    for k, v in extra.items()
                )
            )
        if len(refs) > 20:
            lines.append(f"- ... and {len(refs) - 20} more (rows.jsonl)")
    if bad:
        lines += ["", "Failing parity or raising:"]
        for r in bad[:20]:
            lines.append(
                f"- {r.get('op')} {r.get('model') or ''} {r.get('dtype')} {_shape_text(r)} "
                f"`{r.get('candidate')}`: {str(r.get('parity'))[:160]}"
            )
        if len(bad) > 20:
            lines.append(f"- ... and {len(bad) - 20} more (rows.jsonl)")
    return lines


# ---------------------------------------------------------------- winners (e)
def _commit_name(device: dict) -> str:
    try:
        from bertfast.ops.winners import table_filename

        return table_filename(device)
    except Exception:  # the winners module missing or older
        return "<gpu>_sm<cap>_torch<x.y>_triton<x.y>.json"


def winners_section(out: str) -> list[str]:
    path = os.path.join(out, "winners.json")
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError):
        return ["- no winners.json"]
    entries = [e for e in table.get("entries", []) if isinstance(e, dict)]
    device = table.get("device") or {}
    by_op = Counter(e.get("op") for e in entries)
    lines = [
        f"- {len(entries)} entries ({', '.join(f'{op} {n}' for op, n in by_op.items())}); "
        f"device: {device.get('gpu')} (capability {device.get('capability')}), torch "
        f"{device.get('torch')}, triton {device.get('triton')}"
        + ("; DRY RUN (used only when forced)" if device.get("dry_run") else ""),
        f"- to ship it (once the GPU tests pass there): `{_commit_name(device)}` in "
        "`bertfast/data/winners/`",
    ]
    if entries:
        lines += [
            "",
            "| op | dtype | bucket | winner | ms | runner-up | speedup |",
            "|---|---|---|---|---|---|---|",
        ]
        top = sorted(entries, key=lambda e: -float(e.get("speedup") or 1.0))[:15]
        for e in top:
            label = e.get("backend", "?") + (
                f":{e['variant']}" if e.get("variant") not in (None, "default") else ""
            )
            if e.get("config"):
                label += "[" + ",".join(f"{k}={v}" for k, v in e["config"].items()) + "]"
            lines.append(
                f"| {e.get('op')} | {e.get('dtype')} | {e.get('bucket')} | `{label}` | "
                f"{e.get('median_ms')} | {e.get('runner_up') or '-'} | {e.get('speedup')} |"
            )
        if len(entries) > len(top):
            lines.append(f"\n(the {len(top)} largest speedups; all in winners.json)")
    return lines


def build_winners(target: str, sources: list[str], dry: bool = False) -> int:
    """Stage (e): the table from the rows of ``sources`` into ``target``."""
    rows = []
    for path in sources:
        if not os.path.exists(path):
            print(f"winners: {path} missing (skipped)")
            continue
        got = [r for r in read_rows(path) if r.get("bucket") is not None]
        print(f"winners: {len(got)} sweep rows from {path}")
        rows += got
    if not rows:
        print("winners: no sweep rows; no table written")
        return NO_ROWS
    try:
        from bertfast.ops.winners import table_filename, table_from_rows, write_table
    except ImportError as exc:
        print(f"winners: bertfast.ops.winners cannot build tables here ({exc})")
        return 1
    # The table is for the GPU the rows were measured on (a call may land on another
    # kind of machine than the calls before it): the one most rows name.
    gpus = Counter((r.get("device") or {}).get("gpu") for r in rows)
    gpu = gpus.most_common(1)[0][0]
    device = dict(
        next(r.get("device") or {} for r in rows if (r.get("device") or {}).get("gpu") == gpu)
    )
    if len(gpus) > 1:
        print(f"winners: rows from {dict(gpus)}; the table is for {gpu}, the others are left out")
    if dry:
        device["dry_run"] = True
    made_by = "benchmarks/gpu_check.sh winners (" + ", ".join(map(os.path.basename, sources)) + ")"
    table = table_from_rows(rows, device, made_by=made_by)
    entries = table.get("entries", [])
    if not entries:
        print("winners: no (op, dtype, bucket) has a passing candidate; no table written")
        return 1
    write_table(table, target)
    print(f"winners: {len(entries)} entries from {len(rows)} rows -> {target}")
    print(
        "winners: to ship it, commit it as "
        f"bertfast/data/winners/{table_filename(table.get('device') or {})}"
    )
    return 0


# ---------------------------------------------------------------- end to end (d)
def _e2e_table(rows: list[dict]) -> str:
    names = {r.get("provider") for r in rows}
    baselines = [b for b in E2E_BASELINES if b in names]
    try:
        from bertfast.bench.report import format_table

        return format_table(rows, baselines)
    except Exception as exc:  # rows of another shape: a plain table
        lines = [f"(format_table: {type(exc).__name__}: {exc})", "", "| shape | provider | ms |"]
        lines.append("|---|---|---|")
        for r in rows:
            lines.append(f"| {r.get('shape')} | {r.get('provider')} | {r.get('median_ms')} |")
        return "\n".join(lines)


def e2e_section(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if r.get("stage") == "d"]
    if not rows:
        return ["- no rows"]
    e2e = [r for r in rows if r.get("kind") == "e2e"]
    first = e2e[0] if e2e else rows[0]
    lines = [
        f"- {first.get('model')} {first.get('dtype')}; BERTFAST_WINNERS="
        f"{first.get('winners')}; table in use: {first.get('winners_table')}; isolation "
        f"{first.get('isolation')}. Median ms per call (synchronised), ratios = baseline's "
        "median / the row's (> 1: faster than it), parity against transformers eager.",
    ]
    for r in rows:
        if r.get("kind") == "skip":
            lines.append(f"- skipped {r.get('provider')}: {str(r.get('why'))[:200]}")
    titles = (
        (1, "bertfast-auto beside transformers"),
        (2, "torch.compile, bertfast-cuda, bertfast-triton (beside transformers)"),
        (3, "torch.compile max-autotune (beside transformers)"),
    )
    for group, title in titles:
        part = [r for r in e2e if r.get("group") == group]
        if part:
            lines += ["", f"#### {title}", "", _e2e_table(part)]
    prof = [r for r in rows if r.get("kind") == "profile"]
    summ = next((r for r in rows if r.get("kind") == "profile-summary"), None)
    if summ:
        lines += [
            "",
            f"#### Kernel profile, bertfast-auto at {summ.get('shape')}",
            "",
            f"{summ.get('kernels_per_forward'):.0f} {summ.get('what')} per forward "
            f"(+ {summ.get('copies_per_forward', 0):.0f} copies/memsets), "
            f"{summ.get('device_ms_per_forward'):.3f} ms of them; wall "
            f"{summ.get('wall_ms_per_forward'):.3f} ms per forward "
            f"({summ.get('forwards')} forwards profiled)",
            "",
            "| kernel | calls / forward | ms / forward | share |",
            "|---|---|---|---|",
        ]
        for r in prof:
            name = str(r.get("name")).replace("|", "\\|")[:110]
            lines.append(
                f"| `{name}` | {r.get('calls_per_forward'):.1f} | "
                f"{r.get('ms_per_forward'):.4f} | {r.get('share', 0):.1%} |"
            )
    return lines


def trim(out: str) -> list[str]:
    """Keep OUTDIR within the device's limits: cut logs over 16 MiB (head + tail)."""
    notes = []
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if not os.path.isfile(path):
            continue
        size = os.path.getsize(path)
        if size > MAX_BYTES and not name.endswith(".json"):
            with open(path, "rb") as f:
                head = f.read(KEEP_HEAD)
                f.seek(size - KEEP_TAIL)
                tail = f.read()
            with open(path, "wb") as f:
                f.write(
                    head
                    + f"\n\n[... {size - KEEP_HEAD - KEEP_TAIL} bytes cut ...]\n\n".encode()
                    + tail
                )
            notes.append(f"{name} cut from {size} bytes to its head and tail")
    files = [n for n in os.listdir(out) if os.path.isfile(os.path.join(out, n))]
    if len(files) > MAX_FILES:
        notes.append(f"OUTDIR holds {len(files)} files (> {MAX_FILES}): only 8 come back")
    big = [n for n in files if os.path.getsize(os.path.join(out, n)) > MAX_BYTES]
    if big:
        notes.append(f"over 16 MiB and not brought back: {', '.join(big)}")
    return notes


def _stage_done(stages, name: str) -> bool:
    return any(s == name and r != "skip" for s, r, *_ in stages)


def tests_part(out: str, state: str, stages) -> list[str]:
    """The tests' and the sanitizers' sections (also gpu-tests.md)."""
    parts = []
    if _stage_done(stages, "tests"):
        parts += ["## Tests, by file group", ""]
        parts += test_groups(state, _read(os.path.join(out, "tests.log")))
    if _stage_done(stages, "sanitize"):
        parts += [
            "",
            "## compute-sanitizer (bertfast's kernels only: kernel names with `bertfast`)",
            "",
        ]
        parts += sanitizer_summary(_read(os.path.join(out, "sanitize.log")))
    return parts


def summary(out: str, state: str) -> str:
    v = versions()
    stages = stage_rows(state)
    head = ["- commit: " + commit()]
    head.append(
        f"- device: {v.pop('nvidia-smi', v.get('device (torch)', 'unknown'))} "
        "(name, driver, memory, compute capability)"
    )
    head.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    parts = ["# bertfast GPU check", ""] + head
    parts += ["", "## Stages", "", "| stage | result | seconds | note |", "|---|---|---|---|"]
    parts += [
        f"| {s} | {'PASS' if r == 'pass' else r.upper()} | {t} | {n} |" for s, r, t, n in stages
    ]
    tests = tests_part(out, state, stages)
    if _stage_done(stages, "tests") or _stage_done(stages, "sanitize"):
        with open(os.path.join(out, "gpu-tests.md"), "w", encoding="utf-8") as f:
            f.write("\n".join(["# bertfast GPU tests", ""] + head + [""] + tests) + "\n")
    parts += [""] + tests if tests else []
    rows = read_rows(os.path.join(out, "rows.jsonl"))
    done = {s for s, *_ in stages}
    if "sweep-attention" in done:
        parts += ["", "## (b) Attention candidates", ""] + sweep_section(rows, "b")
    if "sweep-ops" in done:
        parts += ["", "## (c) GEMM, epilogue, LayerNorm candidates", ""] + sweep_section(rows, "c")
    if "winners" in done or os.path.exists(os.path.join(out, "winners.json")):
        parts += ["", "## (e) Winners table (winners.json)", ""] + winners_section(out)
    if "e2e" in done:
        parts += ["", "## (d) End to end"]
        parts += [""] + e2e_section(read_rows(os.path.join(out, "e2e.jsonl")))
    if "check" in done:
        parts += ["", "## bertfast check --device cuda", ""]
        parts += check_summary(_read(os.path.join(out, "gpu_check.log")))
    notes = trim(out)
    files = sorted(
        n for n in os.listdir(out) if os.path.isfile(os.path.join(out, n)) and n != "summary.md"
    )
    parts += (
        ["", "## Files", "", "- summary.md (this file)"]
        + [f"- {n} ({os.path.getsize(os.path.join(out, n))} bytes)" for n in files]
        + [f"- note: {n}" for n in notes]
    )
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--winners"] and len(argv) >= 2:
        rest = argv[2:]
        dry = "--dry-run" in rest
        return build_winners(argv[1], [a for a in rest if a != "--dry-run"], dry=dry)
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, state = argv
    text = summary(out, state)
    # summary.md counts as one of the 8 files: write it first, then check the limits
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
