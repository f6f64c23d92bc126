"""The ``torch`` backend: every op in plain PyTorch. This file is the specification.

The other backends (``cpu``, ``cuda``, ``triton``) are tested against these
functions. Each function takes exactly the arguments of the op contract in
``bertfast/ops/__init__.py`` (arguments are already validated there).

Numerics (docs/design.md): statistics and accumulators in fp32 whatever the storage
dtype; outputs in the storage dtype of the activations; padded positions are zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import sdpa as _sdpa
from .dispatch import Backend

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """GELU (exact, erf), GELU (tanh approximation) or ReLU."""
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    raise ValueError(f"unknown activation {kind!r}; expected one of {ACTIVATIONS}")


def embed_layernorm(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    word_embeddings: torch.Tensor,
    position_embeddings: torch.Tensor,
    token_type_embeddings: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """LayerNorm(word[ids] + type[token_type_ids] + pos[position_ids]).

    ``input_ids``, ``position_ids`` and ``token_type_ids`` share one shape (any
    rank: ``[B, S]`` padded or ``[T]`` packed); the output is that shape plus
    ``[E]``. The sum is taken in the storage dtype in transformers' order (word,
    then token type, then position); LayerNorm statistics are fp32.
    """
    x = F.embedding(input_ids, word_embeddings)
    if token_type_embeddings is not None:
        x = x + F.embedding(token_type_ids, token_type_embeddings)
    x = x + F.embedding(position_ids, position_embeddings)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def add_layernorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    bias: torch.Tensor | None,
    weight: torch.Tensor,
    ln_bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """LayerNorm((x + bias) + residual) over the last dimension ("SkipLayerNorm")."""
    h = x + bias if bias is not None else x
    h = h + residual
    return F.layer_norm(h, (h.shape[-1],), weight, ln_bias, eps)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
    """act(x + bias), act in ``gelu`` (erf), ``gelu_tanh``, ``relu``."""
    return activation(x + bias if bias is not None else x, act)


def bias_gelu_(x: torch.Tensor, bias: torch.Tensor | None, act: str) -> None:
    """In-place ``bias_gelu``: writes act(x + bias) into ``x``."""
    x.copy_(bias_gelu(x, bias, act))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias: a projection with nothing to fuse (QKV, attention output,
    FFN down-projection). Backends whose own GEMM beats the framework's register it."""
    return F.linear(x, weight, bias)


def linear_gelu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    """act(x @ weight.T + bias): the FFN up-projection with its activation."""
    return activation(F.linear(x, weight, bias), act)


def _split_heads(qkv: torch.Tensor, num_heads: int):
    # qkv [..., S, 3H] laid out as [Q | K | V], each head-major ([heads, head_dim]).
    *lead, S, H3 = qkv.shape
    d = H3 // 3 // num_heads
    q, k, v = qkv.view(*lead, S, 3, num_heads, d).movedim(-3, 0).unbind(0)
    # -> [..., heads, S, d]
    return q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2)


def attention(
    qkv: torch.Tensor,
    attention_mask: torch.Tensor | None,
    num_heads: int,
    scale: float,
) -> torch.Tensor:
    """Multi-head self-attention over a padded batch, reading the fused QKV tensor.

    ``qkv`` is ``[B, S, 3H]`` (``[Q | K | V]``, heads contiguous inside each);
    ``attention_mask`` is ``[B, S]`` (nonzero = real token) or None. Computes
    ``softmax(scale * Q K^T + mask) V`` per head in fp32 (fp64 for the float64 gold)
    and returns ``[B, S, H]`` with heads merged; rows at padded query positions are
    zero (so a sequence whose mask is all zero gives zeros).
    """
    B, S, H3 = qkv.shape
    H = H3 // 3
    q, k, v = _split_heads(qkv.to(torch.promote_types(qkv.dtype, torch.float32)), num_heads)
    key_mask = None
    if attention_mask is not None:
        keep = attention_mask.bool()
        key_mask = keep[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, scale=scale)
    out = out.transpose(1, 2).reshape(B, S, H)
    if attention_mask is not None:
        out = out.masked_fill(~keep[:, :, None], 0.0)
    return out.to(qkv.dtype)


def attention_varlen(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    num_heads: int,
    scale: float,
) -> torch.Tensor:
    """Attention over a packed (padding-free) batch.

    ``qkv`` is ``[T, 3H]`` holding the tokens of all sequences back to back;
    ``cu_seqlens`` (int32, ``[B + 1]``) are the prefix sums of their lengths. Each
    token attends to the tokens of its own sequence. Returns ``[T, H]``.
    """
    T, H3 = qkv.shape
    cu = cu_seqlens.long()
    lengths = cu.diff()
    B = lengths.numel()
    S = max(int(max_seqlen), 1)
    mask = torch.arange(S, device=qkv.device)[None, :] < lengths[:, None]  # [B, S]
    # Padded position of each packed token, without nonzero() (a host sync on GPUs):
    # token t belongs to row b = #{rows ending at or before t}, at offset t - cu[b].
    token = torch.arange(T, device=qkv.device)
    row = torch.searchsorted(cu[1:], token, right=True)
    index = row * S + (token - cu[row])
    padded = unpack_tokens(qkv, index, B * S).view(B, S, H3)
    out = attention(padded, mask, num_heads, scale)
    return pack_tokens(out.view(B * S, H3 // 3), index)


def pack_tokens(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Gather rows: ``x[indices]`` for ``x`` of shape ``[N, ...]`` -> ``[T, ...]``."""
    return x.index_select(0, indices)


def unpack_tokens(x: torch.Tensor, indices: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Scatter rows back: ``out[indices] = x``, zeros elsewhere; ``[num_rows, ...]``."""
    out = x.new_zeros((num_rows,) + tuple(x.shape[1:]))
    return out.index_copy_(0, indices, x)


BACKEND = Backend(
    name="torch",
    device_types=("cpu", "cuda"),
    ops={
        "embed_layernorm": embed_layernorm,
        "add_layernorm": add_layernorm,
        "bias_gelu": bias_gelu,
        "bias_gelu_": bias_gelu_,
        "linear": linear,
        "linear_gelu": linear_gelu,
        "attention": attention,
        "attention_varlen": attention_varlen,
        "pack_tokens": pack_tokens,
        "unpack_tokens": unpack_tokens,
    },
    dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64),
    # torch's own kernels in the storage dtype (bertfast/ops/sdpa.py): SDPA (flash /
    # memory-efficient / cuDNN / math, torch's pick) and torch's varlen kernel
    variants={
        "attention": {"sdpa": _sdpa.attention},
        "attention_varlen": {"sdpa": _sdpa.attention_varlen},
    },
    variant_supports={
        ("attention", "sdpa"): _sdpa.supports_attention,
        ("attention_varlen", "sdpa"): _sdpa.supports_attention_varlen,
    },
    # The SDPA kernels the sdpa variants may be forced to ({"sdpa_backend": name}),
    # listed on CUDA tensors only. Keyed by (op, variant): they belong to the sdpa
    # variant alone (the spec computes in fp32, which flash and cuDNN refuse), while
    # dispatch reads op-name keys, for every variant of the op; these become
    # candidates once dispatch also reads (op, variant) keys.
    configs={
        ("attention", "sdpa"): _sdpa.attention_configs,
        ("attention_varlen", "sdpa"): _sdpa.attention_varlen_configs,
    },
)
