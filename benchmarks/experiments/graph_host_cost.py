"""The host work around a CUDA-graph replay, and the kernels a graph holds, without a GPU.

On a GPU a graph replay is one launch; what the forward costs beyond the GPU's own
time is the host work around it (input checks, copies into the static buffers, the
replay launch, copies out, heads run outside the graph) and every device-to-host read
(each one waits for the GPU). This measures both on CPU tensors, for the tree's
``bertfast/graphs.py`` (``new``) and for the committed one (``base``: ``git archive
HEAD`` into a temporary folder, imported with the editable-install finder taken out
of ``sys.meta_path``), in the same run, alternating fresh processes:

- **host µs per forward**: ``model(ids, attention_mask, token_type_ids)`` with every
  graph replaced by a stub whose ``replay()`` does nothing after the first (which
  computes the static outputs once, so the results are still checked against the
  eager model): what is timed is exactly the Python and torch work around the replay.
  A small model (hidden 64), so the few ops that run outside the graph cost their
  dispatch, not their arithmetic (on a GPU they are launches). Medians over the rounds
  of each process's median; only ratios within one run mean anything;
- **ops outside the graph per forward**: aten ops that launch a kernel on a GPU (a
  ``TorchDispatchMode``; allocations and views, ``NO_KERNEL``, are left out),
  bertfast op calls (``dispatch.call``; one or two kernels each), and
  device-to-host reads before / after the replay;
- **kernels in the graph**: the static function a graph captures, run once under the
  same counters, for 2 and 3 layers: the difference is one layer; the rest is the
  input preparation and the head.

Usage::

    python benchmarks/experiments/graph_host_cost.py [--shapes 1x16,1x128,8x64r,32x128r] \
        [--rounds 3] [--seconds 1.0] [--out FILE.md]

A shape ``BxS`` has no padding; ``BxSr`` is ragged (rows of S/4 .. S tokens). With
``--device cuda`` (a GPU machine) it times whole forwards instead, real graphs, the
stream synchronized after each (BERT-base: 12 layers, ``--dtype float16``), and
reports the peak memory the graphs add beyond the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout

TINY = dict(hidden_size=64, num_attention_heads=2, intermediate_size=128)
BASE = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)


# ------------------------------------------------------------------ worker side
def _import_bertfast(which: str, base_dir: str | None):
    """Import the tree's bertfast (``new``) or the committed copy in ``base_dir``."""
    if which == "base":
        sys.meta_path[:] = [f for f in sys.meta_path if "Redirecting" not in type(f).__name__]
        sys.path.insert(0, base_dir)
    import bertfast

    where = Path(bertfast.__file__).resolve()
    expected = Path(base_dir).resolve() if which == "base" else ROOT
    assert expected in where.parents, (which, where)
    return bertfast


def _model(layers: int, head: str, dims: dict, device: str, dtype, backend: str):
    import torch

    from bertfast.checkpoint import encoder_weight_specs
    from bertfast.config import EncoderConfig
    from bertfast.heads import head_weight_specs
    from bertfast.model import BertfastModel

    config = dict(
        model_type="bert",
        architectures=["BertForSequenceClassification"],
        vocab_size=30522,
        num_hidden_layers=layers,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        pad_token_id=0,
        num_labels=2,
        **dims,
    )
    folder = tempfile.mkdtemp(prefix="graph-host-cost-")
    Path(folder, "config.json").write_text(json.dumps(config))
    cfg = EncoderConfig.from_json(folder)
    specs = encoder_weight_specs(cfg)
    specs.update(head_weight_specs(cfg, head)[0])
    g = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in specs.items():
        w = torch.randn(shape, generator=g) * (0.1 if len(shape) == 1 else shape[-1] ** -0.5)
        weights[name] = w + 1.0 if name.endswith("ln.weight") else w
    model = BertfastModel(cfg, weights, head=head, backend=backend, own_weights=True)
    return model.to(device=device, dtype=dtype)


def _batch(shape: str, device: str, seed: int = 0):
    import torch

    ragged = shape.endswith("r")
    B, S = (int(v) for v in shape.rstrip("r").split("x"))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    if ragged:
        lengths = torch.randint(max(1, S // 4), S + 1, (B,), generator=g)
        lengths[0] = S
        mask = (torch.arange(S)[None] < lengths[:, None]).long()
        ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros(B, S, dtype=torch.long)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "token_type_ids": types.to(device),
    }


class _Stub:
    """A graph whose first replay computes the static outputs and later ones do
    nothing; ``on_replay`` is called at every replay (the read counter's mark)."""

    on_replay = None

    def __init__(self, fn, outputs=None):
        self.fn = fn
        self.outputs = fn() if outputs is None else outputs
        self.done = False

    def replay(self):
        if _Stub.on_replay is not None:
            _Stub.on_replay()
        if not self.done:
            new = self.fn()
            for name, t in self.outputs.items():
                t.copy_(new[name])
            self.done = True


def _stub_graphs(which: str, model):
    """Make every graph of ``model`` a stub (new: before any capture; base: the
    entries exist after a first call)."""
    from bertfast import graphs

    if which == "new":
        graphs.GraphCache._make = lambda self, fn: _Stub(fn)
        return
    for entry in model._graphs.entries.values():
        if not isinstance(entry.graph, _Stub):
            entry.graph = _Stub(entry._run, {"out": entry._run()})
            entry.graph.done = True
            entry.out = entry.graph.outputs["out"]


#: aten ops that launch no kernel on a GPU (allocations, views, wrapped scalars).
NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "view", "_unsafe_view", "reshape",
    "_reshape_alias", "unsqueeze", "squeeze", "slice", "select", "expand", "as_strided",
    "alias", "detach", "t", "transpose", "permute", "unbind", "split", "narrow",
    "scalar_tensor", "lift_fresh",
}  # fmt: skip


class _Counters:
    """Aten ops (dispatch mode), bertfast backend calls (dispatch.call) and
    device-to-host reads (tolist / item / numpy ...), with the reads counted at the
    first replay kept apart."""

    def __init__(self):
        import torch
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        from bertfast import ops
        from bertfast.ops import dispatch

        self.aten, self.calls, self.reads, self.reads_before = [], [], [], None
        outer = self
        reads = {"tolist", "item", "numpy", "__array__", "cpu", "__bool__", "__int__"}

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in reads:
                    outer.reads.append(func.__name__)
                return func(*args, **(kwargs or {}))

        class Aten(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._schema.name.split("::", 1)[1]
                if name == "_local_scalar_dense":
                    outer.reads.append(name)
                if name not in NO_KERNEL:
                    outer.aten.append(name)
                return func(*args, **(kwargs or {}))

        self._modes = [Functions(), Aten()]
        self._ops, self._dispatch = ops, dispatch
        self._torch = torch

    def __enter__(self):
        ops, dispatch = self._ops, self._dispatch
        self._saved = (ops._dispatch_stack_len, dispatch.call)
        ops._dispatch_stack_len = lambda: 0  # keep the ops' eager shortcut (what runs)
        real = dispatch.call

        def call(op, *args):
            self.calls.append(op)
            return real(op, *args)

        dispatch.call = call
        _Stub.on_replay = self._mark
        for mode in self._modes:
            mode.__enter__()
        return self

    def _mark(self):
        if self.reads_before is None:
            self.reads_before = len(self.reads)

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._ops._dispatch_stack_len, self._dispatch.call = self._saved
        _Stub.on_replay = None


def _static_fn(which: str, model):
    (entry,) = model._graphs.entries.values()
    return entry.graph.fn if which == "new" else entry._run


def worker(args) -> dict:
    bertfast = _import_bertfast(args.worker, args.base_dir)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    gpu = args.device == "cuda"
    dims = BASE if gpu else TINY
    backend = "auto" if gpu else "cpu"
    out = {"version": args.worker, "bertfast": bertfast.__file__, "shapes": {}}
    for shape in args.shapes.split(","):
        batch = _batch(shape, args.device)
        model = _model(args.layers, "sequence_classification", dims, args.device, dtype, backend)
        eager = model(**batch)
        if gpu:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        model.enable_cuda_graphs(True, capture=gpu)
        if not gpu and args.worker == "new":
            _stub_graphs("new", model)
        got = model(**batch)
        if not gpu and args.worker == "base":
            _stub_graphs("base", model)
            got = model(**batch)
        for name in ("last_hidden_state", "pooler_output", "logits"):
            err = (got[name].float() - eager[name].float()).abs().max().item()
            assert err < (1e-4 if dtype == torch.float32 else 3e-2), (shape, name, err)
        row = {}
        if not gpu:
            with _Counters() as c:
                model(**batch)
            row.update(
                aten=len(c.aten),
                calls=len(c.calls),
                reads_before=c.reads_before,
                reads=len(c.reads),
                keys=[str(k) for k in model._graphs.entries],
            )
        times = []
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline or len(times) < 20:
            t0 = time.perf_counter()
            model(**batch)
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        row["us"] = statistics.median(times) * 1e6
        if gpu:  # the graphs' pool and static buffers, and the call's outputs
            row["mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        out["shapes"][shape] = row
    if not gpu:  # kernels of the static function, per layer and around the layers
        shape = args.shapes.split(",")[0]
        batch = _batch(shape, args.device)
        per_depth = {}
        for layers in (2, 3):
            model = _model(layers, "sequence_classification", dims, "cpu", dtype, backend)
            model.enable_cuda_graphs(True, capture=False)
            if args.worker == "new":
                _stub_graphs("new", model)
            model(**batch)
            if args.worker == "base":
                _stub_graphs("base", model)
            fn = _static_fn(args.worker, model)
            with torch.no_grad(), _Counters() as c:
                fn()
            per_depth[layers] = (len(c.aten), len(c.calls), sorted(set(c.aten)))
        (a2, c2, _), (a3, c3, names) = per_depth[2], per_depth[3]
        out["static"] = dict(
            layer_aten=a3 - a2,
            layer_calls=c3 - c2,
            other_aten=a2 - 2 * (a3 - a2),
            other_calls=c2 - 2 * (c3 - c2),
            aten_names=names,
        )
    return out


# ------------------------------------------------------------------ driver side
def _base_tree() -> str:
    """HEAD's bertfast/ in a temporary folder, with this tree's native extension."""
    import bertfast._C as native

    folder = tempfile.mkdtemp(prefix="bertfast-base-")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "bertfast"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    so = Path(native.__file__)
    os.symlink(so, Path(folder, "bertfast", so.name))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x16,1x128,8x64r,32x128r")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0, help="per shape per process")
    ap.add_argument("--layers", type=int, default=None, help="2 on CPU, 12 on CUDA")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--out", default=None, help="also write the tables here (markdown)")
    ap.add_argument("--worker", default=None, choices=("base", "new"), help=argparse.SUPPRESS)
    ap.add_argument("--base-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    args.layers = args.layers or (12 if args.device == "cuda" else 2)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    base_dir = _base_tree()
    runs = {"base": [], "new": []}
    for r in range(args.rounds):
        for which in ("base", "new") if r % 2 == 0 else ("new", "base"):
            cmd = [sys.executable, __file__, "--worker", which, "--base-dir", base_dir]
            for opt in ("shapes", "seconds", "layers", "device", "dtype"):
                cmd += [f"--{opt}", str(getattr(args, opt))]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
            runs[which].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r} {which} done", file=sys.stderr, flush=True)
    print(report(args, runs))
    if args.out:
        Path(args.out).write_text(report(args, runs, markdown_header=True))


def report(args, runs, markdown_header: bool = False) -> str:
    shapes = args.shapes.split(",")
    gpu = args.device == "cuda"
    lines = []
    if markdown_header:
        lines += [
            "# Host work around a CUDA-graph replay",
            "",
            f"`python benchmarks/experiments/graph_host_cost.py {' '.join(sys.argv[1:])}` on "
            f"{platform.machine()} ({os.cpu_count()} CPUs), torch {_torch_version()}, "
            f"1 thread; `base` = HEAD's `bertfast/` (git archive), `new` = the working "
            f"tree, alternating fresh processes, {args.rounds} rounds. See the script's "
            "docstring for what is counted.",
            "",
        ]
    what = "ms per forward (stream synced)" if gpu else "host µs per forward (stub replay)"
    lines += [
        f"| shape | base {what} | new | base / new | ops outside the graph, base -> new "
        "(aten kernels + bertfast op calls) | reads before the replay | reads in all | "
        + ("graph memory |" if gpu else "new graph key |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    scale = 1e-3 if gpu else 1.0
    for shape in shapes:
        med = {w: statistics.median(r["shapes"][shape]["us"] for r in runs[w]) for w in runs}
        b, n = runs["base"][0]["shapes"][shape], runs["new"][0]["shapes"][shape]
        if gpu:
            counts = reads = total = "-"
            key = f"{b['mib']:.0f} -> {n['mib']:.0f} MiB beyond the weights"
        else:
            counts = f"{b['aten']} + {b['calls']} -> {n['aten']} + {n['calls']}"
            reads = f"{b['reads_before']} -> {n['reads_before']}"
            total = f"{b['reads']} -> {n['reads']}"
            key = ", ".join(n["keys"])
        lines.append(
            f"| {shape} | {med['base'] * scale:.1f} | {med['new'] * scale:.1f} | "
            f"{med['base'] / med['new']:.2f}x | {counts} | {reads} | {total} | {key} |"
        )
    if not gpu:
        sb, sn = runs["base"][0]["static"], runs["new"][0]["static"]
        lines += [
            "",
            "Inside the graph (the static function, first shape): per encoder layer, and "
            "around the layers (input preparation, value checks, head):",
            "",
            "| | base | new |",
            "|---|---|---|",
            f"| bertfast op calls per layer | {sb['layer_calls']} | {sn['layer_calls']} |",
            f"| aten kernels per layer | {sb['layer_aten']} | {sn['layer_aten']} |",
            f"| bertfast op calls around the layers | {sb['other_calls']} | {sn['other_calls']} |",
            f"| aten kernels around the layers | {sb['other_aten']} | {sn['other_aten']} |",
        ]
    return "\n".join(lines) + "\n"


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
