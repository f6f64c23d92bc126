"""Weights of the CPU GEMMs: who packs them, in which form, and when.

Two GEMMs run ``cpu.linear`` on CPU (``BERTFAST_CPU_GEMM`` picks; see ``ROUTE``):

- ``onednn`` (the default where torch has oneDNN, i.e. ``torch.backends.mkldnn``
  on x86-64): torch's oneDNN inner product (``torch.ops.mkldnn._linear_pointwise``,
  what ``torch.compile``'s CPU freezing uses) on a weight reordered once into
  oneDNN's blocked layout, bias and activation fused as post-ops. fp32, and bf16
  where the CPU has native bf16 dot products (``avx512_bf16`` / ``amx_bf16``:
  AMX tiles or ``vdpbf16ps``, fp32 accumulation).
- ``own``: the C++ GEMM of kernels/cpu/gemm.cpp on panels ``[N / NR][K][NR]``
  (fp32; the default without oneDNN), and for bf16 the C++ bf16 GEMM of
  kernels/cpu/bgemm.cpp on k-pair panels ``[N / 32][K / 2][32][2]`` (AMX tiles, or a
  portable fp32 kernel).
- ``torch``: every GEMM on ``F.linear`` / ``torch.matmul``, weights kept plain.

In fp32 the own kernel is ahead below ~128 rows, oneDNN above; in bf16 oneDNN is
ahead of ``F.linear`` (per-call times on the Intel Xeon AMX VM:
``benchmarks/results/cpu-intel-xeon-amx-2t/notes.md``, "GEMM routes (cpu_weights)"),
and the C++ bf16 GEMM on AMX ahead of oneDNN up to ``BF16_SMALL_ROWS`` rows.
A weight is kept in one form only (memory, below). oneDNN's fp32 weight layout on
AVX-512 is the own kernel's panels, 64 wide (``[N / 64][K][64]``), so ``auto`` keeps
the oneDNN form and runs up to ``SMALL_ROWS`` rows on the own kernel reading that
buffer in place (its few-rows kernel prefetches the weight as it streams it from
memory; the layout is checked bit for bit per weight at load; elsewhere oneDNN runs
every row count: never behind ``F.linear``, the same vendor GEMM without its
per-call weight reorder). On AMX machines oneDNN's bf16 layout is the C++ bf16 GEMM's
k-pair panels, so bf16 runs up to ``BF16_SMALL_ROWS`` rows on AMX the same way.
``benchmarks/test_bench_kernels.py`` times every model shape on the chosen route
against ``F.linear``,
``benchmarks/experiments/few_rows_stream.py`` a forward's GEMMs in sequence at few rows.

There is no cache of packed copies (a cache keyed on a tensor's identity and
version counter misses writes through ``.data``, through views under ``no_grad``
and through NumPy arrays sharing the memory, and inference tensors have no version
counter). Two kinds of weight reach ``cpu.linear``:

- :class:`PackedWeight`: a weight *owned* by a model bertfast loaded itself
  (``from_pretrained``), packed once at load into the route's form. It is the only
  copy of that weight: a read-only ``[N, K]`` tensor whose values torch ops read by
  unpacking (slow; only the GEMM reads the packed form directly); writes through
  any route raise (NumPy cannot see it at all). ``BertfastModel.unpack_weights()``
  turns them back into plain tensors for editing, ``refresh()`` packs again.
- any other tensor (``optimize()`` shares the user's parameters, direct op calls):
  read as it is at every call, never copied across calls: ``F.linear`` with the
  bias + activation epilogue of the C++ kernels. Nothing is cached, so ``optimize()``
  costs no memory; its GEMMs are torch's (oneDNN's per-call reorder of the weight
  is the cost a cache would save). Rows >= ``PACK_MIN_ROWS``
  (``BERTFAST_CPU_PACK_MIN_ROWS``; default: never) pack it into a temporary for the
  own C++ GEMM instead: on the Intel Xeon packing per call lost to ``F.linear`` at
  every row count up to 2048 (``benchmarks/experiments/pack_crossover.py``); machines where the
  C++ GEMM is well ahead of the vendor BLAS (AMD Zen) may set it.
"""

from __future__ import annotations

import ctypes
import os

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from .. import dispatch, native

# The extension as native.py loaded it (None without a usable build or on a CPU it
# cannot run on).
_kernels = native._C.cpu if native._C is not None else None

ROUTES = ("auto", "own", "onednn", "torch")


def _onednn_available() -> bool:
    """torch's oneDNN inner product with prepacked weights and post-ops exists
    (torch built with mkldnn, x86-64 / aarch64) and gives a right answer."""
    mk = getattr(torch.ops, "mkldnn", None)
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        w = torch.tensor([[1.0, 2.0], [3.0, -4.0]])
        out = mk._linear_pointwise(
            torch.tensor([[1.0, 1.0]]), mk._reorder_linear_weight(w, None), None, "relu", [], ""
        )
        return out.tolist() == [[3.0, 0.0]]
    except (AttributeError, RuntimeError):  # pragma: no cover - torch without the ops
        return False


def _native_bf16() -> bool:
    """The CPU has bf16 dot-product instructions (AVX512-BF16 or AMX-BF16)."""
    flags = native.cpu_flags() or frozenset()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _avx512() -> bool:
    """The CPU has the AVX-512 subsets the C++ GEMM's AVX-512 kernels need (gemm.cpp's
    ``use_avx512``: F, DQ, VL, BW)."""
    return {"avx512f", "avx512dq", "avx512vl", "avx512bw"} <= (native.cpu_flags() or frozenset())


ONEDNN: bool = _onednn_available()
NATIVE_BF16: bool = ONEDNN and _native_bf16()


def _env_route() -> str:
    raw = os.environ.get("BERTFAST_CPU_GEMM", "auto").strip().lower() or "auto"
    if raw not in ROUTES:
        raise ValueError(f"BERTFAST_CPU_GEMM={raw!r}: choose one of {', '.join(ROUTES)}")
    if raw == "onednn" and not ONEDNN:
        raise ValueError(
            "BERTFAST_CPU_GEMM=onednn: this torch has no oneDNN (torch.backends.mkldnn); "
            "use auto, own or torch"
        )
    if raw == "auto":
        return "onednn" if ONEDNN else "own"
    return raw


#: The GEMM a loaded model's weights are packed for: "onednn", "own" or "torch"
#: (``BERTFAST_CPU_GEMM``, default auto: oneDNN where torch has it, else own).
ROUTE: str = _env_route()


def _env_rows() -> int | None:
    raw = os.environ.get("BERTFAST_CPU_PACK_MIN_ROWS", "").strip().lower()
    if raw in ("", "never", "off", "none"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"BERTFAST_CPU_PACK_MIN_ROWS={raw!r} is not a row count (an integer, or 'never')"
        ) from None
    if value < 0:
        raise ValueError(f"BERTFAST_CPU_PACK_MIN_ROWS={value} must be >= 0")
    return value


#: Rows from which a plain (unowned) fp32 weight is packed per call for the C++
#: GEMM instead of going to ``F.linear``; None: never (see the module notes).
PACK_MIN_ROWS: int | None = _env_rows()


def panel_width() -> int:
    return _kernels.linear_panel_width(True)


def pack(weight: Tensor) -> Tensor:
    """The packed panels of an fp32 ``[N, K]`` weight: a new flat tensor."""
    return _kernels.linear_pack(weight.detach().contiguous(), True)


def unpack(packed: Tensor, N: int, K: int, nr: int) -> Tensor:
    """The ``[N, K]`` weight held in packed panels (a new tensor)."""
    panels = packed.view(-1, K, nr)  # [P, K, NR]
    return panels.transpose(1, 2).reshape(-1, K)[:N].clone()


def storage_for(dtype: torch.dtype, route: str | None = None) -> str | None:
    """The packed form ("onednn" / "own") a CPU weight of ``dtype`` is kept in on
    ``route`` (default ``ROUTE``), or None: kept plain (torch's GEMM)."""
    route = ROUTE if route is None else route
    if route == "onednn" and (dtype == torch.float32 or (dtype == torch.bfloat16 and NATIVE_BF16)):
        return "onednn"
    if route in ("own", "onednn") and dtype == torch.float32 and _kernels is not None:
        return "own"
    if route == "own" and dtype == torch.bfloat16 and _has_bgemm():
        return "own"
    return None


def _has_bgemm() -> bool:
    return _kernels is not None and hasattr(_kernels, "bgemm_pack")


def packed_for_call(weight: Tensor, rows: int) -> Tensor | None:
    """The packed weight the GEMM should use for ``weight`` at ``rows`` rows, or
    None for torch's. Never cached: a plain weight is read at every call."""
    if isinstance(weight, PackedWeight):
        if weight._panels is not None and (
            not weight._packed.is_mkldnn
            or rows <= small_rows(weight.dtype)
            or (onednn_rows(rows) != rows and weight.dtype == torch.float32)
        ):
            # the C++ GEMM (on oneDNN's buffer where oneDNN holds it): few rows, or
            # an fp32 row count oneDNN is not given (see ``onednn_rows``)
            return weight._panels
        return weight._packed
    if (
        PACK_MIN_ROWS is not None
        and rows >= PACK_MIN_ROWS
        and weight.dtype == torch.float32
        and ROUTE != "torch"
    ):
        return pack(weight)
    return None


def layer_panels(weights, rows: int) -> list[Tensor] | None:
    """The C++ GEMM's panels of a layer's GEMM weights at ``rows`` rows (see
    ``packed_for_call``), or None where any of them is not a weight a model packed
    (``PackedWeight``) or runs elsewhere at that row count (oneDNN)."""
    panels = []
    for w in weights:
        p = packed_for_call(w, rows) if isinstance(w, PackedWeight) else None
        if p is None or p.is_mkldnn:
            return None
        panels.append(p)
    return panels


#: Rows up to which a weight oneDNN holds in 64-wide panels runs on the C++ GEMM
#: (it reads those panels in place: no second copy). Up to here the C++ GEMM's
#: few-rows kernel is ahead of oneDNN on the weights a forward streams from L3 or
#: memory, at 256 rows level, at 512 behind (kernels/cpu/gemm.cpp,
#: ``gemm_tile_few_rows``; measured with ``benchmarks/experiments/few_rows_stream.py`` on AMD
#: EPYC Zen 4, 2 threads, ms per forward's GEMMs, C++ / oneDNN: MiniLM 1 row 1.04 /
#: 1.65, 16 rows 1.81 / 2.56, 64 rows 6.52 / 7.17, 128 rows 12.8 / 13.3, 256 rows
#: 25.4 / 25.6; BERT-base 1 row 11.0 / 14.4, 16 rows 13.5 / 17.6, 64 rows 50.0 /
#: 52.9, 128 rows 102.6 / 104.9, 256 rows 204 / 199). The C++ limit is
#: ``kFewRowsMax`` there; above it the row-block kernel runs. On a CPU without AVX-512
#: the C++ GEMM's few-rows kernel (6 x 16 register tiles) stops at 64 rows
#: (``kFewRowsMaxAvx2``): above, oneDNN is level with it and ahead of the row-block
#: kernel (AMD EPYC Zen 3, AVX2, 2 threads, MiniLM, oneDNN / C++: 1.29 at 32 rows, 1.07
#: at 64, 0.97 at 96, row-block 0.70 at 256;
#: benchmarks/results/cpu-amd-epyc-avx2-2t/few-rows-6x16.md), so there the limit is 64.
SMALL_ROWS = 128 if _avx512() else 64


def onednn_rows(rows: int) -> int:
    """The row count a oneDNN GEMM of ``rows`` rows runs at: ``rows`` up to 8, above
    rounded up to one of four sizes per octave (10, 12, 14, 16, 20, ..., 64, 80, 96,
    112, 128, 160, ..., 3072, 3584, 4096, 5120, ...).

    Why: oneDNN builds and caches a primitive per input shape, and each one keeps a
    buffer of about rows x N x 4 bytes (measured: 20 row counts near 3000 at N =
    1536 grew the process by 371 MB). Fed every row count a ragged or streaming
    workload produces, memory grows by hundreds of MB; fed these sizes only, it is
    bounded by the sizes seen (a model keeps about ``rows x sum(N) x 4`` bytes per
    size: MiniLM at 4096 rows, 57 MB). fp32 calls at other row counts run the C++
    GEMM on oneDNN's panels (no padding, ~10-15% slower at thousands of rows); bf16
    calls are padded with zero rows up to the size (at most 25% more rows), and so
    are fp32 calls on a weight without the C++ GEMM's panels (``_panels`` None)."""
    step = 1 << max((rows - 1).bit_length() - 3, 0)
    return -(-rows // step) * step


#: Most rows (as a fraction of the real ones) an encoder adds to its token rows so
#: that its fp32 GEMMs run on oneDNN at a size of ``onednn_rows`` (see ``layer_rows``).
#: Without AVX-512, 0.25: always (``onednn_rows`` adds less than a quarter). The C++
#: GEMM's row-block kernel runs there at about 0.7x oneDNN, so oneDNN is faster even
#: on 24% more rows. Measured on AMD EPYC Zen 3, AVX2, 2 threads, all-MiniLM-L6-v2:
#: `Embedder.embed_tokenized` of 120 random batches of 65-300 tokens, both settings
#: alternating per batch. On the 40 batches whose padding is above 10% (70-280
#: tokens), 2620 ms -> 1916 ms (1.37x); all 120, 1.11x
#: (benchmarks/results/cpu-amd-epyc-avx2-2t/notes.md).
LAYER_PAD_FRACTION = 0.10 if _avx512() else 0.25


def layer_rows(rows: int, weights) -> int:
    """The row count an encoder should run its token-wise ops at when its GEMMs
    multiply by ``weights`` (one layer's, all the same form): ``rows``, or
    ``onednn_rows(rows)`` when every weight is held by oneDNN and the extra rows pay.

    A token count between oneDNN's sizes (a ragged batch: 4036 tokens) otherwise runs
    every fp32 GEMM on the C++ GEMM over oneDNN's panels, 10-20% slower than oneDNN at
    thousands of rows, and every bf16 GEMM pads its input with a copy. Padding the
    activations once per forward (zero rows, a sequence of their own for attention)
    costs the extra rows only. Measured on the Intel Xeon dev VM, 1 thread, the four
    GEMMs of a layer, ms: BERT-base 4036 rows 409 on the C++ GEMM vs 370 on oneDNN at
    4096, 2000 -> 2048: 214 vs 184, 3700 -> 4096 (+11%): 381 vs 384; MiniLM 4036:
    113 vs 90, 3700: 102 vs 88. So fp32 pads up to ``LAYER_PAD_FRACTION`` more rows,
    bf16 (padded at every call otherwise) whenever a size differs."""
    if rows <= SMALL_ROWS:
        return rows
    padded = onednn_rows(rows)
    if padded == rows:
        return rows
    weights = list(weights)
    if not weights or not all(isinstance(w, PackedWeight) and w._packed.is_mkldnn for w in weights):
        return rows
    # each call would pad anyway: no C++ panels, or bf16 (its panels serve few rows only)
    if all(w._panels is None or w.dtype == torch.bfloat16 for w in weights):
        return padded
    return padded if padded - rows <= LAYER_PAD_FRACTION * rows else rows


#: Largest activation a layer allocates afresh at each call: glibc's malloc serves
#: larger blocks with a new mmap (its threshold stops growing at 32 MiB on 64-bit),
#: so every one is page-faulted in again, 4 KiB at a time.
FRESH_BYTES_MAX = 32 << 20


def row_blocks(rows: int, width: int, element_size: int, unit: int = 1) -> list[tuple[int, int]]:
    """Row ranges ``[begin, end)`` to run a token-wise block whose widest activation is
    ``rows x width`` in: ``[(0, rows)]``, or blocks of a power of two times ``unit``
    rows (whole sequences of ``unit`` tokens, for attention) whose activation stays
    under ``FRESH_BYTES_MAX``, each block a row count oneDNN is given
    (``onednn_rows``; else one range).

    Why: BERT-base's QKV output (38 MB) and FFN intermediate (50 MB) at 4096 tokens
    are above what glibc reuses; allocated afresh at each layer they are page-faulted
    in again (measured on the Intel Xeon dev VM, BERT-base 1 thread, forward CPU
    time: 32x128 179k page faults, 5068 ms; in row blocks 0, 4721 ms; 64x256 1.78M
    -> 25k, 22107 -> 19273 ms)."""
    per_unit = max(width * element_size * unit, 1)
    if unit < 1 or rows * width * element_size <= FRESH_BYTES_MAX or per_unit > FRESH_BYTES_MAX:
        return [(0, rows)]
    block = unit << ((FRESH_BYTES_MAX // per_unit).bit_length() - 1)
    if onednn_rows(block) != block:
        return [(0, rows)]
    return [(r, min(r + block, rows)) for r in range(0, rows, block)]


def layer_blocks(tokens: int, weights, element_size: int, seqlen: int | None = None):
    """How an encoder runs its layers on ``tokens`` packed tokens with GEMM weights
    ``weights`` (one layer's QKV, attention output, FFN in, FFN out): ``(rows,
    attention_blocks, ffn_blocks)``. ``rows`` (``layer_rows``) is the row count to pad
    the tokens to (zero rows, one sequence of their own); ``ffn_blocks`` are row
    ranges ``(begin, end)`` for the FFN and ``attention_blocks`` ``(begin, end,
    sequences)`` for QKV + attention + output projection (``row_blocks``), where
    ``sequences`` is the number of whole sequences in the block, None: all of them.
    Attention is split only when every sequence is ``seqlen`` tokens (a batch
    without padding) and no rows were added."""
    weights = list(weights)
    rows = layer_rows(tokens, weights)
    ffn = row_blocks(rows, weights[2].shape[0], element_size)
    attention = [(0, rows, None)]
    if seqlen and rows == tokens and tokens % seqlen == 0:
        blocks = row_blocks(rows, weights[0].shape[0], element_size, seqlen)
        if len(blocks) > 1:
            attention = [(b, e, (e - b) // seqlen) for b, e in blocks]
    return rows, attention, ffn


#: oneDNN's fp32 inner-product weight layout on AVX-512: [N / 64][K][64] (``Ab64a``),
#: i.e. the C++ GEMM's panels 64 wide. Checked on each weight at load (see
#: ``PackedWeight.of``); another layout just runs oneDNN at every row count.
_ONEDNN_PANEL = 64

#: oneDNN's bf16 inner-product weight layout on AMX machines: [N / 32][K / 2][32][2]
#: (k pairs), the C++ bf16 GEMM's panels (``_C.cpu.bgemm_pack``, kernels/cpu/bgemm.h;
#: K padded to 32). Checked on each weight at load, like the fp32 panels.
_BF16_PANEL = 32


def _bf16_gemm_amx() -> bool:
    """The C++ bf16 GEMM runs on AMX tiles here (its portable kernel is for tests and
    CPUs without AMX, where oneDNN is faster)."""
    try:
        return _kernels is not None and _kernels.bf16_gemm_isa("auto") == "amx"
    except (AttributeError, RuntimeError, ValueError):  # a build without the bf16 GEMM
        return False


#: Whether bf16 weights oneDNN holds run few rows on the C++ bf16 GEMM (AMX).
BF16_PANELS: bool = _bf16_gemm_amx()

#: Rows up to which a bf16 weight oneDNN holds in the C++ bf16 GEMM's panels runs on
#: that GEMM (reading oneDNN's buffer in place), above on oneDNN. Whole bf16 forwards,
#: 2 threads, Intel Xeon (Emerald Rapids) AMX VM, one process, the limits alternating
#: round by round (``benchmarks/experiments/bf16_few_rows.py --limits A,B``), limit A
#: time / limit B time. 128 -> 512: MiniLM 1x192 1.30x, 1x256 1.24x, 4x128 1.12x.
#: 512 -> 1024, once the GEMM's erf GELU cost less (``gelu_erf_bf16``) and its tasks
#: were handed out guided: MiniLM 6x128 1.24-1.32x, 8x128 1.02-1.15x (three runs),
#: 16x64 1.01x; BERT-base 4x192 1.22x, 8x128 1.29x (before those two changes 8x128 read
#: 0.91-1.03x). Not beyond: MiniLM 12x128 0.97x (1024 -> 2048), 16x128 0.94x and 32x128
#: 0.86x (1024 -> 4096), where oneDNN's larger blocking wins.
#: benchmarks/results/cpu-intel-xeon-amx-2t/notes.md, "bf16 few rows" and the sessions
#: of 2026-11-28 (last), 2026-11-29 (second) and 2026-11-29 (fourth).
BF16_SMALL_ROWS = 1024


def small_rows(dtype: torch.dtype) -> int:
    """Rows up to which a weight of ``dtype`` with C++ panels runs on the C++ GEMM."""
    return BF16_SMALL_ROWS if dtype == torch.bfloat16 else SMALL_ROWS


def _onednn_panels(packed: Tensor, N: int, K: int) -> Tensor | None:
    """oneDNN's buffer of an fp32 weight read as ``[N / 64, K, 64]`` panels, or of a
    bf16 weight (where ``BF16_PANELS``) as ``[N / 32, K2, 32, 2]`` (K2: K rounded up
    to 32, halved): a view of the same memory (valid while ``packed`` lives), or None
    where its size differs."""
    data_ptr = getattr(torch.ops.mkldnn, "data_ptr", None)
    if data_ptr is None or N * K == 0:
        return None
    if packed.dtype == torch.float32:
        shape, ctype = (-(-N // _ONEDNN_PANEL), K, _ONEDNN_PANEL), ctypes.c_float
    elif packed.dtype == torch.bfloat16 and BF16_PANELS:
        shape, ctype = (-(-N // _BF16_PANEL), -(-K // 32) * 16, _BF16_PANEL, 2), ctypes.c_uint16
    else:
        return None
    numel = shape[0] * shape[1] * shape[2] * (shape[3] if len(shape) == 4 else 1)
    if int(torch.ops.mkldnn._nbytes(packed)) != numel * packed.element_size():
        return None
    buf = (ctype * numel).from_address(int(data_ptr(packed)))
    return torch.frombuffer(buf, dtype=packed.dtype).view(*shape)


#: Activation -> (oneDNN post-op, its algorithm) of ``_linear_pointwise``. ReLU is
#: applied after (torch's ``relu_``): oneDNN's ReLU post-op turns NaN into 0.
_ONEDNN_POST_OPS = {
    None: ("none", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("none", ""),
}


def linear_panels(
    x: Tensor, packed: Tensor, bias: Tensor | None, out_features: int, activation: str | None
) -> Tensor:
    """``activation(x @ W.T + bias)`` for W held packed: oneDNN's blocked weight
    (an ``mkldnn`` tensor) on oneDNN with bias + activation as post-ops, own panels
    on the C++ GEMM with them in its epilogue (fp32 ``linear_packed``, bf16
    ``blinear``)."""
    b = None if bias is None else bias.contiguous()
    if packed.is_mkldnn:
        post_op, algorithm = _ONEDNN_POST_OPS[activation]
        lead, K = x.shape[:-1], x.shape[-1]
        x = x.reshape(-1, K).contiguous()
        M = x.shape[0]
        rows = onednn_rows(M)
        if rows != M:  # zero rows up to a size oneDNN is given (see ``onednn_rows``)
            x = torch.cat([x, x.new_zeros(rows - M, K)])
        out = torch.ops.mkldnn._linear_pointwise(x, packed, b, post_op, [], algorithm)
        out = (out[:M] if rows != M else out).view(*lead, out.shape[-1])
        return out.relu_() if activation == "relu" else out
    if packed.dtype == torch.bfloat16:
        return _kernels.blinear(x.contiguous(), packed, b, out_features, activation)
    return _kernels.linear_packed(x.contiguous(), packed, b, out_features, activation, True)


#: Largest packed / plain size ratio a model keeps a weight packed for oneDNN at:
#: oneDNN's blocked layout pads the output rows (to 64 on AVX-512), nothing for the
#: models' widths (multiples of 64) but +33% for a 96-wide toy layer; such a weight
#: takes the next form instead (own panels in fp32; in bf16 the bf16 GEMM's panels
#: where it runs on AMX, else plain).
MAX_PADDING = 1.05


def pack_owned(weight: Tensor) -> PackedWeight | None:
    """``weight`` packed for the GEMM it runs on (``ROUTE``), or None: kept plain.
    What ``from_pretrained`` does to each linear weight a model owns."""
    storage = storage_for(weight.dtype)
    if storage == "onednn" and weight.numel():
        packed = PackedWeight.of(weight, "onednn")
        if packed.packed_nbytes <= MAX_PADDING * weight.numel() * weight.element_size():
            return packed
        # fp32: own panels; bf16: plain (torch's GEMM), or the bf16 GEMM's panels on AMX
        own = weight.dtype == torch.float32 or BF16_PANELS
        storage = storage_for(weight.dtype, "own") if own else None
    return None if storage is None else PackedWeight.of(weight, storage)


def _readable_panels(packed: Tensor, w: Tensor) -> int:
    """The panel width the C++ GEMM can read oneDNN's ``packed`` form of ``w`` at (64
    for fp32, 32 for bf16), or 0: its buffer must hold exactly ``w`` in that layout
    (zero-padded), compared bit for bit."""
    if _kernels is None or _ONEDNN_PANEL % panel_width():
        return 0
    view = _onednn_panels(packed, *w.shape)
    if view is None:
        return 0
    if w.dtype == torch.bfloat16:
        want = _kernels.bgemm_pack(w)
        return _BF16_PANEL if torch.equal(view.view(torch.int16), want.view(torch.int16)) else 0
    N, K = w.shape
    rows = torch.nn.functional.pad(w, (0, 0, 0, view.shape[0] * _ONEDNN_PANEL - N))
    same = torch.equal(view, rows.view(-1, _ONEDNN_PANEL, K).transpose(1, 2))
    return _ONEDNN_PANEL if same else 0


_READ_ONLY = (
    "bertfast: this weight is packed for the CPU GEMM and owned by the model "
    "(one copy, read-only); call model.unpack_weights(), edit the weights, then "
    "model.refresh() (see README, 'Weights')"
)


class PackedWeight(Tensor):
    """A read-only ``[N, K]`` weight stored only in a CPU GEMM's packed form: oneDNN's
    blocked layout (fp32 or bf16; ``panel_width``: the C++ GEMM's panel width where it
    reads that buffer in place, else 0) or the C++ GEMM's panels (fp32: ``[P, K, NR]``;
    bf16: the bf16 GEMM's k pairs ``[P, K2, 32, 2]``).

    ``cpu.linear`` multiplies with the packed form directly; any other torch op sees
    the ``[N, K]`` values (unpacked for that op). Ops that write into it, or into a
    view of it, raise ``RuntimeError`` naming the way to edit weights.
    """

    _packed: Tensor
    _nr: int

    @staticmethod
    def __new__(cls, packed: Tensor, shape, nr: int):
        out = Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=packed.dtype, device=packed.device, requires_grad=False
        )
        out._packed = packed
        out._nr = int(nr)
        out._out_features = int(shape[0])
        # own panels: the packed tensor; oneDNN's (nr = 64): a view of its buffer
        out._panels = packed if not packed.is_mkldnn else None
        if packed.is_mkldnn and nr:
            out._panels = _onednn_panels(packed, *shape)
        return out

    def __init__(self, packed, shape, nr):  # state is set in __new__
        super().__init__()

    @classmethod
    def of(cls, weight: Tensor, storage: str | None = None) -> PackedWeight:
        """``weight`` packed into ``storage`` ("onednn" / "own"; default: the form
        ``storage_for`` gives its dtype)."""
        storage = storage or storage_for(weight.dtype)
        w = weight.detach().contiguous()
        if storage == "onednn" and w.numel() == 0 and w.dtype == torch.float32:
            storage = "own"  # oneDNN has no primitive for an empty weight
        if storage == "onednn":
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            return cls(packed, w.shape, _readable_panels(packed, w))
        if storage == "own" and w.dtype == torch.float32:
            return cls(pack(w), w.shape, panel_width())
        if storage == "own" and w.dtype == torch.bfloat16 and _has_bgemm():
            return cls(_kernels.bgemm_pack(w), w.shape, _BF16_PANEL)
        raise ValueError(f"PackedWeight: no {storage!r} packed form for a {w.dtype} weight")

    @property
    def storage(self) -> str:
        return "onednn" if self._packed.is_mkldnn else "own"

    def dense(self) -> Tensor:
        """The weight as a plain (new, writable) ``[N, K]`` tensor."""
        if self._packed.is_mkldnn:
            return self._packed.to_dense()
        N, K = self.shape
        if self._packed.dim() == 4:  # the bf16 GEMM's k-pair panels [P, K2, 32, 2]
            P, K2, nr, _ = self._packed.shape
            return self._packed.permute(0, 2, 1, 3).reshape(P * nr, 2 * K2)[:N, :K].clone()
        return unpack(self._packed, N, K, self._nr)

    @property
    def packed_nbytes(self) -> int:
        if self._packed.is_mkldnn:
            return int(torch.ops.mkldnn._nbytes(self._packed))
        return self._packed.numel() * self._packed.element_size()

    def __repr__(self, *, tensor_contents=None):
        return (
            f"PackedWeight(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"storage={self.storage!r}, panel_width={self._nr})"
        )

    def __deepcopy__(self, memo):
        if self._packed.is_mkldnn:
            return PackedWeight.of(self.dense(), "onednn")
        return PackedWeight(self._packed.clone(), self.shape, self._nr)

    def __reduce_ex__(self, proto):  # pickles / saves as the plain weight
        return self.dense().__reduce_ex__(proto)

    def _same(self) -> PackedWeight:
        """Another handle on the same packed weight (``detach``, ``.data``)."""
        out = PackedWeight(self._packed, self.shape, self._nr)
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return read_only_dispatch(PackedWeight, _ReadOnlyView, _READ_ONLY, func, args, kwargs)


def read_only_dispatch(owner, view, message: str, func, args, kwargs):
    """``__torch_dispatch__`` of a model-owned read-only weight class ``owner``
    (``dense()`` gives its values, ``_same()`` another handle on it) and of its views
    (``view``, a :class:`_ReadOnlyView`): writes raise ``message``; ``detach`` /
    ``alias`` keep the weight; any other op sees the values; views it returns refuse
    writes (they would land in a temporary). Shared by PackedWeight and
    ``cpu.int8.QuantizedWeight``."""
    kwargs = kwargs or {}
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        raise RuntimeError(message)
    if func in _SAME_WEIGHT and isinstance(args[0], owner):
        return args[0]._same()  # w.detach(), w.data, nn.Parameter(w): the same weight

    def unwrap(t):
        if isinstance(t, owner):
            return t.dense()
        return t._dense if isinstance(t, _ReadOnlyView) else t

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if any(r.alias_info is not None for r in schema.returns):
        return tree_map(lambda t: view(t) if isinstance(t, Tensor) else t, out)
    return out


_SAME_WEIGHT = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


class _ReadOnlyView(Tensor):
    """A view of a :class:`PackedWeight`: readable, refuses writes."""

    @staticmethod
    def __new__(cls, dense: Tensor):
        out = Tensor._make_wrapper_subclass(
            cls,
            dense.shape,
            strides=dense.stride(),
            dtype=dense.dtype,
            device=dense.device,
            requires_grad=False,
        )
        out._dense = dense
        return out

    def __init__(self, dense):
        super().__init__()

    def __repr__(self, *, tensor_contents=None):
        return f"ReadOnlyWeightView({self._dense!r})"

    __torch_dispatch__ = PackedWeight.__dict__["__torch_dispatch__"]


def is_packed(t) -> bool:
    return isinstance(t, PackedWeight)


def tensor_bytes(t: Tensor) -> int:
    """Bytes a tensor holds (its packed form for a :class:`PackedWeight`)."""
    if isinstance(t, PackedWeight):
        return t.packed_nbytes
    return t.untyped_storage().nbytes()


def can_pack(backend: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on ``device``/``dtype`` with ``backend`` runs its linear
    layers on a packed CPU GEMM (then ``from_pretrained`` packs them at load)."""
    if _kernels is None or torch.device(device).type != "cpu" or storage_for(dtype) is None:
        return False
    return dispatch.resolve(backend, "cpu").name == "cpu"
