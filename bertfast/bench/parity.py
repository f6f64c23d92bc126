"""Whether a provider's output is right: the per-dtype tolerance and the error measure."""

from __future__ import annotations

import torch

__all__ = ["PARITY_TOL", "INT8_PARITY_TOL", "parity_error"]

#: Largest absolute difference on real tokens between a provider's last hidden state
#: and the transformers-eager fp32 reference that still counts as correct. fp32: the
#: encoder output is LayerNorm'd (values ~1), fp32 reorderings over 12-24 layers give
#: ~1e-5..1e-4, so 2e-3 only catches real bugs. fp16/bf16: storage rounding (2^-11,
#: 2^-8 relative) compounded over the layers.
PARITY_TOL = {torch.float32: 2e-3, torch.float16: 5e-2, torch.bfloat16: 2.5e-1}

#: The same measure for the int8 peers (int8 weights, activations quantized per call,
#: against the fp32 reference). Measured on all-MiniLM-L6-v2 (ragged 6-row batch): ORT
#: dynamic quantization with per-channel weights 0.53..0.62, CTranslate2 int8 0.43 (per-
#: tensor ORT weights: 1.2, so the peer uses per-channel); a broken graph is further
#: off: the padding mask ignored 1.93, wrong token types 1.42. So 1.0 flags a broken
#: int8 graph, not quantization loss (the max error is reported with every row).
INT8_PARITY_TOL = 1.0


def parity_error(out, ref: torch.Tensor, mask: torch.Tensor) -> float:
    """Max |out - ref| over real tokens (``mask`` [B, S]), both compared in fp32."""
    if not isinstance(out, torch.Tensor):
        out = torch.as_tensor(out)
    out = out.to(device=ref.device, dtype=torch.float32)
    diff = (out - ref.float()).abs().amax(-1)
    keep = mask.to(ref.device).bool()
    return float(diff[keep].max()) if keep.any() else 0.0
