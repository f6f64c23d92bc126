"""The accuracy contract of the low-precision paths (the ``bertfast accuracy``
command: bertfast/cli/accuracy.py).

Sentence vectors of each variant are compared with **bertfast fp32** on the corpus
the package ships (``bertfast/data/accuracy_corpus.txt``: 599 lines, 1 to 256+
WordPiece tokens, 20+ languages, code, numbers, URLs, emoji; written by
``tools/make_accuracy_corpus.py`` in the repository, which the package does not ship):

- per sentence, the cosine between the variant's vector and the fp32 one (min and
  mean over the corpus are reported);
- retrieval: the 100 queries of ``bertfast/data/accuracy_queries.txt`` (paraphrases
  of corpus sentences) against the corpus, the top-:data:`TOP_K` neighbours under the
  variant (queries and corpus both encoded by it) vs under fp32, the mean overlap.

Variants: ``bertfast-bf16`` (``dtype=torch.bfloat16``), ``bertfast-int8``
(``quantize="int8"``), and the peers a user would try for int8 on CPU,
``onnxruntime-int8`` (dynamic quantization) and ``ctranslate2-int8``
(:mod:`bertfast.bench.peers`, same conversions and caches). ``transformers-fp32`` is
the independent check of the reference itself. Peers and transformers get the token
ids of bertfast's tokenizer (the same truncation) and are pooled by the same
:func:`bertfast.embedder.pool`, so only the encoder differs. A variant that cannot
run here (a runtime not installed) is reported as skipped, with the reason.

The thresholds are :data:`CONTRACT` (the tests in ``tests/test_accuracy_contract.py``
import it): the contract lives here once.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .providers import TransformersProvider
from .registry import INT8_PEERS, provider_by_name

__all__ = [
    "CONTRACT",
    "REFERENCE_MIN_COSINE",
    "TOP_K",
    "VARIANTS",
    "INT8_PEERS",
    "Unavailable",
    "VariantResult",
    "load_corpus",
    "load_queries",
    "data_file",
    "load_embedder",
    "encode_texts",
    "variant_encoder",
    "cosines",
    "retrieval_overlap",
    "evaluate",
    "run",
    "format_markdown",
    "contract_failures",
]

#: The accuracy contract (issue 15), per variant: the floor of each statistic against
#: bertfast fp32 sentence vectors on the shipped corpus.
CONTRACT: dict[str, dict[str, float]] = {
    "bertfast-bf16": {"min_cosine": 0.999},
    "bertfast-int8": {"min_cosine": 0.99, "mean_cosine": 0.997, "retrieval_overlap": 0.90},
}
#: bertfast int8 must be no worse than the int8 peers (``INT8_PEERS``, from
#: bertfast.bench.registry) on the same sentences (min and mean cosine).
#: The reference is checked too: bertfast fp32 vs transformers / sentence-transformers fp32.
REFERENCE_MIN_COSINE = 0.99999
#: Neighbours per query in the retrieval check.
TOP_K = 10
#: Every variant ``bertfast accuracy`` knows, in report order.
VARIANTS = ("transformers-fp32", "bertfast-bf16", "bertfast-int8", *INT8_PEERS)

_DATA = Path(__file__).resolve().parent.parent / "data"


def data_file(name: str) -> Path:
    """A file of the package's ``data`` folder (the corpus and the queries)."""
    return _DATA / name


def _lines(name: str) -> list[str]:
    text = data_file(name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def load_corpus() -> list[str]:
    """The shipped accuracy corpus, one text per line."""
    return _lines("accuracy_corpus.txt")


def load_queries() -> list[str]:
    """The 100 retrieval queries (paraphrases of corpus sentences)."""
    return _lines("accuracy_queries.txt")


class Unavailable(Exception):
    """A variant that cannot run in this installation; ``str()`` says why."""


# ---------------------------------------------------------------- encoders
def _supports_quantize() -> bool:
    from ..embedder import Embedder

    return "quantize" in inspect.signature(Embedder.from_pretrained).parameters


def load_embedder(path, dtype: torch.dtype = torch.float32, quantize: str | None = None):
    """``Embedder.from_pretrained`` on CPU; :class:`Unavailable` when this bertfast has
    no ``quantize`` argument yet."""
    from ..embedder import Embedder

    if quantize is None:
        return Embedder.from_pretrained(path, dtype=dtype)
    if not _supports_quantize():
        raise Unavailable(
            f"bertfast int8 is not available yet: Embedder.from_pretrained takes no "
            f"quantize argument in this version (asked quantize={quantize!r})"
        )
    return Embedder.from_pretrained(path, dtype=dtype, quantize=quantize)


def encode_texts(embedder, texts: Sequence[str]) -> torch.Tensor:
    """Normalised fp32 sentence vectors ``[N, dim]`` (batched by length)."""
    vectors = embedder.encode(list(texts), convert_to="torch", normalize=True, show_progress=False)
    return vectors.float().cpu()


def _runner_encoder(run: Callable, embedder) -> Callable[[Sequence[str]], torch.Tensor]:
    """Texts -> normalised vectors through ``run(Batch) -> last hidden [B, S, H]``, on
    bertfast's token ids, batched by length like :meth:`Embedder.encode`, pooled by
    bertfast's :func:`pool`."""
    from ..embedder import pool, token_budget_batches
    from .workload import Batch

    tokenizer = embedder.tokenizer

    def encode(texts: Sequence[str]) -> torch.Tensor:
        items = tokenizer.tokenize(list(texts))
        order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))
        out = torch.empty((len(items), embedder.dim), dtype=torch.float32)
        for index in token_budget_batches([len(items[i][0]) for i in order], order, 32, 16384):
            t = tokenizer.collate([items[i] for i in index])
            lengths = [len(items[i][0]) for i in index]
            batch = Batch(t["input_ids"], t["attention_mask"], t["token_type_ids"], lengths)
            with torch.inference_mode():
                hidden = run(batch)
            vectors = pool(hidden.float().cpu(), t["attention_mask"], embedder.pooling)
            out[torch.tensor(index)] = F.normalize(vectors, dim=-1)
        return out

    return encode


def variant_encoder(
    name: str, path, reference=None, cache_dir: str | None = None
) -> tuple[Callable[[Sequence[str]], torch.Tensor], dict]:
    """``(encode(texts) -> [N, dim] normalised fp32, info)`` for variant ``name``.

    ``reference`` is the bertfast fp32 :class:`~bertfast.Embedder` (its tokenizer and
    pooling serve the peers). Raises :class:`Unavailable` with the reason when the
    variant cannot run here."""
    if name == "bertfast-fp32":
        emb = reference if reference is not None else load_embedder(path)
        return (lambda texts: encode_texts(emb, texts)), {}
    if name == "bertfast-bf16":
        emb = load_embedder(path, dtype=torch.bfloat16)
        return (lambda texts: encode_texts(emb, texts)), {"dtype": "bfloat16"}
    if name == "bertfast-int8":
        emb = load_embedder(path, quantize="int8")
        return (lambda texts: encode_texts(emb, texts)), {"quantize": "int8"}
    if reference is None:
        reference = load_embedder(path)
    if name == "transformers-fp32":
        provider = TransformersProvider("eager")
    elif name in INT8_PEERS:
        provider = provider_by_name(name, "cpu", cache_dir=cache_dir)
    else:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    why = provider.unavailable("cpu", torch.float32)
    if why:
        raise Unavailable(why)
    run = provider.load(str(path), "cpu", torch.float32)
    return _runner_encoder(run, reference), dict(getattr(run, "info", None) or {})


# ---------------------------------------------------------------- statistics
def cosines(vectors: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-row cosine similarity, in float64."""
    return F.cosine_similarity(vectors.double(), reference.double(), dim=-1)


def _top_k(queries: torch.Tensor, corpus: torch.Tensor, k: int) -> torch.Tensor:
    scores = F.normalize(queries.double(), dim=-1) @ F.normalize(corpus.double(), dim=-1).T
    return scores.topk(k, dim=-1).indices


def retrieval_overlap(
    queries: torch.Tensor,
    corpus: torch.Tensor,
    ref_queries: torch.Tensor,
    ref_corpus: torch.Tensor,
    k: int = TOP_K,
) -> torch.Tensor:
    """Per query, the share of its top-``k`` corpus neighbours (cosine) under the
    variant that are also among its top-``k`` under the reference."""
    mine = _top_k(queries, corpus, k).tolist()
    theirs = _top_k(ref_queries, ref_corpus, k).tolist()
    return torch.tensor([len(set(a) & set(b)) / k for a, b in zip(mine, theirs)])


@dataclass
class VariantResult:
    name: str
    status: str  # "ok", "skipped" or "failed"
    reason: str | None = None
    min_cosine: float | None = None
    mean_cosine: float | None = None
    worst_text: str | None = None
    retrieval_overlap: float | None = None
    min_query_overlap: float | None = None
    seconds: float | None = None
    info: dict = field(default_factory=dict)


def evaluate(
    name: str,
    vectors: torch.Tensor,
    query_vectors: torch.Tensor,
    reference: torch.Tensor,
    ref_queries: torch.Tensor,
    texts: Sequence[str],
) -> VariantResult:
    """The statistics of one variant's vectors against the reference's."""
    cos = cosines(vectors, reference)
    overlap = retrieval_overlap(query_vectors, vectors, ref_queries, reference)
    worst = int(cos.argmin())
    return VariantResult(
        name=name,
        status="ok",
        min_cosine=float(cos.min()),
        mean_cosine=float(cos.mean()),
        worst_text=texts[worst][:80],
        retrieval_overlap=float(overlap.mean()),
        min_query_overlap=float(overlap.min()),
    )


@contextlib.contextmanager
def _no_loading_bars() -> Iterator[None]:
    """transformers' progress bars ("Loading weights", from ``from_pretrained`` of the
    transformers row and the peers' conversions) off for the block, as they were after
    it: they would interleave with the report's lines."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def run(
    path,
    variants: Sequence[str] = VARIANTS,
    cache_dir: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Encode corpus and queries with bertfast fp32 and each variant; returns the
    report (a JSON-ready dict: corpus facts, and one :class:`VariantResult` per
    variant under ``"variants"``). transformers' loading progress bars are off
    meanwhile."""
    with _no_loading_bars():
        return _run(path, variants, cache_dir, log)


def _run(path, variants, cache_dir, log) -> dict:
    log = log or (lambda line: None)
    corpus, queries = load_corpus(), load_queries()
    start = time.perf_counter()
    ref_emb = load_embedder(path)
    ref = encode_texts(ref_emb, corpus)
    ref_q = encode_texts(ref_emb, queries)
    ref_seconds = time.perf_counter() - start
    lengths = [len(ids) for ids, _ in ref_emb.tokenizer.tokenize(corpus)]
    log(f"bertfast-fp32 reference: {len(corpus)} texts in {ref_seconds:.1f} s")
    results = []
    for name in variants:
        start = time.perf_counter()
        try:
            encode, info = variant_encoder(name, path, ref_emb, cache_dir)
            vectors, qvectors = encode(corpus), encode(queries)
        except Unavailable as exc:
            results.append(VariantResult(name, "skipped", reason=str(exc)))
            log(f"{name}: skipped ({exc})")
            continue
        except Exception as exc:  # reported in the table, the others still run
            results.append(VariantResult(name, "failed", reason=f"{type(exc).__name__}: {exc}"))
            log(f"{name}: FAILED ({type(exc).__name__}: {exc})")
            continue
        res = evaluate(name, vectors, qvectors, ref, ref_q, corpus)
        res.seconds = time.perf_counter() - start
        res.info = info
        results.append(res)
        log(
            f"{name}: min cosine {res.min_cosine:.6f}, mean {res.mean_cosine:.6f} "
            f"({res.seconds:.1f} s)"
        )
    from ..presets import display_name

    return {
        "model": str(path),
        "model_name": display_name(path),
        "reference": "bertfast-fp32",
        "corpus": {
            "texts": len(corpus),
            "queries": len(queries),
            "tokens_min": min(lengths),
            "tokens_max": max(lengths),
            "tokens_mean": sum(lengths) / len(lengths),
            "max_length": ref_emb.max_length,
        },
        "top_k": TOP_K,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "reference_seconds": ref_seconds,
        "contract": CONTRACT,
        "variants": [asdict(r) for r in results],
    }


def contract_failures(report: dict) -> list[str]:
    """The contract lines a report breaks: variants that ran below a floor, and
    variants that failed (a skipped variant, one that cannot run here, is no failure)."""
    rows = {v["name"]: v for v in report["variants"] if v["status"] == "ok"}
    bad = [
        f"{v['name']} failed: {v['reason']}" for v in report["variants"] if v["status"] == "failed"
    ]
    for name, floors in CONTRACT.items():
        if name not in rows:
            continue
        for stat, floor in floors.items():
            if rows[name][stat] < floor:
                bad.append(f"{name} {stat} {rows[name][stat]:.6f} < {floor}")
    mine = rows.get("bertfast-int8")
    if mine is not None:
        for peer in INT8_PEERS:
            if peer in rows:
                for stat in ("min_cosine", "mean_cosine"):
                    if mine[stat] < rows[peer][stat]:
                        bad.append(
                            f"bertfast-int8 {stat} {mine[stat]:.6f} < "
                            f"{peer}'s {rows[peer][stat]:.6f}"
                        )
    if (
        "transformers-fp32" in rows
        and rows["transformers-fp32"]["min_cosine"] < REFERENCE_MIN_COSINE
    ):
        bad.append(
            f"reference check: transformers-fp32 min cosine "
            f"{rows['transformers-fp32']['min_cosine']:.7f} < {REFERENCE_MIN_COSINE}"
        )
    return bad


def _floor(name: str, stat: str) -> str:
    floor = CONTRACT.get(name, {}).get(stat)
    if name == "transformers-fp32" and stat == "min_cosine":
        floor = REFERENCE_MIN_COSINE
    return f" (≥ {floor})" if floor is not None else ""


def _cell(text: str) -> str:
    """Text for a Markdown table cell (no pipes, no line breaks)."""
    return " ".join(str(text).replace("|", "\\|").split())


def format_markdown(report: dict) -> str:
    """The report as a Markdown table plus its header lines."""
    c = report["corpus"]
    lines = [
        f"Sentence vectors vs bertfast fp32 on the shipped corpus ({c['texts']} texts, "
        f"{c['tokens_min']}-{c['tokens_max']} tokens with [CLS]/[SEP], mean "
        f"{c['tokens_mean']:.1f}, truncated at {c['max_length']}); retrieval: "
        f"{c['queries']} queries, top-{report['top_k']} neighbours vs fp32's. "
        f"Model {report['model_name']}, "
        f"{report['threads']} threads.",
        "",
        f"| variant | min cosine | mean cosine | top-{report['top_k']} overlap, mean "
        "| worst query's overlap | lowest-cosine text | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in report["variants"]:
        if v["status"] != "ok":
            lines.append(f"| {v['name']} | {v['status']}: {_cell(v['reason'])} | | | | | |")
            continue
        n = v["name"]
        digits = 7 if n == "transformers-fp32" else 6
        lines.append(
            f"| {n} | {v['min_cosine']:.{digits}f}{_floor(n, 'min_cosine')} "
            f"| {v['mean_cosine']:.{digits}f}{_floor(n, 'mean_cosine')} "
            f"| {v['retrieval_overlap']:.3f}{_floor(n, 'retrieval_overlap')} "
            f"| {v['min_query_overlap']:.1f} | {_cell(v['worst_text'][:48])} | {v['seconds']:.1f} |"
        )
    failures = contract_failures(report)
    lines.append("")
    lines.append(
        "Contract: " + ("met by every variant that ran" if not failures else "; ".join(failures))
    )
    return "\n".join(lines)
