"""Padding-free execution: where the real tokens of a padded batch are.

``pack_info(attention_mask)`` is computed once per forward; the model gathers the
real tokens with ``pack_tokens`` into ``[T, ...]``, runs every token-wise op and
``attention_varlen`` on the packed tensor, and scatters back with
``unpack_tokens`` at the end, so cost follows real tokens, not the longest row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checks


@dataclass(frozen=True)
class PackInfo:
    indices: torch.Tensor     # [T] int64: flat positions (b * S + s) of real tokens
    cu_seqlens: torch.Tensor  # [B + 1] int32: prefix sums of real-token counts
    max_seqlen: int           # longest row, in real tokens
    batch: int
    seqlen: int

    @property
    def total_tokens(self) -> int:
        return int(self.indices.shape[0])

    @property
    def first_token(self) -> torch.Tensor:
        """Packed index of each row's first real token (for CLS poolers); rows with
        no tokens point at 0 and must be masked by the caller (see ``lengths``)."""
        starts = self.cu_seqlens[:-1].long()
        return starts.clamp(max=max(self.total_tokens - 1, 0))

    @property
    def lengths(self) -> torch.Tensor:
        return self.cu_seqlens.diff()


def pack_info(attention_mask: torch.Tensor) -> PackInfo:
    """Locate the real tokens of a ``[B, S]`` mask (nonzero = real token).

    Any mask pattern is allowed (right or left padding, holes); tokens keep their
    order inside a row. Costs one device-to-host sync (for ``max_seqlen``). A mask
    that is not a 2-D real-valued tensor is a TypeError / ValueError.
    """
    checks.attention_mask_2d("pack_info", attention_mask)
    B, S = attention_mask.shape
    keep = attention_mask.reshape(-1) != 0
    indices = keep.nonzero().squeeze(1)
    lengths = keep.view(B, S).sum(1, dtype=torch.int32)
    cu = torch.zeros(B + 1, dtype=torch.int32, device=attention_mask.device)
    torch.cumsum(lengths, 0, out=cu[1:])
    max_seqlen = int(lengths.max()) if B else 0
    return PackInfo(indices, cu, max_seqlen, B, S)
