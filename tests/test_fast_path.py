"""The CPU fast path of the encoder: ``BertfastModel._runner`` takes the cpu
backend's encoder runner (``ops.encoder_runner``, ``bertfast/ops/cpu/encoder.py``),
resolved once per model, device and dtype, whose ``layers`` calls the backend's
implementations without per-call checks or dispatch; a batch with no padding skips the
pack / unpack gathers (``PackInfo.dense``).

Reference: transformers (random-weight models of every architecture the encoder
loop handles differently: BERT, RoBERTa positions, ALBERT shared layers and
embedding projection, ELECTRA projection, DistilBERT without token types), with
and without padding. The other tests check that the fast path is really taken on
CPU and is not taken where it must not be (another backend, a dtype the cpu
backend does not run, torch.compile, a torch_dispatch mode).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import bertfast
from bertfast import ops
from bertfast.embedder import Embedder, pool
from bertfast.model import BertfastModel
from bertfast.ops.cpu.encoder import CpuEncoder

from .models import build, make_batch, save
from .test_parity_transformers import ATOL, max_diffs

CASES = [
    ("bert", "sequence_classification"),
    ("roberta", "masked_lm"),
    ("albert", "base"),
    ("electra", "base"),  # embedding_size 48 != hidden 96: the projection
    ("distilbert", "base"),
]

#: the public entry points of the encoder's ops (bypassed by the fast path)
_ENCODER_OPS = ("embed_layernorm", "add_layernorm", "linear_gelu", "attention_varlen")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    out = {}
    for family, head in CASES:
        model = build(family, head)
        out[family] = (model, save(model, str(tmp_path_factory.mktemp(family))))
    return out


class Spy:
    """Counts the runner's encoder runs (as "runner": ``CpuEncoder.forward`` that ran
    the encoder in one native call, or ``CpuEncoder.layers``) and calls of the
    public op entry points."""

    def __init__(self, monkeypatch):
        self.calls: dict[str, int] = {}
        real_direct, real_forward = CpuEncoder.layers, CpuEncoder.forward

        def direct(runner, *a, **k):
            self._count("runner")
            return real_direct(runner, *a, **k)

        def forward(runner, *a, **k):
            out = real_forward(runner, *a, **k)
            if out is not None:
                self._count("runner")
            return out

        monkeypatch.setattr(CpuEncoder, "layers", direct)
        monkeypatch.setattr(CpuEncoder, "forward", forward)
        for name in _ENCODER_OPS + ("linear", "pack_tokens", "unpack_tokens"):
            real = getattr(ops, name)

            def spy(*a, _real=real, _name=name, **k):
                self._count(_name)
                return _real(*a, **k)

            monkeypatch.setattr(ops, name, spy)

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def __getitem__(self, name):
        return self.calls.get(name, 0)


def _batch(family, padded):
    lengths = (11, 7, 1, 9) if padded else (9, 9, 9)
    return make_batch(family, lengths=lengths)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "full"])
@pytest.mark.parametrize("family,head", CASES, ids=[f for f, _ in CASES])
def test_fast_path_matches_transformers(zoo, monkeypatch, family, head, padded):
    hf, folder = zoo[family]
    batch = _batch(family, padded)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    model = bertfast.from_pretrained(folder)  # backend="auto": the cpu kernels
    spy = Spy(monkeypatch)
    out = model(**batch, output_hidden_states=True)
    # taken: one direct encoder run, none of the encoder ops through their entry points
    assert spy["runner"] == 1
    assert all(spy[name] == 0 for name in _ENCODER_OPS if name != "linear_gelu"), spy.calls
    assert spy["linear_gelu"] <= 1, spy.calls  # a masked-LM head's dense layer, if any
    # packing only when something is padded (the heads may still unpack their logits)
    assert (spy["pack_tokens"] > 0) == padded, spy.calls
    if not padded:
        assert spy["unpack_tokens"] == 0, spy.calls
    diffs = max_diffs(out, ref, batch["attention_mask"], model.head)
    assert "hidden_states" in diffs and len(diffs) >= 2, diffs
    bad = {k: v for k, v in diffs.items() if not v <= ATOL}
    assert not bad, f"{family}: {bad} (all: {diffs})"
    if padded:  # padded positions are zero, as on the ordinary path
        real = batch["attention_mask"].bool()
        for t in (out.last_hidden_state,) + out.hidden_states:
            assert torch.all(t[~real] == 0)
    else:  # no mask at all: the counts are known without reading the mask
        no_mask = {k: v for k, v in batch.items() if k != "attention_mask"}
        again = model(**no_mask, output_hidden_states=True)
        assert len(again.hidden_states) == len(out.hidden_states)
        for a, b in zip(again.hidden_states, out.hidden_states):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(again.last_hidden_state, out.last_hidden_state, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_equals_the_checked_path(zoo, monkeypatch, dtype):
    """Same kernels, same order: the direct calls give what the public ops give
    (bf16: the cpu backend's torch-GEMM route, also taken directly)."""
    _, folder = zoo["albert"]
    batch = _batch("albert", padded=True)
    model = bertfast.from_pretrained(folder, backend="cpu", dtype=dtype)
    spy = Spy(monkeypatch)
    fast = model(**batch, output_hidden_states=True)
    assert spy["runner"] == 1, spy.calls
    monkeypatch.setattr(BertfastModel, "_runner", lambda self: None)
    slow = model(**batch, output_hidden_states=True)
    assert spy["runner"] == 1 and spy["attention_varlen"] > 0, spy.calls
    torch.testing.assert_close(fast.last_hidden_state, slow.last_hidden_state, rtol=0, atol=0)
    for a, b in zip(fast.hidden_states, slow.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_not_taken_on_other_backends(zoo, monkeypatch):
    hf, folder = zoo["bert"]
    batch = _batch("bert", padded=True)
    with torch.no_grad():
        ref = hf.base_model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    spy = Spy(monkeypatch)
    model = bertfast.from_pretrained(folder, backend="torch")
    out = model(**batch).last_hidden_state
    assert spy["runner"] == 0 and spy["attention_varlen"] > 0, spy.calls
    assert float((out[real] - ref[real]).abs().max()) <= ATOL

    # BERTFAST_BACKEND overrides "auto": the plan follows the variable as it changes
    model = bertfast.from_pretrained(folder)
    monkeypatch.setenv("BERTFAST_BACKEND", "torch")
    spy.calls.clear()
    out = model(**batch).last_hidden_state
    assert spy["runner"] == 0 and spy["attention_varlen"] > 0, spy.calls
    assert float((out[real] - ref[real]).abs().max()) <= ATOL
    monkeypatch.delenv("BERTFAST_BACKEND")
    spy.calls.clear()
    model(**batch)
    assert spy["runner"] == 1 and spy["attention_varlen"] == 0, spy.calls


def test_not_taken_for_a_dtype_the_cpu_backend_does_not_run(zoo, monkeypatch):
    hf, folder = zoo["roberta"]
    batch = _batch("roberta", padded=True)
    with torch.no_grad():
        ref = hf(**batch).logits
    model = bertfast.from_pretrained(folder)
    spy = Spy(monkeypatch)
    model.to(torch.float64)  # fp64: the torch backend runs it ("auto")
    out = model(**batch).logits
    assert spy["runner"] == 0 and spy["attention_varlen"] > 0, spy.calls
    real = batch["attention_mask"].bool()
    assert out.dtype == torch.float64
    assert float((out[real].float() - ref[real]).abs().max()) <= 1e-3
    model.to(torch.float32)  # back on the cpu kernels: the plan is resolved again
    spy.calls.clear()
    out = model(**batch).logits
    assert spy["runner"] == 1, spy.calls
    assert float((out[real] - ref[real]).abs().max()) <= ATOL


def test_not_taken_under_a_dispatch_mode(zoo, monkeypatch):
    """A torch_dispatch mode must see the registered custom ops, not opaque calls."""

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func._schema.name))
            return func(*args, **(kwargs or {}))

    _, folder = zoo["bert"]
    model = bertfast.from_pretrained(folder)
    spy = Spy(monkeypatch)
    with Seen() as seen:
        model(**_batch("bert", padded=True))
    assert spy["runner"] == 0, spy.calls
    assert {"bertfast::attention_varlen", "bertfast::add_layernorm"} <= seen.ops


def test_not_taken_while_compiling(zoo, monkeypatch):
    torch._dynamo.reset()
    try:
        _, folder = zoo["bert"]
        batch = _batch("bert", padded=True)
        model = bertfast.from_pretrained(folder)
        eager = model(**batch)
        spy = Spy(monkeypatch)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        out = compiled(**batch)
        assert spy["runner"] == 0, spy.calls
        torch.testing.assert_close(out.logits, eager.logits, rtol=0, atol=1e-5)
    finally:
        torch._dynamo.reset()


def test_edited_weights_are_read_at_each_call(zoo, monkeypatch):
    """The plan holds functions, not weights: an edit (unpack_weights / refresh, or a
    replaced parameter) shows at the next call, as on the checked path."""
    _, folder = zoo["bert"]
    batch = _batch("bert", padded=False)
    model = bertfast.from_pretrained(folder)
    before = model(**batch).last_hidden_state
    with model.edit_weights():
        getattr(model.layers, "1").ffn_in.bias.data += 0.5
    model.embeddings.ln.weight = torch.nn.Parameter(model.embeddings.ln.weight * 1.5)
    spy = Spy(monkeypatch)
    after = model(**batch).last_hidden_state
    assert spy["runner"] == 1
    monkeypatch.setattr(BertfastModel, "_runner", lambda self: None)
    checked = model(**batch).last_hidden_state
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, checked, rtol=0, atol=0)


def test_pack_info_dense_only_without_padding():
    full = ops.pack_info(torch.ones(2, 3, dtype=torch.long))
    assert full.dense and full.indices.tolist() == list(range(6))
    assert full.cu_seqlens.tolist() == [0, 3, 6] and full.max_seqlen == 3
    holes = ops.pack_info(torch.tensor([[1, 1, 1], [1, 0, 1]]))
    assert not holes.dense and holes.indices.tolist() == [0, 1, 2, 3, 5]


def test_embedder_pools_the_encoder_output(tmp_path, monkeypatch):
    """The Embedder runs the bare encoder (no pooler / head) and pools the same
    hidden states the full forward returns."""
    from .tiny_embedder import corpus, make_checkpoint

    emb = Embedder.from_pretrained(make_checkpoint(tmp_path))  # a BERT with a pooler
    texts = corpus(3, min_words=2)
    batch = emb.tokenizer.collate(emb.tokenizer.tokenize(texts))
    with torch.no_grad():
        full = emb.model(**batch).last_hidden_state
    expected = pool(full, batch["attention_mask"], emb.pooling)

    def no_forward(*a, **k):
        raise AssertionError("the Embedder ran the full forward (pooler, head)")

    monkeypatch.setattr(emb.model, "forward", no_forward)
    torch.testing.assert_close(emb.embed_batch(batch), expected, rtol=0, atol=1e-6)
    one = emb.encode(texts[1], normalize=False, convert_to="torch")
    torch.testing.assert_close(one, expected[1], rtol=0, atol=1e-5)
