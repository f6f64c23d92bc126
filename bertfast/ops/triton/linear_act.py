"""``linear_gelu``: out = activation(x @ weight.T + bias), the FFN up-projection
with bias and activation fused into the GEMM epilogue (the [M, N] pre-activation
never goes to memory).

Tiled GEMM: each program owns a BLOCK_M x BLOCK_N output tile and walks K in
BLOCK_K steps with ``tl.dot`` into an fp32 accumulator. Programs are ordered in
groups of GROUP_M row-tiles so neighbouring programs share weight tiles in L2.
Autotuned on GPUs, keyed on (M bucket, N, K) and the dtypes; under the interpreter
one small config. ``config=`` (a dict, see :func:`check_config`) launches exactly
that config without autotuning; :func:`linear_gelu_configs` lists the configs a caller
may force for an input (the autotuner's list, pruned as it prunes it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    ACTIVATION_CODES,
    apply_activation,
    bucket,
    cast_out,
    check_launch_config,
    configs,
    dot_precision,
    max_shared_memory,
    rows_of,
)


def _cfg(bm, bn, bk, warps, stages, group_m=8):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
        num_warps=warps,
        num_stages=stages,
    )


# A100 / H100 defaults for fp16/bf16 BERT FFN shapes (N = 4H, K = H, H in 384..1024);
# fp32 configs whose tiles overflow shared memory are dropped by the autotuner.
_GPU_CONFIGS = [
    _cfg(128, 256, 64, 8, 3),
    _cfg(256, 128, 64, 8, 3),
    _cfg(128, 128, 64, 8, 3),
    _cfg(128, 128, 32, 4, 4),
    _cfg(128, 64, 32, 4, 4),
    _cfg(64, 128, 32, 4, 4),
    _cfg(64, 64, 64, 4, 3),
    _cfg(64, 64, 32, 4, 5),
    _cfg(32, 64, 64, 4, 4),
    _cfg(16, 64, 128, 4, 3),
    _cfg(16, 128, 64, 4, 4),
]
_INTERPRET_CONFIG = _cfg(64, 64, 32, 4, 1)

#: Keys of a forced config (``config=``), all required.
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
#: Most fp32 accumulator values per thread (the [BLOCK_M, BLOCK_N] tile in registers).
_MAX_ACC_PER_THREAD = 256


def shared_memory_estimate(block_m, block_n, block_k, num_stages, elem_bytes) -> int:
    """Bytes of shared memory a config takes: ``num_stages`` buffers of the x and w
    tiles. What triton allocates on sm_90, an upper bound on sm_80 (asserted against
    compiled kernels in tests/ops/test_triton_sm90_compile.py)."""
    return num_stages * (block_m + block_n) * block_k * elem_bytes


def _fits(device, block_m, block_n, block_k, num_warps, num_stages, elem_bytes) -> str:
    """Why a tile cannot run on ``device``, or ""."""
    per_thread = block_m * block_n // (32 * num_warps)
    if per_thread > _MAX_ACC_PER_THREAD:
        return (
            f"BLOCK_M x BLOCK_N = {block_m} x {block_n} holds {per_thread} fp32 values per "
            f"thread with {num_warps} warps (at most {_MAX_ACC_PER_THREAD})"
        )
    if device.type == "cuda":
        need = shared_memory_estimate(block_m, block_n, block_k, num_stages, elem_bytes)
        limit = max_shared_memory(device)
        if need > limit:
            return f"needs ~{need} bytes of shared memory, the device has {limit}"
    return ""


def _prune(configs_, named_args, **kwargs):
    """Skip row tiles much taller than the token count (small batches) and tiles that do
    not fit the device (shared memory: fp32 with the widest tiles)."""
    m_bucket = named_args["m_bucket"]
    x = named_args["x_ptr"]
    kept = [
        c
        for c in configs_
        if c.kwargs["BLOCK_M"] <= max(16, m_bucket)
        and not _fits(
            x.device,
            c.kwargs["BLOCK_M"],
            c.kwargs["BLOCK_N"],
            c.kwargs["BLOCK_K"],
            c.num_warps,
            c.num_stages,
            x.element_size(),
        )
    ]
    return kept or configs_[-1:]


def check_config(config, x: torch.Tensor) -> dict:
    """``config`` as launch arguments, or a one-line ValueError: exactly the keys
    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages; tiles powers of two from
    16 to 256; GROUP_M from 1 to 64; an accumulator that fits the registers and tiles
    that fit (on a GPU) the device's shared memory."""
    cfg = check_launch_config(
        "linear_gelu", config, CONFIG_KEYS, blocks=("BLOCK_M", "BLOCK_N", "BLOCK_K"), max_block=256
    )
    if not 1 <= cfg["GROUP_M"] <= 64:
        raise ValueError(f"linear_gelu config {config}: GROUP_M={cfg['GROUP_M']} is not in [1, 64]")
    why = _fits(
        x.device,
        cfg["BLOCK_M"],
        cfg["BLOCK_N"],
        cfg["BLOCK_K"],
        cfg["num_warps"],
        cfg["num_stages"],
        x.element_size(),
    )
    if why:
        raise ValueError(f"linear_gelu config {config}: {why}")
    return cfg


def linear_gelu_configs(x, weight, bias, activation) -> list:
    """The configs ``linear_gelu(..., config=)`` may be forced to for this input."""
    named = {"m_bucket": bucket(rows_of(x), 4096), "x_ptr": x}
    return [
        {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
        for c in _prune(_linear_act_kernel.configs, named)
    ]


# out[m, n] = act(sum_k x[m, k] * w[n, k] + bias[n])
# Layout: x [M, K] and w [N, K] (nn.Linear weight) with any strides, bias [N],
# out [M, N] with unit column stride. fp32 accumulation; bias and activation in
# fp32 in the epilogue. Rows / columns past M / N are wrapped (modulo) for the
# loads, so loads never leave the tensors, and masked at the store; the K tail is
# masked to zero (EVEN_K: K is a multiple of BLOCK_K, no masks at all).
# Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),), grouped by GROUP_M row tiles.
@triton.autotune(
    configs=configs(_GPU_CONFIGS, _INTERPRET_CONFIG),
    key=["m_bucket", "N", "K"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _linear_act_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    m_bucket,
    x_stride_m,
    x_stride_k,
    w_stride_n,
    w_stride_k,
    out_stride_m,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    load_m = (offs_m % M).to(tl.int64)
    load_n = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + load_m[:, None] * x_stride_m + offs_k[None, :] * x_stride_k
    w_ptrs = w_ptr + load_n[None, :] * w_stride_n + offs_k[:, None] * w_stride_k

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:  # no K tail: unmasked (vectorisable) loads
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * x_stride_k
        w_ptrs += BLOCK_K * w_stride_k

    if HAS_BIAS:
        acc += tl.load(bias_ptr + load_n).to(tl.float32)[None, :]
    y = apply_activation(acc, ACTIVATION)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(
        out_ptr + offs_m.to(tl.int64)[:, None] * out_stride_m + offs_n[None, :],
        cast_out(y, out_ptr.dtype.element_ty),
        mask=mask,
    )


def launch_linear_act(x2: torch.Tensor, weight: torch.Tensor, bias, activation: str, config=None):
    """x2 [M, K] (any strides), weight [N, K] -> act(x2 @ weight.T + bias) [M, N];
    ``config``: a forced launch config (dict), or None to autotune."""
    # a bad config is refused before any early return: the same answer for every shape
    cfg = None if config is None else check_config(config, x2)
    M, K = x2.shape
    N = weight.shape[0]
    out = torch.empty((M, N), dtype=x2.dtype, device=x2.device)
    if M == 0 or N == 0:
        return out
    if K == 0:  # empty reduction: act(bias)
        pre = bias.expand(M, N) if bias is not None else out.zero_()
        from .bias_act import launch_bias_act

        return launch_bias_act(pre.contiguous(), None, activation, out)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    # the autotuner, or (a forced config) the heuristics under it, which still derive
    # EVEN_K from K and the config's BLOCK_K
    kernel = _linear_act_kernel if cfg is None else _linear_act_kernel.fn
    kernel[grid](
        x2,
        weight,
        bias if bias is not None else weight,
        out,
        M,
        N,
        K,
        bucket(M, 4096),
        x2.stride(0),
        x2.stride(1),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        ACTIVATION=ACTIVATION_CODES[activation],
        HAS_BIAS=bias is not None,
        DOT_PRECISION=dot_precision(x2.dtype),
        **(cfg or {}),
    )
    return out


def linear_gelu(x, weight, bias, activation, config=None):
    x2 = x.reshape(rows_of(x), x.shape[-1])
    out = launch_linear_act(x2, weight, bias, activation, config)
    return out.view(tuple(x.shape[:-1]) + (weight.shape[0],))
