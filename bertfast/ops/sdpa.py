"""torch's own attention kernels as a candidate: the ``sdpa`` variant of the ``torch``
backend's ``attention`` and ``attention_varlen`` (``bertfast/ops/reference.py``
registers them; docs/design.md section 4, candidates).

Unlike the reference, which upcasts to fp32 to be the specification, these run
``torch.nn.functional.scaled_dot_product_attention`` in the storage dtype, so torch
may pick its fused kernels (flash, memory-efficient, cuDNN):

- ``attention``: the fused ``[B, S, 3H]`` qkv read as views (``[B, S, 3, heads, d]`` ->
  q, k, v ``[B, heads, S, d]``, no copy) with the key mask as a boolean
  ``[B, 1, 1, S]`` broadcast;
- ``attention_varlen``: torch's varlen kernel (``torch.nn.attention.varlen.varlen_attn``,
  flash attention on packed tokens) where it exists and takes the input (see
  :func:`varlen_reason`), else the tokens are scattered to a zero-padded
  ``[B, max_seqlen, 3H]`` batch by index (no host sync), run as ``attention`` and
  gathered back (on CPU this is what runs).

The op contract beyond SDPA: padded query rows are zero and a sequence with no real
key gives zero rows (SDPA gives NaN there on some backends), heads are merged on
output (``[B, S, H]`` / ``[T, H]``), the output has the input's dtype, non-finite
inputs propagate as in torch's SDPA.

**Forcing a kernel.** Both take ``config=``: ``{"sdpa_backend": name}`` runs SDPA
restricted to that backend (``torch.nn.attention.sdpa_kernel``), names ``flash``,
``efficient``, ``math``, ``cudnn``; ``attention_varlen`` also takes ``varlen``
(torch's varlen kernel; a ValueError where it cannot run) and runs the others through
the padded emulation. A backend torch cannot use for the input raises torch's
"No viable backend" error. :func:`attention_configs` / :func:`attention_varlen_configs`
list the forcible ones for an input, on CUDA tensors only (on CPU, SDPA's choice is
the only candidate).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import torch.nn.functional as F

__all__ = [
    "attention",
    "attention_varlen",
    "attention_configs",
    "attention_varlen_configs",
    "supports_attention",
    "supports_attention_varlen",
    "varlen_reason",
]

#: config["sdpa_backend"] -> torch.nn.attention.SDPBackend member name.
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
    "cudnn": "CUDNN_ATTENTION",
}
#: The name of torch's varlen kernel in an ``attention_varlen`` config.
VARLEN = "varlen"
_HALF = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------- configs
def _forced(op: str, config, allowed: tuple):
    """The backend name ``config`` forces (None: torch's choice), or a one-line
    ValueError."""
    if config is None:
        return None
    if not isinstance(config, dict) or set(config) != {"sdpa_backend"}:
        raise ValueError(
            f"{op} (torch sdpa) config {config!r}: expected {{'sdpa_backend': name}} with "
            f"name one of {', '.join(allowed)}"
        )
    name = config["sdpa_backend"]
    if name not in allowed:
        raise ValueError(
            f"{op} (torch sdpa) config {config!r}: sdpa_backend must be one of {', '.join(allowed)}"
        )
    return name


def _kernel_scope(name):
    """A context manager restricting SDPA to backend ``name`` (None: no restriction)."""
    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def _can_use(name: str, q, k, v, mask) -> bool:
    """Whether torch would run SDPA backend ``name`` on these (CUDA) tensors, asked of
    torch's own checks (shapes, dtypes, strides, GPU, build: no device reads). math
    always runs. Where torch's check API differs from the one used here, the rules
    these backends document: flash and cuDNN take fp16 / bf16 only, flash no mask."""
    if name == "math":
        return True
    try:
        from torch.backends import cuda as tbc

        check = {
            "flash": tbc.can_use_flash_attention,
            "efficient": tbc.can_use_efficient_attention,
            "cudnn": tbc.can_use_cudnn_attention,
        }[name]
        params = tbc.SDPAParams(q, k, v, mask, 0.0, False, False)
        return bool(check(params, False))
    except Exception:  # another torch's SDPAParams / checks: the documented rules
        if name in ("flash", "cudnn") and q.dtype not in _HALF:
            return False
        return not (name == "flash" and mask is not None)


def _heads(qkv: torch.Tensor, num_heads: int):
    """q, k, v views ``[B, heads, S, d]`` of ``qkv`` ``[B, S, 3H]`` (no copy)."""
    B, S, H3 = qkv.shape
    d = H3 // 3 // num_heads
    q, k, v = qkv.view(B, S, 3, num_heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


def _configs(qkv1: torch.Tensor, num_heads: int, masked: bool, names: tuple) -> list:
    """``names`` that torch can run on ``qkv1`` (a [1, S, 3H] sample of the input's
    layout, on the input's device), as config dicts."""
    q, k, v = _heads(qkv1, num_heads)
    mask = torch.ones((1, 1, 1, qkv1.shape[1]), dtype=torch.bool, device=qkv1.device)
    mask = mask if masked else None
    return [{"sdpa_backend": n} for n in names if _can_use(n, q, k, v, mask)]


def attention_configs(qkv, attention_mask, num_heads, scale) -> list:
    """The SDPA backends ``attention(..., config=)`` may be forced to for this input:
    on CUDA tensors, those torch's checks accept (flash only without a mask: whether
    a mask is all real cannot be known without reading it); none on other devices."""
    if qkv.device.type != "cuda" or qkv.shape[0] == 0 or qkv.shape[1] == 0:
        return []
    names = ("flash", "cudnn", "efficient", "math")
    if attention_mask is not None:
        names = names[1:]
    return _configs(qkv[:1], num_heads, attention_mask is not None, names)


def attention_varlen_configs(qkv, cu_seqlens, max_seqlen, num_heads, scale) -> list:
    """For ``attention_varlen`` on CUDA tensors: torch's varlen kernel where it can run
    the input, and the SDPA backends the padded emulation can be forced to (it has a
    key mask: no flash)."""
    if qkv.device.type != "cuda" or max_seqlen == 0 or qkv.shape[0] == 0:
        return []
    head_dim = qkv.shape[-1] // 3 // num_heads
    out = [] if varlen_reason(qkv, head_dim) else [{"sdpa_backend": VARLEN}]
    sample = qkv.new_empty((1, int(max_seqlen), qkv.shape[-1]))
    return out + _configs(sample, num_heads, True, ("cudnn", "efficient", "math"))


# ---------------------------------------------------------------------- supports
def supports_attention(qkv, attention_mask, num_heads, scale):
    """Every input the op's checks accept: SDPA picks a backend per input and its math
    backend takes any dtype and head dim (a fused backend's limits never refuse it)."""
    return None


def supports_attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale):
    """Every input: where torch's varlen kernel cannot run it (:func:`varlen_reason`:
    no such API, CPU, fp32, head dim...), the padded emulation through SDPA does."""
    return None


@functools.cache
def _varlen_api():
    """torch's ``varlen_attn``, or why it cannot be used."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, f"torch {torch.__version__} has no torch.nn.attention.varlen"
    try:
        params = inspect.signature(varlen_attn).parameters
    except (TypeError, ValueError):
        params = {}
    if "scale" not in params:  # torch 2.9's first version: the default scale only
        return None, f"torch {torch.__version__}'s varlen_attn takes no scale"
    return varlen_attn, None


@functools.cache
def _capability(index) -> tuple:
    return tuple(torch.cuda.get_device_capability(index))


def varlen_reason(qkv: torch.Tensor, head_dim: int):
    """Why torch's varlen kernel (flash attention) cannot run ``qkv``, or None: it needs
    the API with a ``scale`` (torch 2.10+), CUDA (not ROCm) tensors on sm_80+, fp16 /
    bf16, and a head dim that is a multiple of 8 up to 256."""
    fn, why = _varlen_api()
    if fn is None:
        return why
    if qkv.device.type != "cuda" or torch.version.cuda is None:
        return "varlen_attn runs on CUDA tensors"
    if qkv.dtype not in _HALF:
        return f"varlen_attn (flash attention) takes fp16 / bf16, not {qkv.dtype}"
    if head_dim % 8 or head_dim > 256:
        return f"varlen_attn takes head dims that are multiples of 8 up to 256, not {head_dim}"
    cap = _capability(qkv.device.index)
    if cap < (8, 0):
        return f"varlen_attn needs compute capability 8.0+, the device has {cap[0]}.{cap[1]}"
    return None


# ---------------------------------------------------------------------- the ops
def _sdpa(qkv: torch.Tensor, keep, num_heads: int, scale: float, backend) -> torch.Tensor:
    """SDPA over ``qkv`` [B, S, 3H] with key mask ``keep`` ([B, S] bool or None):
    ``[B, S, H]``, heads merged; rows of padded queries are whatever SDPA gives."""
    B, S, H3 = qkv.shape
    q, k, v = _heads(qkv, num_heads)
    mask = None if keep is None else keep[:, None, None, :]
    with _kernel_scope(backend):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    # [B, heads, S, d] -> [B, S, heads * d]: a view when SDPA wrote it token-major
    return out.transpose(1, 2).reshape(B, S, H3 // 3)


def attention(qkv, attention_mask, num_heads, scale, config=None):
    """``attention`` through torch's SDPA in the storage dtype (module docstring)."""
    backend = _forced("attention", config, tuple(SDPA_BACKENDS))
    B, S, H3 = qkv.shape
    if B == 0 or S == 0 or H3 == 0:
        return qkv.new_zeros((B, S, H3 // 3))
    keep = None
    if attention_mask is not None:
        keep = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
    out = _sdpa(qkv, keep, num_heads, scale, backend)
    if keep is not None:
        # padded queries, and every row of a sequence with no real key, are zeros
        out = out.masked_fill(~keep[:, :, None], 0.0)
    return out


def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, scale, config=None):
    """``attention_varlen`` through torch's varlen kernel, or SDPA on a padded copy
    (module docstring)."""
    backend = _forced("attention_varlen", config, (VARLEN, *SDPA_BACKENDS))
    T, H3 = qkv.shape
    H = H3 // 3
    B = cu_seqlens.shape[0] - 1
    head_dim = H // num_heads if num_heads else 0
    if backend == VARLEN:
        why = varlen_reason(qkv, head_dim)
        if why:
            raise ValueError(f"attention_varlen (torch sdpa) config {config!r}: {why}")
    if T == 0 or H3 == 0 or B == 0 or max_seqlen == 0:
        return qkv.new_zeros((T, H))
    if backend in (None, VARLEN) and varlen_reason(qkv, head_dim) is None:
        fn, _ = _varlen_api()
        q, k, v = qkv.view(T, 3, num_heads, head_dim).unbind(1)  # [T, heads, d] views
        cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.int()
        m = int(max_seqlen)
        out = fn(q, k, v, cu, cu, m, m, scale=scale)
        return out.reshape(T, H)
    # Padded emulation, by index (no host read): token t of row b = #{rows ending at or
    # before t} sits at padded position b * S + (t - cu[b]).
    S = int(max_seqlen)
    cu = cu_seqlens.long()
    token = torch.arange(T, device=qkv.device)
    row = torch.searchsorted(cu[1:], token, right=True)
    index = row * S + (token - cu[row])
    padded = qkv.new_zeros((B * S, H3)).index_copy_(0, index, qkv).view(B, S, H3)
    keep = torch.arange(S, device=qkv.device)[None, :] < cu.diff()[:, None]
    # a sequence of length 0 has no token to gather: its NaN rows (if any) stay there
    out = _sdpa(padded, keep, num_heads, scale, backend)
    return out.view(B * S, H).index_select(0, index)
