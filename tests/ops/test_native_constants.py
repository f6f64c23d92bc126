"""Each fact once: the constants of csrc/constants.h (exported as
``bertfast._C.constants()``) are what the Python backends use, what the C++ and
CUDA kernels accept, and what the Triton kernels assume where they restate them.

A test here fails when two languages disagree about a dtype, an activation code,
a head-dim or size limit.
"""

import pytest
import torch

from bertfast.ops import native, reference

_C = pytest.importorskip("bertfast._C", reason="bertfast._C is not built")
K = _C.constants()


def test_python_reads_the_native_constants():
    from bertfast.ops import cpu, cuda

    assert native.DTYPES == tuple(getattr(torch, n) for n in K["dtypes"])
    assert native.ACTIVATIONS == tuple(K["activations"])
    assert cpu.BACKEND.dtypes == native.DTYPES
    assert cuda.BACKEND.dtypes == native.DTYPES
    assert cuda.ATTENTION_HEAD_DIMS == tuple(K["cuda_attention_head_dims"])
    assert cuda.MAX_LAYERNORM_WIDTH == K["max_layernorm_width"]


def test_activation_names_are_the_references():
    # The kernels' activations, by code, are the reference's (the spec's) names.
    assert tuple(K["activations"]) == tuple(reference.ACTIVATIONS)
    assert K["no_activation"] == -1 and K["no_activation"] not in range(len(K["activations"]))


def test_triton_restates_the_same_constants():
    pytest.importorskip("triton")
    from bertfast.ops import triton as triton_backend
    from bertfast.ops.triton import _common

    codes = {name: code for code, name in enumerate(K["activations"])}
    assert _common.ACTIVATION_CODES == codes, "Triton activation codes differ from C++/CUDA"
    assert triton_backend.MAX_HIDDEN == K["max_layernorm_width"]
    assert triton_backend.MAX_GRID_Z == K["max_grid_yz"]
    assert triton_backend.MAX_HEAD_DIM == max(K["cuda_attention_head_dims"])
    assert set(triton_backend.FLOAT_DTYPES) == set(native.DTYPES)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32]
)
def test_cpu_kernels_take_exactly_the_listed_dtypes(dtype):
    x = torch.ones(2, 4, dtype=dtype)
    if dtype in native.DTYPES:
        assert _C.cpu.bias_act(x, None, "relu", False).dtype == dtype
    else:
        with pytest.raises(TypeError, match="expected float32, float16 or bfloat16"):
            _C.cpu.bias_act(x, None, "relu", False)


@pytest.mark.parametrize("name", list(K["activations"]))
def test_cpu_activation_codes_mean_the_named_function(name):
    # A code mix-up between Python and C++ would apply another activation.
    x = torch.linspace(-4, 4, 64).view(4, 16)
    ours = _C.cpu.bias_act(x, None, name, False)
    torch.testing.assert_close(ours, reference.activation(x, name), atol=1e-5, rtol=1e-5)
    w = torch.eye(16)
    lin = _C.cpu.linear_act(x, w, None, name, True)
    torch.testing.assert_close(lin, reference.activation(x, name), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_attention_takes_exactly_the_listed_head_dims():
    if not hasattr(_C, "cuda"):
        pytest.skip("this build has no CUDA kernels")
    stream = torch.cuda.current_stream().cuda_stream
    for d in sorted(set(K["cuda_attention_head_dims"]) | {16, 48, 256}):
        qkv = torch.randn(1, 8, 3 * d, device="cuda", dtype=torch.float16)
        if d in K["cuda_attention_head_dims"]:
            out = _C.cuda.attention(qkv, None, 1, d**-0.5, stream)
            gold = reference.attention(qkv.double(), None, 1, d**-0.5)
            assert (out.double() - gold).abs().max().item() < 1e-2, d
        else:
            with pytest.raises(ValueError, match=f"head_dim {d} is not one of"):
                _C.cuda.attention(qkv, None, 1, d**-0.5, stream)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_layernorm_width_limit():
    if not hasattr(_C, "cuda"):
        pytest.skip("this build has no CUDA kernels")
    stream = torch.cuda.current_stream().cuda_stream
    width = K["max_layernorm_width"]
    for w in (width, width + 1):
        x = torch.randn(2, w, device="cuda")
        ones, zeros = torch.ones(w, device="cuda"), torch.zeros(w, device="cuda")
        if w <= width:
            out = _C.cuda.add_layernorm(
                x, zeros.expand(2, w).contiguous(), None, ones, zeros, 1e-5, stream
            )
            torch.testing.assert_close(
                out, torch.nn.functional.layer_norm(x, (w,)), atol=1e-4, rtol=1e-4
            )
        else:
            with pytest.raises(ValueError, match="row width"):
                _C.cuda.add_layernorm(x, x, None, ones, zeros, 1e-5, stream)
