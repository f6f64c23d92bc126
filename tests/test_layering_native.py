"""The native tree's include graph: no circle, and includes point down only
(docs/design.md §2, §9; the C++ / CUDA side of the package's layering).

Every ``#include "..."`` (and ``#include <...>`` that names a project header) under
``csrc/`` and ``kernels/`` is an edge, resolved as the compiler resolves it: the
including file's own folder first, then the include folders CMakeLists.txt gives
``_C`` (``target_include_directories(_C PRIVATE ...)``, read from the file), in their
order. Nothing is compiled. The layers, lowest first:

- ``kernels/constants.h``: the facts shared by everything native (and restated in
  Python); it includes no project header;
- ``kernels/cpu/``, ``kernels/cuda/``: the kernels, peers: neither includes the other,
  and no kernel includes a binding (``csrc/``);
- ``csrc/``: the pybind11 bindings; the CPU ones (``csrc/*``) include no CUDA header
  (``kernels/cuda/``, ``csrc/cuda/``), so they build without a CUDA toolkit.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("csrc", "kernels")
SUFFIXES = {".h", ".cuh", ".cpp", ".cu"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
BASE = "kernels/constants.h"


def include_dirs() -> list[Path]:
    """The ``-I`` folders of ``_C``, in CMakeLists.txt's order."""
    text = (ROOT / "CMakeLists.txt").read_text()
    dirs = []
    for m in re.finditer(r"target_include_directories\(\s*_C\s+PRIVATE\s+([^)]*)\)", text):
        dirs += re.findall(r"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([\w./-]+)", m.group(1))
    assert dirs, "no target_include_directories(_C PRIVATE ...) in CMakeLists.txt"
    return [ROOT / d for d in dirs]


def sources() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*") if p.suffix in SUFFIXES)


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def graph() -> tuple[dict[str, dict[str, int]], list[str]]:
    """``edges[a][b]``: the line where file a includes project file b; plus the quoted
    includes that resolve nowhere."""
    dirs = include_dirs()
    edges: dict[str, dict[str, int]] = {}
    unresolved = []
    for src in sources():
        text = src.read_text()
        out = edges.setdefault(rel(src), {})
        for m in INCLUDE.finditer(text):
            quote, name = m.groups()
            line = text.count("\n", 0, m.start()) + 1
            search = ([src.parent] if quote == '"' else []) + dirs
            hit = next(((d / name).resolve() for d in search if (d / name).is_file()), None)
            if hit is None:
                if quote == '"':
                    unresolved.append(f'{rel(src)}:{line}: #include "{name}"')
                continue  # <...>: a system or library header
            out.setdefault(rel(hit), line)
    return edges, unresolved


def forbidden(src: str, dst: str) -> str | None:
    """Why the edge src -> dst points up or sideways, or None."""
    if src == BASE:
        return f"{BASE} is the base of the native tree: it includes no project header"
    if src.startswith("kernels/") and dst.startswith("csrc/"):
        return "a kernel includes a binding (kernels/ is below csrc/)"
    for a, b in (("kernels/cpu/", "kernels/cuda/"), ("kernels/cuda/", "kernels/cpu/")):
        if src.startswith(a) and dst.startswith(b):
            return "the CPU and CUDA kernels are peers"
    cuda = dst.startswith(("kernels/cuda/", "csrc/cuda/"))
    if src.startswith("csrc/") and not src.startswith("csrc/cuda/") and cuda:
        return "a CPU binding includes a CUDA header (it must build without CUDA)"
    return None


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per back edge found by a depth-first search."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def _show(edges) -> str:
    return "\n".join(
        f"  {src} -> {', '.join(sorted(dst)) or '(nothing)'}" for src, dst in sorted(edges.items())
    )


def test_every_quoted_include_resolves():
    _, unresolved = graph()
    assert not unresolved, "includes that name no file:\n" + "\n".join(unresolved)


def test_includes_point_down():
    edges, _ = graph()
    bad = [
        f"{src}:{line}: includes {dst}: {why}"
        for src, out in sorted(edges.items())
        for dst, line in sorted(out.items())
        if (why := forbidden(src, dst))
    ]
    assert not bad, "upward or sideways includes:\n" + "\n".join(bad) + "\n\n" + _show(edges)


def test_no_include_cycle():
    edges, _ = graph()
    found = cycles(edges)
    assert not found, "include cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_shared_constants_are_the_base():
    # Where the layers meet: both kernel families and the bindings read the one header.
    edges, _ = graph()
    readers = {src for src, out in edges.items() if BASE in out}
    for user in ("kernels/cpu/", "kernels/cuda/", "csrc/"):
        assert any(r.startswith(user) for r in readers), f"nothing under {user} includes {BASE}"


def test_the_checks_catch_an_upward_include():
    # The rules themselves, on the edges that would break them.
    assert forbidden("kernels/cpu/common.h", "csrc/binding.h")
    assert forbidden("kernels/cuda/common.cuh", "kernels/cpu/common.h")
    assert forbidden("csrc/cpu_ops.cpp", "kernels/cuda/launchers.cuh")
    assert forbidden(BASE, "kernels/cpu/common.h")
    assert forbidden("csrc/cuda/cuda_ops.cpp", "kernels/cuda/launchers.cuh") is None
    assert forbidden("csrc/cpu_ops.cpp", "kernels/cpu/kernels.h") is None
    assert cycles({"a.h": {"b.h": 1}, "b.h": {"a.h": 1}}) == [["a.h", "b.h", "a.h"]]


if __name__ == "__main__":  # python tests/test_layering_native.py: the graph
    print(_show(graph()[0]))
