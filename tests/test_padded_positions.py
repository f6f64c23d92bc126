"""optimize(padded_positions=...): what an optimized model returns at padded positions.

Reference: the same transformers model's own forward, run before optimize() (fp32,
TF32 off, eager attention), compared at *every* position, padded ones included.
Tolerance 1e-4 (END_TO_END_ATOL) as in test_optimize.py: fp32 through 2-3 layers in a
different summation order drifts by ~1e-6; a wrong mask, position or pooler token is
> 1e-2.
"""

import pytest
import torch

import bertfast
from bertfast.ops.parity import END_TO_END_ATOL

from .models import FAMILIES, build

ATOL = END_TO_END_ATOL


def _inputs(family, left_pad=True, empty_row=False):
    """Right-padded rows, one left-padded row (transformers accepts any mask) and,
    on request, a row with no real token."""
    g = torch.Generator().manual_seed(3)
    B, S = 4, 9
    ids = torch.randint(5, 100, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    if left_pad:
        mask[3, :3] = 0
    if empty_row:
        mask[3] = 0
    pad = 1 if family in ("roberta", "xlm-roberta", "camembert") else 0
    kw = {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
    if family in ("bert", "albert", "electra"):
        kw["token_type_ids"] = (torch.arange(S)[None] >= 5).long().expand(B, -1).contiguous()
    return kw, mask.bool()


def _max_diff(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_values_at_padded_positions(family, backend):
    model = build(family)
    kw, mask = _inputs(family)
    with torch.no_grad():
        expected = model(**kw, output_hidden_states=True)
    bertfast.optimize(model, backend=backend, fallback=False, padded_positions="transformers")
    with torch.no_grad():
        got = model(**kw, output_hidden_states=True)
    pad = ~mask
    # transformers' values at padded positions are far from zero: this is what is tested
    assert expected.last_hidden_state[pad].abs().max() > 0.1
    assert _max_diff(got.last_hidden_state, expected.last_hidden_state) <= ATOL
    assert len(got.hidden_states) == len(expected.hidden_states)
    for i, (e, o) in enumerate(zip(expected.hidden_states, got.hidden_states)):
        assert _max_diff(o, e) <= ATOL, f"hidden_states[{i}]"
    if getattr(expected, "pooler_output", None) is not None:
        # position 0, a padded token in the left-padded row, as transformers reads it
        assert _max_diff(got.pooler_output, expected.pooler_output) <= ATOL


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_default_zeros_at_padded_positions(family):
    model = build(family)
    kw, mask = _inputs(family, left_pad=False)
    with torch.no_grad():
        expected = model(**kw).last_hidden_state
    bertfast.optimize(model, fallback=False)  # padded_positions="zeros"
    with torch.no_grad():
        got = model(**kw).last_hidden_state
    assert (got[~mask] == 0).all()
    assert expected[~mask].abs().max() > 0.1  # so the two modes really differ there
    assert _max_diff(got[mask], expected[mask]) <= ATOL


@pytest.mark.parametrize(
    "family,head",
    [
        ("bert", "masked_lm"),
        ("roberta", "token_classification"),
        ("albert", "sequence_classification"),
    ],
)
def test_heads_see_transformers_values(family, head):
    # The heads stay transformers' own modules: per-token logits at padded
    # positions and a pooler read at position 0 follow from the encoder output.
    model = build(family, head)
    kw, _ = _inputs(family)
    with torch.no_grad():
        expected = model(**kw).logits
    bertfast.optimize(model, fallback=False, padded_positions="transformers")
    with torch.no_grad():
        got = model(**kw).logits
    assert _max_diff(got, expected) <= ATOL


def test_row_without_real_tokens_matches_transformers():
    # transformers' additive mask makes such a row attend uniformly over its padding
    model = build("bert")
    kw, _ = _inputs("bert", empty_row=True)
    with torch.no_grad():
        expected = model(**kw)
    bertfast.optimize(model, fallback=False, padded_positions="transformers")
    with torch.no_grad():
        got = model(**kw)
    assert _max_diff(got.last_hidden_state, expected.last_hidden_state) <= ATOL
    assert _max_diff(got.pooler_output, expected.pooler_output) <= ATOL


def test_switching_modes_and_bad_value():
    model = build("bert")
    kw, mask = _inputs("bert")
    with torch.no_grad():
        expected = model(**kw).last_hidden_state
    bertfast.optimize(model, fallback=False, padded_positions="transformers")
    bertfast.optimize(model, fallback=False)  # back to the default
    with torch.no_grad():
        got = model(**kw).last_hidden_state
    assert (got[~mask] == 0).all()
    assert _max_diff(got[mask], expected[mask]) <= ATOL
    with pytest.raises(ValueError, match="padded_positions must be one of"):
        bertfast.optimize(model, padded_positions="keep")
