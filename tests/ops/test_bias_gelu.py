"""bias_gelu (out of place and in place), linear_gelu and linear against the reference."""

import pytest
import torch

from bertfast.ops import reference

from .harness import (
    ATOL,
    BACKENDS,
    DTYPES,
    assert_parity,
    cast,
    device_for,
    run_backend,
    skip_known_gaps,
)

ACTS = ["gelu", "gelu_tanh", "relu"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", [(5, 200), (64, 1536), (3, 1023), (1, 1)])
@pytest.mark.parametrize("has_bias", [True, False])
def test_bias_gelu(backend, dtype, act, shape, has_bias):
    # Values span the GELU's curved region and its tails (|x| up to ~12).
    x = 3 * torch.randn(shape)
    bias = torch.randn(shape[-1]) if has_bias else None
    assert_parity("bias_gelu", backend, (x, bias, act), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_bias_gelu_inplace(backend, dtype, act):
    device = device_for(backend)
    x = 3 * torch.randn(9, 200)
    bias = torch.randn(200)
    gold = reference.bias_gelu(*cast((x, bias), torch.float64, device), act)
    expected = reference.bias_gelu(*cast((x, bias), dtype, device), act)
    xd, bd = cast((x, bias), dtype, device)
    ptr = xd.data_ptr()
    out = run_backend("bias_gelu_", backend, (xd, bd, act))
    assert out.data_ptr() == ptr, "bias_gelu_ must write into its input"
    err = (xd.double() - gold).abs().max().item()
    ref_err = (expected.double() - gold).abs().max().item()
    assert err <= 2 * ref_err + ATOL["bias_gelu"][dtype]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("m,k,n", [(7, 96, 200), (64, 384, 1536), (1, 33, 17)])
def test_linear_gelu(backend, dtype, act, m, k, n):
    skip_known_gaps("linear_gelu", backend, dtype)
    x = torch.randn(m, k)
    weight = torch.randn(n, k) / k**0.5
    bias = torch.randn(n)
    assert_parity("linear_gelu", backend, (x, weight, bias, act), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_gelu_batched_no_bias(backend):
    x = torch.randn(2, 5, 96)
    weight = torch.randn(200, 96) / 10
    out = assert_parity("linear_gelu", backend, (x, weight, None, "gelu"), torch.float32)
    assert out.shape == (2, 5, 200)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(7, 96, 288), (64, 384, 384), (1, 33, 17), (5, 1536, 384)])
@pytest.mark.parametrize("has_bias", [True, False])
def test_linear(backend, dtype, m, k, n, has_bias):
    x = torch.randn(m, k)
    weight = torch.randn(n, k) / k**0.5
    bias = torch.randn(n) if has_bias else None
    assert_parity("linear", backend, (x, weight, bias), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_follows_inplace_weight_updates(backend):
    """A backend that caches a packed copy of the weight must notice in-place edits."""
    device = device_for(backend)
    x = torch.randn(4, 64, device=device)
    weight = torch.randn(32, 64, device=device)
    first = run_backend("linear", backend, (x, weight, None))
    with torch.no_grad():
        weight.mul_(2)
    second = run_backend("linear", backend, (x, weight, None))
    torch.testing.assert_close(second, 2 * first, atol=1e-4, rtol=1e-5)
