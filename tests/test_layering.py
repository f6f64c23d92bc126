"""The package's import graph: no circle, and imports point down only (docs/design.md §2).

Every module of ``bertfast/`` is parsed with :mod:`ast` (nothing is imported), and
every ``import`` / ``from ... import`` in it is an edge, wherever it stands: module
level, inside a function, a ``try`` or an ``if``. Relative imports are resolved
against the module's package; ``from . import x`` is an edge to the submodule ``x``
where one exists, else to the package; anything under ``bertfast._C`` (the compiled
extension) is the native layer. Two kinds of name are resolved further:

- ``bertfast``'s lazy API (``_LAZY`` in ``bertfast/__init__.py``): the package is
  given an edge to each module it loads by name, and ``from bertfast import
  Embedder`` is an edge to the module that defines it. A constant of the package
  itself (``__version__``) is no edge: Python runs the root before any submodule,
  and it imports nothing;
- ``dispatch``'s registry (``_MODULES``, ``_WINNERS_MODULE``): the backends and the
  winners table are loaded *by name* and import ``dispatch`` for its types
  (``Backend``, ``Candidate``), so they sit above it and are no edge from it
  (docs/design.md §4: "Backend modules are imported on first use").

Then (a) the graph has no cycle, (b) no module imports one of a higher layer
(``LAYERS``, highest first; imports inside one layer are free, cycles aside), and
(c) inside ``bertfast/ops`` the backends are peers: a module of one backend
(``BACKENDS``) imports no module of another, nor the ``bertfast.ops`` package, and
reaches another backend only through ``dispatch`` (by name).

A failure prints the offending edges with file and line, and the whole graph layer
by layer; ``python tests/test_layering.py`` prints the graph alone.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "bertfast"
NATIVE = "bertfast._C"

#: The layers, highest first (docs/design.md §2, with ops split into the sub-layers its
#: text describes). A module's layer is its most specific pattern (an exact name beats
#: a ``.*`` prefix). A module may import its own layer and those below.
LAYERS = [
    ("API", ["bertfast", "bertfast.__main__"]),
    ("CLI", ["bertfast.cli", "bertfast.cli.*"]),
    (
        "integration",
        [
            "bertfast.stream",
            "bertfast.fingerprint",
            "bertfast.embedder",
            "bertfast.dropin",
            "bertfast.ray",  # embed_dataset, and the Ray Serve app (serve_app)
            "bertfast.tune",  # bertfast tune: winners tables from GPU sweeps
            "bertfast.bench",
            "bertfast.bench.*",
            # the HTTP servers' shared request handling and the embedded server;
            # bertfast.ray's Ray Serve deployment imports it
            "bertfast.serving",
            "bertfast.serving.*",
            # LangChain / LlamaIndex adapters around the embedder
            "bertfast.integrations",
            "bertfast.integrations.*",
        ],
    ),
    (
        "model",
        [
            "bertfast.model",
            "bertfast.heads",
            # design.md §2 lists graphs.py under integration, but it is the model's own
            # CUDA-graph cache: BertfastModel builds it (cuda_graphs=) and replays it
            # from encode(); it imports heads, outputs and ops only.
            "bertfast.graphs",
            "bertfast.outputs",  # EncoderOutput: what the model and the heads return
        ],
    ),
    (
        "checkpoint",
        [
            "bertfast.config",
            "bertfast.checkpoint",
            "bertfast.head_specs",  # which head a checkpoint runs, and the weights it reads
            "bertfast.validate",  # load-time checks of user input; asks ops.dispatch
            "bertfast.hub",  # Hub ids -> snapshot folders of the Hugging Face cache
            "bertfast.presets",  # random-weight checkpoints of named architectures
            "bertfast.tokenizer",  # the checkpoint's tokenizer files
            "bertfast.text",  # checks on input text (tokenizer, embedder, stream, ray)
            # design.md §2 names no layer for it: what this installation can run (the
            # build, backend status, CPU flags, the bf16 warning at load). It imports
            # ops only and the model imports it, so it sits here, beside validate.
            "bertfast.info",
        ],
    ),
    ("ops: contracts", ["bertfast.ops"]),  # the op contracts and their registration
    (
        "ops: checks",
        ["bertfast.ops.checks", "bertfast.ops.padding", "bertfast.ops.parity"],
    ),
    (
        "ops: backends",
        [
            "bertfast.ops.reference",
            "bertfast.ops.sdpa",
            "bertfast.ops.cpu",
            "bertfast.ops.cpu.*",  # its weights, int8 and encoder runner
            "bertfast.ops.cuda",
            "bertfast.ops.cuda_epilogue",
            "bertfast.ops.triton",
            "bertfast.ops.triton.*",
        ],
    ),
    (
        "ops: dispatch",
        # the registry (Backend, select, resolve), the per-GPU winners table it loads
        # by name, and the native extension's constants both pybind11 backends share
        ["bertfast.ops.dispatch", "bertfast.ops.winners", "bertfast.ops.native"],
    ),
    # the extension, and the module its init calls to put its torch operators on
    # _C.cpu / _C.cuda (imports no bertfast module)
    ("native", [NATIVE, "bertfast._operators"]),
]

#: Modules that fit no layer, and why; each must import no bertfast module and be
#: imported by none. (The accuracy corpus's generator was the one such module; it is
#: tools/make_accuracy_corpus.py now, outside the package.)
NO_LAYER: dict[str, str] = {}

#: The backends of ``bertfast/ops`` (``dispatch._MODULES``) and the modules each one
#: owns. Peers: no module of one imports a module of another.
BACKENDS = {
    "torch": ["bertfast.ops.reference", "bertfast.ops.sdpa"],
    "cpu": ["bertfast.ops.cpu", "bertfast.ops.cpu.*"],
    "cuda": ["bertfast.ops.cuda", "bertfast.ops.cuda_epilogue"],
    "triton": ["bertfast.ops.triton", "bertfast.ops.triton.*"],
}


# ---------------------------------------------------------------- the graph
def discover(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package ``__init__``) for every .py under
    ``root/package``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        mods[".".join(parts)] = (path, is_pkg)
    return mods


def _module_constants(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names a module binds to a literal at top level, and its ``_LAZY`` table."""
    constants, lazy = set(), {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        if isinstance(node.value, ast.Constant):
            constants.add(target.id)
        elif target.id == "_LAZY":
            lazy = ast.literal_eval(node.value)
    return constants, lazy


def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return ast.literal_eval(node.value)
    return None


class Graph:
    """The import graph of ``package`` under ``root``: ``edges[a][b]`` is where ``a``
    imports ``b`` first (``path:line``, plus a note for a by-name load)."""

    def __init__(self, root: Path = ROOT, package: str = PACKAGE):
        self.root, self.package = root, package
        self.files = discover(root, package)
        self.modules = sorted(set(self.files) | {f"{package}._C"})
        self.native = f"{package}._C"
        self.trees = {m: ast.parse(p.read_text(), str(p)) for m, (p, _) in self.files.items()}
        init = self.trees.get(package)
        self.root_constants, self.lazy = _module_constants(init) if init else (set(), {})
        self.edges: dict[str, dict[str, str]] = {m: {} for m in self.modules}
        for mod in self.files:
            self._scan(mod)
        for name, target in sorted(self.lazy.items()):
            self._add(package, self._resolve(target), f"{self._where(package, None)} (lazy {name})")

    def _where(self, mod: str, node) -> str:
        path = self.files[mod][0].relative_to(self.root)
        return f"{path}:{node.lineno}" if node is not None else str(path)

    def _resolve(self, name: str) -> str | None:
        """The module ``name`` is, or the innermost one holding it; None outside the
        package."""
        if name == self.native or name.startswith(self.native + "."):
            return self.native
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def _add(self, mod: str, target: str | None, where: str) -> None:
        if target is not None and target != mod:
            self.edges[mod].setdefault(target, where)

    def _scan(self, mod: str) -> None:
        is_pkg = self.files[mod][1]
        here = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(self.trees[mod]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == self.package:
                        self._add(mod, self._resolve(alias.name), self._where(mod, node))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")
                    base = parts[: len(parts) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != self.package:
                    continue
                for alias in node.names:
                    self._add(mod, self._from(source, alias.name), self._where(mod, node))

    def _from(self, source: str, name: str) -> str | None:
        """What ``from source import name`` depends on."""
        full = f"{source}.{name}"
        if full in self.files or full == self.native:
            return full
        if source == self.package:
            if name in self.lazy:
                return self._resolve(self.lazy[name])
            if name in self.root_constants:
                return None  # __version__: a constant of the root, which imports nothing
        return self._resolve(source)

    def layer_of(self, mod: str) -> int | None:
        """Index into ``LAYERS`` of ``mod``'s most specific pattern, or None."""
        best = None  # (specificity, layer)
        for index, (_, patterns) in enumerate(LAYERS):
            for pattern in patterns:
                if pattern == mod:
                    score = (2, len(pattern))
                elif pattern.endswith(".*") and fnmatchcase(mod, pattern):
                    score = (1, len(pattern))
                else:
                    continue
                if best is None or score > best[0]:
                    best = (score, index)
        return None if best is None else best[1]

    def importers(self, target: str) -> list[str]:
        return sorted(m for m in self.modules if target in self.edges[m])

    # ------------------------------------------------------------ cycles
    def cycles(self) -> list[list[str]]:
        """One list of modules per strongly connected component of more than one
        module (Tarjan, iterative), each sorted."""
        index, low, on_stack, stack, out = {}, {}, set(), [], []
        counter = 0
        for start in self.modules:
            if start in index:
                continue
            work = [(start, iter(sorted(self.edges[start])))]
            index[start] = low[start] = counter
            counter += 1
            stack.append(start)
            on_stack.add(start)
            while work:
                node, children = work[-1]
                child = next(children, None)
                if child is not None:
                    if child not in index:
                        index[child] = low[child] = counter
                        counter += 1
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(sorted(self.edges[child]))))
                    elif child in on_stack:
                        low[node] = min(low[node], index[child])
                    continue
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
        return sorted(out)

    def shortest_cycle(self, start: str, within: set[str]) -> list[str]:
        """The shortest import chain from ``start`` back to itself inside ``within``."""
        parent = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for child in sorted(self.edges[node]):
                if child not in within:
                    continue
                if child == start:
                    chain = [node]
                    while parent[chain[-1]] is not None:
                        chain.append(parent[chain[-1]])
                    return [start, *reversed(chain[:-1]), start]
                if child not in parent:
                    parent[child] = node
                    queue.append(child)
        return [start]

    def chain_text(self, chain: list[str]) -> str:
        lines = [f"    {chain[0]}"]
        for a, b in zip(chain, chain[1:]):
            lines.append(f"      -> {b}   ({self.edges[a][b]})")
        return "\n".join(lines)

    # ------------------------------------------------------------ the summary
    def summary(self) -> str:
        """The graph layer by layer: each module and what it imports (with the
        imported module's layer)."""
        names = [name for name, _ in LAYERS]
        by_layer: dict[int | None, list[str]] = {}
        for mod in self.modules:
            by_layer.setdefault(self.layer_of(mod), []).append(mod)
        out = ["Import graph of bertfast (tests/test_layering.py), highest layer first:"]
        for index in [*range(len(LAYERS)), None]:
            mods = by_layer.get(index)
            if not mods:
                continue
            out.append(f"[{names[index] if index is not None else 'no layer'}]")
            for mod in mods:
                targets = sorted(self.edges[mod])
                shown = [
                    f"{t} [{names[self.layer_of(t)] if self.layer_of(t) is not None else '?'}]"
                    for t in targets
                ]
                out.append(f"  {mod} -> {', '.join(shown) if shown else '(nothing)'}")
        return "\n".join(out)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph()


def fail(graph: Graph, title: str, problems: list[str]) -> None:
    text = f"{title}:\n" + "\n".join(problems) + "\n\n" + graph.summary()
    pytest.fail(text, pytrace=False)


# ---------------------------------------------------------------- the rules
def test_every_module_has_one_layer(graph):
    problems = []
    for mod in graph.modules:
        layer = graph.layer_of(mod)
        if mod in NO_LAYER:
            if layer is not None:
                problems.append(f"  {mod}: in NO_LAYER and in layer {LAYERS[layer][0]!r}")
            for other in graph.importers(mod) + sorted(graph.edges[mod]):
                problems.append(f"  {mod} (no layer: {NO_LAYER[mod]}) is linked to {other}")
        elif layer is None:
            problems.append(
                f"  {mod}: matches no pattern of LAYERS; add it to the layer it belongs to "
                "(docs/design.md §2) or, with the reason, to NO_LAYER"
            )
    for mod in NO_LAYER:
        if mod not in graph.modules:
            problems.append(f"  {mod}: listed in NO_LAYER but not in the package")
    if problems:
        fail(graph, "modules without exactly one layer", problems)


def test_no_import_cycles(graph):
    problems = []
    for component in graph.cycles():
        members = set(component)
        chains, seen = [], set()
        for start in component:  # the shortest circle through each member, once each
            chain = graph.shortest_cycle(start, members)
            key = frozenset(zip(chain, chain[1:]))
            if key not in seen:
                seen.add(key)
                chains.append(graph.chain_text(chain))
        problems.append(f"  circle among {', '.join(component)}:\n" + "\n".join(chains))
    if problems:
        fail(graph, "import cycles (each chain leads back to where it starts)", problems)


def test_imports_point_down(graph):
    problems = []
    for mod in graph.modules:
        here = graph.layer_of(mod)
        for target, where in sorted(graph.edges[mod].items()):
            there = graph.layer_of(target)
            if here is None or there is None or there >= here:
                continue
            problems.append(
                f"  {mod} [{LAYERS[here][0]}] imports {target} [{LAYERS[there][0]}]   ({where})"
            )
    if problems:
        fail(graph, "imports from a lower layer to a higher one", problems)


def _backend_of(mod: str) -> str | None:
    for name, patterns in BACKENDS.items():
        if any(p == mod or (p.endswith(".*") and fnmatchcase(mod, p)) for p in patterns):
            return name
    return None


def test_backends_are_peers(graph):
    """A backend's modules import no other backend's module and not the ``bertfast.ops``
    package; one backend reaches another only through dispatch (by name)."""
    problems = []
    for mod in graph.modules:
        mine = _backend_of(mod)
        if mine is None:
            continue
        for target, where in sorted(graph.edges[mod].items()):
            theirs = _backend_of(target)
            if target == "bertfast.ops":
                problems.append(f"  {mod} ({mine}) imports the bertfast.ops package   ({where})")
            elif theirs is not None and theirs != mine:
                problems.append(
                    f"  {mod} ({mine}) imports {target} ({theirs}): ask dispatch instead   "
                    f"({where})"
                )
    if problems:
        fail(graph, "backends importing one another", problems)


#: What the model layer may import from ``bertfast/ops`` besides the package (the
#: op entry points, ``encoder_runner`` and the model-weight functions): the packing
#: record's type, and the reference's table of activations the heads apply.
MODEL_OPS_ALLOWED = {"bertfast.ops", "bertfast.ops.padding", "bertfast.ops.reference"}


def test_the_model_calls_ops_only(graph):
    """design.md §2: the model calls ``bertfast.ops``, never a backend module: the CPU
    backend's encoder runner and weight handling are reached through the package."""
    model_layer = dict(LAYERS)["model"]
    problems = []
    for mod in graph.modules:
        if not any(p == mod or (p.endswith(".*") and fnmatchcase(mod, p)) for p in model_layer):
            continue
        for target, where in sorted(graph.edges[mod].items()):
            if target.startswith("bertfast.ops") and target not in MODEL_OPS_ALLOWED:
                problems.append(f"  {mod} imports {target}   ({where})")
    if problems:
        fail(graph, "the model reaching past bertfast.ops", problems)


def test_tables_match_the_code(graph):
    """``BACKENDS`` is dispatch's registry, every module of the ops backends layer
    belongs to one backend, and the registry's by-name loads sit above dispatch."""
    dispatch = graph.trees["bertfast.ops.dispatch"]
    registry = _literal(dispatch, "_MODULES")
    assert registry == {name: mods[0] for name, mods in BACKENDS.items()}, registry
    backends_layer = [name for name, _ in LAYERS].index("ops: backends")
    for mod in graph.modules:
        if graph.layer_of(mod) == backends_layer:
            assert _backend_of(mod) is not None, f"{mod}: in no backend of BACKENDS"
        if _backend_of(mod) is not None:
            assert graph.layer_of(mod) == backends_layer, f"{mod}: a backend outside its layer"
    loaded = [*registry.values(), _literal(dispatch, "_WINNERS_MODULE")]
    for target in loaded:
        assert target in graph.modules, f"dispatch loads {target}, which does not exist"
        assert graph.layer_of(target) <= graph.layer_of("bertfast.ops.dispatch"), target
        assert "bertfast.ops.dispatch" in graph.edges[target], f"{target} does not use dispatch"


# ---------------------------------------------------------------- the parser itself
FAKE = {
    "pkg/__init__.py": (
        "import importlib\n__version__ = '1'\n_LAZY = {'Thing': 'pkg.low'}\n"
        "def __getattr__(name):\n    return importlib.import_module(_LAZY[name])\n"
    ),
    "pkg/low.py": "import os\nfrom . import _C\n",
    "pkg/mid.py": (
        "from .low import x\nfrom . import sub\nfrom pkg import __version__\n"
        "def f():\n    from .sub.leaf import y\n    import pkg.top\n"
    ),
    "pkg/top.py": "from pkg import Thing\ntry:\n    from ._C.cpu import k\nexcept ImportError:\n"
    "    pass\n",
    "pkg/sub/__init__.py": "from .. import low\nfrom . import leaf\n",
    "pkg/sub/leaf.py": "from ..mid import z\nfrom ...outside import w\n",
}


def test_the_parser_sees_every_form_of_import(tmp_path):
    for rel, text in FAKE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = Graph(tmp_path, "pkg")
    assert {m: sorted(t) for m, t in g.edges.items()} == {
        "pkg": ["pkg.low"],  # the lazy table
        "pkg._C": [],
        "pkg.low": ["pkg._C"],
        "pkg.mid": ["pkg.low", "pkg.sub", "pkg.sub.leaf", "pkg.top"],  # not __version__
        "pkg.sub": ["pkg.low", "pkg.sub.leaf"],
        "pkg.sub.leaf": ["pkg.mid"],
        "pkg.top": ["pkg._C", "pkg.low"],  # Thing: the module that defines it
    }
    assert g.edges["pkg.mid"]["pkg.top"] == "pkg/mid.py:6"
    assert g.cycles() == [["pkg.mid", "pkg.sub", "pkg.sub.leaf"]]
    assert g.shortest_cycle("pkg.mid", {"pkg.mid", "pkg.sub", "pkg.sub.leaf"}) == [
        "pkg.mid",
        "pkg.sub.leaf",
        "pkg.mid",
    ]


if __name__ == "__main__":
    print(Graph().summary())
    sys.exit(0)
