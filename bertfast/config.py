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
else is a ``ValueError``. ``position_scheme`` is ``"absolute"`` (position ids
are ``arange(seq_len)``) or ``"roberta"`` (ids count non-pad tokens, offset by
``pad_token_id``: ``cumsum(ids != pad) * (ids != pad) + pad``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

__all__ = ["EncoderConfig", "SUPPORTED_MODEL_TYPES", "normalize_activation"]

#: model_type -> family
SUPPORTED_MODEL_TYPES: Dict[str, str] = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "albert": "albert",
    "electra": "electra",
    "distilbert": "distilbert",
}

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
            f"unsupported activation {what}={name!r}; bertfast supports "
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
    architectures: Tuple[str, ...] = ()
    num_labels: int = 2
    problem_type: Optional[str] = None
    id2label: Optional[Dict[int, str]] = None
    tie_word_embeddings: bool = True
    summary_activation: str = "identity"  # ELECTRA multiple-choice sequence summary
    summary_use_proj: bool = True
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

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
    def from_json(cls, path) -> "EncoderConfig":
        """Read ``config.json`` (``path`` may be the file or its folder)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no config.json at {path}")
        try:
            with open(path, "r", encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return cls.from_dict(raw, source=path)

    @classmethod
    def from_dict(cls, raw: Dict[str, Any], source: str = "config") -> "EncoderConfig":
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"{source}: unsupported model_type {model_type!r}; bertfast supports "
                f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            )
        family = SUPPORTED_MODEL_TYPES[model_type]

        def need(*keys, default=None, required=True):
            for k in keys:
                if k in raw and raw[k] is not None:
                    return raw[k]
            if required and default is None:
                raise ValueError(f"{source}: missing required field {keys[0]!r} "
                                 f"for model_type {model_type!r}")
            return default

        pos_type = raw.get("position_embedding_type", "absolute") or "absolute"
        if pos_type != "absolute":
            raise ValueError(f"{source}: position_embedding_type={pos_type!r} is not supported "
                             "(only 'absolute')")

        if family == "distilbert":
            hidden = int(need("dim", "hidden_size"))
            kw = dict(
                hidden_size=hidden,
                embedding_size=hidden,
                num_layers=int(need("n_layers", "num_hidden_layers")),
                num_heads=int(need("n_heads", "num_attention_heads")),
                intermediate_size=int(need("hidden_dim", "intermediate_size")),
                hidden_act=normalize_activation(need("activation", default="gelu"),
                                                what="activation"),
                type_vocab_size=0,
                layer_norm_eps=1e-12,  # hard-coded in transformers' DistilBERT
            )
        else:
            hidden = int(need("hidden_size"))
            emb = hidden
            if family in ("albert", "electra"):
                emb = int(need("embedding_size", default=hidden))
            kw = dict(
                hidden_size=hidden,
                embedding_size=emb,
                num_layers=int(need("num_hidden_layers")),
                num_heads=int(need("num_attention_heads")),
                intermediate_size=int(need("intermediate_size")),
                hidden_act=normalize_activation(
                    need("hidden_act", default="gelu_new" if family == "albert" else "gelu")),
                type_vocab_size=int(need("type_vocab_size", default=2)),
                layer_norm_eps=float(need("layer_norm_eps", default=1e-12)),
            )
        pad_default = 1 if family == "roberta" else 0
        pad = raw.get("pad_token_id")
        pad = pad_default if pad is None else int(pad)

        id2label = raw.get("id2label")
        if isinstance(id2label, dict):
            id2label = {int(k): v for k, v in id2label.items()}
        else:
            id2label = None
        num_labels = raw.get("num_labels")
        if num_labels is None:
            num_labels = len(id2label) if id2label else 2

        archs = raw.get("architectures") or ()
        cfg = cls(
            model_type=model_type,
            family=family,
            vocab_size=int(need("vocab_size")),
            max_position_embeddings=int(need("max_position_embeddings", default=512)),
            pad_token_id=pad,
            position_scheme="roberta" if family == "roberta" else "absolute",
            num_hidden_groups=int(raw.get("num_hidden_groups", 1) or 1),
            inner_group_num=int(raw.get("inner_group_num", 1) or 1),
            architectures=tuple(archs),
            num_labels=int(num_labels),
            problem_type=raw.get("problem_type"),
            id2label=id2label,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
            summary_activation=normalize_activation(
                raw.get("summary_activation"), what="summary_activation", heads=True),
            summary_use_proj=bool(raw.get("summary_use_proj", True)),
            raw=dict(raw),
            **kw,
        )
        cfg.validate(source)
        return cfg

    def validate(self, source: str = "config") -> None:
        for name in ("vocab_size", "hidden_size", "embedding_size", "num_layers", "num_heads",
                     "intermediate_size", "max_position_embeddings", "num_hidden_groups",
                     "inner_group_num"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{source}: {name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"{source}: hidden_size {self.hidden_size} is not divisible by "
                             f"num_heads {self.num_heads}")
        if self.family == "albert" and self.num_hidden_groups > self.num_layers:
            raise ValueError(f"{source}: num_hidden_groups {self.num_hidden_groups} > "
                             f"num_hidden_layers {self.num_layers}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"{source}: layer_norm_eps must be positive")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"{source}: pad_token_id {self.pad_token_id} is outside the "
                             f"vocabulary [0, {self.vocab_size})")
        if self.position_scheme == "roberta" and self.max_seq_len <= 0:
            raise ValueError(f"{source}: max_position_embeddings {self.max_position_embeddings} "
                             f"leaves no positions after the padding offset")
