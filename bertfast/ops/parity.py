"""The parity rule of docs/design.md section 5, in one place.

Against a float64 (or, for a GPU sweep, fp32) "gold" computed by the reference
(``bertfast.ops.reference``, the spec), an implementation's max abs error may be at
most twice the error of the reference run in the same dtype, plus a small ``atol``
kept as data in :data:`ATOL` with the reason for its value. The tests
(``tests/ops/harness.py``), ``bertfast tune`` and the GPU sweeps all judge with
:func:`verdict`; a candidate that fails it never wins a winners table.

End to end, a whole model in fp32 is held to :data:`END_TO_END_ATOL` against
transformers (``bertfast check`` and the parity tests).
"""

from __future__ import annotations

import torch

__all__ = ["ATOL", "END_TO_END_ATOL", "verdict"]

#: The end-to-end tolerance of docs/design.md section 5: the max abs difference, on
#: real tokens, between a whole fp32 model's output fields (hidden states, pooler,
#: head logits, sentence vectors) and transformers' in fp32 (eager attention, TF32
#: off). Asserted by ``bertfast check`` on a real checkpoint and by the tests against
#: transformers (tests/test_parity_transformers.py for every family and head,
#: tests/test_optimize.py for ``optimize()``, ...). The same math in another order
#: (fused QKV GEMM, packed tokens, per-sequence attention, other summation orders)
#: drifts by ~1e-6 over the 2-3 layers of the test models (MLM logits, larger
#: numbers, by ~1e-5), by ~3e-6 on all-MiniLM-L6-v2 (README, "Numerics and
#: parity"); an indexing, masking or weight bug (a dropped bias, a wrong activation,
#: a mis-split QKV, a wrong position offset) shows up as 1e-2 or more.
END_TO_END_ATOL = 1e-4

# Absolute slack on top of "2x the reference's own error in that dtype".
# fp32: both sides round to ~1e-7 relative; different summation orders over rows
#   of ~1e3 elements and GEMM/attention reductions of a few hundred terms drift by
#   up to ~1e-6..1e-5 on O(1) outputs, so 1e-5 (elementwise/LN) and 5e-5 (GEMM,
#   attention) leave headroom while any real bug shows up as >1e-3.
# fp16: one rounding of an O(1..10) output is up to ~4e-3 (ulp 2^-8 at 4..8); a
#   backend that rounds once where the reference rounds twice can differ by one ulp.
# bf16: 8 bits of mantissa: an ulp at 4..8 is 3e-2.
ATOL = {
    "embed_layernorm": {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2},
    "add_layernorm": {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2},
    "bias_gelu": {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2},
    "linear": {torch.float32: 5e-5, torch.float16: 8e-3, torch.bfloat16: 6e-2},
    "linear_gelu": {torch.float32: 5e-5, torch.float16: 8e-3, torch.bfloat16: 6e-2},
    "attention": {torch.float32: 5e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2},
    "pack_tokens": {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 0.0},
}
ATOL["bias_gelu_"] = ATOL["bias_gelu"]
ATOL["attention_varlen"] = ATOL["attention"]
ATOL["unpack_tokens"] = ATOL["pack_tokens"]


def verdict(
    op: str,
    out: torch.Tensor,
    gold: torch.Tensor,
    same_dtype: torch.Tensor,
    dtype: torch.dtype,
    allow_nonfinite: bool = False,
) -> tuple[str | None, float, float]:
    """``(None, err, bound)`` when ``out`` passes the rule, else ``(why, err, bound)``
    with a one-line reason: a shape or dtype other than the gold's / ``dtype``,
    non-finite values (unless ``allow_nonfinite``), or ``err > bound`` where ``err``
    is ``out``'s max abs error against ``gold`` and ``bound`` is twice that of
    ``same_dtype`` (the reference run in ``dtype``) plus ``ATOL[op][dtype]``."""
    bound = ATOL[op][dtype]
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a tensor", float("inf"), bound
    if tuple(out.shape) != tuple(gold.shape):
        return f"shape {tuple(out.shape)} != {tuple(gold.shape)}", float("inf"), bound
    if out.dtype != dtype:
        return f"dtype {out.dtype} != {dtype}", float("inf"), bound
    if not out.numel():
        return None, 0.0, bound
    gold = gold.double()
    ref_err = (same_dtype.double() - gold).abs().max().item()
    bound += 2 * ref_err
    if not allow_nonfinite and not bool(torch.isfinite(out).all()):
        return "non-finite output", float("inf"), bound
    err = (out.double() - gold).abs().max().item()
    if not err <= bound:
        return (
            f"max abs error {err:.3g} vs the gold exceeds 2 x reference error "
            f"({ref_err:.3g}) + atol ({ATOL[op][dtype]:.1g})",
            err,
            bound,
        )
    return None, err, bound
