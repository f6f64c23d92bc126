"""What the native build contains.

- The C++ (CPU) side of ``bertfast._C`` is always built.
- When ``nvcc`` is on PATH, ``BERTFAST_SKIP_CUDA`` is not set and the torch is a CUDA
  build (or ``BERTFAST_BUILD_CUDA=1`` asks for the kernels with a CPU-only torch, as
  .ci/run does), the CUDA kernels must be in the build, for sm_80 and sm_90 (or, in a
  build made with ``BERTFAST_CUDA_ARCHS``, for exactly those): CMake compiles
  kernels/cuda/*.cu then, so a CUDA compile error fails the build and this test fails
  if CUDA was silently left out. A build without them records why in
  ``build_info()["cuda_status"]`` (nvcc not found, BERTFAST_SKIP_CUDA, a CPU-only
  torch) and this check skips with that reason.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import bertfast

ROOT = Path(__file__).resolve().parents[1]
_FALSE = ("", "0", "off", "false", "no", "n")


def _env_set(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in _FALSE


def _skip_cuda_requested() -> bool:
    return _env_set("BERTFAST_SKIP_CUDA")


#: build_info()["cuda_status"] of a build without the CUDA kernels, one per reason
#: (CMakeLists.txt's CUDA block).
_NOT_BUILT = {
    "skip": re.compile(r"not built: BERTFAST_SKIP_CUDA was set"),
    "cpu torch": re.compile(
        r"not built: skipped for the CPU-only torch \S+, BERTFAST_BUILD_CUDA=1 builds them"
    ),
    "no nvcc": re.compile(r"not built: nvcc not found"),
}


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
    status = info.get("cuda_status", "")
    if _skip_cuda_requested() or "BERTFAST_SKIP_CUDA was set" in status:
        pytest.skip(f"CUDA left out on purpose: {status}")
    if _NOT_BUILT["cpu torch"].fullmatch(status) and not _env_set("BERTFAST_BUILD_CUDA"):
        # what a CPU-only torch builds by default; .ci/run sets BERTFAST_BUILD_CUDA=1, so
        # there a build like this one fails below
        pytest.skip(f"CUDA left out for a torch that cannot run it: {status}")
    assert info["cuda"] is True, (
        f"nvcc is on PATH but bertfast._C was built without CUDA ({status}): rebuild, or "
        "set BERTFAST_SKIP_CUDA=1 if that was intended (BERTFAST_BUILD_CUDA=1 builds the "
        "kernels with a CPU-only torch)"
    )
    assert info["cuda_version"]
    # The build's own record (CMakeLists.txt): "built" for the default architectures,
    # "built for BERTFAST_CUDA_ARCHS 90 (default 80,90)" when BERTFAST_CUDA_ARCHS chose
    # others at build time (benchmarks/gpu_check.sh builds for the GPU it runs on); the
    # environment of the test run need not be the build's.
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


def test_cuda_status_says_why_cuda_is_absent():
    """A build without the CUDA kernels names one of the three reasons; a CPU-only
    torch is the reason only when the torch is CPU-only (the torch _C links)."""
    info = bertfast.build_info()
    status = info["cuda_status"]
    if info["cuda"]:
        assert status.startswith("built"), status
        return
    assert info["cuda_version"] is None and info["cuda_archs"] == []
    reasons = [name for name, pattern in _NOT_BUILT.items() if pattern.fullmatch(status)]
    assert len(reasons) == 1, status
    if reasons == ["cpu torch"]:
        assert torch.version.cuda is None, (status, torch.version.cuda)
        assert torch.__version__ in status, (status, torch.__version__)


def test_info_prints_why_cuda_is_absent(monkeypatch, capsys):
    """`bertfast info` prints the build's cuda_status when the kernels are absent."""
    import bertfast.info
    from bertfast import cli

    status = f"not built: skipped for the CPU-only torch {torch.__version__}, " + (
        "BERTFAST_BUILD_CUDA=1 builds them"
    )
    assert _NOT_BUILT["cpu torch"].fullmatch(status)
    fake = {"native": True, "cxx_compiler": "GNU", "openmp": True, "cuda": False}
    fake |= {"cuda_status": status, "cuda_version": None, "cuda_archs": []}
    monkeypatch.setattr(bertfast.info, "build_info", lambda: fake)
    assert cli.main(["info"]) == 0
    assert f"CUDA         : none ({status})" in capsys.readouterr().out


def test_ci_compiles_the_cuda_kernels():
    """.ci/run's README test command runs with BERTFAST_BUILD_CUDA=1 (CI's torch is
    CPU-only, which would skip them), and pyproject.toml passes it on to CMake."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    lines = (root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    start = lines.index("(")  # the subshell of README's test command
    block = lines[start : lines.index(")", start)]
    assert "export BERTFAST_BUILD_CUDA=1" in block, block
    assert any("pip install --no-build-isolation -e" in line for line in block), block
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert 'BERTFAST_BUILD_CUDA = { env = "BERTFAST_BUILD_CUDA"' in pyproject
    cmake = (root / "CMakeLists.txt").read_text(encoding="utf-8")
    assert "NOT BERTFAST_BUILD_CUDA" in cmake and "CPU-only torch" in cmake


def test_build_targets_the_stable_abi_of_the_oldest_supported_torch():
    # the entry points are torch operators of the stable ABI, compiled for
    # TORCH_TARGET_VERSION = the oldest supported torch: one build loads with that torch
    # and every later one. CMakeLists.txt, native.TORCH_MIN, build_info and
    # pyproject's torch requirement state the same version.
    from bertfast.ops import native

    info = bertfast.build_info()
    assert info["native"]
    need = ".".join(map(str, native.TORCH_MIN))
    assert info["torch_min"] == need
    # built with these headers or a later torch's; any torch from the target on runs it
    assert native._release(info["torch_built"]) >= native.TORCH_MIN
    assert native._release(torch.__version__) >= native.TORCH_MIN
    cmake = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    major = re.search(r"set\(BERTFAST_TORCH_MIN_MAJOR (\d+)\)", cmake).group(1)
    minor = re.search(r"set\(BERTFAST_TORCH_MIN_MINOR (\d+)\)", cmake).group(1)
    assert (int(major), int(minor)) == native.TORCH_MIN
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"torch>={need}"' in pyproject


def test_the_extension_links_only_the_stable_c_shim_of_torch():
    # a C++ symbol of torch (c10::, at::, torch:: mangled names) would tie the build to
    # one torch release: every torch symbol _C needs must be a C function of the shim
    import bertfast._C as ext

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run(
        [nm, "-D", "--undefined-only", ext.__file__], capture_output=True, text=True, check=True
    ).stdout
    undefined = [line.split()[-1] for line in out.splitlines() if line.strip()]
    torch_cxx = [s for s in undefined if re.match(r"_ZN?K?(3c10|2at|5torch|6caffe2)", s)]
    assert torch_cxx == [], torch_cxx[:5]
    shim = [s for s in undefined if s.startswith(("aoti_torch_", "torch_"))]
    assert shim, "no stable-shim symbol: is _C registering its operators?"


def test_a_torch_older_than_the_target_is_named_not_traced():
    from bertfast.ops import native

    so = "/x/_C.cpython-311-x86_64-linux-gnu.so"
    loader = ImportError("_C.so: undefined symbol: torch_library_impl")
    why = native.import_problem(loader, so, "2.10.0+cu128")
    need = ".".join(map(str, native.TORCH_MIN))
    assert f"needs torch >= {need}, but torch 2.10.0+cu128 is running" in why
    assert "undefined symbol" not in why and "\n" not in why
    # a supported torch, another failure: the loader's first line; no build: "not built"
    why = native.import_problem(loader, so, "2.13.0+cpu")
    assert why.startswith("bertfast._C cannot be loaded (_C.so: undefined symbol")
    assert native.import_problem(ImportError("No module named x"), None, "2.13.0") == (
        "bertfast._C is not built (No module named x)"
    )


def test_a_cpu_without_avx2_is_named_before_the_extension_loads():
    # _C is compiled for x86-64-v3: on an older CPU, loading it would end the process
    # with an illegal instruction, so native checks /proc/cpuinfo's flags first
    from bertfast.ops import native

    able = native.parse_cpu_flags("processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma f16c\n")
    old = native.parse_cpu_flags("processor\t: 0\nflags\t\t: fpu sse4_2 avx\n")
    assert old == {"fpu", "sse4_2", "avx"}
    assert native.parse_cpu_flags("processor\t: 0\n") is None
    assert native.missing_cpu_features("x86_64", able) is None
    why = native.missing_cpu_features("x86_64", old)
    assert why.startswith("this CPU has no AVX2/FMA/F16C") and "\n" not in why
    assert native.missing_cpu_features("aarch64", old) is None  # not an x86 build
    assert native.missing_cpu_features("x86_64", None) is None
    # this machine runs the suite with the extension: it must pass the check
    assert native.missing_cpu_features(os.uname().machine, native.cpu_flags()) is None


def test_an_entry_point_error_is_raised_as_its_tagged_python_exception():
    # the stable ABI carries an error as text: csrc/binding.h tags its kind, and
    # native.python_error raises that kind, whatever exception torch raised it as
    from bertfast.ops import native

    for kind in (ValueError, TypeError, IndexError):
        raw = RuntimeError(f"{kind.__name__}: bertfast._C.cpu.op: x is wrong")
        err = native.python_error(raw)
        assert type(err) is kind and str(err) == "bertfast._C.cpu.op: x is wrong"
    untagged = RuntimeError("bertfast._C.cuda.op: kernel launch failed: cudaErrorX")
    assert native.python_error(untagged) is untagged
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match=r"^bertfast\._C\.cpu\.pack_rows: indices has dtype"):
        bertfast._C.cpu.pack_rows(x, torch.zeros(1))
    with pytest.raises(IndexError, match=r"^bertfast\._C\.cpu\.pack_rows: index 7"):
        bertfast._C.cpu.pack_rows(x, torch.tensor([7]))
