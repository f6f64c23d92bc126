"""embed_layernorm and add_layernorm: every backend against the reference (parity rule)."""

import pytest
import torch

from .harness import BACKENDS, DTYPES, assert_parity, device_for, run_backend

# (tokens, hidden): batch/sequence 1, odd widths that defeat vector loads, BERT widths.
ADD_LN_SHAPES = [(1, 96), (7, 1023), (33, 1500), (64, 384), (5, 1024)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", ADD_LN_SHAPES)
@pytest.mark.parametrize("has_bias", [True, False])
def test_add_layernorm(backend, dtype, tokens, hidden, has_bias):
    x = torch.randn(tokens, hidden)
    residual = torch.randn(tokens, hidden)
    bias = torch.randn(hidden) * 0.1 if has_bias else None
    weight = 1 + 0.1 * torch.randn(hidden)
    ln_bias = 0.1 * torch.randn(hidden)
    assert_parity("add_layernorm", backend, (x, residual, bias, weight, ln_bias, 1e-12), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layernorm_large_mean_offset(backend, dtype):
    # A row with mean ~300 and spread ~1: a one-pass E[x^2] - E[x]^2 variance in fp32
    # loses every digit here; the contract asks for a stable variance.
    hidden = 768
    x = 300 + torch.randn(16, hidden)
    residual = torch.randn(16, hidden)
    weight, ln_bias = torch.ones(hidden), torch.zeros(hidden)
    assert_parity("add_layernorm", backend, (x, residual, None, weight, ln_bias, 1e-12), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layernorm_batched_shape(backend, dtype):
    # [B, S, H] input: the op is token-wise over any leading shape.
    x, residual = torch.randn(2, 5, 96), torch.randn(2, 5, 96)
    weight, ln_bias = torch.rand(96) + 0.5, torch.randn(96)
    out = assert_parity(
        "add_layernorm", backend, (x, residual, torch.randn(96), weight, ln_bias, 1e-5), dtype
    )
    assert out.shape == (2, 5, 96)


def _embedding_args(ids_shape, vocab, width, *, types=True, offset=0.0):
    input_ids = torch.randint(0, vocab, ids_shape)
    position_ids = torch.randint(0, 40, ids_shape)
    word = torch.randn(vocab, width) + offset
    pos = torch.randn(40, width)
    if types:
        token_type_ids = torch.randint(0, 2, ids_shape)
        type_table = torch.randn(2, width)
    else:
        token_type_ids = type_table = None
    weight = 1 + 0.1 * torch.randn(width)
    bias = 0.1 * torch.randn(width)
    return (input_ids, position_ids, token_type_ids, word, pos, type_table, weight, bias, 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids_shape", [(2, 7), (13,), (1, 1)], ids=["padded", "packed", "one"])
@pytest.mark.parametrize("width", [96, 1023, 128])
@pytest.mark.parametrize("types", [True, False], ids=["types", "no_types"])
def test_embed_layernorm(backend, dtype, ids_shape, width, types):
    args = _embedding_args(ids_shape, 50, width, types=types)
    out = assert_parity("embed_layernorm", backend, args, dtype)
    assert out.shape == ids_shape + (width,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_embed_layernorm_large_mean_offset(backend, dtype):
    args = _embedding_args((3, 9), 30, 384, offset=200.0)
    assert_parity("embed_layernorm", backend, args, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embed_layernorm_rejects_out_of_vocab(backend):
    device = device_for(backend)
    args = list(_embedding_args((2, 4), 10, 96))
    args[0] = args[0].clone()
    args[0][1, 2] = 10  # == vocab size: one past the end
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(IndexError, match="input_ids contains 10, outside"):
        run_backend("embed_layernorm", backend, args)
    args[0][1, 2] = -1
    with pytest.raises(IndexError, match="input_ids contains -1"):
        run_backend("embed_layernorm", backend, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embed_layernorm_empty(backend):
    args = _embedding_args((0,), 10, 96)
    device = device_for(backend)
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    out = run_backend("embed_layernorm", backend, args)
    assert out.shape == (0, 96)


def test_cpu_add_layernorm_into_out():
    """The cpu kernel's ``out`` (the model's row blocks write the next hidden state in
    place): the same values as without it (torch's LayerNorm in float64 as the gold),
    written into ``out``, ``x`` or ``residual`` themselves; a tensor partly
    overlapping them or of another shape is a ValueError."""
    from bertfast.ops import cpu
    from bertfast.ops.dispatch import get_backend

    if get_backend("cpu").unavailable("cpu") is not None:
        pytest.skip("bertfast._C CPU kernels are not built")
    g = torch.Generator().manual_seed(0)
    x, residual = torch.randn(2, 6, 96, generator=g).unbind(0)
    bias, weight, ln_bias = torch.randn(3, 96, generator=g).unbind(0)
    gold = torch.nn.functional.layer_norm(
        (x.double() + bias.double()) + residual.double(), (96,), weight.double(), ln_bias.double()
    )
    plain = cpu.add_layernorm(x, residual, bias, weight, ln_bias, 1e-5)
    assert (plain.double() - gold).abs().max() < 1e-5
    big = torch.zeros(10, 96)
    got = cpu.add_layernorm(x, residual, bias, weight, ln_bias, 1e-5, out=big[2:8])
    assert got.data_ptr() == big[2:8].data_ptr() and torch.equal(big[2:8], plain)
    assert (big[:2] == 0).all() and (big[8:] == 0).all()
    for target in ("x", "residual"):
        a, r = x.clone(), residual.clone()
        out = a if target == "x" else r
        cpu.add_layernorm(a, r, bias, weight, ln_bias, 1e-5, out=out)
        assert torch.equal(out, plain), target
    both = torch.cat([x, residual])
    with pytest.raises(ValueError, match="overlaps"):
        cpu.add_layernorm(both[:6], residual, bias, weight, ln_bias, 1e-5, out=both[3:9])
    with pytest.raises(ValueError, match="shape"):
        cpu.add_layernorm(x, residual, bias, weight, ln_bias, 1e-5, out=torch.empty(5, 96))
