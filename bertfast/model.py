"""The encoder: padding-free execution of a BERT-family model on bertfast's ops.

``from_pretrained(path, device="cpu", dtype=torch.float32, backend="auto", head=None)``
loads a Hugging Face folder (see ``checkpoint.py``) into a :class:`BertfastModel`.

Forward pass (``H`` hidden, ``T`` real tokens of the batch):

1. validate the inputs (ids, shapes, dtypes, devices, ranges) before any kernel;
2. position ids in the padded layout, as the family does (BERT-style ``arange``;
   RoBERTa ``cumsum(ids != pad) * (ids != pad) + pad``), unless given;
3. ``info = ops.pack_info_from_counts(...)`` (``ops.pack_info`` while compiling);
   ids, positions and token types are gathered to ``[T]`` with ``ops.pack_tokens``;
4. ``ops.embed_layernorm`` on the packed tokens, then the ALBERT/ELECTRA projection;
5. per layer: ``qkv = ops.linear(h, Wqkv, bqkv)``, ``ops.attention_varlen``,
   ``ops.linear`` (output projection, bias folded into) ``ops.add_layernorm``,
   ``ops.linear_gelu`` (FFN up + activation), ``ops.linear`` + ``ops.add_layernorm``;
   ALBERT runs its shared layers by ``EncoderConfig.layer_schedule()``;
6. heads on packed tokens / first real tokens; ``ops.unpack_tokens`` scatters
   ``[T, ...]`` back to ``[B, S, ...]`` only at the end.

A batch with no padding skips the gathers of steps 3 and 6 (``PackInfo.dense``).
On the ``cpu`` backend, in plain eager mode, steps 4 and 5 call the backend's
implementations directly (the backend's encoder runner, ``ops.encoder_runner``:
``ops/cpu/encoder.py``; resolved once per backend, device and dtype; no per-call
checks or dispatch), since the inputs were validated in step 1 and every activation
is made here; see docs/design.md, "Per-call overhead and the CPU fast path".

Host syncs: the value checks of step 1 and the packing counts of step 3 (real
tokens, longest row) are read back to the host in one transfer; the ops after it
are called with ``validate=False`` and nothing else in the forward pass waits for
the device (``tests/test_host_syncs.py`` counts it). ``torch.compile(model,
fullgraph=True)`` traces the whole forward as one graph (value checks are skipped
while tracing; see ``ops/padding.py`` for the data-dependent token count).

Padding: outputs at padded positions are zero. A row whose attention mask is all
zeros has no real token: all its outputs (hidden states, pooler output, logits) are
zero. Poolers and first-token heads read each row's first *real* token.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import re

import torch
from torch import nn

from . import heads as H
from . import hub, ops
from .checkpoint import encoder_weight_specs, file_backed, load_checkpoint, release_freed_memory
from .config import EncoderConfig
from .info import warn_if_slow_bf16
from .outputs import EncoderOutput
from .validate import first_few, load_options

__all__ = ["BertfastModel", "from_pretrained"]

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class _Holder(nn.Module):
    """A plain container; weights are attached under their canonical names."""


def _attach(root: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Register ``tensor`` as the parameter ``name`` (creating holders on the way),
    or replace the parameter already there."""
    *path, leaf = name.split(".")
    mod = root
    for part in path:
        child = mod._modules.get(part)
        if child is None:
            child = _Holder()
            mod.add_module(part, child)
        mod = child
    mod._parameters.pop(leaf, None)
    mod.register_parameter(leaf, _as_parameter(tensor))


def _as_parameter(tensor: torch.Tensor) -> nn.Parameter:
    """``tensor`` as a parameter (no gradient), sharing its memory. A packed or int8
    weight gets another handle on the same packed data marked as a parameter, as
    ``nn.Parameter`` does for a tensor subclass but without dispatching ``detach`` to
    its ``__torch_dispatch__``: torch's first dispatch to a Python tensor subclass
    imports ``torch.distributed.tensor`` and sympy, memory and load time a model does
    not need (benchmarks/results/cpu-intel-xeon-amx-2t/notes.md, "Resident memory")."""
    if ops.is_packed_weight(tensor) or ops.is_int8_weight(tensor):
        handle = tensor._same()
        handle._is_param = True  # what nn.Parameter sets on a subclass
        return handle
    if isinstance(tensor, nn.Parameter):
        tensor = tensor.data
    return nn.Parameter(tensor, requires_grad=False)


#: Matrices that are not linear-layer weights (embedding tables, read by row).
#: Every other 2-D weight (encoder and head dense layers) is read only by
#: ops.linear / ops.linear_gelu: what an owned fp32 CPU model keeps packed.
_TABLES = re.compile(r"^embeddings\.(word|position|token_type)$")

#: The weights ``quantize="int8"`` quantizes: the encoder layers' linear layers
#: (see bertfast/ops/cpu/int8.py for why the projection, pooler and heads stay fp32).
_QUANTIZED = re.compile(r"^layers\.\d+\.(qkv|attn_out|ffn_in|ffn_out)\.weight$")


def _token_counts(lengths) -> list[int]:
    """``encode_packed``'s ``lengths`` as a list of ints, each at least 1."""
    wrong = "lengths must be a sequence of integers, each at least 1"
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"{wrong}, not {type(lengths).__name__}")
    out = []
    for n in lengths:
        if isinstance(n, bool) or not hasattr(type(n), "__index__"):
            raise TypeError(f"{wrong}; got {n!r}")
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"{wrong}; got {n}")
        out.append(n)
    return out


def _read_scalars(scalars) -> list[int]:
    """Device scalars (value checks, packing counts) read back to the host in one
    transfer, as int64."""
    return torch.stack(
        [t if t.dtype == torch.int64 else t.to(torch.int64) for t in scalars]
    ).tolist()


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        ia = a.index if a.index is not None else torch.cuda.current_device()
        ib = b.index if b.index is not None else torch.cuda.current_device()
        return ia == ib
    return True


class BertfastModel(nn.Module):
    """A BERT-family encoder (+ head) running on bertfast's fused ops.

    Call it like a transformers model::

        out = model(input_ids, attention_mask=None, token_type_ids=None,
                    position_ids=None, output_hidden_states=False)

    ``input_ids`` is ``[B, S]`` (``[B, C, S]`` for the ``multiple_choice`` head) of
    integer ids; ``attention_mask`` (default all ones) marks real tokens (nonzero);
    ``token_type_ids`` default to zeros. Returns an :class:`EncoderOutput`:
    ``last_hidden_state [B,S,H]``, ``pooler_output [B,H]`` (when the model has a
    pooler), ``hidden_states`` (embedding output, after the ALBERT/ELECTRA
    projection, then every layer output, as transformers defines them) when asked,
    and the head's fields (``logits``, ``prediction_logits``,
    ``seq_relationship_logits``, ``sop_logits``, ``start_logits``, ``end_logits``).

    Padded positions of every per-token output are zero; a row whose attention mask
    is all zeros gives zeros for all of its outputs (hidden states, pooler output,
    logits). Poolers and classification heads read each row's first real token.
    """

    def __init__(
        self,
        config: EncoderConfig,
        weights: dict[str, torch.Tensor],
        head: str = "base",
        backend: str = "auto",
        own_weights: bool = False,
        quantize: str | None = None,
    ):
        """``own_weights=True`` (what ``from_pretrained`` passes): the tensors in
        ``weights`` belong to this model alone, so on CPU in fp32, where the C++ GEMM
        runs the linear layers, they are packed once and kept only packed (see
        :meth:`refresh`). ``False`` (``optimize()``): they are the caller's and are
        used as they are, never copied. ``quantize="int8"``: the encoder layers'
        linear weights become int8 copies owned by the model (``_quantize_weights``;
        the tensors in ``weights`` are not modified)."""
        super().__init__()
        self.quantize = ops.check_quantize(quantize)
        # what attention computes in when not the model's dtype (int8: see
        # ``quant.attention_dtype``); None: the model's dtype
        self._attention_dtype = None
        self.config = config
        self.head = H.resolve_head(config, head)  # its name (str)
        self.backend = backend
        required = encoder_weight_specs(config)
        required.update(H.head_weight_specs(config, self.head)[0])
        missing = [n for n in required if n not in weights]
        if missing:
            raise ValueError(f"BertfastModel: missing weight(s) {first_few(missing)}")
        for name, shape in required.items():
            if tuple(weights[name].shape) != tuple(shape):
                raise ValueError(
                    f"BertfastModel: weight {name} has shape "
                    f"{tuple(weights[name].shape)}, expected {tuple(shape)}"
                )
        for name, tensor in weights.items():
            _attach(self, name, tensor)
        # The head module, chosen once here; it holds no weights (it reads them by name).
        self.task_head = H.build_head(config, self.head)
        self._owns_weights = bool(own_weights)
        self._graphs = None
        self.eval()
        if self.quantize:
            self._quantize_weights()
        if self._owns_weights:
            self._pack_weights()
            self._copy_mapped_weights()

    # ---------------------------------------------------------------- weights
    def _copy_mapped_weights(self) -> None:
        """Copy each plain CPU weight that is a view of a memory-mapped checkpoint
        file (``checkpoint.file_backed``) into memory of its own. Run once at load,
        after packing (the packed weights were read straight from the mapping, with
        no plain copy in between): once the reader's tensors are dropped, no mapping
        of the file is left, so the model holds one copy of its weights, and the
        checkpoint file can be replaced or deleted while the model lives. Shared
        (tied, ALBERT) weights stay shared."""
        params = [
            (name, p)
            for name, p in self.named_parameters(remove_duplicate=False)
            if not (ops.is_packed_weight(p) or ops.is_int8_weight(p))
        ]
        seen = {}
        for (name, p), mapped in zip(params, file_backed(p for _, p in params)):
            if mapped:
                key = (p.data_ptr(), tuple(p.shape), tuple(p.stride()))
                if key not in seen:
                    seen[key] = p.detach().clone()
                _attach(self, name, seen[key])

    def _packable(self):
        """(name, tensor) of the linear-layer weights; a weight tied to an embedding
        table (the MLM decoder, usually) stays plain with it."""
        params = list(self.named_parameters(remove_duplicate=False))
        tables = {
            p.untyped_storage().data_ptr()
            for n, p in params
            if _TABLES.match(n) and not ops.is_packed_weight(p)
        }
        for name, p in params:
            if p.dim() != 2 or _TABLES.match(name) or ops.is_int8_weight(p):
                continue
            if not ops.is_packed_weight(p) and p.untyped_storage().data_ptr() in tables:
                continue
            yield name, p

    def _pack_weights(self) -> None:
        pack = ops.weight_packer(self.backend, self.device, self.dtype)
        if pack is None:
            return
        seen = {}
        for name, p in list(self._packable()):
            if ops.is_packed_weight(p) or p.device.type != "cpu":
                continue
            if ops.is_int8_weight(p):
                continue
            key = (p.data_ptr(), tuple(p.shape), tuple(p.stride()))
            if key not in seen:  # ALBERT-style shared tensors stay shared
                seen[key] = pack(p)
            if seen[key] is not None:
                _attach(self, name, seen[key])

    def _quantize_weights(self) -> None:
        """``quantize="int8"``: replace the encoder layers' linear weights by int8
        :class:`~bertfast.ops.cpu.int8.QuantizedWeight` copies (CPU, fp32, cpu backend
        only; ValueError otherwise: never a silent fp32 model)."""
        ops.check_int8_supported(self.device, self.dtype, self.backend)
        self._attention_dtype = ops.int8_attention_dtype()
        seen = {}
        for name, p in list(self.named_parameters(remove_duplicate=False)):
            if not _QUANTIZED.match(name) or ops.is_int8_weight(p):
                continue
            key = (p.data_ptr(), tuple(p.shape), tuple(p.stride()))
            if key not in seen:  # ALBERT-style shared tensors stay shared
                # QKV: two-part activations (the attention scores amplify their error)
                split = name.endswith(".qkv.weight")
                seen[key] = ops.quantize_int8(p, split=split)
            _attach(self, name, seen[key])

    def unpack_weights(self) -> BertfastModel:
        """Make every packed weight a plain, writable tensor again (still one copy)
        and stop packing until :meth:`refresh`. Edit the weights in any way
        (``.data[...] =``, ``copy_`` under ``no_grad``, NumPy views,
        ``load_state_dict``), then call :meth:`refresh` for the packed speed; an
        unpacked model computes with its weights as they are at every call."""
        self.__dict__.pop("_runner_cache", None)  # its operands hold the packed weights
        seen = {}
        for name, p in list(self._packable()):
            if ops.is_packed_weight(p):
                if id(p._packed) not in seen:  # shared (ALBERT) weights stay shared
                    seen[id(p._packed)] = p.dense()
                _attach(self, name, seen[id(p._packed)])
        return self

    def refresh(self) -> BertfastModel:
        """Re-read the model's weights after editing them: packs the CPU fp32
        linear weights again (a model ``from_pretrained`` loaded; see
        :meth:`unpack_weights`) and drops captured CUDA graphs, which hold the
        addresses of the tensors they were captured with (needed after a
        parameter was replaced, e.g. ``p.data = other``)."""
        self.__dict__.pop("_runner_cache", None)
        if self._owns_weights:
            self._pack_weights()
        if self._graphs is not None:
            from .graphs import GraphCache

            self._graphs = GraphCache(self, capture=self._graphs.capture)
        return self

    @contextlib.contextmanager
    def edit_weights(self):
        """``with model.edit_weights(): ...``: :meth:`unpack_weights` on entry,
        :meth:`refresh` on exit."""
        self.unpack_weights()
        try:
            yield self
        finally:
            self.refresh()

    def weight_nbytes(self) -> int:
        """Bytes held by the model's tensors (parameters and buffers, shared storage
        counted once; packed weights by their panels)."""
        params = [p for _, p in self.named_parameters(remove_duplicate=False)]
        return ops.weight_nbytes(params + list(self.buffers()))

    def _apply(self, fn, recurse=True):
        # .to() / .half() / .cuda(): convert plain tensors; an owned model packs
        # again when it (still, or again) runs on the C++ GEMM.
        if getattr(self, "quantize", None):
            ops.check_int8_apply(fn)  # an int8 model cannot move or be cast
            return self
        if any(ops.is_packed_weight(p) for _, p in self._packable()):
            self.unpack_weights()
        out = super()._apply(fn, recurse)
        if getattr(self, "_owns_weights", False):
            self._pack_weights()
        return out

    # ------------------------------------------------------------------ helpers
    @property
    def device(self) -> torch.device:
        # through the module dicts: nn.Module's __getattr__ twice cost ~4 us a read,
        # and every forward's input checks read it
        return self._modules["embeddings"]._parameters["word"].device

    @property
    def dtype(self) -> torch.dtype:
        return self._modules["embeddings"]._parameters["word"].dtype

    def _w(self, name: str) -> torch.Tensor | None:
        mod = self
        *path, leaf = name.split(".")
        for part in path:
            mod = mod._modules.get(part)
            if mod is None:
                return None
        return mod._parameters.get(leaf)

    @property
    def has_pooler(self) -> bool:
        return self._w("pooler.weight") is not None

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"model_type={c.model_type}, head={self.head}, layers={c.num_layers}, "
            f"hidden={c.hidden_size}, heads={c.num_heads}, backend={self.backend!r}"
        )

    # ------------------------------------------------------------ validation
    def _check_ids(self, name: str, t, shape, ids: bool = True):
        """Type, dtype (integer ids when ``ids``), shape and device of an input tensor
        (no device read)."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if ids and t.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must hold integer ids, got dtype {t.dtype}")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} "
                f"(the shape of input_ids)"
            )
        if not _same_device(t.device, self.device):
            raise ValueError(
                f"{name} is on {t.device} but the model is on {self.device}; "
                f"move the inputs with .to({str(self.device)!r})"
            )

    def _prepare(self, input_ids, attention_mask, token_type_ids, position_ids):
        """Validated ``(attention_mask, token_type_ids, position_ids)`` (see
        ``_prepare_counted``)."""
        return self._prepare_counted(input_ids, attention_mask, token_type_ids, position_ids)[:3]

    def _check_inputs(self, input_ids, attention_mask, token_type_ids, position_ids):
        """The host-side input checks (types, ranks, shapes, dtypes, devices; no device
        read), in the order their errors are reported; returns ``(attention_mask,
        token_type_ids, position_ids)`` with ``[S]`` / ``[1, S]`` position ids
        broadcast to ``[B, S]`` (None where not given). Also raises here, on the host,
        when default absolute positions cannot hold ``S`` tokens."""
        cfg = self.config
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}"
            )
        B, S = input_ids.shape
        if B == 0 or S == 0:
            raise ValueError(f"empty batch: input_ids has shape {tuple(input_ids.shape)}")
        self._check_ids("input_ids", input_ids, None)
        if attention_mask is not None:
            self._check_ids("attention_mask", attention_mask, (B, S), ids=False)
            if attention_mask.is_complex():
                raise TypeError("attention_mask must be a real (bool/int/float) tensor")
        if token_type_ids is not None:
            self._check_ids("token_type_ids", token_type_ids, (B, S))
        if position_ids is not None:
            if isinstance(position_ids, torch.Tensor) and position_ids.dim() == 1:
                position_ids = position_ids.unsqueeze(0)
            if isinstance(position_ids, torch.Tensor) and tuple(position_ids.shape) == (1, S):
                position_ids = position_ids.expand(B, S)
            self._check_ids("position_ids", position_ids, (B, S))
        elif cfg.position_scheme != "roberta":  # positions 0 .. S - 1
            self._check_values((("position_ids", "top", S, ""),), [S - 1])
        return attention_mask, token_type_ids, position_ids

    def _value_checks(self, types_given: bool, positions_given: bool, seqlen: int) -> tuple:
        """The checks of input *values* of one forward, in the order they are reported:
        ``(name, kind, limit, what)`` with kind ``"range"`` (reads the input's min and
        max: ids in ``[0, limit)``), ``"zero"`` (reads whether any token type is
        nonzero, for a family without token types) or ``"top"`` (reads the largest
        default RoBERTa position id; ``limit`` is then the sequence length, for the
        message). :meth:`_check_values` raises on the values read; the eager forward
        reads them before its kernels (``_prepare_counted``), a CUDA graph computes
        them inside the graph and reads them after (``graphs.py``). Default absolute
        positions need no read: ``_check_inputs`` checks ``S - 1`` on the host."""
        cfg = self.config
        checks = [("input_ids", "range", cfg.vocab_size, "vocabulary size")]
        if types_given:
            if cfg.has_token_types:
                checks.append(("token_type_ids", "range", cfg.type_vocab_size, "type_vocab_size"))
            else:
                checks.append(("token_type_ids", "zero", 0, ""))
        if positions_given:
            checks.append(
                (
                    "position_ids",
                    "range",
                    cfg.max_position_embeddings,
                    "max_position_embeddings",
                )
            )
        elif cfg.position_scheme == "roberta":
            checks.append(("position_ids", "top", seqlen, ""))
        return tuple(checks)

    def _check_values(self, checks, values) -> None:
        """Raise the error of the first check of ``checks`` (:meth:`_value_checks`)
        that ``values`` (two per ``"range"`` check, one otherwise) fail."""
        cfg = self.config
        at = 0
        for name, kind, limit, what in checks:
            if kind == "range":
                lo, hi = values[at], values[at + 1]
                at += 2
                if lo < 0 or hi >= limit:
                    bad = lo if lo < 0 else hi
                    raise IndexError(f"{name} contains {bad}, outside [0, {limit}) ({what})")
                continue
            value = values[at]
            at += 1
            if kind == "zero" and value:
                raise ValueError(
                    f"{cfg.model_type} has no token type embeddings: "
                    f"token_type_ids must be omitted or all zero"
                )
            if kind == "top" and value >= cfg.max_position_embeddings:
                raise ValueError(
                    f"sequence of {limit} tokens needs position id {value}, but "
                    f"max_position_embeddings is {cfg.max_position_embeddings} "
                    f"(at most {cfg.max_seq_len} tokens for {cfg.model_type})"
                )

    def _id_scalars(self, input_ids, token_type_ids, shape):
        """The device scalars of the id and token-type value checks (in the order of
        ``_value_checks``), and the token types to embed: zeros of ``shape`` where the
        family has token types and none were given, None where it has none. Each
        aminmax is unpacked into the list: torch 2.11's dynamo cannot add its result
        tuple to a list (``list += aminmax``), which broke ``torch.compile(model,
        fullgraph=True)``."""
        scalars = [*torch.aminmax(input_ids)]
        if token_type_ids is not None:
            if self.config.has_token_types:
                scalars += [*torch.aminmax(token_type_ids)]
            else:
                scalars.append((token_type_ids != 0).any())
        return scalars, self._token_types(token_type_ids, shape, input_ids.device)

    def _token_types(self, token_type_ids, shape, device):
        """The token types to embed: those given, zeros of ``shape`` where the family has
        token types and none were given, None where it has none."""
        if not self.config.has_token_types:
            return None
        if token_type_ids is None:
            return torch.zeros(shape, dtype=torch.long, device=device)
        return token_type_ids

    def _prepare_counted(self, input_ids, attention_mask, token_type_ids, position_ids):
        """Validate the inputs and fill in the defaults; returns ``(mask, token types or
        None, positions, counts)``.

        Metadata (types, shapes, devices) is checked first (``_check_inputs``). The
        value checks (``_value_checks``: id ranges, the RoBERTa position limit, all-zero
        token types for families without them) and the packing counts (real tokens,
        longest row) are then read back to the host together: *one* device-to-host
        transfer per forward, after which no op of the forward pass reads device
        memory on the host. ``counts`` is ``(keep, lengths, total, max_seqlen)`` for
        ``ops.pack_info_from_counts``, or None while compiling (value checks need the
        values, so they are skipped when tracing; the kernels are bounds-safe
        regardless). Where a backend reads the inputs on the host (CPU tensors,
        ``ops.scan_inputs``) the values and counts come from one native pass instead
        (``_prepare_scanned``: the same checks, and the ``PackInfo`` as ``counts``).
        """
        cfg = self.config
        attention_mask, token_type_ids, position_ids = self._check_inputs(
            input_ids, attention_mask, token_type_ids, position_ids
        )
        B, S = input_ids.shape
        device = input_ids.device
        checks = self._value_checks(token_type_ids is not None, position_ids is not None, S)
        full = attention_mask is None  # every position real: counts known on the host
        roberta = position_ids is None and cfg.position_scheme == "roberta"
        if roberta:  # RoBERTa's default positions: past the padding index, from the ids
            real = input_ids.ne(cfg.pad_token_id).long()
            position_ids = torch.cumsum(real, 1) * real + cfg.pad_token_id
        if self._graphs is None and not torch.compiler.is_compiling():
            scanned = self._prepare_scanned(
                input_ids, attention_mask, token_type_ids, position_ids, checks, roberta
            )
            if scanned is not None:
                return scanned
        if full:
            attention_mask = torch.ones(B, S, dtype=torch.int32, device=device)

        # Device scalars of the value checks, in the order of ``checks``.
        scalars, token_type_ids = self._id_scalars(input_ids, token_type_ids, (B, S))
        if roberta:  # the largest default position
            scalars.append(position_ids.max())
        elif position_ids is not None:
            scalars += [*torch.aminmax(position_ids)]
        else:  # S - 1 was checked on the host
            position_ids = torch.arange(S, device=device).expand(B, S)

        if torch.compiler.is_compiling():
            return attention_mask, token_type_ids, position_ids, None
        if full:
            keep, lengths = None, torch.full((B,), S, dtype=torch.int32, device=device)
        else:
            keep, lengths = ops.padding.mask_lengths(attention_mask)
            scalars += [lengths.sum(), lengths.max()]
        values = _read_scalars(scalars)  # the one device -> host read of the forward
        self._check_values(checks, values)
        total, longest = (B * S, S) if full else values[-2:]
        return attention_mask, token_type_ids, position_ids, (keep, lengths, total, longest)

    def _prepare_scanned(self, input_ids, mask, types, pos, checks, roberta):
        """``_prepare_counted``'s result from one pass over the inputs where a backend
        reads them on the host (``ops.scan_inputs``: CPU tensors), in place of a torch
        op per value: the same tensors, the same checks and errors, one host read, and
        as counts the batch's ``PackInfo`` itself. None where no backend scans them.
        ``pos``: the positions given, or RoBERTa's default ones (``roberta``), or None."""
        cfg = self.config
        B, S = input_ids.shape
        scan = ops.scan_inputs(input_ids, mask, types, pos)
        if scan is None:
            return None
        stats, cu, indices = scan
        ids_lo, ids_hi, types_lo, types_hi, pos_lo, pos_hi, total, longest = stats.tolist()
        values = [ids_lo, ids_hi]  # in the order of ``checks``
        if types is not None:
            values += [types_lo, types_hi] if cfg.has_token_types else [types_lo or types_hi]
        if roberta:  # the largest default position
            values.append(pos_hi)
        elif pos is not None:
            values += [pos_lo, pos_hi]
        self._check_values(checks, values)
        types = self._token_types(types, (B, S), input_ids.device)
        if pos is None:  # S - 1 was checked on the host
            pos = torch.arange(S).expand(B, S)
        if mask is None:
            mask = torch.ones(B, S, dtype=torch.int32)
        return mask, types, pos, ops.PackInfo(indices, cu, longest, B, S, dense=total == B * S)

    # ------------------------------------------------------------------- pack
    def _pack_info(self, mask: torch.Tensor, counts):
        if isinstance(counts, ops.PackInfo):  # _prepare_scanned's
            return counts
        if counts is None:  # compiling: the traced pack_info (no value known here)
            return ops.pack_info(mask)
        return ops.pack_info_from_counts(mask, *counts)

    def _pack(self, x: torch.Tensor, info) -> torch.Tensor:
        """Gather the real tokens of an integer ``[B, S]`` tensor -> ``[T]`` int64."""
        x = x.reshape(-1)
        if x.dtype != torch.int64:
            x = x.long()
        if info.dense:  # every position is real: the packed layout is the flat one
            return x
        return ops.pack_tokens(x, info.indices, backend=self.backend, validate=False)

    def _unpack(self, x: torch.Tensor, info) -> torch.Tensor:
        if info.dense:
            return x.view(info.batch, info.seqlen, *x.shape[1:])
        out = ops.unpack_tokens(
            x, info.indices, info.batch * info.seqlen, backend=self.backend, validate=False
        )
        return out.view(info.batch, info.seqlen, *x.shape[1:])

    # ---------------------------------------------------------------- encoder
    def _embed(self, ids, pos, types):
        cfg = self.config
        emb = self.embeddings
        h = ops.embed_layernorm(
            ids,
            pos,
            types,
            emb.word,
            emb.position,
            getattr(emb, "token_type", None) if types is not None else None,
            emb.ln.weight,
            emb.ln.bias,
            cfg.layer_norm_eps,
            backend=self.backend,
            validate=False,
        )
        if cfg.has_projection:
            h = ops.linear(h, emb.project.weight, emb.project.bias, backend=self.backend)
        return h

    def _layers(self, h, attend, states=None):
        """Every layer application; ``attend(qkv) -> ctx`` is the attention flavour
        (packed varlen, or padded with a key mask)."""
        cfg = self.config
        be = self.backend
        eps = cfg.layer_norm_eps
        layers = self.layers._modules
        ad = self._attention_dtype
        for idx in cfg.layer_schedule():
            L = layers[str(idx)]
            qkv = ops.linear(h, L.qkv.weight, L.qkv.bias, backend=be)
            ctx = attend(qkv) if ad is None else attend(qkv.to(ad)).to(qkv.dtype)
            a = ops.linear(ctx, L.attn_out.weight, None, backend=be)
            h = ops.add_layernorm(
                a, h, L.attn_out.bias, L.attn_ln.weight, L.attn_ln.bias, eps, backend=be
            )
            f = ops.linear_gelu(h, L.ffn_in.weight, L.ffn_in.bias, cfg.hidden_act, backend=be)
            o = ops.linear(f, L.ffn_out.weight, None, backend=be)
            h = ops.add_layernorm(
                o, h, L.ffn_out.bias, L.ffn_ln.weight, L.ffn_ln.bias, eps, backend=be
            )
            if states is not None:
                states.append(h)
        return h

    def _runner(self):
        """The cpu backend's encoder runner (``ops.encoder_runner``) when this
        forward may take it, else None (the ops then run through their public entry
        points: checks, dispatch, custom-op registration).

        Taken in plain eager mode only (not while compiling or under a torch_dispatch
        mode: those must see the registered ops). The runner is resolved once per
        (backend, ``BERTFAST_BACKEND``, device, dtype) and cached; a model moved or
        cast (``.to()``) resolves again."""
        if torch.compiler.is_compiling() or ops._dispatch_stack_len() != 0:
            return None
        word = self.embeddings._parameters["word"]
        key = (self.backend, os.environ.get("BERTFAST_BACKEND"), word.device, word.dtype)
        cached = self.__dict__.get("_runner_cache")
        if cached is None or cached[0] != key:
            params = [p for _, p in self.named_parameters(remove_duplicate=False)]
            runner = ops.encoder_runner(
                self.backend, self.config, self.embeddings, self.layers, params
            )
            cached = (key, runner)
            self.__dict__["_runner_cache"] = cached
        return cached[1]

    def encode(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        output_hidden_states: bool = False,
    ):
        """Run the encoder padding-free; returns ``(packed last hidden [T,H], PackInfo,
        list of packed hidden states or None)``.

        Host syncs: ``_prepare_counted`` reads the value checks and the packing counts
        back once; every op after it runs with ``validate=False`` (its values were
        checked there), so no layer syncs. With CUDA graphs on (and no hidden states
        asked), a batch that fits a packed graph replays it after that same read
        (``graphs.GraphCache.encode``). Under ``torch.compile`` the whole function
        traces as one graph (``ops.pack_info`` is a custom op with a data-dependent
        size; ``max_seqlen`` is then the padded length)."""
        prepared = self._prepare_counted(input_ids, attention_mask, token_type_ids, position_ids)
        graphs = self._graphs
        if graphs is not None and not output_hidden_states:
            got = graphs.encode(input_ids, *prepared)
            if got is not None:
                return got
        return self._encode_prepared(input_ids, *prepared, output_hidden_states)

    def _encode_prepared(self, input_ids, mask, types, pos, counts, output_hidden_states):
        """``encode`` after ``_prepare_counted``: the eager padding-free encoder."""
        info = self._pack_info(mask, counts)
        ids_p = self._pack(input_ids, info)
        pos_p = self._pack(pos, info)
        types_p = self._pack(types, info) if types is not None else None
        eager = counts is not None and type(input_ids) is torch.Tensor
        return self._encode_rows(ids_p, pos_p, types_p, info, eager, output_hidden_states)

    def encode_packed(self, input_ids, lengths, token_type_ids=None):
        """Run the encoder on sequences laid back to back, with no padding at all:
        ``input_ids`` ``[T]`` (the sequences' ids, one after the other), ``lengths``
        their token counts (Python ints, each at least 1, summing to ``T``: known on
        the host, so nothing is read back to count them), ``token_type_ids`` ``[T]``
        or None (zeros). Positions are each sequence's own, as in :meth:`encode`
        (``0 .. n - 1``; RoBERTa's counted from the padding id). Returns ``(last
        hidden [T, H], PackInfo)``.

        The same rows, kernels and order as :meth:`encode` of the sequences
        right-padded into ``[B, max(lengths)]``, so the same values, bit for bit,
        without the padded tensors, the mask's packing and the gathers. Inputs are
        checked as in ``forward`` (one device read for the value checks). Runs
        eagerly: CUDA graphs replay :meth:`encode`'s padded batches only."""
        cfg = self.config
        self._check_ids("input_ids", input_ids, None)
        if input_ids.dim() != 1:
            raise ValueError(
                f"input_ids must be [total_tokens], got shape {tuple(input_ids.shape)}"
            )
        lengths = _token_counts(lengths)
        T, B = input_ids.shape[0], len(lengths)
        if B == 0 or sum(lengths) != T:
            raise ValueError(
                f"lengths sum to {sum(lengths)} but input_ids holds {T} tokens"
                if B
                else "empty batch: no sequence in lengths"
            )
        if token_type_ids is not None:
            self._check_ids("token_type_ids", token_type_ids, (T,))
        S = max(lengths)
        if cfg.position_scheme != "roberta":
            self._check_values((("position_ids", "top", S, ""),), [S - 1])
        device = input_ids.device
        cu = torch.tensor(
            list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32, device=device
        )
        ids = input_ids if input_ids.dtype == torch.int64 else input_ids.long()
        types = token_type_ids
        if types is not None and types.dtype != torch.int64:
            types = types.long()

        # The value checks of ``_prepare_counted``, on the packed tensors.
        checks = self._value_checks(types is not None, False, S)
        scalars, types = self._id_scalars(ids, types, (T,))
        # Each token's sequence start (more than one sequence).
        counts = None if B == 1 else torch.tensor(lengths, device=device)
        starts = None if B == 1 else cu[:-1].long().repeat_interleave(counts, output_size=T)
        if cfg.position_scheme == "roberta":
            real = ids.ne(cfg.pad_token_id).long()
            counted = torch.cumsum(real, 0)
            if starts is not None:  # restart the count at each sequence
                counted = counted - torch.cat([counted.new_zeros(1), counted])[starts]
            pos = counted * real + cfg.pad_token_id
            scalars.append(pos.max())
        else:
            pos = torch.arange(T, device=device)
            if starts is not None:
                pos = pos - starts
        self._check_values(checks, _read_scalars(scalars))

        flat = torch.arange(T, device=device)
        dense = min(lengths) == S
        if not dense:  # where each row sits in the padded [B, S] layout
            rows = (torch.arange(B, device=device) * S).repeat_interleave(counts, output_size=T)
            flat = flat + rows - starts
        info = ops.PackInfo(flat, cu, S, B, S, dense=dense)
        eager = type(input_ids) is torch.Tensor and not torch.compiler.is_compiling()
        h, info, _ = self._encode_rows(ids, pos, types, info, eager, False)
        return h, info

    def _encode_packed_host(
        self, ids: list[int], lengths: list[int], types: list[int] | None, pool=None
    ):
        """:meth:`encode_packed` of ids held on the host, for a model on the CPU (the
        Embedder's tokenised texts): ``ids`` the sequences' ids back to back,
        ``lengths`` their token counts (ints, each at least 1, summing to ``len(ids)``:
        the caller's), ``types`` their token types or None.

        The same value checks, on the lists (min and max in Python: no torch op and
        no read back), raising the same errors in the same order; positions and the
        packing layout made on the host too, and every int64 input as one tensor.
        The same tensors as :meth:`encode_packed` makes, so the same result bit for
        bit, without the dozen small torch ops around the forward (each costs tens of
        microseconds right after a forward has streamed the weights through the
        caches: a measurable share of a lone short query).

        Returns ``(last hidden [T, H], PackInfo, pooled)``. ``pool``: ``(mode,
        normalize)`` for the Embedder, whose vectors the backend's encoder runner then
        pools in the same native step (``CpuEncoder.pool``); ``pooled`` is those
        ``[B, H]`` vectors, or None where the runner does not pool (no runner, another
        mode or dtype: the caller pools ``hidden``)."""
        cfg = self.config
        T, B, S = len(ids), len(lengths), max(lengths)
        if cfg.position_scheme != "roberta":
            self._check_values((("position_ids", "top", S, ""),), [S - 1])
        checks = self._value_checks(types is not None, False, S)
        scalars = [min(ids), max(ids)]
        if types is not None:
            if cfg.has_token_types:
                scalars += [min(types), max(types)]
            else:
                scalars.append(int(any(types)))
                types = None
        if cfg.has_token_types and types is None:
            types = [0] * T
        if cfg.position_scheme == "roberta":  # counted from the padding id, per sequence
            pad, pos, at = cfg.pad_token_id, [], 0
            for n in lengths:
                count = pad
                for token in ids[at : at + n]:
                    if token != pad:
                        count += 1
                        pos.append(count)
                    else:
                        pos.append(pad)
                at += n
            scalars.append(max(pos))
        else:
            pos = list(range(T)) if B == 1 else [i for n in lengths for i in range(n)]
        self._check_values(checks, scalars)
        dense = min(lengths) == S
        if dense:
            flat = range(T)
        else:  # where each row sits in the padded [B, S] layout
            flat = [b * S + i for b, n in enumerate(lengths) for i in range(n)]
        buf = torch.tensor([*ids, *pos, *(types or ()), *flat], dtype=torch.int64)
        ids_t, pos_t = buf[:T], buf[T : 2 * T]
        types_t = buf[2 * T : 3 * T] if types is not None else None
        cu = torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=torch.int32)
        info = ops.PackInfo(buf[buf.shape[0] - T :], cu, S, B, S, dense=dense)
        eager = not torch.compiler.is_compiling()
        h, info, _ = self._encode_rows(ids_t, pos_t, types_t, info, eager, False)
        runner = self._runner() if eager and pool is not None else None
        return h, info, runner.pool(h, info, *pool) if runner is not None else None

    def _encode_rows(self, ids_p, pos_p, types_p, info, eager, output_hidden_states):
        """The encoder on packed ids, positions and token types (``info``: their
        ``PackInfo``); ``eager``: the backend's encoder runner may take it."""
        cfg = self.config
        runner = self._runner() if eager else None
        if runner is not None and not output_hidden_states:
            h = runner.forward(ids_p, pos_p, types_p, info, self._attention_dtype)
            if h is not None:  # the embeddings and every layer in one native call
                return h, info, None
        h = runner.embed(ids_p, pos_p, types_p) if runner else self._embed(ids_p, pos_p, types_p)
        states = [h] if output_hidden_states else None
        if runner is not None:
            return runner.layers(h, info, states, self._attention_dtype), info, states
        nh, scale = cfg.num_heads, cfg.head_dim**-0.5
        cu, max_len, be = info.cu_seqlens, info.max_seqlen, self.backend
        h = self._layers(
            h,
            lambda qkv: ops.attention_varlen(
                qkv, cu, max_len, nh, scale, backend=be, validate=False
            ),
            states,
        )
        return h, info, states

    def encode_static(self, input_ids, attention_mask, token_type_ids, position_ids):
        """The encoder on the *padded* layout with static shapes and no host read (what
        a padded CUDA graph captures, see ``graphs.py``): ``[B, S]`` ids, key mask
        (nonzero = real token), token types (None when the family has none) and
        positions, all in range (validated, or clamped by the graph); returns the last
        hidden state ``[B, S, H]``, zero at padded positions. The mask is converted to
        the attention kernels' form (bool bytes) once here, not in every layer; a
        bool mask is used as it is."""
        cfg = self.config
        keep = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
        keep = keep.contiguous()
        h = self._embed(input_ids, position_ids, token_type_ids if cfg.has_token_types else None)
        nh, scale, be = cfg.num_heads, cfg.head_dim**-0.5, self.backend
        h = self._layers(h, lambda qkv: ops.attention(qkv, keep, nh, scale, backend=be))
        return torch.where(keep[..., None], h, 0.0)

    def encode_packed_static(self, input_ids, position_ids, token_type_ids, cu_seqlens, max_seqlen):
        """The padding-free encoder with static shapes and no host read (what a packed
        CUDA graph captures, see ``graphs.py``): ``[T]`` ids, positions and token types
        (None when the family has none), all in range; ``cu_seqlens`` int32 rising
        from 0 to ``T`` (every row of ``T`` in some sequence); ``max_seqlen`` at least
        the longest sequence. Returns ``[T, H]``."""
        cfg = self.config
        types = token_type_ids if cfg.has_token_types else None
        h = self._embed(input_ids, position_ids, types)
        nh, scale, be = cfg.num_heads, cfg.head_dim**-0.5, self.backend
        return self._layers(
            h,
            lambda qkv: ops.attention_varlen(
                qkv, cu_seqlens, max_seqlen, nh, scale, backend=be, validate=False
            ),
        )

    def enable_cuda_graphs(self, enabled: bool | None = True, capture: bool = True):
        """Replay CUDA graphs of the encoder and its head (``graphs.GraphCache``; the
        policy is in ``graphs.py``); ``enabled=None`` means on for CUDA devices.
        ``capture=False`` runs the same static-shape functions without graphs (how
        they are tested on CPU)."""
        if not enabled and enabled is not None:
            self._graphs = None
            return self
        from .graphs import GraphCache, graphs_enabled

        if capture and not graphs_enabled(enabled, self.device):
            self._graphs = None
            return self
        self._graphs = GraphCache(self, capture=capture)
        return self

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        output_hidden_states: bool = False,
    ) -> EncoderOutput:
        with torch.no_grad():
            return self._forward(
                input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
            )

    def _forward(
        self, input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
    ):
        head = self.task_head
        input_ids, attention_mask, token_type_ids, position_ids, choices = head.flatten_inputs(
            input_ids, attention_mask, token_type_ids, position_ids
        )
        graphs = self._graphs
        if graphs is not None and not output_hidden_states:
            # A small batch replays a padded graph, with no host read before the replay;
            # another reads its counts (with the input checks) and replays a packed graph
            # when one fits, else runs eagerly with the counts read (graphs.py).
            out = graphs.forward(input_ids, attention_mask, token_type_ids, position_ids, choices)
            if out is not None:
                return out
            prepared = self._prepare_counted(
                input_ids, attention_mask, token_type_ids, position_ids
            )
            out = graphs.forward_packed(input_ids, *prepared, choices)
            if out is not None:
                return out
            h, info, states = self._encode_prepared(input_ids, *prepared, False)
        else:
            h, info, states = self.encode(
                input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
            )
        out = EncoderOutput()
        out.last_hidden_state = self._unpack(h, info)
        if states is not None:
            out.hidden_states = tuple(self._unpack(s, info) for s in states)
        unpack = lambda t: self._unpack(t, info)  # noqa: E731
        lazy = not torch.compiler.is_compiling()
        return head(H.HeadInput(h, info, self._w, unpack, self.backend, choices, lazy), out)


def from_pretrained(
    path,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
    head: str | None = None,
    cuda_graphs: bool | None = None,
    quantize: str | None = None,
    *,
    revision: str | None = None,
    token=None,
    cache_dir=None,
) -> BertfastModel:
    """Load a Hugging Face checkpoint folder, or a Hub model id, into a
    :class:`BertfastModel`.

    ``path``: a local folder, or a Hugging Face Hub id (``"BAAI/bge-small-en-v1.5"``)
    found in or downloaded to the standard Hugging Face cache, with ``revision``,
    ``token`` and ``cache_dir`` (:mod:`bertfast.hub`: only the files bertfast reads;
    ``HF_HUB_OFFLINE=1`` loads cached models only).

    ``head`` is one of :data:`bertfast.heads.HEADS` or None (chosen from
    ``architectures`` in config.json). ``backend`` is passed to every op (``"auto"``,
    ``"torch"``, ``"cpu"``, ``"cuda"``, ``"triton"``). ``cuda_graphs`` (default: on
    for CUDA devices unless ``BERTFAST_CUDA_GRAPHS=0``) replays the encoder and its head
    through captured CUDA graphs (``graphs.py``: padded graphs for small batches, packed
    ones up to ``graphs.MAX_GRAPH_TOKENS`` real tokens); hidden states and larger
    batches run the padding-free eager path.

    Everything is checked before any weight is read: ``backend`` (and
    ``BERTFAST_BACKEND``) x ``device`` x ``dtype`` (a backend that cannot run there is
    a ``BackendError`` naming the ones that can; a CUDA device with none visible is a
    ``ValueError``), then the folder. A bad checkpoint raises
    :class:`~bertfast.validate.CheckpointError` (a missing folder or file is also a
    ``FileNotFoundError``), a non-floating ``dtype`` a ``TypeError``; nothing is
    half-loaded.

    ``quantize="int8"`` (CPU, float32, ``cpu``/``auto`` backend; ValueError elsewhere):
    the encoder layers' linear weights are held in int8 with per-output-channel
    scales and the activations quantized per token at run time (see
    ``bertfast/ops/cpu/int8.py``); everything else stays fp32.
    """
    ops.check_quantize(quantize)
    device = load_options(device, dtype, backend)
    if quantize:
        ops.check_int8_supported(device, dtype, backend)
    folder = hub.resolve(path, revision=revision, token=token, cache_dir=cache_dir)
    cfg, head, weights = load_checkpoint(folder, head=head, dtype=dtype, device=device)
    model = BertfastModel(
        cfg, weights, head=head, backend=backend, own_weights=True, quantize=quantize
    )
    del weights  # the checkpoint tensors the model did not keep (int8: the fp32 ones)
    release_freed_memory()
    warn_if_slow_bf16(device, dtype)  # once per process, on a CPU without native bf16
    if cuda_graphs or (cuda_graphs is None and device.type == "cuda"):
        model.enable_cuda_graphs(cuda_graphs)
    return model
