"""Drop-in: ``optimize(model)`` runs an existing transformers / sentence-transformers
model on bertfast.

The model keeps its class, call signature, head modules and output classes; only
the forward of its encoder (``model.base_model``: ``BertModel``, ``RobertaModel``,
``AlbertModel``, ``ElectraModel``, ``DistilBertModel``...) is replaced by
bertfast's padding-free encoder, which reads the model's own weight tensors:

- weights are shared, not copied: bertfast's canonical weights alias the model's
  parameters, and the fused ``[3H, H]`` QKV matrix becomes the storage of the
  model's query/key/value parameters (they are re-pointed at views of it), so
  memory after ``optimize()`` stays at the size of the original model. Nothing is
  cached from them either (no packed copies, see bertfast/ops/cpu/weights.py):
  every call reads the parameters as they are, so any in-place edit (``.data[...]
  =``, ``copy_`` on a view, a NumPy array sharing the memory, ``load_state_dict``)
  is seen by the next call, and a parameter given a new tensor (``p.data = t``,
  ``module.weight = Parameter(t)``, ``model.to(...)``) is noticed by a pointer check
  per call and the encoder rebuilt over it;
- heads (classifiers, LM heads, QA...) run unchanged on bertfast's encoder output;
- arguments bertfast does not implement (``output_attentions=True``, ``head_mask``,
  ``inputs_embeds``, ``past_key_values``, cross-attention inputs, ...) or a model in
  training mode run the original transformers forward for that call, with a
  warning naming the reason (``fallback=False`` raises instead);
- padded positions of the encoder output are zero by default, where transformers
  returns values computed from the padding tokens (they can differ by several units
  there; parity holds on real tokens). ``padded_positions="transformers"`` returns
  transformers' values instead: a batch with padding then runs the padded layout
  (cost follows ``batch x longest row`` like transformers, attention through torch's
  SDPA with transformers' additive mask; the other ops stay bertfast's) and the
  pooler reads position 0, as transformers' does.

``undo(model)`` restores the original forward.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import torch
import torch.nn.functional as F

from . import heads
from .checkpoint import canonical_name, convert
from .config import EncoderConfig
from .model import BertfastModel
from .outputs import EncoderOutput
from .validate import check_backend

__all__ = ["optimize", "undo", "UnsupportedArgument"]

#: Arguments bertfast's encoder implements.
_SUPPORTED = {
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "position_ids",
    "output_hidden_states",
    "return_dict",
}


#: What an optimized model returns at padded positions (``optimize(padded_positions=)``).
PADDED_POSITIONS = ("zeros", "transformers")


class UnsupportedArgument(NotImplementedError):
    """An argument of the original forward that bertfast does not implement."""


def _is_sentence_transformer(model) -> bool:
    return any(c.__name__ == "SentenceTransformer" for c in type(model).__mro__)


def optimize(
    model,
    backend: str = "auto",
    dtype: torch.dtype | None = None,
    fallback: bool = True,
    cuda_graphs: bool | None = None,
    padded_positions: str = "zeros",
    quantize: str | None = None,
):
    """Make ``model`` run on bertfast and return it (the same object).

    ``model``: a transformers ``PreTrainedModel`` of a supported family (any head) or
    a sentence-transformers ``SentenceTransformer``. ``backend``: as in
    ``from_pretrained``. ``dtype``: cast the model first (``model.to(dtype)``),
    e.g. ``torch.float16`` on a GPU. ``fallback``: what to do with an argument
    bertfast does not implement: run the original forward (warn) or raise
    :class:`UnsupportedArgument`. ``cuda_graphs``: replay small batches through
    captured CUDA graphs (default: on when the model is on a CUDA device; see
    ``bertfast/graphs.py``). ``padded_positions``: ``"zeros"`` (padded positions
    of the hidden states are zero, the padding-free fast path) or
    ``"transformers"`` (transformers' values there, at the cost of running a padded
    batch in the padded layout; see the module docstring). ``quantize="int8"``
    (CPU, float32): the encoder layers' linear layers run in int8 on a quantized
    copy of their weights, made now (the model's own parameters are not modified;
    the copy is the only extra memory, about a quarter of those weights' fp32 size:
    10.6 MB for all-MiniLM-L6-v2). Edits to the parameters in place are not seen
    by the int8 copy: call ``optimize`` again after editing.
    """
    from .ops.cpu import int8 as quant

    quant.check_quantize(quantize)
    if padded_positions not in PADDED_POSITIONS:
        choices = ", ".join(map(repr, PADDED_POSITIONS))
        raise ValueError(f"padded_positions must be one of {choices}, got {padded_positions!r}")
    if _is_sentence_transformer(model):
        found = False
        for module in model.modules():
            inner = getattr(module, "auto_model", None)
            if inner is not None:
                optimize(
                    inner,
                    backend=backend,
                    dtype=dtype,
                    fallback=fallback,
                    cuda_graphs=cuda_graphs,
                    padded_positions=padded_positions,
                    quantize=quantize,
                )
                found = True
        if not found:
            raise TypeError(
                "this SentenceTransformer has no transformers module "
                "(no `auto_model`) for bertfast to optimize"
            )
        return model

    try:
        from transformers import PreTrainedModel
    except ImportError as exc:  # pragma: no cover
        raise ImportError("optimize() needs transformers installed") from exc
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"optimize() takes a transformers PreTrainedModel or a "
            f"SentenceTransformer, got {type(model).__name__}"
        )
    base = model.base_model
    # Backend x device x dtype checked now, not at the first forward (as at load).
    anchor = next(base.parameters())
    check_backend(backend, anchor.device, anchor.dtype if dtype is None else dtype)
    if quantize:
        quant.check_supported(anchor.device, anchor.dtype if dtype is None else dtype, backend)
    if dtype is not None:
        model.to(dtype)
    cfg = EncoderConfig.from_dict(model.config.to_dict(), source=type(model).__name__)
    state = getattr(base, "_bertfast_state", None)
    if state is None:
        state = _FastForward(
            base, cfg, backend, fallback, cuda_graphs, padded_positions, quantize=quantize
        )
        state.install()
    else:
        state.backend, state.fallback, state.cuda_graphs = backend, fallback, cuda_graphs
        state.padded_positions = padded_positions
        state.quantize = quantize
        state.rebuild()
    return model


def undo(model):
    """Restore the original transformers forward of an optimized model."""
    if _is_sentence_transformer(model):
        for module in model.modules():
            inner = getattr(module, "auto_model", None)
            if inner is not None:
                undo(inner)
        return model
    base = model.base_model
    state = getattr(base, "_bertfast_state", None)
    if state is not None:
        state.uninstall()
    return model


class _FastForward:
    """The replacement forward of one transformers encoder module."""

    def __init__(
        self,
        base,
        cfg: EncoderConfig,
        backend: str,
        fallback: bool,
        cuda_graphs: bool | None,
        padded_positions: str = "zeros",
        quantize: str | None = None,
    ):
        self.base = base
        self.quantize = quantize
        self.padded_positions = padded_positions
        self.cuda_graphs = cuda_graphs
        self.cfg = cfg
        self.backend = backend
        self.fallback = fallback
        self.original = base.forward
        self.signature = inspect.signature(self.original)
        self.output_cls = None
        self.output_fields = frozenset()
        self.fast: BertfastModel | None = None
        self._warned = set()

    # ----------------------------------------------------------- install
    def install(self):
        self.output_cls = self._probe_output_class()
        # Read once here: dataclasses.fields() of it cannot be traced by torch.compile.
        self.output_fields = frozenset(f.name for f in dataclasses.fields(self.output_cls))
        self.rebuild()
        # Plain attributes (not submodules): state_dict / save_pretrained are unchanged.
        object.__setattr__(self.base, "_bertfast_state", self)
        object.__setattr__(self.base, "forward", self.forward)

    def uninstall(self):
        self.base.__dict__.pop("forward", None)
        self.base.__dict__.pop("_bertfast_state", None)

    def _probe_output_class(self):
        """The output class the original forward returns (one tiny forward)."""
        device = self._anchor().device
        ids = torch.full((1, 2), 1, dtype=torch.long, device=device)
        with torch.no_grad():
            out = self.original(
                input_ids=ids, attention_mask=torch.ones_like(ids), return_dict=True
            )
        return type(out)

    def _anchor(self) -> torch.Tensor:
        return next(self.base.parameters())

    def rebuild(self):
        """(Re)build the bertfast encoder over the module's current parameters and
        make Q/K/V parameters views of the fused QKV tensor (no second copy)."""
        anchor = self._anchor()
        state = self.base.state_dict()
        items = ((key, (lambda t=t: t)) for key, t in state.items())
        weights = convert(
            self.cfg,
            items,
            "base",
            dtype=anchor.dtype,
            device=anchor.device,
            source=type(self.base).__name__,
        )
        params = dict(self.base.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for key in state:
                mapped = canonical_name(self.cfg, key)
                if mapped is None or mapped[1] is None or key not in params:
                    continue
                name, part = mapped
                fused = weights.get(name)
                if fused is None:
                    continue
                n = fused.shape[0] // 3
                params[key].data = fused[part * n : (part + 1) * n]
        del state
        self.fast = BertfastModel(
            self.cfg, weights, head="base", backend=self.backend, quantize=self.quantize
        )
        if self.cuda_graphs is not False:
            self.fast.enable_cuda_graphs(self.cuda_graphs)
        # (parameter dict, name) of every parameter: checked per call without walking
        # the module tree (a module given a new Parameter shows in its dict).
        self._param_slots = [
            (mod._parameters, name)
            for mod in self.base.modules()
            for name, p in mod._parameters.items()
            if p is not None
        ]
        self._params_key = self._params_now()
        self._anchor_meta = (anchor.device, anchor.dtype)

    def _params_now(self):
        """Where every parameter of the module lives now (cheap: no data read; a
        cast or a move makes new storage too)."""
        return [
            d[name].data_ptr() if d.get(name) is not None else 0 for d, name in self._param_slots
        ]

    def _stale(self) -> bool:
        if torch.compiler.is_compiling():
            # data_ptr() cannot be traced: compare device and dtype, and refuse to rebuild
            # inside a graph (the caller runs the model once eagerly first).
            a = self._anchor()
            if (a.device, a.dtype) != self._anchor_meta:
                raise RuntimeError(
                    "bertfast.optimize: the model was moved or cast after "
                    "optimize(); call it once outside torch.compile (or "
                    "optimize() it again) before compiling"
                )
            return False
        return self._params_now() != self._params_key

    # ----------------------------------------------------------- forward
    def _why_fallback(self, args) -> str | None:
        if self.base.training:
            return "the model is in training mode (bertfast is inference-only; call .eval())"
        config = self.base.config
        for key, value in args.items():
            if key in _SUPPORTED:
                continue
            if value is None or value is False:
                continue
            return f"argument {key}={_short(value)} is not implemented by bertfast"
        if args.get("output_attentions") is None and getattr(config, "output_attentions", False):
            return "config.output_attentions=True is not implemented by bertfast"
        mask = args.get("attention_mask")
        if mask is not None and isinstance(mask, torch.Tensor) and mask.dim() != 2:
            return f"a {mask.dim()}-D attention_mask (bertfast takes [batch, seq] key masks)"
        if args.get("input_ids") is None:
            return "input_ids is required (inputs_embeds is not implemented by bertfast)"
        return None

    def forward(self, *args, **kwargs):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return self.original(*args, **kwargs)  # let transformers report it
        given = dict(bound.arguments)
        for name, param in self.signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:  # transformers 5: **kwargs
                given.update(given.pop(name, None) or {})
        reason = self._why_fallback(given)
        if reason is not None:
            if not self.fallback:
                raise UnsupportedArgument(f"bertfast.optimize: {reason}")
            if reason not in self._warned:
                self._warned.add(reason)
                warnings.warn(
                    f"bertfast: {reason}; running the original transformers forward for such calls",
                    stacklevel=2,
                )
            return self.original(*args, **kwargs)
        if self._stale():  # the user moved, cast or replaced parameters since optimize()
            self.rebuild()

        config = self.base.config
        hidden = given.get("output_hidden_states")
        if hidden is None:
            hidden = bool(getattr(config, "output_hidden_states", False))
        return_dict = given.get("return_dict")
        if return_dict is None:
            # config.return_dict is the supported spelling (transformers 5 deprecates
            # use_return_dict and logs a warning when it is read); TorchScript means tuples.
            return_dict = bool(getattr(config, "return_dict", True)) and not getattr(
                config, "torchscript", False
            )
        mask = given.get("attention_mask")
        if (
            self.padded_positions == "transformers"
            and isinstance(mask, torch.Tensor)
            and bool((mask == 0).any())
        ):
            with torch.no_grad():
                out = self._padded_forward(given, hidden)
        else:
            out = self.fast(
                given.get("input_ids"),
                attention_mask=mask,
                token_type_ids=given.get("token_type_ids"),
                position_ids=given.get("position_ids"),
                output_hidden_states=hidden,
            )
        fields = {"last_hidden_state": out.last_hidden_state}
        if "pooler_output" in self.output_fields:
            fields["pooler_output"] = out.get("pooler_output")
        if hidden:
            fields["hidden_states"] = out.hidden_states
        result = self.output_cls(**fields)
        return result if return_dict else result.to_tuple()

    def _padded_forward(self, given, hidden: bool) -> EncoderOutput:
        """``padded_positions="transformers"`` on a batch with padding: the encoder on
        the padded ``[B, S]`` layout, every position a query (padded ones included)
        and padded keys masked additively with the dtype's minimum, as transformers
        does (so a row with no real token attends uniformly, as there); the pooler
        reads position 0. Values at real positions equal the fast path's within the
        parity tolerance."""
        fast = self.fast
        cfg = fast.config
        ids = given.get("input_ids")
        mask, types, pos = fast._prepare(
            ids, given.get("attention_mask"), given.get("token_type_ids"), given.get("position_ids")
        )
        h = fast._embed(ids, pos, types)
        states = [h] if hidden else None
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=h.device)
        bias = bias.masked_fill(mask == 0, torch.finfo(h.dtype).min)[:, None, None, :]
        nh, scale = cfg.num_heads, cfg.head_dim**-0.5

        def attend(qkv: torch.Tensor) -> torch.Tensor:
            B, S, H3 = qkv.shape
            q, k, v = qkv.float().view(B, S, 3, nh, H3 // (3 * nh)).permute(2, 0, 3, 1, 4)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
            return ctx.transpose(1, 2).reshape(B, S, H3 // 3).to(qkv.dtype)

        h = fast._layers(h, attend, states)
        out = EncoderOutput(last_hidden_state=h)
        if states is not None:
            out.hidden_states = tuple(states)
        if fast.has_pooler:
            out.pooler_output = heads.pool(fast._w, h[:, 0], fast.backend)
        return out


def _short(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."
