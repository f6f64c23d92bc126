"""Model outputs with transformers' field names.

``EncoderOutput`` carries every field any head produces; fields a head does not
produce are ``None``. Access by attribute (``out.logits``) or by key
(``out["logits"]``); ``keys()``/``items()``/``to_dict()`` list the fields that are
set, and ``out[0]`` is the first set field (like transformers' ``ModelOutput``).

A field may be *deferred* (:meth:`EncoderOutput.defer`): computed on its first read,
by any of those means, then kept. The eager forward defers ``pooler_output``, so a
caller that reads the hidden states alone does not pay for the pooler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

__all__ = ["EncoderOutput"]


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor | None = None
    # A default factory leaves no class attribute, so that a deferred field, absent
    # from the instance, reaches __getattr__.
    pooler_output: torch.Tensor | None = field(default_factory=lambda: None)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    logits: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None

    def defer(self, name: str, compute: Callable[[], Any]) -> None:
        """Make field ``name`` the result of ``compute()`` (run under ``no_grad``),
        computed on the field's first read and then kept; a value assigned to the
        field before that read is the field's (``compute`` never runs)."""
        if name != "pooler_output":
            raise ValueError(f"only pooler_output can be deferred, not {name!r}")
        self.__dict__.setdefault("_deferred", {})[name] = compute
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str):
        # Reached only for a name the instance does not hold: a deferred field.
        compute = self.__dict__.get("_deferred", {}).get(name)
        if compute is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with torch.no_grad():
            value = compute()
        self.__dict__[name] = value
        self.__dict__["_deferred"].pop(name, None)  # (another thread may have read it too)
        return value

    def __getstate__(self):
        """Pickled with every deferred field computed (a closure does not pickle)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

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
