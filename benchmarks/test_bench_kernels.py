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
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from bertfast.bench import bertfast_backends, ragged_lengths, synchronize

OPS = (
    "embed_layernorm",
    "add_layernorm",
    "bias_gelu",
    "linear",
    "linear_gelu",
    "attention",
    "attention_varlen",
)
#: The encoder layer's GEMMs: name -> (in width, out width, activation) per hidden H.
GEMMS = {
    "gemm_qkv": (1, 3, None),
    "gemm_attn_out": (1, 1, None),
    "gemm_ffn_in": (1, 4, "gelu"),
    "gemm_ffn_out": (4, 1, None),
}
MEMORY_BOUND = ("embed_layernorm", "add_layernorm", "bias_gelu")
BASELINE = "pytorch"
SEQ = 128
HEAD_DIM = 64
#: Parity of a bertfast kernel against the PyTorch composition (flags, never asserts).
#: fp32: reorderings of sums of up to 4096 terms; fp16/bf16: one rounding of the output.
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 6e-2}


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
    for op in OPS + tuple(GEMMS):
        for tokens, hidden in gemm_shapes(settings) if op in GEMMS else shapes(settings):
            for impl in [BASELINE] + backends:
                out.append(
                    pytest.param((op, tokens, hidden, impl), id=f"{op}-{tokens}x{hidden}-{impl}")
                )
    return out


# ---------------------------------------------------------------- inputs
def _inputs(op: str, tokens: int, hidden: int, device, dtype) -> dict[str, object]:
    g = torch.Generator().manual_seed(tokens * 7 + hidden)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    H = hidden
    if op == "embed_layernorm":
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
    if op == "add_layernorm":
        return dict(
            x=rand(tokens, H),
            residual=rand(tokens, H),
            bias=rand(H, scale=0.1),
            weight=rand(H).abs() + 0.5,
            ln_bias=rand(H, scale=0.1),
        )
    if op == "bias_gelu":
        return dict(x=rand(tokens, 4 * H), bias=rand(4 * H, scale=0.1))
    if op == "linear":  # the fused QKV projection
        return dict(
            x=rand(tokens, H), weight=rand(3 * H, H, scale=H**-0.5), bias=rand(3 * H, scale=0.1)
        )
    if op == "linear_gelu":
        return dict(
            x=rand(tokens, H), weight=rand(4 * H, H, scale=H**-0.5), bias=rand(4 * H, scale=0.1)
        )
    if op in GEMMS:
        k_mult, n_mult, act = GEMMS[op]
        K, N = k_mult * H, n_mult * H
        return dict(x=rand(tokens, K), weight=rand(N, K, scale=K**-0.5), bias=rand(N, scale=0.1))
    heads = max(H // HEAD_DIM, 1)
    if op == "attention":
        B, S = max(tokens // SEQ, 1), min(tokens, SEQ)
        return dict(
            qkv=rand(B, S, 3 * H),
            mask=torch.ones(B, S, dtype=torch.long, device=device),
            heads=heads,
            lengths=[S] * B,
        )
    if op == "attention_varlen":
        lengths = ragged_lengths(max(tokens // 64, 1), 64, SEQ, seed=tokens + hidden)
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
            heads=heads,
            lengths=lengths,
            padded=padded.view(len(lengths), S, 3 * H),
            mask=mask.long().to(device),
            index=index.to(device),
        )
    raise ValueError(op)


# ---------------------------------------------------------------- implementations
def _sdpa_heads(qkv: torch.Tensor, mask, heads: int) -> torch.Tensor:
    """transformers' SDPA path: split heads, masked SDPA, merge heads."""
    B, S, H3 = qkv.shape
    H = H3 // 3
    q, k, v = qkv.view(B, S, 3, heads, H // heads).permute(2, 0, 3, 1, 4).unbind(0)
    m = None if mask is None else mask.bool()[:, None, None, :]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    return out.transpose(1, 2).reshape(B, S, H)


def _pytorch(op: str, a: dict[str, object]) -> Callable[[], torch.Tensor]:
    if op == "embed_layernorm":

        def f():
            x = F.embedding(a["input_ids"], a["word"])
            x = x + F.embedding(a["token_type_ids"], a["types"])
            x = x + F.embedding(a["position_ids"], a["pos"])
            return F.layer_norm(x, (x.shape[-1],), a["weight"], a["bias"], 1e-12)

        return f
    if op == "add_layernorm":
        return lambda: F.layer_norm(
            a["x"] + a["bias"] + a["residual"],
            (a["x"].shape[-1],),
            a["weight"],
            a["ln_bias"],
            1e-12,
        )
    if op == "bias_gelu":
        return lambda: F.gelu(a["x"] + a["bias"])
    if op == "linear":
        return lambda: F.linear(a["x"], a["weight"], a["bias"])
    if op == "linear_gelu":
        return lambda: F.gelu(F.linear(a["x"], a["weight"], a["bias"]))
    if op in GEMMS:
        if GEMMS[op][2] is None:
            return lambda: F.linear(a["x"], a["weight"], a["bias"])
        return lambda: F.gelu(F.linear(a["x"], a["weight"], a["bias"]))
    if op == "attention":
        return lambda: _sdpa_heads(a["qkv"], a["mask"], a["heads"])
    if op == "attention_varlen":
        # What a padded implementation runs on the same ragged batch.
        return lambda: _sdpa_heads(a["padded"], a["mask"], a["heads"])
    raise ValueError(op)


def _bertfast(op: str, a: dict[str, object], backend: str) -> Callable[[], torch.Tensor]:
    from bertfast import ops

    if op == "embed_layernorm":
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
    if op == "add_layernorm":
        return lambda: ops.add_layernorm(
            a["x"], a["residual"], a["bias"], a["weight"], a["ln_bias"], 1e-12, backend=backend
        )
    if op == "bias_gelu":
        return lambda: ops.bias_gelu(a["x"], a["bias"], "gelu", backend=backend)
    if op == "linear":
        return lambda: ops.linear(a["x"], a["weight"], a["bias"], backend=backend)
    if op == "linear_gelu":
        return lambda: ops.linear_gelu(a["x"], a["weight"], a["bias"], "gelu", backend=backend)
    if op in GEMMS:
        w = a["weight"]
        if backend == "cpu" and w.device.type == "cpu":  # packed as a loaded model keeps it
            from bertfast.ops import cpu_weights

            packed = cpu_weights.pack_owned(w)
            w = w if packed is None else packed
        act = GEMMS[op][2]
        if act is None:
            return lambda: ops.linear(a["x"], w, a["bias"], backend=backend)
        return lambda: ops.linear_gelu(a["x"], w, a["bias"], act, backend=backend)
    if op == "attention":
        return lambda: ops.attention(a["qkv"], a["mask"], a["heads"], backend=backend)
    if op == "attention_varlen":
        return lambda: ops.attention_varlen(
            a["qkv"], a["cu"], a["max_seqlen"], a["heads"], backend=backend
        )
    raise ValueError(op)


def _work(op: str, a: dict[str, object], tokens: int, hidden: int, elt: int) -> tuple[str, float]:
    """("GB", bytes) for memory-bound ops, ("GFLOP", flops) otherwise."""
    H = hidden
    if op == "embed_layernorm":
        rows = a["rows"]
        return "GB", rows * H * elt * 2 + rows * 8 * 3  # word rows in, output out, 3 id tensors
    if op == "add_layernorm":
        return "GB", 3 * tokens * H * elt
    if op == "bias_gelu":
        return "GB", 2 * tokens * 4 * H * elt
    if op == "linear":
        return "GFLOP", 2 * tokens * H * 3 * H
    if op == "linear_gelu":
        return "GFLOP", 2 * tokens * H * 4 * H
    if op in GEMMS:
        return "GFLOP", 2 * tokens * a["weight"].numel()
    return "GFLOP", sum(4 * n * n * H for n in a["lengths"])


_measured: dict[tuple, dict] = {}


def measure_group(bench, timing, key, impls) -> dict:
    """Time every implementation of one (op, tokens, hidden) case, interleaved."""
    if key in _measured:
        return _measured[key]
    _measured.clear()
    s = bench.s
    op, tokens, hidden = key
    a = _inputs(op, tokens, hidden, s.device, s.dtype)
    from bertfast.ops import BackendError

    fns, skips = {}, {}
    for impl in impls:
        if impl == BASELINE:
            fns[impl] = _pytorch(op, a)
            continue
        fn = _bertfast(op, a, impl)
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
    ref = _pytorch(op, a)().float()
    if op == "attention_varlen":
        ref_packed = ref.reshape(-1, ref.shape[-1])[a["index"]]
    errs, one = {}, {}
    for n, call in calls.items():
        out = call()
        r = ref_packed if (op == "attention_varlen" and out.dim() == 2) else ref
        errs[n] = float((out.float() - r).abs().max()) if out.numel() else 0.0
        del out
        t0 = time.perf_counter()
        call()
        one[n] = time.perf_counter() - t0
    del ref
    times = timing.interleave(calls, one, min(s.budget, 1.0), s.smoke)
    unit, amount = _work(op, a, tokens, hidden, torch.finfo(s.dtype).bits // 8)
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
