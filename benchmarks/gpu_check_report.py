"""The report of ``benchmarks/gpu_check.sh``: ``summary.md`` from the stage logs.

    python benchmarks/gpu_check_report.py OUTDIR STATEDIR
    python benchmarks/gpu_check_report.py --merge OUT.json IN.json...

The first form writes ``OUTDIR/summary.md`` (device, driver, versions, commit, stage
results, test counts, sanitizer summaries, the checks' verdicts, the benchmark tables)
and keeps ``OUTDIR`` within what a device run may bring back: at most 8 files, each
under 16 MiB (a longer log keeps its head and its tail). ``STATEDIR`` holds the
script's scratch files (``stages.tsv``, the JUnit XML of the test run). The second
form concatenates pytest-benchmark JSON files (those that exist) into one.
"""

from __future__ import annotations

import json
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


# ---------------------------------------------------------------- helpers
def _cmd(args: list[str]) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def versions() -> dict[str, str]:
    info: dict[str, str] = {}
    info["python"] = sys.version.split()[0]
    for mod in ("torch", "triton", "transformers", "numpy", "bertfast"):
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


def test_counts(state: str, log: str) -> list[str]:
    lines = []
    path = os.path.join(state, "tests.xml")
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        root = None
    if root is not None:
        suites = [root] if root.tag == "testsuite" else list(root)
        total = {
            k: sum(int(s.get(k, 0)) for s in suites)
            for k in ("tests", "failures", "errors", "skipped")
        }
        passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
        lines.append(
            f"- {passed} passed, {total['failures']} failed, {total['errors']} errors, "
            f"{total['skipped']} skipped ({total['tests']} collected)"
        )
        failed, skipped = [], Counter()
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            for tag in ("failure", "error"):
                el = case.find(tag)
                if el is not None:
                    msg = (
                        (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                    )
                    failed.append(f"{name}: {msg}")
            el = case.find("skipped")
            if el is not None:
                skipped[(el.get("message") or "")[:120]] += 1
        if failed:
            lines.append("- failed:")
            lines += [f"  - `{f}`" for f in failed[:40]]
            if len(failed) > 40:
                lines.append(f"  - ... and {len(failed) - 40} more (tests.log)")
        if skipped:
            lines.append("- skip reasons (count):")
            lines += [f"  - {n} x {reason}" for reason, n in skipped.most_common(8)]
    else:
        tail = [ln for ln in log.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
        lines.append(
            f"- {tail[-1].strip('= ') if tail else 'no pytest result line (see tests.log)'}"
        )
    return lines


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
            ln for ln in body.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)
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
    lines = []
    for chunk in log.split("\n$ ")[1:]:
        cmd = chunk.splitlines()[0]
        dtype = re.search(r"--dtype (\w+)", cmd)
        verdict = [ln for ln in chunk.splitlines() if ln.startswith(("PASS:", "FAIL:"))]
        err = [ln for ln in chunk.splitlines() if ln.startswith("bertfast: error")]
        rows = [ln.strip() for ln in chunk.splitlines() if re.match(r"\s+\S+\s+(PASS|FAIL)\s", ln)]
        lines.append(
            f"- {dtype.group(1) if dtype else cmd}: "
            + (verdict[-1] if verdict else err[-1] if err else "no verdict (see check.log)")
        )
        lines += [f"  - {r}" for r in rows if " FAIL " in f" {r} "]
    return lines or ["- not run"]


def bench_section(out: str, name: str, full: bool) -> list[str]:
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    sys.path.insert(0, HERE)
    import report  # benchmarks/report.py

    try:
        rows, machine = report.load([path])
    except (OSError, ValueError, KeyError) as exc:
        return [f"### {name}", "", f"cannot read: {exc}", ""]
    if not rows:
        return [f"### {name}", "", "no timed rows (see bench.log)", ""]
    if full:  # the whole table is in the JSON; the summary keeps the targets
        e2e = [r for r in rows if r.get("suite") == "e2e"]
        text = report.targets(e2e) if e2e else "no end-to-end rows"
    else:
        text = report.build(rows, machine).replace("\n# ", "\n### ").replace("\n## ", "\n#### ")
        text = re.sub(r"^# ", "### ", text)
    return [f"### {name}", "", text, ""]


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


def summary(out: str, state: str) -> str:
    v = versions()
    stages = stage_rows(state)
    parts = ["# bertfast GPU check", ""]
    parts.append(f"- commit: {commit()}")
    parts.append(
        f"- device: {v.pop('nvidia-smi', v.get('device (torch)', 'unknown'))} "
        "(name, driver, memory, compute capability)"
    )
    parts.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    parts += ["", "## Stages", "", "| stage | result | seconds | note |", "|---|---|---|---|"]
    parts += [
        f"| {s} | {'PASS' if r == 'pass' else r.upper()} | {t} | {n} |" for s, r, t, n in stages
    ]
    done = {s for s, *_ in stages}
    if "tests" in done:
        parts += ["", "## Tests", ""] + test_counts(state, _read(os.path.join(out, "tests.log")))
    if "sanitize" in done:
        parts += ["", "## compute-sanitizer (tests/ops/test_cuda_backend.py, small shapes)", ""]
        parts += sanitizer_summary(_read(os.path.join(out, "sanitize.log")))
    if "check" in done:
        parts += ["", "## bertfast check --device cuda", ""]
        parts += check_summary(_read(os.path.join(out, "check.log")))
    bench = bench_section(out, "bench-quick.json", full=False) + bench_section(
        out, "bench-full.json", full=True
    )
    if bench:
        parts += ["", "## Benchmarks", ""] + bench
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


def merge(target: str, sources: list[str]) -> int:
    merged = None
    for path in sources:
        if not os.path.exists(path):
            print(f"merge: {path} missing (that run did not finish)")
            continue
        with open(path) as f:
            data = json.load(f)
        if merged is None:
            merged = data
        else:
            merged["benchmarks"].extend(data.get("benchmarks", []))
    if merged is None:
        print(f"merge: nothing to merge into {target}")
        return 1
    with open(target, "w") as f:
        json.dump(merged, f)
    print(f"merge: {len(merged['benchmarks'])} rows -> {target}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--merge"] and len(argv) >= 2:
        return merge(argv[1], argv[2:])
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
