"""Host syncs of the forward pass: how often it reads device values back to the host.

On a GPU every such read (``.item()``, ``.tolist()``, ``int(t)``, ``bool(t)``,
``nonzero()``, boolean indexing...) waits for all queued kernels; at small batches
those waits dominate latency. The model validates its inputs and reads the packing
counts in *one* transfer per forward, and nothing after it syncs: no per-layer
``cu_seqlens.tolist()``, no per-op id-range checks.

The counter below is itself tested against every kind of read it claims to catch
(``test_counter_sees_every_kind_of_read``), so a count of 1 means one read, not a
blind spot. It runs on CPU tensors: a read is the same call there, only cheaper.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import bertfast
from bertfast import ops

from .models import build, make_batch, save

# Python-level reads that do not go through an aten op (seen as torch functions).
_FUNCTION_READS = {"tolist", "numpy", "__array__", "cpu", "__dlpack__"}
# aten ops that read device memory on the host: scalar reads, and ops whose output
# size depends on the data (on a GPU they wait for the device to know it).
_ATEN_READS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "equal",
    "is_nonzero",
    "bincount",
    "histc",
    "repeat_interleave",
    "_assert_async",
}


def _aten_name(func) -> str:
    return func._schema.name.split("::", 1)[1]


class _Functions(TorchFunctionMode):
    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _FUNCTION_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


class _Aten(TorchDispatchMode):
    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _aten_name(func)
        if name == "repeat_interleave" and len(args) == 1 and "output_size" not in (kwargs or {}):
            self.reads.append(name)  # repeats tensor without output_size: data-dependent
        elif name in _ATEN_READS and name != "repeat_interleave":
            self.reads.append(name)
        elif name == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in (args[1] if len(args) > 1 else ())
            if i is not None
        ):
            self.reads.append("index[bool mask]")  # a nonzero() inside
        return func(*args, **(kwargs or {}))


class HostReads:
    """Context manager recording every device -> host read (``.reads``).

    Both a torch-function mode (``tolist``/``numpy``, which read memory directly) and
    a dispatch mode (every aten op, including those run inside bertfast's ops) are
    active. The bertfast ops' eager shortcut is kept (it is what runs in production):
    with a dispatch mode active the ops would otherwise run as opaque custom ops and
    hide their insides from the mode.
    """

    def __init__(self, monkeypatch):
        monkeypatch.setattr(ops, "_dispatch_stack_len", lambda: 0)
        self.reads = []
        self._modes = [_Functions(self.reads), _Aten(self.reads)]

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


@pytest.fixture
def count(monkeypatch):
    return lambda: HostReads(monkeypatch)


def test_counter_sees_every_kind_of_read(count):
    t = torch.tensor([3, 0, 2])
    reads = [
        lambda: t[0].item(),
        lambda: t.tolist(),
        lambda: bool(t[0]),
        lambda: int(t[0]),
        lambda: float(t[0]),
        lambda: [0, 1, 2, 3][t[0]],
        lambda: 1 if t[0] else 0,
        lambda: f"{t[0]}",
        lambda: t.numpy(),
        lambda: t.nonzero(),
        lambda: t[t > 0],
        lambda: torch.zeros(t[0]),
        lambda: t.unique(),
        lambda: torch.equal(t, t),
        lambda: t.masked_select(t > 0),
        lambda: t.repeat_interleave(t),
        lambda: t.cpu(),
        lambda: range(t[2]),
        lambda: torch.nonzero(t > 0, as_tuple=True),
    ]
    for i, read in enumerate(reads):
        with count() as c:
            read()
        assert c.reads, f"read #{i} was not seen"
    with count() as c:  # and device-side work is not a read
        y = (t * 2).cumsum(0).index_select(0, t.clamp(max=2)).float().softmax(0)
        torch.nonzero_static(t, size=2)
        y.max(), torch.aminmax(t), t.sum(), t.shape[0], t.view(3, 1).expand(3, 4)
    assert c.reads == []


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for family, head, layers in [
        ("bert", "sequence_classification", 12),
        ("bert", "sequence_classification", 2),
        ("roberta", "masked_lm", 12),
        ("albert", "pretraining", 12),
    ]:
        path = tmp_path_factory.mktemp(f"{family}{layers}")
        kw = {"num_hidden_layers": layers}
        out[(family, layers)] = save(build(family, head, **kw), str(path))
    return out


def _forward_reads(model, count, batch, **kw):
    model(**batch, **kw)  # warm-up: lazy imports, backend selection, weight packing
    with count() as c:
        out = model(**batch, **kw)
    return c.reads, out


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("family", ["bert", "roberta", "albert"])
def test_forward_reads_back_once(folders, count, family, backend):
    """12 layers, ragged batch with an empty row, pooler/heads, hidden states: one read
    (the input checks and the packing counts, together)."""
    model = bertfast.from_pretrained(folders[(family, 12)], backend=backend)
    batch = make_batch(family, lengths=(9, 4, 0, 7), seq_len=11)
    reads, out = _forward_reads(model, count, batch, output_hidden_states=True)
    assert reads == ["tolist"], reads
    assert len(out.hidden_states) == len(model.config.layer_schedule()) + 1


def test_reads_do_not_grow_with_depth(folders, count):
    batch = make_batch("bert", lengths=(5, 8), seq_len=8)
    given = dict(batch, position_ids=torch.arange(8))  # user positions are checked too
    per_depth = {}
    for layers in (2, 12):
        model = bertfast.from_pretrained(folders[("bert", layers)], backend="torch")
        assert model.config.num_layers == layers
        per_depth[layers] = (
            _forward_reads(model, count, batch)[0],
            _forward_reads(model, count, given)[0],
        )
    assert per_depth[2] == per_depth[12] == (["tolist"], ["tolist"])


def test_static_bucket_path_reads_back_once(folders, count):
    """The padded path that CUDA graphs capture (run here without capture)."""
    model = bertfast.from_pretrained(folders[("bert", 12)], backend="torch")
    model.enable_cuda_graphs(True, capture=False)
    reads, _ = _forward_reads(model, count, make_batch("bert", lengths=(3, 6)))
    assert reads == ["tolist"], reads


def test_optimized_transformers_model_reads_back_once(count):
    model = build("bert", "base", num_hidden_layers=12)
    bertfast.optimize(model, backend="torch")
    batch = make_batch("bert", lengths=(6, 2, 5))
    with torch.no_grad():
        reads, _ = _forward_reads(model, count, batch)
    assert reads == ["tolist"], reads


def test_bad_input_still_rejected_in_that_read(folders):
    model = bertfast.from_pretrained(folders[("bert", 2)], backend="torch")
    batch = make_batch("bert", lengths=(4, 3))
    batch["input_ids"][1, 0] = 10_000
    with pytest.raises(IndexError, match="input_ids contains 10000"):
        model(**batch)
    batch = make_batch("bert", lengths=(4, 3))
    batch["token_type_ids"][0, 1] = 7
    with pytest.raises(IndexError, match="token_type_ids contains 7"):
        model(**batch)


# ------------------------------------------------------------ the public ops
def test_public_ops_validate_every_call_and_internal_calls_skip_reads(count):
    qkv = torch.randn(7, 3 * 8)
    bad_cu = torch.tensor([0, 5, 3], dtype=torch.int32)  # falls: not prefix sums
    with pytest.raises(ValueError, match="cu_seqlens must rise"):
        ops.attention_varlen(qkv, bad_cu, 4, 2)
    with pytest.raises(ValueError, match="longer than max_seqlen"):
        ops.attention_varlen(qkv, torch.tensor([0, 2, 7], dtype=torch.int32), 4, 2)
    x, idx = torch.randn(5, 3), torch.tensor([0, 9])
    with pytest.raises(IndexError, match="indices contains 9"):
        ops.pack_tokens(x, idx)
    with pytest.raises(IndexError, match="indices contains 9"):
        ops.unpack_tokens(torch.randn(2, 3), idx, 5)
    ids = torch.tensor([[1, 50]])
    args = (
        ids,
        torch.zeros_like(ids),
        None,
        torch.randn(10, 4),
        torch.randn(3, 4),
        None,
        torch.ones(4),
        torch.zeros(4),
    )
    with pytest.raises(IndexError, match="input_ids contains 50"):
        ops.embed_layernorm(*args)

    good_cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    good = [
        lambda v: ops.attention_varlen(qkv, good_cu, 4, 2, validate=v, backend="torch"),
        lambda v: ops.pack_tokens(x, torch.tensor([0, 4]), validate=v, backend="torch"),
        lambda v: ops.unpack_tokens(x[:2], torch.tensor([0, 4]), 5, validate=v, backend="torch"),
        lambda v: ops.embed_layernorm(
            torch.tensor([[1, 2]]),
            torch.tensor([[0, 1]]),
            None,
            *args[3:],
            validate=v,
            backend="torch",
        ),
    ]
    for call in good:
        with count() as c:
            call(True)
        assert c.reads, "public ops check values by default"
        with count() as c:
            call(False)
        assert c.reads == []
    # validate=False still checks shapes, dtypes and devices (those are free)
    with pytest.raises(TypeError, match="cu_seqlens must be an int32 tensor"):
        ops.attention_varlen(qkv, good_cu.long(), 4, 2, validate=False)


def test_pack_info_reads_back_once(count):
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]])
    with count() as c:
        info = ops.pack_info(mask)
    assert c.reads == ["tolist"]
    keep = mask.flatten() != 0
    assert info.indices.tolist() == keep.nonzero().squeeze(1).tolist()
    assert info.cu_seqlens.tolist() == [0, 3, 3, 6]
    assert info.max_seqlen == 3 and info.total_tokens == 6


# ------------------------------------------- launchers that cannot run here
def test_gpu_launchers_do_not_read_back():
    """The cuda and triton launchers cannot run on this machine's CPU (the triton
    interpreter reads everything back by design), so scan their source for the
    calls that would read device memory on the host. Sizes come from shapes and
    Python ints; none of these calls belongs in a launcher."""
    import ast
    import pathlib

    root = pathlib.Path(bertfast.__file__).parent / "ops"
    files = [
        root / "cpu" / "__init__.py",
        root / "cuda.py",
        root / "native.py",
        root / "dispatch.py",
        root / "padding.py",
        *sorted((root / "triton").glob("*.py")),
    ]
    banned = {"item", "tolist", "cpu", "numpy", "nonzero", "masked_select", "unique", "synchronize"}
    found = []
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in banned
            ):
                found.append(f"{path.name}:{node.lineno} .{node.func.attr}()")
    # padding.py's one read (public pack_info) and the op torch.compile calls
    # (bertfast::pack_indices, which must size its output) are the known ones.
    expected = {"padding.py .tolist()", "padding.py .nonzero()"}
    assert {f.split(":")[0] + " " + f.split(" ")[1] for f in found} <= expected, found
    assert len(found) == 2, found


# ------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend,cuda_graphs", [("torch", False), ("cuda", False), ("triton", False), ("auto", True)]
)
def test_cuda_forward_synchronizes_once(folders, backend, cuda_graphs):
    """CUDA's own sync detector (``torch.cuda.set_sync_debug_mode``) sees exactly the
    one read of a 12-layer forward, for every GPU backend and for graph replay."""
    import warnings

    if backend != "auto" and ops.backend_status("cuda")[backend] is not None:
        pytest.skip(f"{backend}: {ops.backend_status('cuda')[backend]}")
    model = bertfast.from_pretrained(
        folders[("bert", 12)], device="cuda", backend=backend, cuda_graphs=cuda_graphs
    )
    batch = {k: v.cuda() for k, v in make_batch("bert", lengths=(9, 4, 0, 7)).items()}
    model(**batch)  # warm-up: autotuning, graph capture
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model(**batch)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # only the detector's reports: torch >= 2.11 also warns (once per process) that
    # "Synchronization debug mode is a prototype feature ..." when it is switched on
    syncs = [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in caught]
