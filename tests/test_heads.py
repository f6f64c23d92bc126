"""Heads run through bertfast's ops and are chosen once at load.

Parity of every head against transformers is tests/test_parity_transformers.py;
this file checks *how* they run: every weight matrix of a head is multiplied by
``bertfast.ops.linear`` / ``ops.linear_gelu`` (so the masked-LM decoder, the
largest GEMM of any head, runs on bertfast's GEMM), and the head module is built
at load, not chosen per call.
"""
import pytest
import torch

import bertfast
import bertfast.heads as H

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
    x = torch.nn.functional.layer_norm(x, (x.shape[-1],), model._w("mlm.ln.weight"),
                                       model._w("mlm.ln.bias"), model.config.layer_norm_eps)
    logits = bertfast.ops.linear(x, model._w("mlm.decoder.weight"),
                                 model._w("mlm.decoder.bias"), backend="cpu")
    assert torch.equal(out.logits.view(-1, logits.shape[-1])[info.indices], logits)
