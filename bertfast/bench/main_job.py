"""The main job: text in, sentence vectors out, bertfast's :class:`~bertfast.Embedder`
vs sentence-transformers (``benchmarks/main_job.py`` is its command line).

Each provider encodes the whole text list (the shipped accuracy corpus,
:func:`~bertfast.bench.accuracy.load_corpus`, or its first ``limit`` texts) with
``batch_size`` 32, the way a user would: ``SentenceTransformer.encode`` or
``Embedder.encode``, tokenisation, batching and pooling included. The providers fit
the harness of :mod:`bertfast.bench.isolated`: ``load`` returns a callable that takes
a token batch (ignored: a tiny dummy, :data:`DUMMY_BATCH`) and returns the fp32 CPU
vectors ``[n_texts, dim]`` of one full pass, so each one runs in a
:class:`~bertfast.bench.isolated.Worker` of its own and ``prepare`` hands its vectors
back for the parity check.

:func:`run` times the passes: rounds rotating the provider order, each provider
settling (:data:`~bertfast.bench.timing.SETTLE_S` of untimed passes, at least one)
before ``n`` timed passes. Per provider: the median seconds per pass, texts/s,
tokens/s (real tokens, counted once here with bertfast's tokenizer), ``x
sentence-transformers`` (sentence-transformers fp32 median / the row's median) and the
cosine of each sentence's vector against sentence-transformers fp32 (min, mean).
:func:`format_markdown` and :func:`write_json` report it; the targets
(:data:`TARGETS`) are tracked, never asserted.
"""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .isolated import ISOLATION_MODES, LocalRunner, Worker
from .providers import Provider
from .report import write_json as _write_json
from .timing import SETTLE_S, Stats, cpu_info, device_name
from .workload import make_batch

__all__ = [
    "BATCH_SIZE",
    "REFERENCE",
    "PROVIDERS",
    "TARGETS",
    "DUMMY_BATCH",
    "TextProvider",
    "SentenceTransformersProvider",
    "BertfastEmbedderProvider",
    "provider_by_name",
    "load_texts",
    "count_tokens",
    "MainJobResult",
    "run",
    "format_markdown",
    "write_json",
]

BATCH_SIZE = 32
#: The row the ratios and the parity are taken against.
REFERENCE = "sentence-transformers"
#: Every provider, in the default order.
PROVIDERS = (
    "sentence-transformers",
    "sentence-transformers-bf16",
    "bertfast",
    "bertfast-bf16",
    "bertfast-int8",
)
#: The issue's targets, ``x sentence-transformers`` fp32 (bf16: on a CPU with AMX).
TARGETS = {"bertfast": 1.8, "bertfast-bf16": 6.0}
#: What the harness passes to ``run``; the main job's callables ignore it.
DUMMY_BATCH = make_batch([4], vocab_size=30522)


def load_texts(limit: int | None = None) -> list[str]:
    """The accuracy corpus (599 real texts, 1 to 256+ tokens), or its first ``limit``."""
    from .accuracy import load_corpus

    texts = load_corpus()
    return texts[:limit] if limit else texts


def count_tokens(model_path: str, texts: Sequence[str]) -> tuple[int, int | None]:
    """``(tokens, max_length)``: the real tokens (special tokens included, after
    truncation) bertfast's tokenizer makes of ``texts`` with the token limit
    ``Embedder.from_pretrained`` picks (the checkpoint's ``max_seq_length``, capped by
    the model's)."""
    from ..embedder import read_sentence_config
    from ..tokenizer import Tokenizer, model_max_length

    limit = model_max_length(model_path)
    max_length = read_sentence_config(model_path).max_seq_length or limit
    if limit is not None and max_length is not None:
        max_length = min(max_length, limit)
    tokenizer = Tokenizer.from_pretrained(model_path, max_length=max_length)
    return sum(len(ids) for ids, _ in tokenizer.tokenize(list(texts))), max_length


class TextProvider(Provider):
    """One way of encoding the text list. :meth:`encoder` returns ``texts -> [N, dim]``;
    ``load`` wraps it in the harness's ``run(batch)`` (a full pass, ``batch`` ignored)."""

    is_baseline = False
    precision = "float32"

    def __init__(self, name: str, limit: int | None = None, batch_size: int = BATCH_SIZE):
        self.name = name
        self.limit = limit
        self.batch_size = batch_size

    def encoder(self, model_path: str) -> Callable[[list[str]], torch.Tensor]:
        raise NotImplementedError

    def load(self, model_path, device, dtype):
        if torch.device(device).type != "cpu":
            raise ValueError(f"the main job runs on the CPU, not {device}")
        texts = load_texts(self.limit)
        encode = self.encoder(model_path)

        def run(batch=None) -> torch.Tensor:
            return encode(texts).to("cpu", torch.float32)

        run.info = {"texts": len(texts), "batch_size": self.batch_size}
        return run


class SentenceTransformersProvider(TextProvider):
    """``SentenceTransformer(path, device="cpu").encode(texts, batch_size=32,
    convert_to_tensor=True, show_progress_bar=False)``, the model in ``dtype``
    (``.to(torch.bfloat16)`` for the bf16 row)."""

    def __init__(self, name: str, dtype: torch.dtype = torch.float32, **kwargs):
        super().__init__(name, **kwargs)
        self.dtype = dtype
        self.precision = str(dtype).replace("torch.", "")

    def unavailable(self, device, dtype):
        try:
            import sentence_transformers  # noqa: F401
        except ImportError as exc:
            return f"sentence-transformers is not installed ({exc})"
        return None

    def encoder(self, model_path):
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(model_path, device="cpu")
        if self.dtype != torch.float32:
            model = model.to(self.dtype)
        batch_size = self.batch_size

        def encode(texts):
            return model.encode(
                texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False
            )

        return encode


class BertfastEmbedderProvider(TextProvider):
    """``Embedder.from_pretrained(path, dtype=..., quantize=...).encode(texts,
    batch_size=32, convert_to="torch", show_progress=False)``."""

    def __init__(
        self,
        name: str,
        dtype: torch.dtype = torch.float32,
        quantize: str | None = None,
        **kwargs,
    ):
        super().__init__(name, **kwargs)
        self.dtype = dtype
        self.quantize = quantize
        self.precision = quantize or str(dtype).replace("torch.", "")

    def unavailable(self, device, dtype):
        if self.quantize:
            from ..ops.cpu import int8 as quant

            return quant.unsupported_reason(device, self.dtype)
        return None

    def encoder(self, model_path):
        from ..embedder import Embedder

        embedder = Embedder.from_pretrained(model_path, dtype=self.dtype, quantize=self.quantize)
        batch_size = self.batch_size

        def encode(texts):
            return embedder.encode(
                texts, batch_size=batch_size, convert_to="torch", show_progress=False
            )

        return encode


def provider_by_name(
    name: str, limit: int | None = None, batch_size: int = BATCH_SIZE
) -> TextProvider:
    """One of :data:`PROVIDERS` (``ValueError`` listing them for another name)."""
    kw = {"limit": limit, "batch_size": batch_size}
    if name == "sentence-transformers":
        return SentenceTransformersProvider(name, **kw)
    if name == "sentence-transformers-bf16":
        return SentenceTransformersProvider(name, torch.bfloat16, **kw)
    if name == "bertfast":
        return BertfastEmbedderProvider(name, **kw)
    if name == "bertfast-bf16":
        return BertfastEmbedderProvider(name, torch.bfloat16, **kw)
    if name == "bertfast-int8":
        return BertfastEmbedderProvider(name, quantize="int8", **kw)
    raise ValueError(f"unknown provider {name!r}; choose from {', '.join(PROVIDERS)}")


@dataclass
class MainJobResult:
    """What :func:`run` measured: ``header`` (the run's facts), ``rows`` (one per
    provider that ran, in the order asked), ``skipped`` (name -> reason) and
    ``vectors`` (name -> ``[n_texts, dim]`` of its first pass; not in the JSON)."""

    header: dict
    rows: list[dict]
    skipped: dict[str, str] = field(default_factory=dict)
    vectors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def row(self, name: str) -> dict:
        return next(r for r in self.rows if r["provider"] == name)


def _open(provider, model_path: str, isolation: str, threads: int):
    if isolation == "process":
        return Worker(provider, model_path, "cpu", torch.float32, threads=threads)
    return LocalRunner(provider, model_path, "cpu", torch.float32)


def run(
    model_path: str,
    providers: Sequence[str] = PROVIDERS,
    rounds: int = 3,
    n: int = 2,
    limit: int | None = None,
    threads: int | None = None,
    isolation: str = "process",
    settle_s: float = SETTLE_S,
    batch_size: int = BATCH_SIZE,
    command: str | None = None,
    say: Callable[[str], None] = print,
) -> MainJobResult:
    """Time full passes of the text list per provider (see the module doc).

    ``threads``: every provider's torch threads (default: this process's); with
    ``isolation="process"`` each provider runs in a worker of its own, ``"inline"``
    loads them all here. A provider that cannot run or load is skipped with its reason
    (``result.skipped``). Unknown names, bad counts: ``ValueError``."""
    unknown = [p for p in providers if p not in PROVIDERS]
    if unknown or not providers:
        raise ValueError(
            f"unknown provider(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"choose from {', '.join(PROVIDERS)}"
        )
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, not {isolation!r}")
    for what, value in (("rounds", rounds), ("n", n), ("threads", threads), ("limit", limit)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{what} must be a whole number of at least 1, not {value!r}")
    if threads is not None and isolation == "inline":
        torch.set_num_threads(threads)
    threads = threads or torch.get_num_threads()
    model_path = str(model_path)
    texts = load_texts(limit)
    tokens, max_length = count_tokens(model_path, texts)

    header = _header(model_path, threads, isolation, texts, tokens, max_length, batch_size)
    header.update(rounds=rounds, n=n, settle_s=settle_s, command=command)
    result = MainJobResult(header, [])
    runners: dict[str, object] = {}
    load_s: dict[str, float] = {}
    first_s: dict[str, float] = {}
    precision: dict[str, str] = {}
    try:
        for name in dict.fromkeys(providers):
            pr = provider_by_name(name, limit, batch_size)
            why = pr.unavailable("cpu", torch.float32)
            if why:
                result.skipped[name] = why
                say(f"  skip {name}: {why}")
                continue
            t0 = time.perf_counter()
            runner = None
            try:
                runner = _open(pr, model_path, isolation, threads)
                load_s[name] = time.perf_counter() - t0
                result.vectors[name], first_s[name] = runner.prepare(DUMMY_BATCH)
            except Exception as exc:  # reported, not fatal: the other rows still run
                result.skipped[name] = f"failed ({type(exc).__name__}: {exc})"
                say(f"  skip {name}: {result.skipped[name]}")
                if runner is not None:
                    runner.close()
                continue
            runners[name] = runner
            precision[name] = pr.precision
            say(f"  {name}: loaded, warm pass {first_s[name]:.2f} s")

        names = list(runners)
        times: dict[str, list[float]] = {name: [] for name in names}
        for k in range(rounds):
            j = k % max(len(names), 1)
            for name in names[j:] + names[:j]:
                times[name] += runners[name].timed(n, settle_s=settle_s)
            say(
                f"  round {k + 1}/{rounds}: "
                + ", ".join(f"{m} {Stats(times[m]).median:.2f} s" for m in names)
            )
        info = {name: runners[name].info for name in names}
    finally:
        for runner in runners.values():
            runner.close()

    ref = result.vectors.get(REFERENCE)
    ref_median = Stats(times[REFERENCE]).median if REFERENCE in times else None
    for name in names:
        st = Stats(times[name])
        cos = None
        if ref is not None:
            cos = F.cosine_similarity(result.vectors[name], ref, dim=-1)
        result.rows.append(
            {
                "provider": name,
                "precision": precision[name],
                "median_s": st.median,
                "iqr_s": st.iqr,
                "min_s": st.min,
                "times_s": times[name],
                "texts_per_s": len(texts) / st.median,
                "tokens_per_s": tokens / st.median,
                "x_reference": None if ref_median is None else ref_median / st.median,
                "cos_min": None if cos is None else float(cos.min()),
                "cos_mean": None if cos is None else float(cos.mean()),
                "dim": int(result.vectors[name].shape[-1]),
                "load_s": load_s[name],
                "warm_pass_s": first_s[name],
                "info": info[name],
            }
        )
    return result


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _header(model_path, threads, isolation, texts, tokens, max_length, batch_size) -> dict:
    from ..presets import display_name

    cpu = cpu_info()
    flags = set(cpu["flags"] or [])
    return {
        "model": display_name(model_path),
        "model_path": model_path,
        # device_name ends in this process's thread count; the workers' is ``threads``
        "device": device_name("cpu").rsplit("-", 1)[0] + f"-{threads}t",
        "cpu": cpu,
        "amx": bool(flags & {"amx_bf16", "amx_tile"}),
        "threads": threads,
        "isolation": isolation,
        "torch": torch.__version__,
        "sentence_transformers": _version("sentence-transformers"),
        "bertfast": _version("bertfast"),
        "corpus": "bertfast/data/accuracy_corpus.txt",
        "texts": len(texts),
        "tokens": tokens,
        "max_length": max_length,
        "batch_size": batch_size,
        "reference": REFERENCE,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _target_lines(result: MainJobResult) -> list[str]:
    lines = []
    names = {r["provider"] for r in result.rows}
    for name, want in TARGETS.items():
        label = f"`{name}` >= {want:g}x {REFERENCE}"
        if name == "bertfast-bf16":
            label += " (on a CPU with AMX)"
        if name not in names or REFERENCE not in names:
            lines.append(f"- {label}: not measured")
            continue
        got = result.row(name)["x_reference"]
        if name == "bertfast-bf16" and not result.header["amx"]:
            verdict = "no AMX on this CPU, target not applicable"
        else:
            verdict = "met" if got >= want else "not met"
        lines.append(f"- {label}: {got:.2f}x, {verdict}")
    return lines


def format_markdown(result: MainJobResult) -> str:
    """The run's header, the table (one row per provider) and the targets."""
    h = result.header
    cpu = h["cpu"]
    flags = " ".join(cpu["flags"] or []) or "unknown"
    per = "each in a worker process of its own" if h["isolation"] == "process" else "inline"
    lines = [
        "# The main job: text in, sentence vectors out",
        "",
        f"- model: {h['model']} (`{h['model_path']}`)",
        f"- machine: {h['device']}; CPU: {cpu['model']}, {cpu['logical_cpus']} logical CPUs; "
        f"flags: {flags}",
        f"- threads: {h['threads']} per provider, {per}",
        f"- torch {h['torch']}, sentence-transformers {h['sentence_transformers']}, "
        f"bertfast {h['bertfast']}",
        f"- texts: {h['texts']} ({h['corpus']}), {h['tokens']} tokens (bertfast's tokenizer, "
        f"max_length {h['max_length']}), batch_size {h['batch_size']}",
        f"- timing: {h['rounds']} round(s) rotating the provider order; per round each "
        f"provider settles {h['settle_s'] * 1e3:.0f} ms (at least one untimed pass), then "
        f"{h['n']} timed pass(es); medians over all timed passes",
    ]
    if h.get("command"):
        lines.append(f"- command: `{h['command']}`")
    head = [
        "provider",
        "precision",
        "median s / pass",
        "IQR s",
        "texts/s",
        "tokens/s",
        f"x {REFERENCE}",
        "cos min",
        "cos mean",
    ]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result.rows:
        ref = r["provider"] == REFERENCE
        cells = [
            r["provider"],
            r["precision"],
            f"{r['median_s']:.3f}",
            f"{r['iqr_s']:.3f}",
            f"{r['texts_per_s']:.1f}",
            f"{r['tokens_per_s']:.0f}",
            _fmt(r["x_reference"], ".2f"),
            "ref" if ref else _fmt(r["cos_min"], ".6f"),
            "ref" if ref else _fmt(r["cos_mean"], ".6f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"x {REFERENCE}: its fp32 median / the row's median (> 1: faster), same run, same "
        f"texts. cos: per-sentence cosine of the row's vectors against {REFERENCE} fp32.",
    ]
    for name, why in result.skipped.items():
        lines.append(f"- skipped {name}: {why}")
    lines += ["", "Targets (tracked, not asserted):", *_target_lines(result)]
    return "\n".join(lines) + "\n"


def write_json(path: str, result: MainJobResult) -> None:
    """The header, the skipped providers and the rows (raw times included)."""
    _write_json(path, dict(result.header, skipped=result.skipped), result.rows)
