"""Heads run through bertfast's ops and are chosen once at load.

Parity of every head against transformers is tests/test_parity_transformers.py;
this file checks *how* they run: every weight matrix of a head is multiplied by
``bertfast.ops.linear`` / ``ops.linear_gelu`` (so the masked-LM decoder, the
largest GEMM of any head, runs on bertfast's GEMM), and the head module is built
at load, not chosen per call.
"""

import pickle

import pytest
import torch

import bertfast
import bertfast.heads as H
from bertfast.outputs import EncoderOutput

from .models import FAMILIES, FAMILY_HEADS, build, make_batch, save

CASES = [(f, h) for f in FAMILIES for h in FAMILY_HEADS[f] if h != "base"]


@pytest.fixture
def gemm_weights(monkeypatch):
    """The shapes of the weight matrices the heads hand to bertfast.ops."""
    seen = []
    real_linear, real_linear_gelu = H.ops.linear, H.ops.linear_gelu

    def linear(x, weight, bias=None, backend="auto"):
        seen.append(weight)
        return real_linear(x, weight, bias, backend=backend)

    def linear_gelu(x, weight, bias=None, activation="gelu", backend="auto"):
        seen.append(weight)
        return real_linear_gelu(x, weight, bias, activation, backend=backend)

    monkeypatch.setattr(H.ops, "linear", linear)
    monkeypatch.setattr(H.ops, "linear_gelu", linear_gelu)
    return seen


@pytest.mark.parametrize("family,head", CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_every_head_matrix_goes_through_ops(tmp_path, gemm_weights, family, head):
    folder = save(build(family, head), str(tmp_path / "ckpt"))
    model = bertfast.from_pretrained(folder, backend="torch")
    assert isinstance(model.task_head, H.Head)
    required, _ = H.head_weight_specs(model.config, model.head)
    matrices = {n for n, shape in required.items() if n.endswith(".weight") and len(shape) == 2}
    assert matrices, required
    batch = make_batch(family)
    if head == "multiple_choice":
        batch = {k: v.view(v.shape[0] // 2, 2, v.shape[1]) for k, v in batch.items()}
    gemm_weights.clear()
    model(**batch)
    used = {id(w) for w in gemm_weights}
    missing = [n for n in sorted(matrices) if id(model._w(n)) not in used]
    assert not missing, f"{family}/{model.head}: not multiplied through bertfast.ops: {missing}"


def test_head_module_is_chosen_once_at_load(tmp_path):
    folder = save(build("bert", "masked_lm"), str(tmp_path / "ckpt"))
    model = bertfast.from_pretrained(folder)
    assert type(model.task_head) is H.MaskedLMHead and model.head == "masked_lm"
    assert "masked_lm" in repr(model)
    # the head holds no weights: the state dict is the checkpoint's canonical names
    assert not any(k.startswith("task_head") for k in model.state_dict())
    with pytest.raises(ValueError, match="unknown head"):
        H.build_head(model.config, "nope")


def test_masked_lm_decoder_runs_on_the_cpu_gemm(tmp_path):
    # backend="cpu", fp32: the decoder's [V, H] product is the C++ GEMM's result,
    # identical to calling bertfast.ops.linear on the same inputs.
    folder = save(build("bert", "masked_lm"), str(tmp_path / "ckpt"))
    model = bertfast.from_pretrained(folder, backend="cpu")
    batch = make_batch("bert")
    out = model(**batch)
    h, info, _ = model.encode(**batch)
    x = H.dense(model._w, "mlm.dense", h, model.task_head.act, "cpu")
    x = torch.nn.functional.layer_norm(
        x,
        (x.shape[-1],),
        model._w("mlm.ln.weight"),
        model._w("mlm.ln.bias"),
        model.config.layer_norm_eps,
    )
    logits = bertfast.ops.linear(
        x, model._w("mlm.decoder.weight"), model._w("mlm.decoder.bias"), backend="cpu"
    )
    assert torch.equal(out.logits.view(-1, logits.shape[-1])[info.indices], logits)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_pooler_output_is_computed_on_first_read_with_the_forwards_weights(
    tmp_path, monkeypatch, backend
):
    # The eager forward defers the pooler (outputs.EncoderOutput.defer): a caller of
    # the hidden states alone does not run its GEMM; reading pooler_output by any
    # means runs it once, on the weights the forward ran with, and gives
    # transformers' value.
    hf = build("bert")
    folder = save(hf, str(tmp_path / "ckpt"))
    model = bertfast.from_pretrained(folder, backend=backend)
    batch = make_batch("bert")
    with torch.no_grad():
        want = hf(**batch).pooler_output
    calls = []
    real_pool = H.pool
    monkeypatch.setattr(H, "pool", lambda *a, **k: calls.append(1) or real_pool(*a, **k))

    with torch.inference_mode():
        out = model(**batch)
        hidden = out.last_hidden_state
    assert hidden.shape[:2] == batch["input_ids"].shape and calls == []
    assert "pooler_output" in out.keys() and calls == [1]  # keys() reads it
    torch.testing.assert_close(out.pooler_output, want, atol=2e-5, rtol=1e-4)
    assert out[1] is out.pooler_output and out["pooler_output"] is out.pooler_output
    assert calls == [1]

    # Weights replaced between the forward and the read: still the forward's pooler.
    out = model(**batch)
    width = model.config.hidden_size
    model.pooler.weight = torch.nn.Parameter(torch.zeros(width, width), requires_grad=False)
    model.pooler.bias = torch.nn.Parameter(torch.zeros(width), requires_grad=False)
    torch.testing.assert_close(out.pooler_output, want, atol=2e-5, rtol=1e-4)
    assert not out.pooler_output.requires_grad
    # A pickled output carries the value (the deferred function is not pickled).
    out = pickle.loads(pickle.dumps(model(**batch)))
    torch.testing.assert_close(out.pooler_output, torch.zeros_like(want))
    # Assigned before it is read: the assigned value, the deferred function dropped.
    out = model(**batch)
    out.pooler_output = None
    assert "pooler_output" not in out.keys() and out.pooler_output is None


def test_only_pooler_output_defers():
    out = EncoderOutput(last_hidden_state=torch.zeros(1))
    with pytest.raises(ValueError, match="only pooler_output"):
        out.defer("logits", lambda: torch.zeros(1))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        out.nope  # noqa: B018


def test_a_head_that_reads_the_pooler_runs_it_once(tmp_path, monkeypatch):
    # BERT's sequence classification reads the pooler for its logits: pooler_output
    # is that same tensor, not a second GEMM on the read.
    hf = build("bert", "sequence_classification")
    model = bertfast.from_pretrained(save(hf, str(tmp_path / "ckpt")), backend="cpu")
    batch = make_batch("bert")
    calls = []
    real_pool = H.pool
    monkeypatch.setattr(H, "pool", lambda *a, **k: calls.append(1) or real_pool(*a, **k))
    out = model(**batch)
    assert calls == [1]
    with torch.no_grad():
        want = hf.bert(**batch).pooler_output
    torch.testing.assert_close(out.pooler_output, want, atol=2e-5, rtol=1e-4)
    assert calls == [1]
