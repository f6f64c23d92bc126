"""Kernel benchmarks: each bertfast op, per usable backend, against the PyTorch ops it
replaces (written the way transformers composes them), on the same inputs in one run.

Shapes: tokens in 128..16384 x hidden in (384, 768, 1024); attention runs sequences of
128 tokens (``tokens / 128`` of them) with ``hidden / 64`` heads; ``attention_varlen``
runs log-normal ragged lengths (mean 64, max 128) totalling about ``tokens`` against
padded SDPA over the same batch; ``linear_gelu`` and ``bias_gelu`` use the FFN width
``4 * hidden``; ``linear`` is the fused QKV projection (``3 * hidden`` outputs).

The ``gemm_*`` cases are the four GEMMs of an encoder layer at the model widths
(MiniLM 384 / 1536, BERT-base 768 / 3072) and 16, 128, 4096 rows: ``gemm_qkv``
(H -> 3H), ``gemm_attn_out`` (H -> H), ``gemm_ffn_in`` (H -> 4H, + GELU),
``gemm_ffn_out`` (4H -> H). bertfast runs them on the weight packed as a loaded model
keeps it (``cpu_weights.pack_owned``: the route ``BERTFAST_CPU_GEMM`` picks), against
``F.linear`` (+ ``F.gelu``); ``ceiling_share`` puts each against the machine's GEMM
ceiling measured in the same run.

Per case ``extra_info`` holds ``gbps`` (memory-bound ops: embed_layernorm,
add_layernorm, bias_gelu; minimal bytes: every input read once, output written once,
small tables and vectors ignored) or ``gflops`` (linear, linear_gelu, attention: useful FLOPs,
real tokens only), ``ratios`` (speedup over the PyTorch baseline timed in the same rounds),
and ``parity_max_abs_err`` against that baseline. Implementations of one case are timed
interleaved, round by round (``conftest.interleave``), like the end-to-end suite.

Each op is one entry of ``CASES`` (an :class:`OpCase`: its inputs, the PyTorch
composition that is both baseline and reference, the bertfast call, and its bytes or
FLOPs); adding an op to the suite is adding an entry.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from bertfast.bench import bertfast_backends, ragged_lengths, synchronize

SEQ = 128
HEAD_DIM = 64
BASELINE = "pytorch"
#: Parity of a bertfast kernel against the PyTorch composition (flags, never asserts).
#: fp32: reorderings of sums of up to 4096 terms; fp16/bf16: one rounding of the output.
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 6e-2}

Inputs = dict[str, object]
Call = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class OpCase:
    """How one op is benchmarked.

    ``inputs(rand, g, tokens, hidden, device, dtype)`` builds its inputs (``rand(*shape,
    scale=)``: seeded normal draws on the device, ``g`` the generator behind them);
    ``pytorch(a)`` is the PyTorch composition it replaces (the baseline and the parity
    reference); ``bertfast(a, backend)`` is the bertfast op; ``work(a, tokens, hidden,
    elt)`` counts the bytes (``unit="GB"``: memory-bound ops, every input read once and
    the output written once) or useful FLOPs (``unit="GFLOP"``) of one call. ``gemm``:
    timed on :func:`gemm_shapes` instead of :func:`shapes`. ``packed_out``: bertfast's
    output holds only the real tokens, compared with the reference's real tokens."""

    inputs: Callable[..., Inputs]
    pytorch: Callable[[Inputs], Call]
    bertfast: Callable[[Inputs, str], Call]
    work: Callable[[Inputs, int, int, int], float]
    unit: str = "GFLOP"
    gemm: bool = False
    packed_out: bool = False


# ---------------------------------------------------------------- shapes and cases
def shapes(settings) -> list[tuple[int, int]]:
    if settings.smoke:
        return [(128, 64)]
    if settings.profile == "full":
        tokens = (128, 512, 2048, 8192, 16384)
    else:
        tokens = (128, 2048, 16384)
    return [(t, h) for h in (384, 768, 1024) for t in tokens]


def gemm_shapes(settings) -> list[tuple[int, int]]:
    if settings.smoke:
        return [(16, 64)]
    return [(t, h) for h in (384, 768) for t in (16, 128, 4096)]


def cases(settings):
    backends = bertfast_backends(settings.device)
    out = []
    for op, case in CASES.items():
        for tokens, hidden in gemm_shapes(settings) if case.gemm else shapes(settings):
            for impl in [BASELINE] + backends:
                out.append(
                    pytest.param((op, tokens, hidden, impl), id=f"{op}-{tokens}x{hidden}-{impl}")
                )
    return out


def _inputs(op: str, tokens: int, hidden: int, device, dtype) -> Inputs:
    g = torch.Generator().manual_seed(tokens * 7 + hidden)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    return CASES[op].inputs(rand, g, tokens, hidden, device, dtype)


def _ops():
    from bertfast import ops

    return ops


def _sdpa_heads(qkv: torch.Tensor, mask, heads: int) -> torch.Tensor:
    """transformers' SDPA path: split heads, masked SDPA, merge heads."""
    B, S, H3 = qkv.shape
    H = H3 // 3
    q, k, v = qkv.view(B, S, 3, heads, H // heads).permute(2, 0, 3, 1, 4).unbind(0)
    m = None if mask is None else mask.bool()[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    return out.transpose(1, 2).reshape(B, S, H)


# ---------------------------------------------------------------- embed_layernorm
def _embed_inputs(rand, g, tokens, H, device, dtype):
    B, S = max(tokens // SEQ, 1), min(tokens, SEQ)
    V = 30522
    return dict(
        input_ids=torch.randint(0, V, (B, S), generator=g).to(device),
        position_ids=torch.arange(S).expand(B, S).contiguous().to(device),
        token_type_ids=torch.zeros(B, S, dtype=torch.long, device=device),
        word=rand(V, H, scale=0.05),
        pos=rand(512, H, scale=0.05),
        types=rand(2, H, scale=0.05),
        weight=rand(H).abs() + 0.5,
        bias=rand(H, scale=0.1),
        rows=B * S,
    )


def _embed_pytorch(a):
    def f():
        x = F.embedding(a["input_ids"], a["word"])
        x = x + F.embedding(a["token_type_ids"], a["types"])
        x = x + F.embedding(a["position_ids"], a["pos"])
        return F.layer_norm(x, (x.shape[-1],), a["weight"], a["bias"], 1e-12)

    return f


def _embed_bertfast(a, backend):
    ops = _ops()
    return lambda: ops.embed_layernorm(
        a["input_ids"],
        a["position_ids"],
        a["token_type_ids"],
        a["word"],
        a["pos"],
        a["types"],
        a["weight"],
        a["bias"],
        1e-12,
        backend=backend,
    )


# ---------------------------------------------------------------- add_layernorm
def _add_ln_inputs(rand, g, tokens, H, device, dtype):
    return dict(
        x=rand(tokens, H),
        residual=rand(tokens, H),
        bias=rand(H, scale=0.1),
        weight=rand(H).abs() + 0.5,
        ln_bias=rand(H, scale=0.1),
    )


def _add_ln_pytorch(a):
    return lambda: F.layer_norm(
        a["x"] + a["bias"] + a["residual"],
        (a["x"].shape[-1],),
        a["weight"],
        a["ln_bias"],
        1e-12,
    )


def _add_ln_bertfast(a, backend):
    ops = _ops()
    return lambda: ops.add_layernorm(
        a["x"], a["residual"], a["bias"], a["weight"], a["ln_bias"], 1e-12, backend=backend
    )


# ---------------------------------------------------------------- bias_gelu
def _bias_gelu_bertfast(a, backend):
    ops = _ops()
    return lambda: ops.bias_gelu(a["x"], a["bias"], "gelu", backend=backend)


# ---------------------------------------------------------------- linear and the GEMMs
def _linear_inputs(k_mult: int, n_mult: int):
    """x [tokens, k_mult*H], weight [n_mult*H, k_mult*H], bias [n_mult*H]."""

    def inputs(rand, g, tokens, H, device, dtype):
        K, N = k_mult * H, n_mult * H
        return dict(x=rand(tokens, K), weight=rand(N, K, scale=K**-0.5), bias=rand(N, scale=0.1))

    return inputs


def _linear_pytorch(act: str | None):
    if act is None:
        return lambda a: lambda: F.linear(a["x"], a["weight"], a["bias"])
    return lambda a: lambda: F.gelu(F.linear(a["x"], a["weight"], a["bias"]))


def _linear_bertfast(act: str | None, packed: bool = False):
    """``ops.linear`` / ``ops.linear_gelu``; ``packed``: on the CPU backend the weight is
    packed as a loaded model keeps it (``cpu_weights.pack_owned``)."""

    def make(a, backend):
        ops = _ops()
        w = a["weight"]
        if packed and backend == "cpu" and w.device.type == "cpu":
            from bertfast.ops.cpu import weights as cpu_weights

            p = cpu_weights.pack_owned(w)
            w = w if p is None else p
        if act is None:
            return lambda: ops.linear(a["x"], w, a["bias"], backend=backend)
        return lambda: ops.linear_gelu(a["x"], w, a["bias"], act, backend=backend)

    return make


def _gemm_flops(a, tokens, H, elt):
    return 2 * tokens * a["weight"].numel()


def _gemm(k_mult: int, n_mult: int, act: str | None) -> OpCase:
    """One of the encoder layer's GEMMs (``k_mult*H -> n_mult*H``, then ``act``) on a
    packed weight, against ``F.linear`` (+ ``F.gelu``)."""
    return OpCase(
        inputs=_linear_inputs(k_mult, n_mult),
        pytorch=_linear_pytorch(act),
        bertfast=_linear_bertfast(act, packed=True),
        work=_gemm_flops,
        gemm=True,
    )


# ---------------------------------------------------------------- attention
def _heads(H: int) -> int:
    return max(H // HEAD_DIM, 1)


def _attention_inputs(rand, g, tokens, H, device, dtype):
    B, S = max(tokens // SEQ, 1), min(tokens, SEQ)
    return dict(
        qkv=rand(B, S, 3 * H),
        mask=torch.ones(B, S, dtype=torch.long, device=device),
        heads=_heads(H),
        lengths=[S] * B,
    )


def _varlen_inputs(rand, g, tokens, H, device, dtype):
    lengths = ragged_lengths(max(tokens // 64, 1), 64, SEQ, seed=tokens + H)
    S = max(lengths)
    T = sum(lengths)
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    index = mask.flatten().nonzero().squeeze(1)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    packed = rand(T, 3 * H)
    padded = torch.zeros(len(lengths) * S, 3 * H, dtype=dtype, device=device)
    padded[index.to(device)] = packed
    return dict(
        qkv=packed,
        cu=cu.to(device),
        max_seqlen=S,
        heads=_heads(H),
        lengths=lengths,
        padded=padded.view(len(lengths), S, 3 * H),
        mask=mask.long().to(device),
        index=index.to(device),
    )


def _attention_bertfast(a, backend):
    ops = _ops()
    return lambda: ops.attention(a["qkv"], a["mask"], a["heads"], backend=backend)


def _varlen_bertfast(a, backend):
    ops = _ops()
    return lambda: ops.attention_varlen(
        a["qkv"], a["cu"], a["max_seqlen"], a["heads"], backend=backend
    )


def _attention_flops(a, tokens, H, elt):
    return sum(4 * n * n * H for n in a["lengths"])


#: op -> how it is benchmarked, in the order the cases run. ``gemm_*`` are the encoder
#: layer's four GEMMs per hidden H: qkv (H -> 3H), attn_out (H -> H), ffn_in (H -> 4H,
#: + GELU), ffn_out (4H -> H).
CASES: dict[str, OpCase] = {
    "embed_layernorm": OpCase(
        inputs=_embed_inputs,
        pytorch=_embed_pytorch,
        bertfast=_embed_bertfast,
        # word rows in, output out, 3 id tensors
        work=lambda a, tokens, H, elt: a["rows"] * H * elt * 2 + a["rows"] * 8 * 3,
        unit="GB",
    ),
    "add_layernorm": OpCase(
        inputs=_add_ln_inputs,
        pytorch=_add_ln_pytorch,
        bertfast=_add_ln_bertfast,
        work=lambda a, tokens, H, elt: 3 * tokens * H * elt,
        unit="GB",
    ),
    "bias_gelu": OpCase(
        inputs=lambda rand, g, tokens, H, device, dtype: dict(
            x=rand(tokens, 4 * H), bias=rand(4 * H, scale=0.1)
        ),
        pytorch=lambda a: lambda: F.gelu(a["x"] + a["bias"]),
        bertfast=_bias_gelu_bertfast,
        work=lambda a, tokens, H, elt: 2 * tokens * 4 * H * elt,
        unit="GB",
    ),
    "linear": OpCase(  # the fused QKV projection
        inputs=_linear_inputs(1, 3),
        pytorch=_linear_pytorch(None),
        bertfast=_linear_bertfast(None),
        work=lambda a, tokens, H, elt: 2 * tokens * H * 3 * H,
    ),
    "linear_gelu": OpCase(
        inputs=_linear_inputs(1, 4),
        pytorch=_linear_pytorch("gelu"),
        bertfast=_linear_bertfast("gelu"),
        work=lambda a, tokens, H, elt: 2 * tokens * H * 4 * H,
    ),
    "attention": OpCase(
        inputs=_attention_inputs,
        pytorch=lambda a: lambda: _sdpa_heads(a["qkv"], a["mask"], a["heads"]),
        bertfast=_attention_bertfast,
        work=_attention_flops,
    ),
    "attention_varlen": OpCase(
        inputs=_varlen_inputs,
        # What a padded implementation runs on the same ragged batch.
        pytorch=lambda a: lambda: _sdpa_heads(a["padded"], a["mask"], a["heads"]),
        bertfast=_varlen_bertfast,
        work=_attention_flops,
        packed_out=True,
    ),
    "gemm_qkv": _gemm(1, 3, None),
    "gemm_attn_out": _gemm(1, 1, None),
    "gemm_ffn_in": _gemm(1, 4, "gelu"),
    "gemm_ffn_out": _gemm(4, 1, None),
}


_measured: dict[tuple, dict] = {}


def measure_group(bench, timing, key, impls) -> dict:
    """Time every implementation of one (op, tokens, hidden) case, interleaved."""
    if key in _measured:
        return _measured[key]
    _measured.clear()
    s = bench.s
    op, tokens, hidden = key
    case = CASES[op]
    a = _inputs(op, tokens, hidden, s.device, s.dtype)
    from bertfast.ops import BackendError

    fns, skips = {}, {}
    for impl in impls:
        if impl == BASELINE:
            fns[impl] = case.pytorch(a)
            continue
        fn = case.bertfast(a, impl)
        try:
            fn()
        except (BackendError, NotImplementedError) as exc:
            skips[impl] = f"{impl}: {exc}"
            continue
        fns[impl] = fn

    def sync(fn):
        def call():
            r = fn()
            synchronize(s.device)
            return r

        return call

    calls = {n: sync(f) for n, f in fns.items()}
    ref = case.pytorch(a)().float()
    if case.packed_out:  # the reference's real tokens, as bertfast packs them
        ref_packed = ref.reshape(-1, ref.shape[-1])[a["index"]]
    errs, one = {}, {}
    for n, call in calls.items():
        out = call()
        r = ref_packed if (case.packed_out and out.dim() == 2) else ref
        errs[n] = float((out.float() - r).abs().max()) if out.numel() else 0.0
        del out
        t0 = time.perf_counter()
        call()
        one[n] = time.perf_counter() - t0
    del ref
    times = timing.interleave(calls, one, min(s.budget, 1.0), s.smoke)
    unit, amount = case.unit, case.work(a, tokens, hidden, torch.finfo(s.dtype).bits // 8)
    res = {
        "times": times,
        "errs": errs,
        "skips": skips,
        "fns": calls,
        "unit": unit,
        "amount": amount,
    }
    _measured[key] = res
    return res


def test_kernel(benchmark, bench, timing, kernel_case):
    op, tokens, hidden, impl = kernel_case
    s = bench.s
    key = (op, tokens, hidden)
    impls = s.kernel_groups.get(key, [impl]) if hasattr(s, "kernel_groups") else [impl]
    res = measure_group(bench, timing, key, impls)
    if impl in res["skips"]:
        pytest.skip(res["skips"][impl])
    times = res["times"][impl]

    benchmark.group = f"{op} {tokens}x{hidden}"
    benchmark.name = f"{op}-{tokens}x{hidden}-{impl}"
    if not timing.record(benchmark, times):  # fallback: time this implementation alone
        benchmark.pedantic(
            res["fns"][impl], rounds=max(len(times), 1), iterations=1, warmup_rounds=1
        )

    unit, amount = res["unit"], res["amount"]
    err = res["errs"][impl]
    tol = TOL.get(s.dtype, 1e-2)
    info = benchmark.extra_info
    info.update(
        {
            "suite": "kernels",
            "op": op,
            "tokens": tokens,
            "hidden": hidden,
            "provider": impl,
            "is_bertfast": impl != BASELINE,
            "timing": "interleaved",
            "device": bench.device_name,
            "dtype": str(s.dtype).replace("torch.", ""),
            "unit": unit,
            "amount": amount,
            "parity_max_abs_err": err,
            "parity_ok": bool(err <= tol),
            "parity_tol": tol,
        }
    )
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return
    med = stats.stats.median
    rate = amount / med / 1e9
    info.update(
        {
            "median_s": med,
            "iqr_s": stats.stats.iqr,
            "rounds": stats.stats.rounds,
            "gbps" if unit == "GB" else "gflops": rate,
        }
    )
    base = res["times"].get(BASELINE)
    info["ratios"] = {BASELINE: statistics.median(base) / med} if base and impl != BASELINE else {}
    if unit == "GFLOP" and not s.gpu:
        info["ceiling_share"] = rate / bench.ceiling
