"""What the native build contains.

- The C++ (CPU) side of ``bertfast._C`` is always built.
- When ``nvcc`` is on PATH and ``BERTFAST_SKIP_CUDA`` is not set, the CUDA kernels
  must be in the build, for sm_80 and sm_90 (or, in a build made with
  ``BERTFAST_CUDA_ARCHS``, for exactly those): CMake compiles kernels/cuda/*.cu then,
  so a CUDA compile error fails the build and this test fails if CUDA was silently
  left out. A build made on purpose with BERTFAST_SKIP_CUDA=1 records that in
  ``build_info()["cuda_status"]`` and this check skips with that reason.
"""

import os
import re
import shutil

import pytest
import torch

import bertfast

_FALSE = ("", "0", "off", "false", "no", "n")


def _skip_cuda_requested() -> bool:
    return os.environ.get("BERTFAST_SKIP_CUDA", "").strip().lower() not in _FALSE


def test_cpp_side_always_present():
    info = bertfast.build_info()
    assert info["native"], info.get("error")
    assert info["cxx_compiler"]
    from bertfast import _C

    assert hasattr(_C, "cpu"), "bertfast._C has no CPU kernels"


def test_cuda_built_when_nvcc_present():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH: the build has no CUDA kernels by design")
    info = bertfast.build_info()
    if _skip_cuda_requested() or "BERTFAST_SKIP_CUDA" in info.get("cuda_status", ""):
        pytest.skip(f"CUDA left out on purpose: {info.get('cuda_status')}")
    assert info["cuda"] is True, (
        "nvcc is on PATH but bertfast._C was built without CUDA: rebuild, or set "
        "BERTFAST_SKIP_CUDA=1 if that was intended"
    )
    assert info["cuda_version"]
    # The build's own record (CMakeLists.txt): "built" for the default architectures,
    # "built for BERTFAST_CUDA_ARCHS 90 (default 80,90)" when BERTFAST_CUDA_ARCHS chose
    # others at build time (benchmarks/gpu_check.sh builds for the GPU it runs on); the
    # environment of the test run need not be the build's.
    status = info.get("cuda_status", "")
    requested = re.search(r"BERTFAST_CUDA_ARCHS (\S+)", status)
    if requested:
        want = [f"sm_{a}" for a in requested.group(1).split(",") if a]
        assert sorted(info["cuda_archs"]) == sorted(want), (status, info["cuda_archs"])
        if torch.cuda.is_available():
            # A narrowed build must still run on the GPU at hand: its own arch, or a lower
            # one whose PTX the driver compiles forward.
            major, minor = torch.cuda.get_device_capability()
            built = [int(a[3:]) for a in info["cuda_archs"]]
            assert min(built) <= 10 * major + minor, (status, (major, minor))
    else:
        assert status == "built", status
        assert "sm_80" in info["cuda_archs"], info["cuda_archs"]
        assert "sm_90" in info["cuda_archs"], info["cuda_archs"]
    from bertfast import _C

    for name in (
        "embed_layernorm",
        "add_layernorm",
        "bias_act",
        "attention",
        "attention_varlen",
        "pack_rows",
        "unpack_rows",
        "device_count",
    ):
        assert hasattr(_C.cuda, name), f"bertfast._C.cuda.{name} missing"
    assert isinstance(_C.cuda.device_count(), int)
