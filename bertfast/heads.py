"""Task heads on top of the encoder: which one to run, its weights, and its math.

How a head is chosen (``resolve_head``): an explicit ``head=`` wins; otherwise the
first entry of ``architectures`` in config.json decides, by suffix:

=====================================  ==========================
architecture                           head
=====================================  ==========================
``*Model`` (and anything unknown)      ``base``
``*ForMaskedLM``                       ``masked_lm``
``BertForPreTraining``                 ``pretraining`` (MLM + NSP)
``AlbertForPreTraining``               ``pretraining`` (MLM + SOP)
``ElectraForPreTraining``              ``electra_discriminator``
``*ForNextSentencePrediction``         ``next_sentence``
``*ForSequenceClassification``         ``sequence_classification``
``*ForTokenClassification``            ``token_classification``
``*ForQuestionAnswering``              ``question_answering``
``*ForMultipleChoice``                 ``multiple_choice``
=====================================  ==========================

Heads and their canonical weights (checkpoint.py maps each family's names):

- ``pooler``: ``pooler.weight [H,H]``, ``pooler.bias`` -> tanh(dense(first token)).
  For ``base`` the pooler runs when its weights are in the checkpoint.
- ``masked_lm``: ``mlm.dense`` (``[H,H]``, ``[E,H]`` for ALBERT/ELECTRA), activation
  (``hidden_act``; RoBERTa and the ELECTRA generator use exact GELU), ``mlm.ln``,
  ``mlm.decoder.weight`` (tied to ``embeddings.word`` when absent), ``mlm.decoder.bias``.
- ``next_sentence``: pooler + ``nsp [2,H]``. ALBERT ``sentence_order``: pooler + ``sop``.
- ``pretraining``: masked_lm + next_sentence (BERT) or + sentence_order (ALBERT).
- ``sequence_classification``: BERT/ALBERT ``classifier.out`` on the pooler; RoBERTa
  and ELECTRA ``classifier.dense`` + tanh (RoBERTa) / exact GELU (ELECTRA) +
  ``classifier.out`` on the first token; DistilBERT ``classifier.dense`` + ReLU +
  ``classifier.out`` on the first token. Logits are the same for single-label,
  multi-label and regression; ``config.problem_type`` is kept for the caller.
- ``token_classification``: ``classifier.out`` on every token.
- ``question_answering``: ``qa [num_labels,H]`` -> ``start_logits``, ``end_logits``.
- ``multiple_choice``: inputs ``[B, C, S]`` run as ``B*C`` rows; BERT/ALBERT/RoBERTa
  pooler + ``classifier.out [1,H]``; ELECTRA sequence summary (``classifier.dense`` +
  ``summary_activation``) + ``classifier.out``; DistilBERT as its classification head.
  ``logits`` is ``[B, C]``.
- ``electra_discriminator``: ``discriminator.dense`` + ``hidden_act`` +
  ``discriminator.out [1,H]`` -> one logit per token.

Token-level heads run on the packed real tokens only; their outputs at padded
positions are zero, like the hidden states.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from .config import EncoderConfig
from .ops.reference import activation as reference_activation

__all__ = ["HEADS", "resolve_head", "head_weight_specs", "activation"]

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

_POOLER_FAMILIES = ("bert", "roberta", "albert")


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


def resolve_head(cfg: EncoderConfig, head: Optional[str]) -> str:
    """The head to run: ``head`` if given (validated against the family), else from
    ``architectures``."""
    if head is None:
        head = head_from_architectures(cfg)
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    fam = cfg.family
    if head in ("pooler", "next_sentence", "sentence_order") and fam not in _POOLER_FAMILIES:
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
            raise ValueError(f"ELECTRA multiple choice with summary_type={summary!r} is not "
                             "supported (only 'first')")
    if head == "pretraining" and fam == "electra":
        head = "electra_discriminator"
    if head == "electra_discriminator" and fam != "electra":
        raise ValueError(f"head 'electra_discriminator' exists only for ELECTRA, "
                         f"not {cfg.model_type}")
    return head


def _summary_width(cfg: EncoderConfig) -> int:
    if cfg.raw.get("summary_proj_to_labels") and cfg.num_labels > 0:
        return cfg.num_labels
    return cfg.hidden_size


def head_weight_specs(cfg: EncoderConfig, head: str) -> Tuple[Dict[str, tuple], Dict[str, tuple]]:
    """``(required, optional)``: canonical head weight names -> expected shapes."""
    H, E, V = cfg.hidden_size, cfg.embedding_size, cfg.vocab_size
    fam = cfg.family
    req: Dict[str, tuple] = {}
    opt: Dict[str, tuple] = {}

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
        if fam in _POOLER_FAMILIES:
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
        if fam in _POOLER_FAMILIES:
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


# ------------------------------------------------------------------------ math
def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The encoder's activations (``ops.reference.activation``) plus the heads' own
    ``tanh`` and ``identity`` (ELECTRA's sequence summary)."""
    if kind == "tanh":
        return torch.tanh(x)
    if kind == "identity":
        return x
    return reference_activation(x, kind)


def _linear(w: Dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))


def pooler(w, first: torch.Tensor) -> torch.Tensor:
    """tanh(dense(first-token states)); ``first`` is ``[B, H]``."""
    return torch.tanh(_linear(w, "pooler", first))


def masked_lm(cfg: EncoderConfig, w, tokens: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits for ``tokens`` ``[T, H]`` -> ``[T, V]``."""
    act = cfg.hidden_act
    if cfg.family == "roberta" or cfg.family == "electra":
        act = "gelu"  # RobertaLMHead and ElectraGeneratorPredictions hard-code exact GELU
    x = activation(_linear(w, "mlm.dense", tokens), act)
    x = F.layer_norm(x, (x.shape[-1],), w["mlm.ln.weight"], w["mlm.ln.bias"], cfg.layer_norm_eps)
    return _linear(w, "mlm.decoder", x)


def sequence_logits(cfg: EncoderConfig, w, first: torch.Tensor,
                    pooled: Optional[torch.Tensor]) -> torch.Tensor:
    """Sequence classification (and multiple-choice scoring) from the first token."""
    fam = cfg.family
    if fam in ("bert", "albert"):
        return _linear(w, "classifier.out", pooled)
    if fam == "roberta":
        return _linear(w, "classifier.out", torch.tanh(_linear(w, "classifier.dense", first)))
    if fam == "electra":
        return _linear(w, "classifier.out", F.gelu(_linear(w, "classifier.dense", first)))
    return _linear(w, "classifier.out", F.relu(_linear(w, "classifier.dense", first)))


def multiple_choice_scores(cfg: EncoderConfig, w, first: torch.Tensor,
                           pooled: Optional[torch.Tensor]) -> torch.Tensor:
    """One score per row ``[B*C, 1]``."""
    fam = cfg.family
    if fam in _POOLER_FAMILIES:
        return _linear(w, "classifier.out", pooled)
    if fam == "electra":
        x = first
        if cfg.summary_use_proj:
            x = _linear(w, "classifier.dense", x)
        return _linear(w, "classifier.out", activation(x, cfg.summary_activation))
    return _linear(w, "classifier.out", F.relu(_linear(w, "classifier.dense", first)))


def discriminator(cfg: EncoderConfig, w, tokens: torch.Tensor) -> torch.Tensor:
    x = activation(_linear(w, "discriminator.dense", tokens), cfg.hidden_act)
    return _linear(w, "discriminator.out", x).squeeze(-1)
