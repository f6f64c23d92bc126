"""torch.compile of the padding-free encoder: one graph, no graph break.

``fullgraph=True`` makes any graph break an error, so each test passing means the
whole forward (input checks, packing with its data-dependent token count, every
layer, the heads, unpacking) traced as one graph. Most tests compile with the
``aot_eager`` backend (it runs the same tracing, fake implementations and
functionalization as inductor, without generating code, which costs tens of
seconds per model on CPU); one test runs the default (inductor) backend end to end.

Reference: the same model run eagerly (itself checked against transformers in
test_parity_transformers.py), and transformers for the optimize()d model.
"""
from __future__ import annotations

import pytest
import torch

import bertfast

from .models import build, make_batch, save

ATOL = 1e-5  # fp32; the compiled graph runs the same kernels, fusion may reorder a sum


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Every model's forward is one code object: start each test with an empty cache
    # so that earlier tests' graphs neither count against the recompile limit nor
    # hide a recompilation.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Counting:
    """A compile backend that records each graph it is given, then compiles it with
    ``inner``."""

    def __init__(self, inner: str = "aot_eager"):
        self.inner = torch._dynamo.lookup_backend(inner)
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return self.inner(gm, example_inputs)

    def custom_ops(self):
        """Names of the bertfast custom ops in the graphs (``bertfast.<op>``)."""
        return sorted({str(n.target).removesuffix(".default") for g in self.graphs
                       for n in g.graph.nodes
                       if n.op == "call_function" and str(n.target).startswith("bertfast.")})


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for family, head in [("bert", "sequence_classification"), ("roberta", "masked_lm"),
                         ("albert", "pretraining"), ("distilbert", "question_answering")]:
        path = tmp_path_factory.mktemp(family)
        out[family] = save(build(family, head), str(path))
    return out


def _close(got, ref, names):
    for name in names:
        a, b = got[name], ref[name]
        if isinstance(a, tuple):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, rtol=0, atol=ATOL)
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=ATOL, msg=name)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_compiled_model_is_one_graph_and_matches_eager(folders, backend):
    model = bertfast.from_pretrained(folders["bert"], backend=backend)
    counter = Counting()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    names = ("last_hidden_state", "pooler_output", "logits", "hidden_states")
    batch = make_batch("bert", lengths=(9, 4, 0, 7), seq_len=11)  # ragged, one empty row
    _close(compiled(**batch, output_hidden_states=True),
           model(**batch, output_hidden_states=True), names)
    assert len(counter.graphs) == 1
    # The packed layer ops and the data-dependent packing are in the graph as ops.
    ops_seen = set(counter.custom_ops())
    assert {"bertfast.pack_indices", "bertfast.attention_varlen", "bertfast.embed_layernorm",
            "bertfast.unpack_tokens"} <= ops_seen
    # The FFN GEMM: linear_gelu, or linear_packed for a loaded model's packed weights
    # on the cpu backend (a PackedWeight's panels enter the graph as a plain tensor).
    assert ops_seen & {"bertfast.linear_gelu", "bertfast.linear_packed"}
    # Other lengths in the same [batch, seq] shape: other token counts, same graph.
    for seed, lengths in enumerate([(11, 11, 11, 11), (1, 0, 0, 2), (0, 0, 0, 0)]):
        batch = make_batch("bert", lengths=lengths, seq_len=11, seed=seed)
        _close(compiled(**batch, output_hidden_states=True),
               model(**batch, output_hidden_states=True), names)
    assert len(counter.graphs) == 1


@pytest.mark.parametrize("family,names", [
    ("roberta", ("last_hidden_state", "logits")),
    ("albert", ("last_hidden_state", "pooler_output", "prediction_logits", "sop_logits")),
    ("distilbert", ("last_hidden_state", "start_logits", "end_logits")),
])
def test_compiled_families_and_heads(folders, family, names):
    model = bertfast.from_pretrained(folders[family], backend="torch")
    counter = Counting()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    batch = make_batch(family, lengths=(6, 2, 8), seq_len=8)
    _close(compiled(**batch), model(**batch), names)
    assert len(counter.graphs) == 1


def test_compiled_with_dynamic_shapes(folders):
    """Symbolic batch and sequence length: still no graph break."""
    model = bertfast.from_pretrained(folders["bert"], backend="torch")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=Counting())
    for lengths, seq_len in [((9, 4, 7), 11), ((3, 5), 6), ((1, 2, 13, 4, 0), 13)]:
        batch = make_batch("bert", lengths=lengths, seq_len=seq_len)
        _close(compiled(**batch), model(**batch), ("last_hidden_state", "logits"))


def test_compiled_with_inductor_matches_eager(folders):
    """The default backend, code generation included (the torch backend, so the
    encoder's own math is compiled, not only the glue around C++ kernels)."""
    model = bertfast.from_pretrained(folders["bert"], backend="torch")
    compiled = torch.compile(model, fullgraph=True)
    batch = make_batch("bert", lengths=(9, 4, 0, 7), seq_len=11)
    _close(compiled(**batch), model(**batch), ("last_hidden_state", "pooler_output", "logits"))


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_compiled_optimized_transformers_model(backend):
    hf = build("bert", "base")
    batch = make_batch("bert", lengths=(9, 4, 7), seq_len=11)
    with torch.no_grad():
        expected = hf(**batch)
    bertfast.optimize(hf, backend=backend)
    counter = Counting()
    compiled = torch.compile(hf, fullgraph=True, backend=counter)
    with torch.no_grad():
        eager = hf(**batch)
        got = compiled(**batch)
        as_tuple = compiled(**batch, return_dict=False)
    assert type(got) is type(expected)
    torch.testing.assert_close(got.last_hidden_state, eager.last_hidden_state, rtol=0, atol=ATOL)
    torch.testing.assert_close(got.pooler_output, eager.pooler_output, rtol=0, atol=ATOL)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got.last_hidden_state[real], expected.last_hidden_state[real],
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(as_tuple[0], got.last_hidden_state, rtol=0, atol=0)
    assert "bertfast.attention_varlen" in counter.custom_ops()
    assert len(counter.graphs) == 2  # return_dict=True and False: one graph each


def test_pack_indices_op_and_validate_argument_pass_opcheck():
    """The custom op torch.compile traces for packing (data-dependent output size),
    against the eager pack_info; and the ``validate`` argument in the op schemas."""
    from bertfast import ops

    for mask in (torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]]),
                 torch.rand(5, 7) > 0.4, torch.zeros(2, 3, dtype=torch.bool)):
        torch.library.opcheck(torch.ops.bertfast.pack_indices.default, (mask,))
        indices, cu = torch.ops.bertfast.pack_indices(mask)
        info = ops.pack_info(mask)
        assert torch.equal(indices, info.indices) and torch.equal(cu, info.cu_seqlens)
    qkv, cu = torch.randn(7, 24), torch.tensor([0, 3, 7], dtype=torch.int32)
    torch.library.opcheck(torch.ops.bertfast.attention_varlen.default,
                          (qkv, cu, 4, 2, 0.3, "torch", False))
    torch.library.opcheck(torch.ops.bertfast.pack_tokens.default,
                          (qkv, torch.tensor([0, 6]), "torch", False))
