"""The embeddings and every encoder layer in one native call on the CPU
(``CpuEncoder.forward`` -> ``bertfast.ops.cpu.encoder_forward``, bindings
``_C.cpu.encoder_forward`` / ``encoder_forward_int8``): where every layer of a forward
would run as one native call (``tests/ops/test_cpu_encoder_layer.py``), the whole
encoder runs as one: fp32 on the C++ GEMM, int8, and bf16 on the C++ bf16 GEMM.

References: the same model with a call per layer (``cpu.FUSED_FORWARD = False``) and
op by op (``cpu.FUSED_LAYER = False``), the same kernels, so equal bit for bit; and
transformers (parity). Then where it must not be taken, and that a weight replaced or
edited after a call is what the next call computes with (the runner keeps the
operands it made between calls).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bertfast
from bertfast.ops import cpu as cpu_ops
from bertfast.ops.cpu import weights as cpu_weights
from bertfast.ops.cpu.encoder import CpuEncoder

from ..test_parity_transformers import ATOL
from .test_cpu_encoder_layer import FAMILIES, _batch, _bf16_model, _on_panels, zoo  # noqa: F401
from .test_cpu_encoder_layer import Count as _Count

pytestmark = pytest.mark.skipif(
    cpu_ops._kernels is None, reason="bertfast._C CPU kernels are not built"
)


def Count(monkeypatch):
    """Counts ``CpuEncoder.forward`` calls that ran the encoder (returned a tensor) and
    that declined (None: the model went on layer by layer)."""
    return _Count(monkeypatch, CpuEncoder, "forward")


def _last(model, ids, mask):
    return model(ids, attention_mask=mask).last_hidden_state


def _three_ways(model, ids, mask, monkeypatch):
    """The last hidden state in one call, a call per layer, and op by op; asserts the
    one call ran once and all three are equal bit for bit."""
    count = Count(monkeypatch)
    one_call = _last(model, ids, mask)
    assert (count.ran, count.declined) == (1, 0)
    monkeypatch.setattr(cpu_ops, "FUSED_FORWARD", False)
    per_layer = _last(model, ids, mask)
    monkeypatch.setattr(cpu_ops, "FUSED_LAYER", False)
    op_by_op = _last(model, ids, mask)
    monkeypatch.setattr(cpu_ops, "FUSED_FORWARD", True)
    monkeypatch.setattr(cpu_ops, "FUSED_LAYER", True)
    assert count.ran == 1  # not taken when switched off
    assert torch.equal(one_call, per_layer)
    assert torch.equal(one_call, op_by_op)
    return one_call


@pytest.mark.parametrize("family", FAMILIES + ["onednn"])
@pytest.mark.parametrize("lengths", [[1], [7, 3], [10, 10, 10], [14, 1, 9, 5], [30, 1, 17, 9]])
def test_one_call_equals_layer_calls_and_transformers(family, lengths, zoo, monkeypatch):  # noqa: F811
    if sum(lengths) > cpu_weights.SMALL_ROWS:
        pytest.skip(f"above {cpu_weights.SMALL_ROWS} rows this CPU runs the GEMMs on oneDNN")
    hf, folder = zoo[family]
    model = _on_panels(folder, family, monkeypatch)
    ids, mask = _batch(lengths, hf.config.vocab_size)
    got = _three_ways(model, ids, mask, monkeypatch)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (got[real] - ref[real]).abs().max().item() <= ATOL


@pytest.mark.parametrize("attention", ["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths", [[1], [7, 3], [30, 1, 17, 9]])
def test_int8_one_call_equals_layer_calls(family, lengths, attention, zoo, monkeypatch):  # noqa: F811
    """int8 weights with attention in fp32 or bf16: ``_C.cpu.encoder_forward_int8``,
    equal bit for bit to a call per layer and op by op, and near transformers (the
    int8 contract itself is tests/test_accuracy_contract.py)."""
    monkeypatch.setenv("BERTFAST_CPU_INT8_ATTENTION", attention)
    hf, folder = zoo[family]
    model = bertfast.from_pretrained(folder, backend="cpu", quantize="int8")
    ids, mask = _batch(lengths, hf.config.vocab_size)
    got = _three_ways(model, ids, mask, monkeypatch)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    cos = torch.nn.functional.cosine_similarity(got[real], ref[real], dim=-1)
    assert cos.min().item() > 0.95


@pytest.mark.parametrize("route", ["onednn", "own"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths", [[1], [7, 3], [30, 1, 17, 9]])
def test_bf16_one_call_equals_layer_calls(family, lengths, route, zoo, monkeypatch):  # noqa: F811
    """bf16 weights in the C++ bf16 GEMM's panels (up to ``BF16_SMALL_ROWS`` rows):
    ``_C.cpu.encoder_forward`` on bf16 tokens (``blinear`` for every GEMM), equal bit
    for bit to a call per layer and op by op, and near transformers in fp32 (a bf16
    forward: every token's cosine similarity above 0.999)."""
    hf, folder = zoo[family]
    model = _bf16_model(folder, route, monkeypatch)
    ids, mask = _batch(lengths, hf.config.vocab_size)
    got = _three_ways(model, ids, mask, monkeypatch)
    assert got.dtype == torch.bfloat16
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    cos = torch.nn.functional.cosine_similarity(got[real].float(), ref[real], dim=-1)
    assert cos.min().item() > 0.999


def test_bf16_rows_above_the_limit_run_on_onednn(zoo, monkeypatch):  # noqa: F811
    """Above ``BF16_SMALL_ROWS`` rows a bf16 model's GEMMs run on oneDNN: the one call
    is considered and declined (also right after a call of few rows, whose operands
    the runner keeps), and the result is the one a fresh model gives."""
    hf, folder = zoo["bert"]
    model = _bf16_model(folder, "onednn", monkeypatch)
    small_ids, small_mask = _batch([5, 3], hf.config.vocab_size)
    _last(model, small_ids, small_mask)  # the runner now keeps the few-rows operands
    # Rows of 36 tokens (the zoo's models take 40), more of them than the bf16 limit.
    seqs = cpu_weights.BF16_SMALL_ROWS // 36 + 1
    ids, mask = _batch([36] * seqs, hf.config.vocab_size)
    count = Count(monkeypatch)
    got = _last(model, ids, mask)
    assert (count.ran, count.declined) == (0, 1)
    assert torch.equal(got, _last(_bf16_model(folder, "onednn", monkeypatch), ids, mask))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    got, ref = got.flatten(0, 1).float(), ref.flatten(0, 1)  # no padding: equal lengths
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert cos.min().item() > 0.999


def test_embedder_lone_query_takes_one_call(monkeypatch):
    """What a served query runs (``Embedder.encode`` -> ``encode_packed``): one call,
    and the vector sentence-transformers' pooling of transformers' output gives."""
    from transformers import AutoModel, AutoTokenizer

    from bertfast.embedder import default_checkpoint

    path = default_checkpoint()
    emb = bertfast.Embedder.from_pretrained(path)
    count = Count(monkeypatch)
    text = "how do I make my search faster"
    got = emb.encode([text], normalize=False, convert_to="torch")
    assert (count.ran, count.declined) == (1, 0)
    tok, hf = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    batch = tok([text], return_tensors="pt")
    with torch.no_grad():
        want = hf(**batch).last_hidden_state.mean(dim=1)
    assert (got - want).abs().max().item() <= ATOL


def test_not_taken_with_hidden_states(zoo, monkeypatch):  # noqa: F811
    """Every layer's output asked for: a call per layer (each keeps its output)."""
    hf, folder = zoo["bert"]
    model = _on_panels(folder, "bert", monkeypatch)
    ids, mask = _batch([5, 3], hf.config.vocab_size)
    count = Count(monkeypatch)
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    assert (count.ran, count.declined) == (0, 0)
    assert len(out.hidden_states) == hf.config.num_hidden_layers + 1
    assert torch.equal(out.last_hidden_state, _last(model, ids, mask))
    assert count.ran == 1


@pytest.mark.parametrize("kind", ["bf16 without panels", "plain", "onednn rows"])
def test_declined_off_the_cpp_gemm(kind, zoo, monkeypatch):  # noqa: F811
    """bf16 weights oneDNN holds in another layout (or with the bf16 GEMM off AMX),
    weights the model does not own packed (``optimize()``), and rows oneDNN runs:
    considered, declined, and the forward is the model's layer by layer."""
    hf, folder = zoo["onednn" if kind == "onednn rows" else "bert"]
    lengths = [5, 3]
    if kind == "bf16 without panels":
        monkeypatch.setattr(cpu_weights, "BF16_PANELS", False)  # read at load
        model = bertfast.from_pretrained(folder, backend="cpu", dtype=torch.bfloat16)
        # oneDNN's form without panels, or (no native bf16) a plain weight
        assert getattr(model.layers._modules["0"].qkv.weight, "_panels", None) is None
    elif kind == "plain":
        model = bertfast.optimize(hf, backend="cpu")
    else:
        if not cpu_weights.ONEDNN:
            pytest.skip("torch has no oneDNN")
        model = bertfast.from_pretrained(folder, backend="cpu")
        w = model.layers._modules["0"].ffn_in.weight
        if w._panels is None or not w._packed.is_mkldnn:
            pytest.skip("oneDNN does not hold this weight in 64-wide panels on this CPU")
        rows = cpu_weights.SMALL_ROWS + 32
        lengths = [rows // 2, rows // 2]
    ids, mask = _batch(lengths, hf.config.vocab_size)
    count = Count(monkeypatch)
    got = _last(model, ids, mask)
    assert (count.ran, count.declined) == (0, 1)
    monkeypatch.setattr(cpu_ops, "FUSED_FORWARD", False)
    assert torch.equal(got, _last(model, ids, mask))


def _op_by_op(model, ids, mask, monkeypatch):
    monkeypatch.setattr(cpu_ops, "FUSED_LAYER", False)
    out = _last(model, ids, mask)
    monkeypatch.setattr(cpu_ops, "FUSED_LAYER", True)
    return out


@pytest.mark.parametrize("how", ["parameter replaced", "edit_weights", "unpack_weights"])
def test_weights_changed_after_a_call(how, zoo, monkeypatch):  # noqa: F811
    """The runner keeps the operands it made between calls; a weight replaced
    (``module.weight = nn.Parameter(...)``), edited (``edit_weights``) or unpacked
    after a call is what the next call computes with, never the kept operands."""
    hf, folder = zoo["albert" if how == "parameter replaced" else "bert"]
    model = _on_panels(folder, "bert", monkeypatch)
    ids, mask = _batch([6, 4], hf.config.vocab_size)
    before = _last(model, ids, mask)
    L = model.layers._modules["0"]
    if how == "parameter replaced":  # ALBERT: the shared layer, in every use
        L.ffn_ln.weight = nn.Parameter(L.ffn_ln.weight.detach() * 1.5, requires_grad=False)
    elif how == "edit_weights":
        with torch.no_grad(), model.edit_weights():
            L.ffn_in.weight.mul_(0.5)
    else:
        model.unpack_weights()
        with torch.no_grad():
            L.qkv.weight.mul_(0.5)
    count = Count(monkeypatch)
    after = _last(model, ids, mask)
    assert count.ran == (0 if how == "unpack_weights" else 1)
    assert not torch.equal(after, before)
    assert torch.equal(after, _op_by_op(model, ids, mask, monkeypatch))


@pytest.mark.parametrize("how", ["parameter replaced", "unpack_weights", "model deleted"])
def test_kept_operands_are_held_natively_and_released(how, zoo, monkeypatch):  # noqa: F811
    """The operands the runner keeps are held on the C++ side too (the call passes
    their handle); a replaced parameter, unpacked weights or the model's end releases
    them there (``encoder_release`` then finds nothing under the old handle)."""
    import gc

    from bertfast._C import cpu as native

    hf, folder = zoo["bert"]
    model = _on_panels(folder, "bert", monkeypatch)
    ids, mask = _batch([6, 4], hf.config.vocab_size)
    seen = []
    real = native.encoder_forward_held
    monkeypatch.setattr(native, "encoder_forward_held", lambda *a: seen.append(a[3]) or real(*a))
    before = _last(model, ids, mask)
    assert len(seen) == 1
    handle = seen[0]
    assert torch.equal(_last(model, ids, mask), before) and seen == [handle, handle]
    L = model.layers._modules["0"]
    if how == "parameter replaced":
        L.ffn_ln.weight = nn.Parameter(L.ffn_ln.weight.detach() * 1.5, requires_grad=False)
        _last(model, ids, mask)
        assert len(seen) == 3 and seen[2] != handle  # new operands, a new handle
    elif how == "unpack_weights":
        model.unpack_weights()
    else:
        del model, L
        gc.collect()
    assert native.encoder_release(handle) is False  # released already


STEPS = [
    "embeddings",
    "QKV projection",
    "attention",
    "attention output projection",
    "attention LayerNorm",
    "FFN in",
    "FFN out",
    "FFN LayerNorm",
]


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_step_profile_times_each_step_of_the_one_call(quantize, zoo, monkeypatch):  # noqa: F811
    """``_C.cpu.step_profile_start`` / ``step_profile_stop`` (what
    benchmarks/experiments/forward_split.py reads): while on, each innermost step of
    the one-call forward adds its wall time, the embeddings once a forward and each
    layer step once a layer (a layer is not a step of its own); the steps' sum is
    within the forwards' wall time; stopped, it keeps nothing more."""
    import time

    from bertfast import _C

    hf, folder = zoo["bert"]
    model = bertfast.from_pretrained(folder, backend="cpu", quantize=quantize)
    ids, mask = _batch([7, 3], hf.config.vocab_size)
    _last(model, ids, mask)
    count = Count(monkeypatch)
    forwards, layers = 3, hf.config.num_hidden_layers
    _C.cpu.step_profile_start()
    t0 = time.perf_counter()
    for _ in range(forwards):
        _last(model, ids, mask)
    wall = time.perf_counter() - t0
    steps = _C.cpu.step_profile_stop()
    assert (count.ran, count.declined) == (forwards, 0)
    assert [name for name, _, _ in steps] == STEPS
    calls = {name: n for name, _, n in steps}
    assert calls == {name: forwards * (1 if name == "embeddings" else layers) for name in STEPS}
    assert all(seconds > 0 for _, seconds, _ in steps)
    assert sum(seconds for _, seconds, _ in steps) <= wall
    _last(model, ids, mask)
    assert _C.cpu.step_profile_stop() == []
