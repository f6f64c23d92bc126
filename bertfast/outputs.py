"""Model outputs with transformers' field names.

``EncoderOutput`` carries every field any head produces; fields a head does not
produce are ``None``. Access by attribute (``out.logits``) or by key
(``out["logits"]``); ``keys()``/``items()``/``to_dict()`` list the fields that are
set, and ``out[0]`` is the first set field (like transformers' ``ModelOutput``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = ["EncoderOutput"]


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    logits: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None

    def keys(self):
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def items(self):
        return [(k, getattr(self, k)) for k in self.keys()]

    def values(self):
        return [getattr(self, k) for k in self.keys()]

    def to_dict(self):
        return dict(self.items())

    def to_tuple(self):
        return tuple(self.values())

    def __getitem__(self, key: Any):
        if isinstance(key, str):
            if key not in {f.name for f in fields(self)}:
                raise KeyError(
                    f"{key!r} is not an output field; fields: "
                    f"{', '.join(f.name for f in fields(self))}"
                )
            value = getattr(self, key)
            if value is None:
                raise KeyError(
                    f"{key!r} was not produced by this model/head; set fields: "
                    f"{', '.join(self.keys())}"
                )
            return value
        return self.to_tuple()[key]

    def __contains__(self, key) -> bool:
        return key in self.keys()

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def get(self, key: str, default=None):
        value = getattr(self, key, None)
        return default if value is None else value
