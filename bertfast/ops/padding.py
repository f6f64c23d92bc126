"""Padding-free execution: where the real tokens of a padded batch are.

``pack_info(attention_mask)`` is computed once per forward; the model gathers the
real tokens with ``pack_tokens`` into ``[T, ...]``, runs every token-wise op and
``attention_varlen`` on the packed tensor, and scatters back with
``unpack_tokens`` at the end, so cost follows real tokens, not the longest row.

Host syncs: the token count ``T`` sizes the packed tensors and ``max_seqlen`` sizes
the attention launch, so eager ``pack_info`` reads both back in one device-to-host
transfer (and nothing else: the indices come from ``nonzero_static`` with the known
count). A caller that already holds them (the model reads them together with its
input checks) passes them to :func:`pack_info_from_counts` and costs no sync at all.

Under ``torch.compile`` the indices come from the custom op ``bertfast::pack_indices``
whose fake implementation has a data-dependent size, and ``max_seqlen`` is the padded
length ``S`` (an upper bound of every row's length, known from the shape), so the
whole padding-free encoder traces as one graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checks

__all__ = ["PackInfo", "pack_info", "pack_info_from_counts", "mask_lengths"]


@dataclass(frozen=True)
class PackInfo:
    indices: torch.Tensor  # [T] int64: flat positions (b * S + s) of real tokens
    cu_seqlens: torch.Tensor  # [B + 1] int32: prefix sums of real-token counts
    max_seqlen: int  # longest row in real tokens (eager); S while compiling
    batch: int
    seqlen: int
    #: every position is a real token (no padding): ``indices`` is ``arange(B * S)``
    #: and packing / unpacking are plain reshapes (eager only; False while compiling)
    dense: bool = False

    @property
    def total_tokens(self) -> int:
        return int(self.indices.shape[0])

    @property
    def first_token(self) -> torch.Tensor:
        """Packed index of each row's first real token (for CLS poolers); rows with
        no tokens point at 0 and must be masked by the caller (see ``lengths``)."""
        starts = self.cu_seqlens[:-1].long()
        last = (self.cu_seqlens[-1:].long() - 1).clamp(min=0)  # a tensor: no host read
        return torch.minimum(starts, last)

    @property
    def lengths(self) -> torch.Tensor:
        return self.cu_seqlens.diff()


def mask_lengths(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep [B*S] bool, lengths [B] int32)`` of a ``[B, S]`` mask; no host sync."""
    B, S = attention_mask.shape
    keep = attention_mask.reshape(-1) != 0
    return keep, keep.view(B, S).sum(1, dtype=torch.int32)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    cu = lengths.new_zeros(lengths.shape[0] + 1)
    torch.cumsum(lengths, 0, out=cu[1:])
    return cu


def pack_info_from_counts(
    attention_mask: torch.Tensor,
    keep: torch.Tensor | None,
    lengths: torch.Tensor,
    total: int,
    max_seqlen: int,
) -> PackInfo:
    """``PackInfo`` of a mask whose real-token count ``total`` and longest row
    ``max_seqlen`` the caller has already read back (``keep``/``lengths`` from
    :func:`mask_lengths`): no host sync. The counts must be the mask's; ``keep`` may
    be None when every position is real (``total == B * S``)."""
    B, S = attention_mask.shape
    total = int(total)
    if total == B * S and total > 0:  # nothing padded: no gather needed
        indices = torch.arange(total, device=lengths.device)
        return PackInfo(indices, _cu_seqlens(lengths), int(max_seqlen), B, S, dense=True)
    indices = torch.nonzero_static(keep, size=total).squeeze(1)
    return PackInfo(indices, _cu_seqlens(lengths), int(max_seqlen), B, S)


def pack_info(attention_mask: torch.Tensor) -> PackInfo:
    """Locate the real tokens of a ``[B, S]`` mask (nonzero = real token).

    Any mask pattern is allowed (right or left padding, holes); tokens keep their
    order inside a row. Costs one device-to-host read (the token count and the
    longest row, together); none while compiling (see the module notes). A mask
    that is not a 2-D real-valued tensor is a TypeError / ValueError.
    """
    checks.attention_mask_2d("pack_info", attention_mask)
    B, S = attention_mask.shape
    if torch.compiler.is_compiling():
        indices, cu = torch.ops.bertfast.pack_indices(attention_mask)
        return PackInfo(indices, cu, S, B, S)
    keep, lengths = mask_lengths(attention_mask)
    if B == 0:
        return pack_info_from_counts(attention_mask, keep, lengths, 0, 0)
    total, longest = torch.stack([lengths.sum(), lengths.max()]).tolist()  # the one sync
    return pack_info_from_counts(attention_mask, keep, lengths, total, longest)


# --------------------------------------------------- the op torch.compile traces
@torch.library.custom_op("bertfast::pack_indices", mutates_args=())
def _pack_indices(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices [T] int64, cu_seqlens [B + 1] int32)`` of a ``[B, S]`` mask: the
    data-dependent part of ``pack_info``, opaque to the compiler."""
    keep, lengths = mask_lengths(attention_mask)
    return keep.nonzero().squeeze(1), _cu_seqlens(lengths)


@_pack_indices.register_fake
def _(attention_mask):
    B, S = attention_mask.shape
    n = B * S
    bound = {"max": n} if isinstance(n, int) else {}  # a bound must be a plain int
    total = torch.library.get_ctx().new_dynamic_size(**bound)
    return (
        attention_mask.new_empty((total,), dtype=torch.int64),
        attention_mask.new_empty((B + 1,), dtype=torch.int32),
    )
