"""Task heads on top of the encoder: which one to run, its weights, and its math.

Which head runs and which weights it needs is decided at load, in the checkpoint
layer (``bertfast/head_specs.py``: ``resolve_head``, ``head_weight_specs``, re-exported
here). An explicit ``head=`` wins; otherwise the first entry of ``architectures`` in
config.json decides, by suffix:

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

Each head is a small :class:`Head` module, built once at load by
:func:`build_head` (``BertfastModel.task_head``). It holds no weights: it reads the
model's canonical weights by name and runs every dense layer through bertfast's
ops (``ops.linear``, or ``ops.linear_gelu`` when the activation fuses into the
GEMM's epilogue), so the masked-LM decoder, the largest GEMM of any head, runs on
the same GEMM as the encoder. The one plain torch op is the masked-LM LayerNorm
(there is no residual to fuse it with).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .config import EncoderConfig
from .head_specs import HEADS, POOLER_FAMILIES, head_weight_specs, resolve_head
from .ops.padding import PackInfo
from .ops.reference import ACTIVATIONS
from .ops.reference import activation as reference_activation
from .outputs import EncoderOutput

__all__ = [
    "HEADS",
    "resolve_head",
    "head_weight_specs",
    "activation",
    "build_head",
    "Head",
    "HeadInput",
    "dense",
    "pool",
    "first_tokens",
]

# ------------------------------------------------------------------------ modules
#: canonical weight name -> tensor, or None when the checkpoint has no such weight
Weights = Callable[[str], torch.Tensor | None]


def activation(x: torch.Tensor, kind: str | None) -> torch.Tensor:
    """The encoder's activations (``ops.reference.activation``) plus the heads' own
    ``tanh`` and ``identity`` (ELECTRA's sequence summary); ``None`` is identity."""
    if kind == "tanh":
        return torch.tanh(x)
    if kind is None or kind == "identity":
        return x
    return reference_activation(x, kind)


def first_tokens(tokens: torch.Tensor, info: PackInfo) -> torch.Tensor:
    """``[B, H]``: each row's first real token of the packed ``tokens`` ``[T, H]``;
    zeros for rows with no real token."""
    if torch.compiler.is_compiling():
        # The token count is data-dependent there: no branch on it. A zero row after
        # the tokens keeps every index valid, even for a batch with no token at all.
        tokens = torch.cat([tokens, tokens.new_zeros(1, tokens.shape[-1])])
    elif tokens.shape[0] == 0:
        return tokens.new_zeros(info.batch, tokens.shape[-1])
    elif info.dense:  # no padding: row b's first token is at b * S, every row has one
        return tokens.view(info.batch, info.seqlen, tokens.shape[-1])[:, 0].contiguous()
    first = tokens.index_select(0, info.first_token)
    return first.masked_fill((info.lengths == 0)[:, None], 0)


def dense(
    weight: Weights, name: str, x: torch.Tensor, act: str | None = None, backend: str = "auto"
) -> torch.Tensor:
    """``act(x @ W.T + b)`` for the head layer ``name`` (``name.weight``,
    ``name.bias``) through bertfast's ops: the activations the kernels implement
    (gelu, gelu_tanh, relu) run in the GEMM's epilogue (``ops.linear_gelu``); the
    others (tanh, identity) follow ``ops.linear``."""
    w, b = weight(f"{name}.weight"), weight(f"{name}.bias")
    if act in ACTIVATIONS:
        return ops.linear_gelu(x, w, b, act, backend=backend)
    return activation(ops.linear(x, w, b, backend=backend), act)


def pool(weight: Weights, first: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """The pooler: ``tanh(dense(first))`` on ``[B, H]`` first-token states."""
    return dense(weight, "pooler", first, "tanh", backend)


class HeadInput:
    """What a head reads: the encoder's packed output and the means to lay it out.

    ``tokens`` ``[T, H]`` is the last hidden state of the real tokens (packed);
    ``unpack`` scatters a ``[T, ...]`` tensor back to ``[B, S, ...]`` with zeros at
    padded positions; ``first`` (each row's first real token) and ``pooled`` (the
    pooler over it, None without pooler weights) are computed on first use.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        info: PackInfo,
        weight: Weights,
        unpack: Callable[[torch.Tensor], torch.Tensor],
        backend: str = "auto",
        num_choices: int | None = None,
        lazy_pooler: bool = False,
    ):
        self.tokens = tokens
        self.info = info
        self.weight = weight
        self.unpack = unpack
        self.backend = backend
        self.num_choices = num_choices
        #: the base head leaves ``pooler_output`` to be computed on its first read
        #: (:meth:`pooled_later`); the eager forward's choice, not a graph's or compile's
        self.lazy_pooler = lazy_pooler
        # Computed on first use. (Not functools.cached_property: before Python 3.12 it
        # takes a lock, which torch.compile cannot trace.)
        self._cache = {}

    def _once(self, name: str, compute):
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    @property
    def empty_rows(self) -> torch.Tensor:
        """``[B, 1]`` bool: rows whose attention mask has no real token."""
        return self._once("empty_rows", lambda: (self.info.lengths == 0)[:, None])

    @property
    def first(self) -> torch.Tensor:
        return self._once("first", lambda: first_tokens(self.tokens, self.info))

    @property
    def pooled(self) -> torch.Tensor | None:
        return self._once("pooled", lambda: self.pooled_later()())

    def pooled_later(self) -> Callable[[], torch.Tensor | None]:
        """:attr:`pooled` as a function to call later: it holds the pooler weights
        held now and each row's first token (``[B, H]``, taken now), not the hidden
        states, so calling it after the weights were replaced still gives the pooler
        of the forward that ran."""
        w, b = self.weight("pooler.weight"), self.weight("pooler.bias")
        if w is None:
            return lambda: None
        first, backend = self.first, self.backend
        # no padding (``dense``): no row is empty, nothing to mask
        empty = None if self.info.dense else self.empty_rows
        held = {"pooler.weight": w, "pooler.bias": b}.get

        def compute():
            pooled = pool(held, first, backend)
            return pooled if empty is None else pooled.masked_fill(empty, 0)

        return compute

    def dense(self, name: str, x: torch.Tensor, act: str | None = None) -> torch.Tensor:
        return dense(self.weight, name, x, act, self.backend)


class Head(nn.Module):
    """A task head: reads a :class:`HeadInput`, writes its fields into an
    :class:`~bertfast.outputs.EncoderOutput`. Heads hold no weights (the model
    does, under canonical names); they run on bertfast's ops.

    This class is the ``base`` head: hidden states, plus the pooler output when
    the checkpoint has a pooler. ``reads_first``: the head reads each row's first
    real token, and reports ``pooler_output`` when there is one.
    """

    name = "base"
    reads_first = True

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg

    def extra_repr(self) -> str:
        return f"{self.name!r}, family={self.cfg.family}"

    def flatten_inputs(self, input_ids, attention_mask, token_type_ids, position_ids):
        """Inputs as the encoder takes them (``[B, S]``), and the number of choices
        per example (None but for multiple choice)."""
        return input_ids, attention_mask, token_type_ids, position_ids, None

    def forward(self, inp: HeadInput, out: EncoderOutput) -> EncoderOutput:
        self.run(inp, out)
        if self.reads_first:
            if inp.lazy_pooler and "pooled" not in inp._cache:
                # Read on demand: a caller of the hidden states alone (an embedding
                # model's usual call) does not pay for the pooler's GEMM. A head
                # whose own fields read the pooler (run above) has it already.
                out.defer("pooler_output", inp.pooled_later())
            else:
                out.pooler_output = inp.pooled
        return out

    def run(self, inp: HeadInput, out: EncoderOutput) -> None:
        """The head's own fields (none for ``base`` and ``pooler``)."""


class PoolerHead(Head):
    name = "pooler"


class MaskedLMHead(Head):
    """Vocabulary logits per real token: dense + activation, LayerNorm, decoder (the
    largest GEMM of the head, ``[V, W]``, through ``ops.linear``)."""

    name = "masked_lm"
    reads_first = False

    def __init__(self, cfg: EncoderConfig, field: str = "logits"):
        super().__init__(cfg)
        self.field = field
        # RobertaLMHead and ElectraGeneratorPredictions hard-code exact GELU
        self.act = "gelu" if cfg.family in ("roberta", "electra") else cfg.hidden_act

    def run(self, inp, out):
        x = inp.dense("mlm.dense", inp.tokens, self.act)
        # A plain LayerNorm (no residual to fuse): torch's.
        x = F.layer_norm(
            x,
            (x.shape[-1],),
            inp.weight("mlm.ln.weight"),
            inp.weight("mlm.ln.bias"),
            self.cfg.layer_norm_eps,
        )
        setattr(out, self.field, inp.unpack(inp.dense("mlm.decoder", x)))


class SentencePairHead(Head):
    """BERT's next-sentence or ALBERT's sentence-order head: one linear layer on
    the pooler output."""

    def __init__(self, cfg: EncoderConfig, field: str = "logits"):
        super().__init__(cfg)
        self.name = "next_sentence" if cfg.family == "bert" else "sentence_order"
        self.prefix = "nsp" if cfg.family == "bert" else "sop"
        self.field = field

    def run(self, inp, out):
        logits = inp.dense(self.prefix, inp.pooled)
        setattr(out, self.field, logits.masked_fill(inp.empty_rows, 0))


class PretrainingHead(Head):
    """Masked LM + next-sentence (BERT) or sentence-order (ALBERT)."""

    name = "pretraining"

    def __init__(self, cfg: EncoderConfig):
        super().__init__(cfg)
        self.mlm = MaskedLMHead(cfg, "prediction_logits")
        self.pair = SentencePairHead(
            cfg, "seq_relationship_logits" if cfg.family == "bert" else "sop_logits"
        )

    def run(self, inp, out):
        self.mlm.run(inp, out)
        self.pair.run(inp, out)


#: activation between ``classifier.dense`` and ``classifier.out`` of the families
#: whose sequence classifier reads the first token rather than the pooler
_CLASSIFIER_ACT = {"roberta": "tanh", "electra": "gelu", "distilbert": "relu"}


class SequenceClassificationHead(Head):
    name = "sequence_classification"

    def scores(self, inp: HeadInput) -> torch.Tensor:
        fam = self.cfg.family
        if fam in ("bert", "albert"):
            return inp.dense("classifier.out", inp.pooled)
        x = inp.dense("classifier.dense", inp.first, _CLASSIFIER_ACT[fam])
        return inp.dense("classifier.out", x)

    def run(self, inp, out):
        out.logits = self.scores(inp).masked_fill(inp.empty_rows, 0)


class MultipleChoiceHead(Head):
    """Inputs ``[B, C, S]`` run as ``B*C`` rows; one score per row -> ``[B, C]``."""

    name = "multiple_choice"

    def flatten_inputs(self, input_ids, attention_mask, token_type_ids, position_ids):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3:
            raise ValueError(
                "the multiple_choice head takes input_ids of shape "
                "[batch, num_choices, seq_len], got "
                f"{tuple(getattr(input_ids, 'shape', ()))}"
            )
        B, C, S = input_ids.shape

        def flat(t, name):
            if t is None:
                return None
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() == 3:
                if tuple(t.shape) != (B, C, S):
                    raise ValueError(
                        f"{name} has shape {tuple(t.shape)}, expected "
                        f"{(B, C, S)} (the shape of input_ids)"
                    )
                return t.reshape(B * C, S)
            return t  # the encoder's [B, S] checks report the shape error

        return (
            input_ids.reshape(B * C, S),
            flat(attention_mask, "attention_mask"),
            flat(token_type_ids, "token_type_ids"),
            flat(position_ids, "position_ids"),
            C,
        )

    def scores(self, inp: HeadInput) -> torch.Tensor:
        cfg = self.cfg
        fam = cfg.family
        if fam in POOLER_FAMILIES:
            return inp.dense("classifier.out", inp.pooled)
        if fam == "electra":  # sequence summary: optional projection, then its activation
            x = inp.first
            if cfg.summary_use_proj:
                x = inp.dense("classifier.dense", x, cfg.summary_activation)
            else:
                x = activation(x, cfg.summary_activation)
            return inp.dense("classifier.out", x)
        return inp.dense("classifier.out", inp.dense("classifier.dense", inp.first, "relu"))

    def run(self, inp, out):
        scores = self.scores(inp).masked_fill(inp.empty_rows, 0)
        out.logits = scores.view(-1, inp.num_choices)


class TokenClassificationHead(Head):
    name = "token_classification"
    reads_first = False

    def run(self, inp, out):
        out.logits = inp.unpack(inp.dense("classifier.out", inp.tokens))


class QuestionAnsweringHead(Head):
    name = "question_answering"
    reads_first = False

    def run(self, inp, out):
        qa = inp.unpack(inp.dense("qa", inp.tokens))
        out.start_logits = qa[..., 0].contiguous()
        out.end_logits = qa[..., -1].contiguous()


class DiscriminatorHead(Head):
    """ELECTRA's replaced-token discriminator: one logit per token."""

    name = "electra_discriminator"
    reads_first = False

    def run(self, inp, out):
        x = inp.dense("discriminator.dense", inp.tokens, self.cfg.hidden_act)
        out.logits = inp.unpack(inp.dense("discriminator.out", x).squeeze(-1))


_HEAD_CLASSES = {
    "base": Head,
    "pooler": PoolerHead,
    "masked_lm": MaskedLMHead,
    "next_sentence": SentencePairHead,
    "sentence_order": SentencePairHead,
    "pretraining": PretrainingHead,
    "sequence_classification": SequenceClassificationHead,
    "token_classification": TokenClassificationHead,
    "question_answering": QuestionAnsweringHead,
    "multiple_choice": MultipleChoiceHead,
    "electra_discriminator": DiscriminatorHead,
}


def build_head(cfg: EncoderConfig, head: str) -> Head:
    """The head module for a head name that :func:`resolve_head` returned."""
    try:
        cls = _HEAD_CLASSES[head]
    except KeyError:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}") from None
    return cls(cfg)
