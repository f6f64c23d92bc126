"""The reference (torch backend) against independent, naive formulations.

The reference is the spec every other backend is tested against, so it is itself
checked here against textbook formulas written out by hand, in float64.
"""

import math

import pytest
import torch

from bertfast.ops import reference


def _naive_layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def test_add_layernorm_matches_formula():
    x, r = torch.randn(5, 33, dtype=torch.float64), torch.randn(5, 33, dtype=torch.float64)
    bias, w, b = (torch.randn(33, dtype=torch.float64) for _ in range(3))
    got = reference.add_layernorm(x, r, bias, w, b, 1e-12)
    torch.testing.assert_close(got, _naive_layernorm(x + bias + r, w, b, 1e-12))


def test_embed_layernorm_matches_formula():
    word, pos, typ = (torch.randn(n, 16, dtype=torch.float64) for n in (11, 7, 2))
    w, b = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    ids = torch.tensor([[3, 10, 0], [1, 2, 5]])
    pids = torch.tensor([[0, 1, 2], [0, 1, 6]])
    tids = torch.tensor([[0, 0, 1], [1, 1, 0]])
    got = reference.embed_layernorm(ids, pids, tids, word, pos, typ, w, b, 1e-5)
    rows = [
        [word[ids[i, j]] + pos[pids[i, j]] + typ[tids[i, j]] for j in range(3)] for i in range(2)
    ]
    expected = _naive_layernorm(torch.stack([torch.stack(r) for r in rows]), w, b, 1e-5)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
def test_activations_match_formula(act):
    x = torch.linspace(-8, 8, 101, dtype=torch.float64)
    if act == "gelu":
        expected = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    elif act == "gelu_tanh":
        expected = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    else:
        expected = x.clamp(min=0)
    torch.testing.assert_close(reference.bias_gelu(x, None, act), expected)


def _naive_attention(qkv, lengths, heads, scale):
    """Loop over sequences and heads; explicit softmax over the real keys only."""
    B, S, H3 = qkv.shape
    H = H3 // 3
    d = H // heads
    out = torch.zeros(B, S, H, dtype=qkv.dtype)
    for b, n in enumerate(lengths):
        for h in range(heads if n else 0):  # an empty sequence stays zero
            q = qkv[b, :n, h * d : (h + 1) * d]
            k = qkv[b, :n, H + h * d : H + (h + 1) * d]
            v = qkv[b, :n, 2 * H + h * d : 2 * H + (h + 1) * d]
            s = q @ k.T * scale
            p = torch.exp(s - s.max(-1, keepdim=True).values)
            p = p / p.sum(-1, keepdim=True)
            out[b, :n, h * d : (h + 1) * d] = p @ v
    return out


def test_attention_matches_naive_loops():
    lengths, heads, d = [6, 1, 0, 4], 3, 8
    qkv = torch.randn(4, 6, 3 * heads * d, dtype=torch.float64)
    mask = (torch.arange(6)[None] < torch.tensor(lengths)[:, None]).long()
    got = reference.attention(qkv, mask, heads, 0.3)
    torch.testing.assert_close(got, _naive_attention(qkv, lengths, heads, 0.3))


def test_attention_varlen_matches_naive_loops():
    lengths, heads, d = [2, 5, 3], 2, 4
    S = max(lengths)
    padded = torch.zeros(3, S, 3 * heads * d, dtype=torch.float64)
    rows = []
    for b, n in enumerate(lengths):
        seq = torch.randn(n, 3 * heads * d, dtype=torch.float64)
        padded[b, :n] = seq
        rows.append(seq)
    cu = torch.tensor([0, 2, 7, 10], dtype=torch.int32)
    got = reference.attention_varlen(torch.cat(rows), cu, S, heads, 0.5)
    expected = _naive_attention(padded, lengths, heads, 0.5)
    expected = torch.cat([expected[b, :n] for b, n in enumerate(lengths)])
    torch.testing.assert_close(got, expected)
