"""``bertfast check``: bertfast against transformers (fp32, TF32 off) on sample
sentences or a file of them. Exit status 0 when every row passes, 1 when one fails.

fp32 is held to the end-to-end tolerance of docs/design.md section 5
(:data:`bertfast.ops.parity.END_TO_END_ATOL`), fp16 / bf16 to the benchmark suite's
per-dtype rule (:data:`bertfast.bench.PARITY_TOL`), int8 to the cosine of its sentence
vectors (:data:`INT8_MIN_COSINE`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from . import options
from ._common import UserError, checkpoint_path, load_embedder, read_lines, torch_device

NAME = "check"

#: ``bertfast check --quantize int8``: int8 is judged by the sentence vectors' cosine
#: to transformers' fp32 ones (issue 15's contract), not by max abs differences,
#: which are reported only.
INT8_MIN_COSINE = 0.99

#: Sentences ``bertfast check`` runs when no --input is given: short and long, cased,
#: punctuation, numbers, accents, CJK, emoji, and one past the length limit.
CHECK_SENTENCES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "",
    "Transformers turn tokens into contextual vectors, layer after layer.",
    "Is this the real life? Is this just fantasy?",
    "Pi is roughly 3.14159, and e is about 2.71828.",
    "Crème brûlée, jalapeño, naïve façade — déjà vu.",
    "東京は日本の首都です。",
    "Ça va? Ja, gut! ¿Y tú?",
    "Emoji are tokens too 🙂🚀",
    "don't, can't, won't; it's (mostly) fine...",
    "URL: https://example.com/a/b?c=1&d=2 — email: someone@example.org",
    "A much longer sentence that keeps going, with several clauses, commas and words, "
    "so that its batch holds a good deal of padding for the shorter sentences beside it.",
    " ".join(["long"] * 600),
]
CHECK_PAIRS = [
    ("How old are you?", "I am 30 years old."),
    ("The cat sat on the mat.", "A feline rested on a rug."),
    ("Where is the station?", "Take the second street on the left, then walk straight on."),
]


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME, help="compare bertfast (any dtype) with transformers (fp32) on sample sentences"
    )
    options.add_model_options(p)
    p.add_argument(
        "--input",
        "-i",
        default=None,
        help="UTF-8 text file of sentences to check (default: built-in samples)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="sentences per batch, sorted by length (default: 32)",
    )
    options.add_progress(p)
    p.set_defaults(func=run)


def tolerance(dtype_name: str) -> float:
    """``bertfast check``'s tolerance for a dtype: the end-to-end fp32 tolerance, or for
    fp16 / bf16 runs the benchmark suite's parity rule (storage rounding compounded
    over layers)."""
    import torch

    if dtype_name == "float32":
        from ..ops import parity

        return parity.END_TO_END_ATOL
    from ..bench import PARITY_TOL

    return PARITY_TOL[getattr(torch, dtype_name)]


def _max_abs(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _transformers():
    """transformers, quiet (no weight-loading bars or warnings around the report)."""
    try:
        import transformers
    except ImportError:
        raise UserError(
            "bertfast check compares against transformers, which is not installed: "
            "run `pip install bertfast[demo]` (or `pip install transformers`)"
        ) from None
    try:
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # pragma: no cover - older transformers
        pass
    return transformers


def _reference(path, device):
    """transformers' tokenizer and fp32 model of ``path``, and whether the checkpoint
    lacks the pooler's weights (then pooler outputs are not compared)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    try:
        ref_tok = AutoTokenizer.from_pretrained(str(path))
        try:
            ref, info = AutoModel.from_pretrained(
                str(path), dtype=torch.float32, output_loading_info=True
            )
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            ref, info = AutoModel.from_pretrained(
                str(path), torch_dtype=torch.float32, output_loading_info=True
            )
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"transformers cannot load {path}: {exc}") from None
    pooler_missing = any("pooler" in key for key in info.get("missing_keys", []))
    return ref_tok, ref.to(device).eval(), pooler_missing


@dataclass
class _Diffs:
    """What the batches measured: tokenizer agreement, max abs differences, and
    transformers' pooled sentence vectors (input order) when the checkpoint has them."""

    tok_equal: bool = True
    hidden: float = 0.0
    pooler: float | None = None
    expect_vectors: object = None


def _compare(embedder, ref_tok, ref, groups, device, args, want_vectors, pooler_missing, bar):
    """Run bertfast and the reference over ``groups`` (sentences, then pairs) in
    length-sorted batches; results are kept by input index."""
    import torch

    from ..embedder import pool

    model, tok = embedder.model, embedder.tokenizer
    d = _Diffs()
    for firsts, seconds in groups:
        # Longest first, in batches: each reference batch pads little.
        inputs = firsts if seconds is None else list(zip(firsts, seconds))
        lengths = [len(ids) for ids, _ in tok.tokenize(inputs)]
        order = sorted(range(len(inputs)), key=lambda i: -lengths[i])
        for start in range(0, len(order), args.batch_size):
            index = order[start : start + args.batch_size]
            part = [firsts[i] for i in index]
            part_b = None if seconds is None else [seconds[i] for i in index]
            mine = tok(part, part_b)
            theirs = ref_tok(
                part,
                part_b,
                padding=True,
                truncation=True,
                max_length=embedder.max_length,
                return_tensors="pt",
            )
            same = all(
                torch.equal(mine[key], theirs[key].long())
                for key in ("input_ids", "attention_mask")
            )
            d.tok_equal = d.tok_equal and same
            batch = {k: v.to(device) for k, v in mine.items()}
            types = batch["token_type_ids"] if getattr(model.config, "type_vocab_size", 1) else None
            out = model(
                batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=types
            )
            expect = ref(**{k: v for k, v in batch.items() if k in ref_tok.model_input_names})
            real = batch["attention_mask"].bool()
            d.hidden = max(
                d.hidden,
                _max_abs(out.last_hidden_state[real].float(), expect.last_hidden_state[real]),
            )
            mine_pool = getattr(out, "pooler_output", None)
            their_pool = getattr(expect, "pooler_output", None)
            if mine_pool is not None and their_pool is not None and not pooler_missing:
                d.pooler = max(d.pooler or 0.0, _max_abs(mine_pool.float(), their_pool))
            if want_vectors and seconds is None:
                # transformers' own tokens for the embedding reference
                hidden, mask = expect.last_hidden_state, batch["attention_mask"]
                if not same:
                    theirs = theirs.to(device)
                    hidden = ref(
                        **{k: v for k, v in theirs.items() if k in ref_tok.model_input_names}
                    ).last_hidden_state
                    mask = theirs["attention_mask"]
                vectors = pool(hidden, mask, embedder.pooling)
                if d.expect_vectors is None:
                    d.expect_vectors = vectors.new_zeros(len(firsts), vectors.shape[-1])
                d.expect_vectors[torch.tensor(index, device=vectors.device)] = vectors
            bar.update(len(index))
    return d


def run(args) -> int:
    import torch
    from tqdm.auto import tqdm

    transformers = _transformers()
    from ..embedder import PROGRESS_MIN_TEXTS, read_sentence_config

    path = checkpoint_path(args.checkpoint)
    sentences = read_lines(args.input) if args.input else list(CHECK_SENTENCES)
    if not sentences:
        raise UserError("no sentences to check: the input file is empty")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
    pairs = [] if args.input else list(CHECK_PAIRS)
    device = torch_device(args.device)

    # fp32 reference: no TF32 anywhere.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    atol = tolerance(args.dtype)
    int8 = bool(getattr(args, "quantize", None))
    embedder = load_embedder(path, args)
    ref_tok, ref, pooler_missing = _reference(path, device)
    sent_cfg = read_sentence_config(path)

    print(f"bertfast check: {path}")
    print(
        f"  bertfast backend={args.backend} device={device} dtype={args.dtype} "
        f"{'quantize=int8 ' if int8 else ''}"
        f"max_length={embedder.max_length}; "
        f"reference transformers {transformers.__version__} {type(ref).__name__} fp32, TF32 off"
    )
    print(f"  {len(sentences)} sentences" + (f" + {len(pairs)} sentence pairs" if pairs else ""))

    rows = []  # (name, value text, passed: True / False / None for not applicable)
    embed_diff = 0.0
    want_vectors = sent_cfg.is_sentence_transformers
    groups = [(sentences, None)]
    if pairs:
        groups.append(([a for a, _ in pairs], [b for _, b in pairs]))
    total = sum(len(firsts) for firsts, _ in groups)
    show = args.progress if args.progress is not None else total >= PROGRESS_MIN_TEXTS
    with (
        torch.inference_mode(),
        tqdm(
            total=total,
            disable=not show,
            unit="text",
            desc="checking",
            file=sys.stderr,
            dynamic_ncols=True,
        ) as bar,
    ):
        d = _compare(
            embedder, ref_tok, ref, groups, device, args, want_vectors, pooler_missing, bar
        )
        rows.append(
            (
                "tokenizer",
                "input ids identical to transformers"
                if d.tok_equal
                else "input ids DIFFER from transformers' tokenizer",
                d.tok_equal,
            )
        )
        rows.append(
            (
                "last_hidden_state",
                f"max |diff| {d.hidden:.2e} (real tokens)",
                None if int8 else d.hidden <= atol,
            )
        )
        if d.pooler is not None:
            rows.append(
                ("pooler_output", f"max |diff| {d.pooler:.2e}", None if int8 else d.pooler <= atol)
            )
        else:
            rows.append(("pooler_output", "no pooler in this checkpoint", None))

        if want_vectors:
            vectors = embedder.encode(
                sentences, convert_to="torch", batch_size=args.batch_size, show_progress=show
            ).float()
            expect = d.expect_vectors
            if embedder.normalize:
                expect = torch.nn.functional.normalize(expect, dim=-1)
            embed_diff = _max_abs(vectors, expect)
            cos = torch.nn.functional.cosine_similarity(vectors.double(), expect.double(), dim=-1)
            rows.append(
                (
                    "sentence embedding",
                    f"max |diff| {embed_diff:.2e}, min cosine {float(cos.min()):.7f} "
                    f"({'+'.join(embedder.pooling)} pooling"
                    f"{', normalized' if embedder.normalize else ''})",
                    float(cos.min()) >= INT8_MIN_COSINE if int8 else embed_diff <= atol,
                )
            )

    width = max(len(name) for name, _, _ in rows)
    for name, text, ok in rows:
        print(f"  {name:<{width}}  {'n/a ' if ok is None else 'PASS' if ok else 'FAIL'}  {text}")
    passed = all(ok is not False for _, _, ok in rows)
    verdict = "PASS" if passed else "FAIL"
    worst = max(d.hidden, d.pooler or 0.0, embed_diff)
    if int8:
        print(
            f"{verdict}: bertfast int8 vs transformers fp32, max abs diff {worst:.2e} "
            f"(judged by sentence vectors: min cosine >= {INT8_MIN_COSINE})"
        )
    else:
        print(
            f"{verdict}: bertfast vs transformers, max abs diff {worst:.2e} "
            f"(tolerance {atol:.0e}, {args.dtype})"
        )
    return 0 if passed else 1
