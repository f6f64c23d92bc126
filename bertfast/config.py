"""One normalised configuration for every supported encoder family.

``EncoderConfig.from_json(path)`` reads a Hugging Face ``config.json`` (or the
folder holding it) and maps each family's field names onto one set:

=================  =============================================================
family             model_type values
=================  =============================================================
``bert``           ``bert`` (also MiniLM, BGE, E5, GTE: BERT-architecture models)
``roberta``        ``roberta``, ``xlm-roberta``, ``camembert``
``albert``         ``albert`` (factorised embedding, shared layer groups)
``electra``        ``electra`` (embedding projection when embedding_size != hidden)
``distilbert``     ``distilbert`` (no token types, ``dim``/``n_layers``/... names)
=================  =============================================================

``hidden_act`` is normalised to ``"gelu"`` (exact, erf), ``"gelu_tanh"``
(``gelu_new``, ``gelu_pytorch_tanh``, ``gelu_fast``) or ``"relu"``; anything
else is refused. ``position_scheme`` is ``"absolute"`` (position ids
are ``arange(seq_len)``) or ``"roberta"`` (ids count non-pad tokens, offset by
``pad_token_id``: ``cumsum(ids != pad) * (ids != pad) + pad``).

A field bertfast cannot use (an unknown ``model_type``, a size that is not a positive
integer such as ``384.7`` or ``"384x"``, ``hidden_size`` not divisible by the head
count, so at most ``hidden_size`` heads, ...) raises
:class:`~bertfast.validate.CheckpointError` naming the field and its value (shortened
by :func:`~bertfast.validate.short_repr`: one short line whatever the value). Sizes are
only checked for consistency here; ``checkpoint.check_sizes`` bounds them by the
weights before anything proportional to them is built. ``EncoderConfig.keys`` records
which ``config.json`` key each size came from (``n_layers`` for a DistilBERT, ...), so
messages name the field as the file spells it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from .validate import CheckpointError, CheckpointNotFoundError, first_few, one_line, short_repr

__all__ = [
    "EncoderConfig",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_FAMILIES",
    "CheckpointError",
    "normalize_activation",
]

#: model_type -> family
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "albert": "albert",
    "electra": "electra",
    "distilbert": "distilbert",
}

#: The families, as users know them (for error messages).
SUPPORTED_FAMILIES = (
    "BERT (incl. MiniLM, BGE, E5, GTE), RoBERTa (XLM-R, CamemBERT), ALBERT, ELECTRA and DistilBERT"
)

_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "relu": "relu",
}

# Activations heads may use besides the encoder's three (ELECTRA's sequence summary
# can be "tanh" or none at all).
_HEAD_ACTIVATIONS = dict(_ACTIVATIONS, tanh="tanh", linear="identity", identity="identity")


def normalize_activation(name: Any, *, what: str = "hidden_act", heads: bool = False) -> str:
    """Map a transformers activation name to ``gelu`` / ``gelu_tanh`` / ``relu``
    (heads also accept ``tanh`` and ``identity``)."""
    table = _HEAD_ACTIVATIONS if heads else _ACTIVATIONS
    if heads and name is None:
        return "identity"
    if not isinstance(name, str) or name.lower() not in table:
        raise ValueError(
            f"unsupported activation {what}={short_repr(name)}; bertfast supports "
            f"{', '.join(sorted(table))}"
        )
    return table[name.lower()]


@dataclass
class EncoderConfig:
    """Normalised encoder configuration (see the module docstring)."""

    model_type: str
    family: str
    vocab_size: int
    hidden_size: int
    embedding_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    position_scheme: str
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    architectures: tuple[str, ...] = ()
    num_labels: int = 2
    problem_type: str | None = None
    id2label: dict[int, str] | None = None
    tie_word_embeddings: bool = True
    summary_activation: str = "identity"  # ELECTRA multiple-choice sequence summary
    summary_use_proj: bool = True
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: field name -> the config.json key it was read from (sizes only; a size left at
    #: its default has no entry)
    keys: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ derived
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def has_token_types(self) -> bool:
        return self.type_vocab_size > 0

    @property
    def has_projection(self) -> bool:
        """ALBERT always projects embeddings to hidden; ELECTRA when sizes differ."""
        if self.family == "albert":
            return True
        return self.family == "electra" and self.embedding_size != self.hidden_size

    @property
    def num_stored_layers(self) -> int:
        """Distinct layers held in the checkpoint (ALBERT shares them)."""
        if self.family == "albert":
            return self.num_hidden_groups * self.inner_group_num
        return self.num_layers

    def layer_schedule(self):
        """Stored-layer index of every layer application, in order.

        For ALBERT depth ``i`` runs group ``int(i / (num_layers / num_hidden_groups))``,
        each group applying its ``inner_group_num`` layers; other families run
        ``0..num_layers-1``.
        """
        if self.family != "albert":
            return list(range(self.num_layers))
        order = []
        for i in range(self.num_layers):
            g = int(i / (self.num_layers / self.num_hidden_groups))
            order.extend(g * self.inner_group_num + j for j in range(self.inner_group_num))
        return order

    @property
    def max_seq_len(self) -> int:
        """Longest sequence the position table can hold with default position ids."""
        if self.position_scheme == "roberta":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_json(cls, path) -> EncoderConfig:
        """Read ``config.json`` (``path`` may be the file or its folder)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise CheckpointNotFoundError(f"no config.json at {path}")
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON
            raise CheckpointError(f"cannot read {path}: {one_line(exc)}") from exc
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path} does not hold a JSON object")
        return cls.from_dict(raw, source=path)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> EncoderConfig:
        """Normalise a transformers config dict; every bad field is a
        :class:`CheckpointError` naming the field and its value."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: a config must be a dict, got {type(raw).__name__}")
        archs = _architectures(raw.get("architectures"), source)
        model_type = raw.get("model_type")
        if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
            what = (
                "has no model_type"
                if model_type is None
                else f"has model_type {short_repr(model_type)}, which bertfast does not run"
            )
            arch = f" (architectures: {first_few(archs, 3)})" if archs else ""
            raise CheckpointError(
                f"{source} {what}{arch}; bertfast supports the {SUPPORTED_FAMILIES} families "
                f"(model_type one of {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
            )
        family = SUPPORTED_MODEL_TYPES[model_type]
        found: dict[str, str] = {}  # normalised size -> the key it was read from

        def need(*keys, default=None, required=True):
            """``(key found, value)``: the first of ``keys`` set in the config."""
            for k in keys:
                if k in raw and raw[k] is not None:
                    return k, raw[k]
            if required and default is None:
                raise CheckpointError(
                    f"{source}: missing required field {keys[0]!r} for model_type {model_type!r}"
                )
            return keys[0], default

        def size(*keys, default=None, minimum=1, field=None):
            """The first of ``keys`` set, as an integer >= ``minimum``; recorded in
            ``found`` under ``field`` (default: ``keys[0]``) when it is set."""
            key, value = need(*keys, default=default)
            if key in raw and raw[key] is not None:
                found[field or keys[0]] = key
            return _integer(source, key, value, minimum)

        pos_type = raw.get("position_embedding_type", "absolute") or "absolute"
        if pos_type != "absolute":
            raise CheckpointError(
                f"{source}: position_embedding_type={short_repr(pos_type)} is not supported "
                f"(only 'absolute')"
            )

        if family == "distilbert":
            hidden = size("dim", "hidden_size", field="hidden_size")
            kw = dict(
                hidden_size=hidden,
                embedding_size=hidden,
                num_layers=size("n_layers", "num_hidden_layers", field="num_layers"),
                num_heads=size("n_heads", "num_attention_heads", field="num_heads"),
                intermediate_size=size(
                    "hidden_dim", "intermediate_size", field="intermediate_size"
                ),
                hidden_act=_activation(source, *need("activation", default="gelu")),
                type_vocab_size=0,
                layer_norm_eps=1e-12,  # hard-coded in transformers' DistilBERT
            )
        else:
            hidden = size("hidden_size")
            emb = hidden
            if family in ("albert", "electra"):
                emb = size("embedding_size", default=hidden)
            eps_key, eps = need("layer_norm_eps", default=1e-12)
            kw = dict(
                hidden_size=hidden,
                embedding_size=emb,
                num_layers=size("num_hidden_layers", field="num_layers"),
                num_heads=size("num_attention_heads", field="num_heads"),
                intermediate_size=size("intermediate_size"),
                hidden_act=_activation(
                    source,
                    *need("hidden_act", default="gelu_new" if family == "albert" else "gelu"),
                ),
                type_vocab_size=size("type_vocab_size", default=2, minimum=0),
                layer_norm_eps=_positive_float(source, eps_key, eps),
            )
        pad = raw.get("pad_token_id")
        pad = (
            (1 if family == "roberta" else 0)
            if pad is None
            else _integer(source, "pad_token_id", pad, 0)
        )

        id2label = raw.get("id2label")
        if isinstance(id2label, dict):
            try:
                id2label = {int(k): v for k, v in id2label.items()}
            except (TypeError, ValueError):
                raise CheckpointError(
                    f"{source}: id2label keys must be integers, got {short_repr(list(id2label))}"
                ) from None
        elif id2label is not None:
            raise CheckpointError(
                f"{source}: id2label must be a mapping, got {short_repr(id2label)}"
            )
        num_labels = raw.get("num_labels")
        if num_labels is None:
            num_labels = len(id2label) if id2label else 2

        cfg = cls(
            model_type=model_type,
            family=family,
            vocab_size=size("vocab_size"),
            max_position_embeddings=size("max_position_embeddings", default=512),
            pad_token_id=pad,
            position_scheme="roberta" if family == "roberta" else "absolute",
            num_hidden_groups=size("num_hidden_groups", default=1),
            inner_group_num=size("inner_group_num", default=1),
            architectures=archs,
            num_labels=_integer(source, "num_labels", num_labels, 1),
            problem_type=raw.get("problem_type"),
            id2label=id2label,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            summary_activation=normalize_activation(
                raw.get("summary_activation"), what="summary_activation", heads=True
            ),
            summary_use_proj=bool(raw.get("summary_use_proj", True)),
            raw=dict(raw),
            **kw,
        )
        if family not in ("albert", "electra"):
            found["embedding_size"] = found["hidden_size"]  # the embedding width is hidden
        cfg.keys = found
        cfg.validate(source)
        return cfg

    def validate(self, source: str = "config") -> None:
        """Consistency of the normalised fields (a :class:`CheckpointError` each)."""
        for name in (
            "vocab_size",
            "hidden_size",
            "embedding_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "num_hidden_groups",
            "inner_group_num",
        ):
            _integer(source, name, getattr(self, name), 1)
        _integer(source, "type_vocab_size", self.type_vocab_size, 0)
        # Divisible, so heads <= hidden: the head count is bounded by a size the
        # weights hold (checkpoint.check_sizes).
        if self.hidden_size % self.num_heads:
            raise CheckpointError(
                f"{source}: hidden_size {short_repr(self.hidden_size)} is not divisible by "
                f"num_attention_heads {short_repr(self.num_heads)} (each head must get the "
                f"same width)"
            )
        if self.family == "albert" and self.num_hidden_groups > self.num_layers:
            raise CheckpointError(
                f"{source}: num_hidden_groups {short_repr(self.num_hidden_groups)} > "
                f"num_hidden_layers {short_repr(self.num_layers)}"
            )
        _positive_float(source, "layer_norm_eps", self.layer_norm_eps)
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise CheckpointError(
                f"{source}: pad_token_id {short_repr(self.pad_token_id)} is outside the "
                f"vocabulary [0, {short_repr(self.vocab_size)})"
            )
        if self.position_scheme == "roberta" and self.max_seq_len <= 0:
            raise CheckpointError(
                f"{source}: max_position_embeddings {short_repr(self.max_position_embeddings)} "
                f"leaves no positions after the padding offset"
            )


def _integer(source: str, field: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (an integral float such as 384.0 is accepted;
    384.7, "384", true are not)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value, ok = int(value), True
    if not ok:
        raise CheckpointError(f"{source}: {field} must be an integer, got {short_repr(value)}")
    if value < minimum:
        need = "positive" if minimum == 1 else f">= {minimum}"
        raise CheckpointError(f"{source}: {field} must be {need}, got {short_repr(value)}")
    return value


def _positive_float(source: str, field: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise CheckpointError(
            f"{source}: {field} must be a positive number, got {short_repr(value)}"
        )
    return float(value)


def _activation(source: str, field: str, value: Any) -> str:
    try:
        return normalize_activation(value, what=field)
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def _architectures(value: Any, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise CheckpointError(
            f"{source}: architectures must be a list of class names, got {short_repr(value)}"
        )
    return tuple(value)
