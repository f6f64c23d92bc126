"""Which task head a checkpoint runs and which canonical weights it needs.

The checkpoint layer's half of the heads (``bertfast/heads.py`` is the model's half,
the math): :func:`resolve_head` chooses the head from ``head=`` or the checkpoint's
``architectures`` (the table is in ``heads.py``'s docstring), and
:func:`head_weight_specs` lists the canonical weight names and shapes it reads, so
``checkpoint.py`` can map and check them before anything is built.
"""

from __future__ import annotations

from .config import EncoderConfig
from .validate import short_repr

__all__ = ["HEADS", "head_from_architectures", "resolve_head", "head_weight_specs"]

HEADS = (
    "base",
    "pooler",
    "masked_lm",
    "next_sentence",
    "pretraining",
    "sentence_order",
    "sequence_classification",
    "token_classification",
    "question_answering",
    "multiple_choice",
    "electra_discriminator",
)

_SUFFIXES = (
    ("ForMaskedLM", "masked_lm"),
    ("ForNextSentencePrediction", "next_sentence"),
    ("ForSequenceClassification", "sequence_classification"),
    ("ForTokenClassification", "token_classification"),
    ("ForQuestionAnswering", "question_answering"),
    ("ForMultipleChoice", "multiple_choice"),
)

POOLER_FAMILIES = ("bert", "roberta", "albert")


def head_from_architectures(cfg: EncoderConfig) -> str:
    for arch in cfg.architectures:
        if arch == "ElectraForPreTraining":
            return "electra_discriminator"
        if arch.endswith("ForPreTraining"):
            return "pretraining"
        for suffix, head in _SUFFIXES:
            if arch.endswith(suffix):
                return head
    return "base"


def resolve_head(cfg: EncoderConfig, head: str | None) -> str:
    """The head to run: ``head`` if given (validated against the family), else from
    ``architectures``."""
    if head is None:
        head = head_from_architectures(cfg)
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    fam = cfg.family
    if head in ("pooler", "next_sentence", "sentence_order") and fam not in POOLER_FAMILIES:
        raise ValueError(f"head {head!r} needs a pooler, which {cfg.model_type} does not have")
    if head == "next_sentence" and fam != "bert":
        raise ValueError(f"head 'next_sentence' exists only for BERT, not {cfg.model_type}")
    if head == "sentence_order" and fam != "albert":
        raise ValueError(f"head 'sentence_order' exists only for ALBERT, not {cfg.model_type}")
    if head == "pretraining" and fam not in ("bert", "albert", "electra"):
        raise ValueError(f"head 'pretraining' does not exist for {cfg.model_type}")
    if head == "multiple_choice" and fam == "electra":
        summary = cfg.raw.get("summary_type", "first")
        if summary != "first":
            raise ValueError(
                f"ELECTRA multiple choice with summary_type={short_repr(summary)} is not "
                "supported (only 'first')"
            )
    if head == "pretraining" and fam == "electra":
        head = "electra_discriminator"
    if head == "electra_discriminator" and fam != "electra":
        raise ValueError(
            f"head 'electra_discriminator' exists only for ELECTRA, not {cfg.model_type}"
        )
    return head


def _summary_width(cfg: EncoderConfig) -> int:
    if cfg.raw.get("summary_proj_to_labels") and cfg.num_labels > 0:
        return cfg.num_labels
    return cfg.hidden_size


def head_weight_specs(cfg: EncoderConfig, head: str) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """``(required, optional)``: canonical head weight names -> expected shapes."""
    H, E, V = cfg.hidden_size, cfg.embedding_size, cfg.vocab_size
    fam = cfg.family
    req: dict[str, tuple] = {}
    opt: dict[str, tuple] = {}

    def lin(d, name, out, inp, bias=True):
        d[f"{name}.weight"] = (out, inp)
        if bias:
            d[f"{name}.bias"] = (out,)

    def pooler(d):
        lin(d, "pooler", H, H)

    def mlm(d):
        W = E if fam in ("albert", "electra") else H
        lin(d, "mlm.dense", W, H)
        d["mlm.ln.weight"] = (W,)
        d["mlm.ln.bias"] = (W,)
        lin(d, "mlm.decoder", V, W)

    if head == "base":
        if fam in POOLER_FAMILIES:
            pooler(opt)
    elif head == "pooler":
        pooler(req)
    elif head == "masked_lm":
        mlm(req)
    elif head == "next_sentence":
        pooler(req)
        lin(req, "nsp", 2, H)
    elif head == "sentence_order":
        pooler(req)
        lin(req, "sop", cfg.num_labels, H)
    elif head == "pretraining":
        pooler(req)
        mlm(req)
        if fam == "bert":
            lin(req, "nsp", 2, H)
        else:
            lin(req, "sop", cfg.num_labels, H)
    elif head == "sequence_classification":
        if fam in ("bert", "albert"):
            pooler(req)
        else:
            lin(req, "classifier.dense", H, H)
        lin(req, "classifier.out", cfg.num_labels, H)
    elif head == "token_classification":
        lin(req, "classifier.out", cfg.num_labels, H)
    elif head == "question_answering":
        lin(req, "qa", cfg.num_labels, H)
    elif head == "multiple_choice":
        if fam in POOLER_FAMILIES:
            pooler(req)
            lin(req, "classifier.out", 1, H)
        elif fam == "electra":
            W = H
            if cfg.summary_use_proj:
                W = _summary_width(cfg)
                lin(req, "classifier.dense", W, H)
            lin(req, "classifier.out", 1, W)
        else:  # distilbert
            lin(req, "classifier.dense", H, H)
            lin(req, "classifier.out", 1, H)
    elif head == "electra_discriminator":
        lin(req, "discriminator.dense", H, H)
        lin(req, "discriminator.out", 1, H)
    else:  # pragma: no cover - resolve_head guards this
        raise ValueError(f"unknown head {head!r}")
    return req, opt
