"""Each fact once: the constants of kernels/constants.h (exported as
``bertfast._C.constants()``, restated without a build as
``bertfast.ops.native.HEADER_CONSTANTS``) are what the Python backends use, what the
C++ and CUDA kernels accept, and what the Triton kernels read.

The header is parsed here (no build needed), so the Python restatement cannot drift
from it; a build that exports other values (stale, or a binding that forgot one)
fails too. A test here fails when two languages disagree about a dtype, an activation
code, a head-dim or size limit.
"""

import ast
import operator
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertfast.ops import native, reference

HEADER = Path(__file__).resolve().parents[2] / "kernels" / "constants.h"
K = native.HEADER_CONSTANTS  # = the parsed header (test_the_python_mirror_is_the_header)

try:
    from bertfast import _C
except ImportError:
    _C = None
needs_build = pytest.mark.skipif(_C is None, reason="bertfast._C is not built")

#: The header's names of the constants exported to Python, by their key there.
HEADER_NAMES = {
    "CudaAttentionHeadDims": "cuda_attention_head_dims",
    "CudaFlashAttentionHeadDims": "cuda_flash_attention_head_dims",
    "kMaxLayerNormWidth": "max_layernorm_width",
    "kMaxGridYZ": "max_grid_yz",
    "kMaxCudaSeqLen": "max_cuda_seqlen",
    "kMaxCudaRows": "max_cuda_rows",
}

_OPS = {
    ast.LShift: operator.lshift,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.BitOr: operator.or_,
}


def _cxx_int(expr: str) -> int:
    """An integer constant expression of the header (``int64_t(1) << 30``,
    ``0x7fffffffLL``, ``-1``): casts and suffixes dropped, then evaluated with
    integer operators only."""
    text = re.sub(r"\b(?:int64_t|int32_t|int)\(", "(", expr)
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU])\b", r"\1", text)

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"kernels/constants.h: cannot read {expr!r}")

    return ev(ast.parse(text.strip(), mode="eval").body)


def _enum(text: str, name: str) -> dict[str, int]:
    body = re.search(rf"enum\s+{name}\s*:\s*int\s*{{([^}}]*)}}", text).group(1)
    return {k: _cxx_int(v) for k, v in re.findall(r"(\w+)\s*=\s*([^,]+)", body)}


def _names(text: str, name: str) -> tuple:
    body = re.search(rf"{name}\[\]\s*=\s*{{([^}}]*)}}", text).group(1)
    return tuple(re.findall(r'"([^"]*)"', body))


def parse_header(text: str) -> dict:
    """kernels/constants.h as ``bertfast._C.constants()`` exports it (csrc/module.cpp)."""
    text = re.sub(r"//[^\n]*", "", text)
    dtypes, activations = _enum(text, "DType"), _enum(text, "Activation")
    out = {
        "dtypes": _names(text, "kDTypeNames"),
        "activations": _names(text, "kActivationNames"),
        "no_activation": activations.pop("kNoActivation"),
    }
    # codes are indices into the name lists (the bindings and the Triton kernels rely on it)
    assert list(dtypes.values()) == list(range(len(out["dtypes"]))), dtypes
    assert list(activations.values()) == list(range(len(out["activations"]))), activations
    found = {}
    for name, values in re.findall(r"using\s+(\w+)\s*=\s*IntList<([^>]*)>", text):
        found[name] = tuple(_cxx_int(v) for v in values.split(","))
    scalar = r"^\s*(?:inline\s+)?constexpr\s+(?:u?int(?:64|32)_t|int|long)\s+(\w+)\s*=\s*([^;]+);"
    for name, expr in re.findall(scalar, text, re.M):
        found[name] = _cxx_int(expr)
    unmapped = sorted(set(found) - set(HEADER_NAMES))
    assert not unmapped, (
        f"{unmapped} in kernels/constants.h but not restated for Python: export it in "
        "csrc/module.cpp (constants()), add it to bertfast.ops.native.HEADER_CONSTANTS and "
        "to HEADER_NAMES here"
    )
    out.update({HEADER_NAMES[name]: value for name, value in found.items()})
    return out


def test_the_python_mirror_is_the_header():
    parsed = parse_header(HEADER.read_text())
    assert parsed == native.HEADER_CONSTANTS, (
        "bertfast.ops.native.HEADER_CONSTANTS differs from kernels/constants.h: "
        f"header {parsed}, Python {native.HEADER_CONSTANTS}"
    )


def test_the_header_reader_reads_cxx_constants():
    assert _cxx_int("int64_t(1) << 30") == 1 << 30
    assert _cxx_int("0x7fffffffLL") == 2**31 - 1
    assert _cxx_int("65535") == 65535 and _cxx_int("-1") == -1
    with pytest.raises(ValueError):
        _cxx_int("sizeof(float) * 4")


@needs_build
def test_the_build_exports_the_header():
    # A stale build (compiled from another header) fails here: rebuild.
    assert dict(_C.constants()) == native.HEADER_CONSTANTS
    assert native.CONSTANTS == native.HEADER_CONSTANTS


@needs_build
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


def test_triton_reads_the_same_constants():
    pytest.importorskip("triton")
    from bertfast.ops import triton as triton_backend
    from bertfast.ops.triton import _common

    codes = {name: code for code, name in enumerate(K["activations"])}
    assert _common.ACTIVATION_CODES == codes, "Triton activation codes differ from C++/CUDA"
    assert triton_backend.MAX_HIDDEN == K["max_layernorm_width"]
    assert triton_backend.MAX_GRID_Z == K["max_grid_yz"]
    assert triton_backend.FLOAT_DTYPES == tuple(getattr(torch, n) for n in K["dtypes"])
    # Triton's own tile limit (any head_dim up to it) covers every CUDA head dim.
    assert max(K["cuda_attention_head_dims"]) <= triton_backend.MAX_HEAD_DIM


def test_triton_backend_needs_no_build():
    # The Triton backend imports, with the header's limits, where bertfast._C is absent.
    code = (
        "import sys\n"
        "sys.modules['bertfast._C'] = None  # as if not built\n"
        "from bertfast.ops import native, triton as t\n"
        "assert native._C is None and native.CONSTANTS == {}\n"
        "assert t.MAX_HIDDEN == native.HEADER_CONSTANTS['max_layernorm_width'] > 0\n"
        "assert t.BACKEND.name == 'triton'\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


@needs_build
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


@needs_build
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
@needs_build
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
@needs_build
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
