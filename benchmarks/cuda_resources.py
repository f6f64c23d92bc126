"""Resource use and instruction mix of the CUDA kernels, on a machine without a GPU.

Compiles every ``kernels/cuda/*.cu`` for sm_80 and sm_90 to a cubin with
``-Xptxas -v`` (the flags, include directories and defines of CMakeLists.txt), reads
per kernel the registers, spills and static shared memory ptxas reports, and counts in
``cuobjdump -sass`` the instructions that tell how a kernel moves data:

=========  ===================================================================
HMMA       ``mma.sync`` on the tensor cores (wmma compiles to it too)
LDSM       ``ldmatrix``: shared -> registers in mma fragment layout
LDS / STS  ordinary shared-memory loads / stores
LDGSTS     ``cp.async``: global -> shared without a register round trip
=========  ===================================================================

Counts are static (instructions in the code, not executed ones); the key loops are
not unrolled, so for the attention kernels they are close to the per-key-tile counts.
Dynamic shared memory and block size of the attention kernels are not in the cubin:
a host-only probe compiled from the kernel's own source prints them (its config
structs), and the table adds the CTAs per SM that registers, shared memory and
threads allow (A100 for sm_80, H100 for sm_90).

    python benchmarks/cuda_resources.py                 # all kernels, writes the table
    python benchmarks/cuda_resources.py --match attention --no-write

Writes ``benchmarks/results/cuda-resources.md`` (and prints it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels" / "cuda"
OUT = ROOT / "benchmarks" / "results" / "cuda-resources.md"
ARCHS = ("80", "90")

#: Per-SM limits used for the occupancy column (sm_80: A100, sm_90: H100). Shared
#: memory: the carve-out maximum, and 1 KiB the hardware reserves per CTA.
SM_LIMITS = {
    "80": {"gpu": "A100", "smem": 167936, "regs": 65536, "threads": 2048, "ctas": 32},
    "90": {"gpu": "H100", "smem": 233472, "regs": 65536, "threads": 2048, "ctas": 32},
}
SMEM_RESERVED_PER_CTA = 1024

#: Kernels launched with dynamic shared memory: file -> (kernel template, expression of
#: its dynamic shared bytes, expression of its block size), both in the file's own
#: terms (the probe includes the .cu file).
DYNAMIC_SMEM = {
    "attention.cu": ("attention_kernel", "AttnConfig<{T}, {D}>::kSmemBytes", "kThreads"),
    "flash_attention.cu": (
        "flash_attention_kernel",
        "FlashConfig<{T}, {D}>::kSmemBytes",
        "kThreads",
    ),
}

COUNTED = ("HMMA", "LDSM", "LDS", "STS", "LDGSTS")


def find_tool(name: str) -> str:
    """``name`` on PATH, under $CUDA_HOME / /usr/local/cuda, or (cuobjdump) the copy a
    triton install carries."""
    found = shutil.which(name)
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / name).exists():
            return str(Path(base) / "bin" / name)
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    sys.exit(f"{name} not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, triton's bin)")


def nvcc_flags(arch: str) -> list[str]:
    """CMakeLists.txt's CUDA flags for one architecture (its include directories and the
    kernels' defines; torch's headers are on the target's path but no kernel uses them)."""
    return [
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-O3",
        "-lineinfo",
        f"-I{ROOT / 'csrc'}",
        f"-I{ROOT / 'kernels'}",
        "-DBERTFAST_WITH_CUDA=1",
        f"-arch=sm_{arch}",
    ]


def compile_cubin(nvcc: str, src: Path, arch: str, tmp: Path) -> tuple[Path, str]:
    cubin = tmp / f"{src.stem}.sm{arch}.cubin"
    cmd = [nvcc, *nvcc_flags(arch), "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(src)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"nvcc failed for {src.name} (sm_{arch}):\n{run.stderr}")
    return cubin, run.stderr


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\d+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, dict]:
    """mangled kernel name -> registers, spills, static smem (entry functions only)."""
    out: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            out[current] = {"regs": 0, "spill_st": 0, "spill_ld": 0, "smem": 0, "stack": 0}
            continue
        if current is None:
            continue
        m = _SPILL.search(line)
        if m:
            out[current]["stack"] = int(m.group(1))
            out[current]["spill_st"] = int(m.group(2))
            out[current]["spill_ld"] = int(m.group(3))
        m = _USED.search(line)
        if m:
            out[current]["regs"] = int(m.group(1))
            s = _SMEM.search(line)
            out[current]["smem"] = int(s.group(1)) if s else 0
            current = None
    return out


_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")


def count_sass(cuobjdump: str, cubin: Path) -> dict[str, dict[str, int]]:
    """mangled kernel name -> {opcode: count} for the COUNTED opcodes (modifiers dropped:
    LDS.U.128 counts as LDS, LDSM.16.MT88.4 as LDSM). Instructions predicated on
    ``!PT`` never execute (ptxas places an ``@!PT LDS RZ, [RZ]`` beside LDGSTS) and are
    not counted."""
    run = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"cuobjdump failed on {cubin.name}:\n{run.stderr}")
    out: dict[str, dict[str, int]] = {}
    counts = None
    for line in run.stdout.splitlines():
        m = _FUNCTION.match(line)
        if m:
            counts = out.setdefault(m.group(1), dict.fromkeys(COUNTED, 0))
            continue
        if counts is None:
            continue
        m = _INSTR.search(line)
        if m and (m.group(1) or "").strip() != "@!PT":
            op = m.group(2).split(".")[0]
            if op in counts:
                counts[op] += 1
    return out


def demangle(names: list[str]) -> dict[str, str]:
    """Readable names: ``flash_attention_kernel<__half, 64>`` (namespaces and parameter
    lists dropped)."""
    filt = shutil.which("c++filt")
    if not filt or not names:
        return {n: n for n in names}
    run = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True)
    out = {}
    for mangled, plain in zip(names, run.stdout.splitlines()):
        plain = plain.replace("(anonymous namespace)::", "")
        plain = re.sub(r"\([^()]*\)$", "", plain)  # the parameter list
        plain = re.sub(r"^void ", "", plain)  # a template's return type
        plain = re.sub(r"\b\w+::", "", plain)  # namespaces
        out[mangled] = plain
    return out


_TEMPLATE = re.compile(r"^(\w+)<(.*)>$")


def probe_dynamic(nvcc: str, src: Path, instances: list[str], tmp: Path) -> dict[str, tuple]:
    """readable kernel name -> (dynamic smem bytes, threads per block), for the kernels of
    DYNAMIC_SMEM, from a host program compiled from the kernel's source (it reads
    constexpr values of the file's config structs; nothing runs on a GPU)."""
    spec = DYNAMIC_SMEM.get(src.name)
    if spec is None:
        return {}
    kernel, smem_expr, threads_expr = spec
    lines = [f'#include "{src}"', "#include <cstdio>", "int main() {"]
    lines.append("  using namespace bertfast::cuda;")
    wanted = []
    for name in instances:
        m = _TEMPLATE.match(name)
        if not m or m.group(1) != kernel:
            continue
        T, D = (a.strip() for a in m.group(2).split(","))
        expr = smem_expr.format(T=T, D=D)
        lines.append(
            f'  std::printf("%s|%d|%d\\n", "{name}", static_cast<int>({expr}), '
            f"static_cast<int>({threads_expr}));"
        )
        wanted.append(name)
    lines.append("  return 0;\n}")
    if not wanted:
        return {}
    probe_src = tmp / f"probe_{src.stem}.cu"
    probe_src.write_text("\n".join(lines) + "\n")
    exe = tmp / f"probe_{src.stem}"
    cmd = [nvcc, *nvcc_flags("80"), "-o", str(exe), str(probe_src)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"warning: the shared-memory probe of {src.name} failed:\n{run.stderr}")
        return {}
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    out = {}
    for line in run.stdout.splitlines():
        name, smem, threads = line.rsplit("|", 2)
        out[name] = (int(smem), int(threads))
    return out


def ctas_per_sm(arch: str, regs: int, smem: int, threads: int) -> int:
    """CTAs per SM that registers (allocated per warp in units of 256, from 4 scheduler
    partitions of 16384), shared memory and threads allow."""
    lim = SM_LIMITS[arch]
    warps = (threads + 31) // 32
    warp_regs = max((regs * 32 + 255) // 256 * 256, 256)
    by_regs = 4 * (lim["regs"] // 4 // warp_regs) // warps
    by_smem = lim["smem"] // (smem + SMEM_RESERVED_PER_CTA)
    by_threads = lim["threads"] // (warps * 32)
    return min(by_regs, by_smem, by_threads, lim["ctas"])


def collect(match: str | None) -> list[dict]:
    nvcc = find_tool("nvcc")
    cuobjdump = find_tool("cuobjdump")
    sources = sorted(KERNELS.glob("*.cu"))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        jobs = [(src, arch) for src in sources for arch in ARCHS]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            built = list(pool.map(lambda j: compile_cubin(nvcc, j[0], j[1], tmp), jobs))
        for (src, arch), (cubin, log) in zip(jobs, built):
            ptxas = parse_ptxas(log)
            sass = count_sass(cuobjdump, cubin)
            names = demangle(sorted(ptxas))
            dynamic = probe_dynamic(nvcc, src, sorted(set(names.values())), tmp)
            for mangled, res in ptxas.items():
                name = names[mangled]
                if match and not re.search(match, f"{src.name} {name}"):
                    continue
                dyn, threads = dynamic.get(name, (0, None))
                smem = res["smem"] + dyn
                rows.append(
                    {
                        "file": src.name,
                        "kernel": name,
                        "arch": arch,
                        **res,
                        "dyn_smem": dyn,
                        "total_smem": smem,
                        "threads": threads,
                        "ctas": ctas_per_sm(arch, res["regs"], smem, threads) if threads else None,
                        **sass.get(mangled, dict.fromkeys(COUNTED, 0)),
                    }
                )
    rows.sort(key=lambda r: (r["file"], _natural(r["kernel"]), r["arch"]))
    return rows


def _natural(name: str) -> list:
    """Sort key: numbers in a name compare as numbers (head dim 32 before 128)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _kib(n: int) -> str:
    return "0" if n == 0 else f"{n / 1024:.1f} KiB"


_HEADER = [
    "| kernel | arch | regs | spill st/ld (B) | smem | threads | CTAs/SM "
    "| HMMA | LDSM | LDS | STS | LDGSTS |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
_ATTENTION = re.compile(r"^\w*attention_kernel<(\w+), (\d+)>$")


def _line(r: dict) -> str:
    return (
        f"| `{r['kernel']}` | sm_{r['arch']} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} "
        f"| {_kib(r['total_smem'])} | {r['threads'] or '-'} | {r['ctas'] or '-'} "
        f"| {r['HMMA']} | {r['LDSM']} | {r['LDS']} | {r['STS']} | {r['LDGSTS']} |"
    )


def render(rows: list[dict]) -> str:
    nvcc = find_tool("nvcc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    line = next((v for v in version.splitlines() if "release" in v), "release ?")
    version = line.split("release")[-1].strip(" ,")  # "13.0, V13.0.88"
    out = [
        "# CUDA kernels: resources and instruction mix",
        "",
        "Made by `python benchmarks/cuda_resources.py` (no GPU needed) with "
        f"nvcc {version}: ptxas `-v` on cubins built with CMakeLists.txt's flags, "
        "static instruction counts from `cuobjdump -sass` (instructions predicated "
        "`@!PT`, never executed, left out). The key loops are not unrolled, so for the "
        "attention kernels a count is close to one key tile's, per warp. smem = static + "
        "dynamic (the launch's, from the kernel's config); CTAs/SM = what registers, "
        "shared memory and threads allow on an A100 (sm_80) / H100 (sm_90), `-` where "
        "the block size is the launcher's choice at run time.",
    ]
    # The two attention kernels side by side, per storage dtype, head dim and arch.
    attention = [r for r in rows if _ATTENTION.match(r["kernel"])]
    if attention:

        def key(r):
            dtype, d = _ATTENTION.match(r["kernel"]).groups()
            return (dtype, int(d), r["arch"], r["kernel"])

        out += [
            "",
            "## Attention: `attention.cu` (default) and `flash_attention.cu` (variant flash)",
            "",
            "attention_kernel: 4 warps x 16 query rows, wmma, scores / P / alpha through "
            "shared memory, synchronous loads. flash_attention_kernel: 8 warps x 16 rows, "
            "mma.sync + ldmatrix, scores, softmax and P in registers, cp.async "
            "double-buffered K/V; its LDS / STS are the epilogue's (none in the key loop). "
            "HMMA per key tile and warp: D for both (S = Q K^T: D/16 x 8, P V: 4 x D/8).",
            "",
            *_HEADER,
            *(_line(r) for r in sorted(attention, key=key)),
        ]
    others = [r for r in rows if not _ATTENTION.match(r["kernel"])]
    if others:
        out += ["", "## Other kernels", "", *_HEADER, *(_line(r) for r in others)]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", help="only kernels whose 'file kernel' matches this regex")
    parser.add_argument("--no-write", action="store_true", help=f"print only, do not write {OUT}")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the table")
    args = parser.parse_args(argv)
    text = render(collect(args.match))
    print(text, end="")
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
