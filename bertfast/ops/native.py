"""Host-side helpers shared by the pybind11 backends (``cpu.py``, ``cuda.py``).

``bertfast._C`` takes raw addresses, so each launcher makes its operands
contiguous, allocates the output with torch and passes ``data_ptr()`` integers.
The operand preparation that both backends do identically lives here once.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

#: Storage dtype codes understood by the C++/CUDA kernels.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: Activation codes understood by the C++/CUDA kernels.
ACT_CODES = {"gelu": 0, "gelu_tanh": 1, "relu": 2}


def ptr(t: Optional[Tensor]) -> int:
    """The address of ``t``, or 0 (nullptr) for an absent optional operand."""
    return 0 if t is None else t.data_ptr()


def contig(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def ids64(t: Optional[Tensor]) -> Optional[Tensor]:
    """Integer ids as contiguous int64 (what the kernels index with)."""
    return None if t is None else t.to(torch.int64).contiguous()


def embed_operands(input_ids, position_ids, token_type_ids, word_embeddings,
                   position_embeddings, token_type_embeddings, weight, bias):
    """``(out, ids, pids, tids, word, pos, types, weight, bias)`` for embed_layernorm:
    contiguous operands (int64 ids; ``tids``/``types`` None for families without
    token types) and the uninitialised output ``[*ids.shape, E]``."""
    E = word_embeddings.shape[1]
    out = word_embeddings.new_empty(tuple(input_ids.shape) + (E,))
    types = contig(token_type_embeddings)
    return (out, ids64(input_ids), ids64(position_ids),
            ids64(token_type_ids) if types is not None else None,
            word_embeddings.contiguous(), position_embeddings.contiguous(), types,
            weight.contiguous(), bias.contiguous())


def add_layernorm_operands(x, residual, bias, weight, ln_bias):
    """``(out, x, residual, bias, weight, ln_bias)`` contiguous, with the output."""
    x = x.contiguous()
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x,
            residual.contiguous(), contig(bias), weight.contiguous(), ln_bias.contiguous())
