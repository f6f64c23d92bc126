"""The Triton attention and linear_act kernels compiled for sm_90 (H100) and sm_80 (A100)
on this machine, no GPU needed (docs/design.md section 10; ../shared/gpu-without-a-gpu.md):
what the PTX of the configs a GPU would autotune over contains.

The launch arguments are the launcher's own: the launcher runs on CPU tensors with the
kernel replaced by a recorder, and each argument is specialised as triton's runtime
would specialise it (a pointer aligned to 16 bytes and an integer divisible by 16 get
``tt.divisibility = 16``, an integer 1 becomes a constant). Checked per kernel:

- varlen attention keeps its K / V loads asynchronous (``cp.async``), also for a head
  width that is not a multiple of 16 elements (head_dim 40, fp16): the launcher passes
  row strides in bytes so that the divisibility reaches the kernel;
- tensor cores: ``wgmma`` on sm_90 for query tiles of 64+ rows, ``mma.sync`` on sm_80;
- shared memory within the device's limit, and within the estimate the launchers prune
  with (``shared_memory_estimate``), so no config they keep fails to launch.

Compilation runs in a subprocess without ``TRITON_INTERPRET``: tests/conftest.py sets
it, and with it set ``@triton.jit`` makes interpreter functions, which
``triton.compile`` cannot take. It needs triton's NVIDIA backend and the ``ptxas`` it
ships; where compiling for a GPU target is not possible here, the test skips and says
why. ASTSource's keyword API (``constexprs=`` / ``attrs=`` keyed by argument path) is
the one of triton 3.3 and later (3.6 on the GPU machine, 3.9 here); an older triton is
a skip with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: ~40 compiles per target: 20-60 s on 2 cores, depending on triton's cache.
pytestmark = pytest.mark.slow

#: Opt-in shared memory per block: H100 (sm_90), A100 (sm_80).
SHARED_LIMIT = {90: 232448, 80: 166912}
SKIP = "SKIP:"


# ---------------------------------------------------------------------- subprocess side
def _specialize(value):
    """(type, attrs) of one launch argument, as triton's runtime makes them."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        ty, key = native_specialize_impl(BaseBackend, value, False, True, True)[:2]
        if ty == "constexpr":
            return ty, value
        return ty, BaseBackend.parse_attr(key) if isinstance(key, str) else []
    except ImportError:  # the same rules, spelled out
        import torch

        if isinstance(value, torch.Tensor):
            ty = (
                "*"
                + {
                    torch.float32: "fp32",
                    torch.float16: "fp16",
                    torch.bfloat16: "bf16",
                    torch.int64: "i64",
                    torch.int32: "i32",
                    torch.uint8: "u8",
                }[value.dtype]
            )
            aligned = value.data_ptr() % 16 == 0
        elif isinstance(value, bool):
            return "u1", []
        elif isinstance(value, int):
            if value == 1:
                return "constexpr", 1
            ty = "i32" if -(2**31) <= value < 2**31 else "i64"
            aligned = value % 16 == 0
        else:
            return "fp32", []
        return ty, [["tt.divisibility", 16]] if aligned else []


def _record(module, name, run):
    """The (args, kwargs) ``run()`` launches ``module.<name>[grid]`` with."""
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((a, k))

    saved = getattr(module, name)
    setattr(module, name, Recorder())
    try:
        run()
    finally:
        setattr(module, name, saved)
    assert len(calls) == 1, f"expected one launch, got {len(calls)}"
    return calls[0]


def _compile(jit_fn, args, kwargs, cap):
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
        raise RuntimeError(
            f"{SKIP} triton {triton.__version__}'s ASTSource predates the constexprs= / "
            "attrs= API (triton 3.3+) this test compiles with"
        )
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages")}
    bound = dict(zip(jit_fn.arg_names, args))
    bound.update(kwargs)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(jit_fn.arg_names):
        value = bound[name]
        if jit_fn.params[i].is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
            continue
        ty, attr = _specialize(value)
        signature[name] = ty
        if ty == "constexpr":
            constexprs[name] = attr
        elif attr:
            attrs[(i,)] = attr
    src = ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cap, 32), options=options)


def _counts(kernel):
    import re

    ptx = kernel.asm["ptx"]
    return {
        "shared": int(kernel.metadata.shared),
        "cp_async": len(re.findall(r"cp\.async\.c[ag]\.", ptx)),
        "tma": len(re.findall(r"cp\.async\.bulk", ptx)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
        "ldmatrix": len(re.findall(r"ldmatrix", ptx)),
    }


def _probe(cap):
    """Compile a trivial kernel for ``cap``: raises with a SKIP reason when compiling
    for a GPU target is not possible in this install."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs))

    try:
        import torch

        x = torch.zeros(16)
        _compile(_copy, (x, x), {"BLOCK": 16, "num_warps": 1, "num_stages": 1}, cap)
    except Exception as exc:
        if str(exc).startswith(SKIP):
            raise
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        raise RuntimeError(
            f"{SKIP} triton {triton.__version__} cannot compile for sm_{cap} here "
            f"(NVIDIA backend / ptxas): {type(exc).__name__}: {line}"
        ) from exc


def _attention_cases(cap):
    """(label, dtype, heads, head_dim, varlen, configs) to compile for ``cap``."""
    import torch

    from bertfast.ops.triton import attention

    arch = "sm90" if cap >= 90 else "sm80"
    full = [
        {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
        for c in attention._config_list(arch)
    ]
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    return [
        # every config of the list, BERT-base shape
        ("varlen fp16 d64", f16, 12, 64, True, full),
        ("padded+mask fp16 d64", f16, 12, 64, False, full[:2]),
        # widths that are not a multiple of 16 elements: byte strides keep cp.async
        ("varlen fp16 d40 (H=200)", f16, 5, 40, True, full[:1]),
        ("varlen bf16 d80", bf16, 12, 80, True, full[:1]),
        ("varlen fp32 d64", f32, 12, 64, True, full[:1]),
    ]


def _attention(cap, label, dtype, heads, head_dim, varlen, cfg):
    import torch

    from bertfast.ops.triton import attention

    H = heads * head_dim
    if varlen:
        T = 300
        qkv = torch.zeros(T, 3 * H, dtype=dtype)
        cu = torch.tensor([0, 100, 300], dtype=torch.int32)

        def run():
            attention.attention_varlen(qkv, cu, 200, heads, head_dim**-0.5, config=cfg)

    else:
        qkv = torch.zeros(2, 77, 3 * H, dtype=dtype)
        mask = torch.ones(2, 77, dtype=torch.int64)

        def run():
            attention.attention(qkv, mask, heads, head_dim**-0.5, config=cfg)

    args, kwargs = _record(attention, "_attention_kernel", run)
    k = _compile(attention._attention_kernel, args, dict(kwargs), cap)
    est = attention.shared_memory_estimate(
        cfg["BLOCK_M"], cfg["BLOCK_N"], kwargs["BLOCK_D"], cfg["num_stages"], qkv.element_size()
    )
    return {"kernel": "attention", "case": label, "cap": cap, "config": cfg, "estimate": est}, k


def _linear(cap, cfg, dtype):
    import torch

    from bertfast.ops.triton import linear_act

    M, K, N = 1000, 384, 1536
    x, w, b = torch.zeros(M, K, dtype=dtype), torch.zeros(N, K, dtype=dtype), torch.zeros(N)
    b = b.to(dtype)

    def run():
        linear_act.launch_linear_act(x, w, b, "gelu", config=cfg)

    # a forced config launches the heuristics object (EVEN_K) under the autotuner
    heur = linear_act._linear_act_kernel.fn
    args, kwargs = _record(linear_act._linear_act_kernel, "fn", run)
    kwargs = dict(kwargs)
    kwargs["EVEN_K"] = K % cfg["BLOCK_K"] == 0
    k = _compile(heur.fn, args, kwargs, cap)
    est = linear_act.shared_memory_estimate(
        cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_stages"], x.element_size()
    )
    label = f"fp16 {M}x{K}x{N}" if dtype == torch.float16 else f"{dtype} {M}x{K}x{N}"
    return {"kernel": "linear_act", "case": label, "cap": cap, "config": cfg, "estimate": est}, k


def main(cap: int):
    """Compile every case for sm_<cap>: one JSON line per compiled kernel on stdout, or
    one SKIP line."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    sys.path.insert(0, str(ROOT))
    try:
        _probe(cap)
    except RuntimeError as exc:
        print(str(exc))
        return
    from bertfast.ops.triton import linear_act

    # every attention config of the list; of linear_act's (one list for both GPUs),
    # one per tile height and warp count
    linear_configs = [
        {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
        for c in linear_act._GPU_CONFIGS[::3]
    ]
    for label, dtype, heads, head_dim, varlen, cfgs in _attention_cases(cap):
        for cfg in cfgs:
            row, k = _attention(cap, label, dtype, heads, head_dim, varlen, cfg)
            print(json.dumps({**row, **_counts(k)}), flush=True)
    for cfg in linear_configs:
        row, k = _linear(cap, cfg, torch.float16)
        print(json.dumps({**row, **_counts(k)}), flush=True)


# ---------------------------------------------------------------------- pytest side
@pytest.fixture(scope="module")
def compiled():
    """The rows of both targets, compiled side by side (one process per target)."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from tests.ops.test_triton_sm90_compile import main; main({cap})",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for cap in (90, 80)
    ]
    rows = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines = out.strip().splitlines()
        if lines and lines[0].startswith(SKIP):
            pytest.skip(lines[0][len(SKIP) :].strip())
        assert proc.returncode == 0, err[-4000:]
        rows += [json.loads(line) for line in lines]
    assert rows, "nothing compiled"
    return rows


def _table(rows):
    return "\n".join(
        f"sm_{r['cap']} {r['kernel']} {r['case']} {r['config']}: shared {r['shared']} "
        f"(est {r['estimate']}), cp.async {r['cp_async']}, wgmma {r['wgmma']}, "
        f"mma.sync {r['mma_sync']}, ldmatrix {r['ldmatrix']}"
        for r in rows
    )


@pytest.mark.parametrize("cap", [90, 80])
def test_attention_varlen_pipelines_loads_on_tensor_cores(compiled, cap):
    rows = [
        r
        for r in compiled
        if r["kernel"] == "attention" and r["cap"] == cap and r["case"].startswith("varlen")
    ]
    print(_table(rows))
    for r in rows:
        what = f"sm_{cap} attention {r['case']} {r['config']}"
        # async copies of K / V (cp.async, or TMA bulk copies should triton use them)
        assert r["cp_async"] + r["tma"] > 0, f"{what}: no cp.async in the PTX"
        if "fp32" in r["case"]:
            continue  # fp32 runs IEEE (TF32 off): no tensor cores by design
        if cap >= 90 and r["config"]["BLOCK_M"] >= 64:
            assert r["wgmma"] > 0, f"{what}: no wgmma (Hopper tensor cores)"
        else:
            assert r["wgmma"] + r["mma_sync"] > 0, f"{what}: no tensor-core mma"
        if cap < 90:
            assert r["mma_sync"] > 0 and r["wgmma"] == 0, f"{what}: expected mma.sync"


@pytest.mark.parametrize("cap", [90, 80])
def test_attention_padded_uses_tensor_cores(compiled, cap):
    rows = [
        r
        for r in compiled
        if r["kernel"] == "attention" and r["cap"] == cap and r["case"].startswith("padded")
    ]
    print(_table(rows))
    assert rows
    for r in rows:
        assert r["wgmma"] + r["mma_sync"] > 0, f"sm_{cap} {r['case']} {r['config']}: no mma"


@pytest.mark.parametrize("cap", [90, 80])
def test_linear_act_pipelines_loads_on_tensor_cores(compiled, cap):
    rows = [r for r in compiled if r["kernel"] == "linear_act" and r["cap"] == cap]
    print(_table(rows))
    assert rows
    for r in rows:
        what = f"sm_{cap} linear_act {r['config']}"
        assert r["cp_async"] + r["tma"] > 0, f"{what}: no cp.async in the PTX"
        if cap >= 90 and r["config"]["BLOCK_M"] >= 64:
            assert r["wgmma"] > 0, f"{what}: no wgmma"
        else:
            assert r["mma_sync"] > 0, f"{what}: no mma.sync"


@pytest.mark.parametrize("cap", [90, 80])
def test_shared_memory_within_limit_and_estimate(compiled, cap):
    """Every compiled config fits the device, and the launchers' estimate (what they
    prune configs with) is never below what triton allocates."""
    rows = [r for r in compiled if r["cap"] == cap]
    for r in rows:
        what = f"sm_{cap} {r['kernel']} {r['case']} {r['config']}"
        assert r["shared"] <= SHARED_LIMIT[cap], f"{what}: {r['shared']} bytes of shared memory"
        assert r["shared"] <= r["estimate"], (
            f"{what}: triton allocates {r['shared']} bytes, the estimate says {r['estimate']}"
        )
