"""End-to-end parity of bertfast against transformers, every family and head.

Tolerance: fp32 with TF32 off (conftest.py; set again below). bertfast and
transformers compute the same math in a different order (fused QKV GEMM, packed
tokens, per-sequence attention), so over 2-3 layers the outputs differ by ~1e-6
(MLM logits, which are larger numbers, by ~1e-5). ``ATOL`` (1e-4, the end-to-end
tolerance ``bertfast.ops.parity.END_TO_END_ATOL``) leaves that headroom yet catches
any real bug (a dropped bias, a wrong activation, a mis-split QKV, a wrong position
offset), which shows up as > 1e-2.
"""

from __future__ import annotations

import os

import pytest
import torch

import bertfast
from bertfast.ops.parity import END_TO_END_ATOL
from tests.models import (
    FAMILIES,
    FAMILY_HEADS,
    PREFIX,
    build,
    edit_config,
    make_batch,
    rename_keys,
    save,
)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

ATOL = END_TO_END_ATOL
BACKENDS = ("torch", "auto")

#: output fields whose second dimension is the sequence (compared on real tokens)
_TOKEN_FIELDS = {"last_hidden_state", "prediction_logits", "start_logits", "end_logits"}
_TOKEN_LOGIT_HEADS = {"masked_lm", "token_classification", "electra_discriminator"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """(family, head) -> (transformers model, saved folder), built on first use."""
    cache = {}
    root = tmp_path_factory.mktemp("zoo")

    def get(family, head, fmt="safetensors", **overrides):
        key = (family, head, fmt, tuple(sorted(overrides.items())))
        if key not in cache:
            model = build(family, head, **overrides)
            folder = save(model, str(root / "-".join(map(str, key[:3])) / str(len(cache))), fmt)
            cache[key] = (model, folder)
        return cache[key]

    return get


def _reshape_mc(batch, choices=2):
    return {k: v.view(v.shape[0] // choices, choices, v.shape[1]) for k, v in batch.items()}


def max_diffs(ours, ref, mask, head):
    """Max |ours - ref| per output field, on real tokens only."""
    real = mask.reshape(-1, mask.shape[-1]).bool()
    diffs = {}
    for name in ref.keys():
        if name in ("loss", "attentions"):
            continue
        r = ref[name]
        o = ours[name]
        if name == "hidden_states":
            assert len(o) == len(r), f"{len(o)} hidden states, transformers has {len(r)}"
            diffs[name] = max(float((a[real] - b[real]).abs().max()) for a, b in zip(o, r))
            continue
        assert o.shape == r.shape, f"{name}: shape {tuple(o.shape)} vs {tuple(r.shape)}"
        per_token = name in _TOKEN_FIELDS or (name == "logits" and head in _TOKEN_LOGIT_HEADS)
        if per_token:
            diffs[name] = float((o[real] - r[real]).abs().max())
        else:
            diffs[name] = float((o - r).abs().max())
    return diffs


CASES = [(f, h) for f in FAMILIES for h in FAMILY_HEADS[f]]


@pytest.mark.parametrize("family,head", CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_parity_every_family_and_head(zoo, family, head):
    """Every output field, with backend="torch" and backend="auto" (which picks the
    native/triton kernels as they land)."""
    hf, folder = zoo(family, head)
    expected_head = (
        "electra_discriminator" if (family, head) == ("electra", "pretraining") else head
    )
    batch = make_batch(family)
    if head == "multiple_choice":
        batch = _reshape_mc(batch)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    for backend in BACKENDS:
        model = bertfast.from_pretrained(folder, backend=backend)
        assert model.head == expected_head  # chosen from config.json's architectures
        out = model(**batch, output_hidden_states=True)
        diffs = max_diffs(out, ref, batch["attention_mask"], expected_head)
        assert "hidden_states" in diffs and len(diffs) >= 2, diffs
        bad = {k: v for k, v in diffs.items() if not v <= ATOL}
        assert not bad, (
            f"{family}/{head}/backend={backend}: max abs diff over {ATOL}: {bad} (all: {diffs})"
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_base_outputs_and_padding(zoo, family):
    """Last hidden state, pooler and every hidden state; padded positions are zero."""
    hf, folder = zoo(family, "base")
    model = bertfast.from_pretrained(folder, backend="torch")
    batch = make_batch(family, lengths=(5, 12, 3), seq_len=13)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    out = model(**batch, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    assert out.last_hidden_state.shape == ref.last_hidden_state.shape
    assert float((out.last_hidden_state[real] - ref.last_hidden_state[real]).abs().max()) <= ATOL
    has_pooler = family not in ("electra", "distilbert")
    assert (out.pooler_output is not None) == has_pooler
    if has_pooler:
        assert float((out.pooler_output - ref.pooler_output).abs().max()) <= ATOL
    n_layers = model.config.num_layers * (model.config.inner_group_num if family == "albert" else 1)
    assert len(out.hidden_states) == n_layers + 1 == len(ref.hidden_states)
    for t in (out.last_hidden_state,) + out.hidden_states:
        assert torch.all(t[~real] == 0)
    # ALBERT/ELECTRA: hidden_states[0] is the projected embedding (width H, not E)
    assert out.hidden_states[0].shape[-1] == model.config.hidden_size
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert"])
def test_user_position_ids(zoo, family):
    hf, folder = zoo(family, "base")
    model = bertfast.from_pretrained(folder, backend="torch")
    batch = make_batch(family, lengths=(6, 4))
    pos = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 1, 0, 2, 2, 2]])
    with torch.no_grad():
        ref = hf(**batch, position_ids=pos)
    out = model(**batch, position_ids=pos)
    real = batch["attention_mask"].bool()
    assert float((out.last_hidden_state[real] - ref.last_hidden_state[real]).abs().max()) <= ATOL


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_left_padding_real_tokens(zoo, family):
    """Left padding: positions follow the padded layout exactly as transformers does
    (BERT arange; RoBERTa counts non-pad ids), so real tokens match."""
    hf, folder = zoo(family, "base")
    model = bertfast.from_pretrained(folder, backend="torch")
    batch = make_batch(family, lengths=(8, 5, 2))
    batch = {k: v.flip(1) for k, v in batch.items()}
    with torch.no_grad():
        ref = hf(**batch)
    out = model(**batch)
    real = batch["attention_mask"].bool()
    assert float((out.last_hidden_state[real] - ref.last_hidden_state[real]).abs().max()) <= ATOL
    assert torch.all(out.last_hidden_state[~real] == 0)


def test_batch_invariance(zoo):
    """A sentence's outputs alone equal its outputs inside a ragged batch."""
    _, folder = zoo("bert", "sequence_classification")
    model = bertfast.from_pretrained(folder, backend="torch")
    batch = make_batch("bert", lengths=(9, 4, 7))
    full = model(**batch, output_hidden_states=True)
    for b, n in enumerate((9, 4, 7)):
        one = {k: v[b : b + 1, :n] for k, v in batch.items()}
        alone = model(**one)
        torch.testing.assert_close(
            alone.last_hidden_state[0], full.last_hidden_state[b, :n], rtol=0, atol=1e-5
        )
        torch.testing.assert_close(alone.pooler_output[0], full.pooler_output[b], rtol=0, atol=1e-5)
        torch.testing.assert_close(alone.logits[0], full.logits[b], rtol=0, atol=1e-5)


# ---------------------------------------------------------------- checkpoint formats
def _check_against(hf, folder, family, head, backend="torch", **kw):
    model = bertfast.from_pretrained(folder, backend=backend, **kw)
    batch = make_batch(family)
    if head == "multiple_choice":
        batch = _reshape_mc(batch)
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    out = model(**batch, output_hidden_states=True)
    diffs = max_diffs(out, ref, batch["attention_mask"], model.head)
    assert all(v <= ATOL for v in diffs.values()), diffs
    return model


@pytest.mark.parametrize("fmt", ["safetensors", "sharded", "bin"])
@pytest.mark.parametrize(
    "family,head",
    [
        ("bert", "pretraining"),
        ("albert", "masked_lm"),
        ("distilbert", "sequence_classification"),
        ("electra", "base"),
    ],
)
def test_checkpoint_formats(zoo, family, head, fmt):
    hf, folder = zoo(family, head, fmt)
    files = set(os.listdir(folder))
    if fmt == "sharded":
        assert "model.safetensors.index.json" in files
        assert sum(f.endswith(".safetensors") for f in files) > 1
    elif fmt == "bin":
        assert "pytorch_model.bin" in files and "model.safetensors" not in files
    _check_against(hf, folder, family, head)


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra", "distilbert"])
def test_keys_with_and_without_prefix(zoo, tmp_path, family):
    import shutil

    # a head model saved with the prefix, rewritten without it
    hf, folder = zoo(family, "sequence_classification")
    stripped = str(tmp_path / "stripped")
    shutil.copytree(folder, stripped)
    p = PREFIX[family] + "."
    rename_keys(stripped, lambda k: k[len(p) :] if k.startswith(p) else k)
    _check_against(hf, stripped, family, "sequence_classification")
    # a base model saved without the prefix, rewritten with it
    hf, folder = zoo(family, "base")
    prefixed = str(tmp_path / "prefixed")
    shutil.copytree(folder, prefixed)
    rename_keys(prefixed, lambda k: p + k)
    _check_against(hf, prefixed, family, "base")


def test_legacy_gamma_beta_names(zoo, tmp_path):
    import shutil

    hf, folder = zoo("bert", "base")
    legacy = str(tmp_path / "legacy")
    shutil.copytree(folder, legacy)

    def old(k):
        if "LayerNorm" in k:
            return k.replace(".weight", ".gamma").replace(".bias", ".beta")
        return k

    rename_keys(legacy, old)
    _check_against(hf, legacy, "bert", "base")


@pytest.mark.parametrize("family", ["bert", "albert", "distilbert"])
def test_untied_mlm_decoder(zoo, family):
    """tie_word_embeddings=False: the checkpoint's own decoder weight is used."""
    hf, folder = zoo(family, "masked_lm", tie_word_embeddings=False)
    assert (
        hf.get_output_embeddings().weight.data_ptr() != hf.get_input_embeddings().weight.data_ptr()
    )
    model = _check_against(hf, folder, family, "masked_lm")
    assert model.mlm.decoder.weight.data_ptr() != model.embeddings.word.data_ptr()


@pytest.mark.parametrize("family", ["bert", "roberta", "electra"])
def test_tied_mlm_decoder_shares_memory(zoo, family):
    _, folder = zoo(family, "masked_lm")
    model = bertfast.from_pretrained(folder, backend="torch")
    assert model.mlm.decoder.weight.data_ptr() == model.embeddings.word.data_ptr()


def test_dtype_is_honoured(zoo):
    """dtype= casts the weights on load; outputs come in that dtype. (float64 is held
    to the fp32 tolerance: attention accumulates in fp32 by design, docs/design.md.)"""
    hf, folder = zoo("roberta", "sequence_classification")
    model = bertfast.from_pretrained(folder, backend="torch", dtype=torch.float64)
    assert model.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in model.parameters())
    batch = make_batch("roberta")
    with torch.no_grad():
        ref = hf(**batch)
    out = model(**batch)
    assert out.logits.dtype == torch.float64
    assert float((out.logits - ref.logits.double()).abs().max()) <= ATOL


def test_bfloat16_load_runs(zoo):
    hf, folder = zoo("bert", "base")
    model = bertfast.from_pretrained(folder, backend="torch", dtype=torch.bfloat16)
    batch = make_batch("bert")
    out = model(**batch)
    assert out.last_hidden_state.dtype == torch.bfloat16
    with torch.no_grad():
        ref = hf(**batch)
    real = batch["attention_mask"].bool()
    # bf16 storage: ~3 significant digits over 3 layers of O(1) activations.
    err = (out.last_hidden_state.float()[real] - ref.last_hidden_state[real]).abs().max()
    assert float(err) < 0.25


def test_explicit_head_on_a_head_checkpoint(zoo):
    """head="base" on a BertForPreTraining checkpoint: encoder + pooler, no logits."""
    hf, folder = zoo("bert", "pretraining")
    model = bertfast.from_pretrained(folder, backend="torch", head="base")
    batch = make_batch("bert")
    out = model(**batch)
    assert out.logits is None and out.prediction_logits is None
    with torch.no_grad():
        ref = hf.bert(**batch)
    assert float((out.pooler_output - ref.pooler_output).abs().max()) <= ATOL
    # and "pooler" demands the pooler weights, which this checkpoint has
    model = bertfast.from_pretrained(folder, backend="torch", head="pooler")
    assert model(**batch).pooler_output is not None


def test_albert_sentence_order_head(zoo):
    hf, folder = zoo("albert", "pretraining")
    model = bertfast.from_pretrained(folder, backend="torch", head="sentence_order")
    batch = make_batch("albert")
    with torch.no_grad():
        ref = hf(**batch)
    out = model(**batch)
    assert float((out.logits - ref.sop_logits).abs().max()) <= ATOL


@pytest.mark.parametrize(
    "problem_type", ["single_label_classification", "multi_label_classification", "regression"]
)
def test_sequence_classification_problem_types(zoo, problem_type):
    num_labels = 1 if problem_type == "regression" else 4
    hf, folder = zoo(
        "electra", "sequence_classification", problem_type=problem_type, num_labels=num_labels
    )
    model = _check_against(hf, folder, "electra", "sequence_classification")
    assert model.config.problem_type == problem_type
    assert model.config.num_labels == num_labels


def test_embedding_model_without_architectures(zoo, tmp_path):
    """Sentence-embedding checkpoints (MiniLM/BGE/E5/GTE) are plain BertModel folders;
    no ``architectures`` means the base head."""
    import shutil

    hf, folder = zoo("bert", "base")
    bare = str(tmp_path / "bare")
    shutil.copytree(folder, bare)
    edit_config(bare, architectures=None)
    model = _check_against(hf, bare, "bert", "base")
    assert model.head == "base"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "family,head",
    [
        ("bert", "pretraining"),
        ("roberta", "masked_lm"),
        ("albert", "sequence_classification"),
        ("electra", "question_answering"),
        ("distilbert", "multiple_choice"),
        ("xlm-roberta", "token_classification"),
    ],
)
def test_parity_on_cuda(zoo, family, head):
    """fp32 on the GPU (TF32 off) against transformers on the GPU, with the torch
    backend and with auto (cuda/triton kernels), eager and through CUDA graphs."""
    hf, folder = zoo(family, head)
    batch = make_batch(family)
    if head == "multiple_choice":
        batch = _reshape_mc(batch)
    batch = {k: v.cuda() for k, v in batch.items()}
    hf_cuda = hf.cuda()
    try:
        with torch.no_grad():
            ref = hf_cuda(**batch, output_hidden_states=True)
        for backend in BACKENDS:
            for graphs in (False, True):
                model = bertfast.from_pretrained(
                    folder, device="cuda", backend=backend, cuda_graphs=graphs
                )
                out = model(**batch, output_hidden_states=not graphs)
                if graphs:  # hidden states are not produced by the graph path
                    ref_cmp = {k: v for k, v in ref.items() if k != "hidden_states"}
                else:
                    ref_cmp = ref
                diffs = max_diffs(out, _Dict(ref_cmp), batch["attention_mask"], model.head)
                bad = {k: v for k, v in diffs.items() if not v <= ATOL}
                assert not bad, f"{family}/{head}/{backend}/graphs={graphs}: {bad}"
    finally:
        hf.cpu()


class _Dict(dict):
    """transformers' output subset with .keys() and [] (what max_diffs needs)."""
