"""CUDA graphs of the encoder and its head: captured once per shape bucket, replayed.

At small batches the GPU encoder is bound by kernel launches and by the host work
around them, not by arithmetic: a captured graph replays every kernel of the
forward in one launch. Graphs need static shapes and addresses, so each input is
copied into a static buffer of a bucket, the graph is replayed on the caller's
current stream, and the outputs are copied out. Two kinds of graph:

**Padded graphs** (``bucket``; key: batch bucket ``b`` from ``BATCH_BUCKETS``,
sequence bucket ``s`` from ``SEQ_BUCKETS``, and which of mask / token types /
positions the caller gave) for batches whose bucket holds at most
``PADDED_MAX_TOKENS`` positions, ragged or not. The graph runs the padded layout
``[b, s]`` (attention with a key mask) and needs nothing from the host but the
inputs: per call the host checks the inputs' metadata (types, shapes, devices),
writes the batch's extent ``(B, S)`` into a device scalar (one ``fill_``), copies
each given input into the ``[:B, :S]`` corner of its buffer (one copy each: the
mask's dtype conversion to the kernels' bool form happens in that copy), replays,
and copies each output out once. **No device-to-host read comes before the
replay.** Inside the graph the mask's columns past ``S`` are masked off, default
positions and token types are made, ids are clamped into their tables (any backend
is then safe with bad ids), and the value checks of the forward (id ranges, the
RoBERTa position limit, all-zero token types: ``BertfastModel._value_checks``) are
reduced to a few device scalars. The host reads those once, after the replay (the
read waits for the replay, which the caller waits for anyway) and raises the same
``IndexError`` / ``ValueError`` as the eager path; the outputs of a call that fails
its checks are never returned, and its static id buffers are zeroed. So those only
ever hold values that passed the checks, and what a larger earlier call left outside
the corner is harmless: the checks read whole buffers, rows past ``B`` are computed
and never read.

**Packed graphs** (``packed_bucket``; key: batch bucket from
``PACKED_BATCH_BUCKETS``, token bucket from ``TOKEN_BUCKETS``) for the other
batches, up to ``MAX_GRAPH_TOKENS`` real tokens. These run padding-free, like the
eager path, so their cost follows the real tokens: the forward first does the eager
path's one read (input checks and the real-token count, ``_prepare_counted``), the
real tokens' ids, positions and types are gathered into the static buffers and the
row lengths copied; the graph makes ``cu_seqlens`` from the lengths, and the token
bucket's unused rows are extra sequences of at most ``DUMMY_ROWS`` rows each, so
``attention_varlen`` sees a valid ``cu_seqlens`` (their outputs are never read).
``BertfastModel.encode`` (what ``Embedder`` runs) always takes this kind: it returns
the packed tokens and their ``PackInfo``, which need the count anyway.

Heads: every head runs inside the graph except the vocabulary-sized ones
(``masked_lm``, ``pretraining``), which run eagerly on the copied-out hidden state:
their ``[tokens, vocab]`` logits would be a static output per graph.

Outputs are copied out of the static buffers exactly once (a result never aliases a
buffer that the next replay overwrites): per-row fields ``[:B]``, per-token fields
``[:B, :S]`` (padded) or scattered to ``[B, S]`` with ``unpack_tokens`` (packed; a
plain copy when nothing is padding).

Memory: all graphs of a model share one memory pool. A graph's activations are freed
when its capture ends, so graphs captured later reuse them; its static inputs and
outputs stay allocated while it is kept. The pool is therefore about the largest
graph's activations (``MAX_GRAPH_TOKENS`` bounds them) plus the static buffers of the
kept graphs, which ``MAX_GRAPHS`` and ``MAX_STATIC_BYTES`` bound (least recently
used graphs are dropped first). Sharing is safe because every replay's outputs are
read on its stream before any other replay of the model starts (one lock; a call on
another stream than the previous one first waits for it).

``capture=False`` runs the same static functions without a graph (each "replay"
recomputes them into the static outputs): that is how this module is tested on
machines without a GPU. Turned on by ``from_pretrained(..., cuda_graphs=True)``
(default: on for CUDA devices; ``BERTFAST_CUDA_GRAPHS=0`` turns it off globally).
"""

from __future__ import annotations

import bisect
import collections
import os
import threading

import torch

from . import heads as H
from . import ops
from .ops.padding import PackInfo
from .outputs import EncoderOutput

#: Padded graphs: batch and sequence buckets, and the most positions (b x s) of one.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
SEQ_BUCKETS = (16, 32, 64, 128, 256, 512)
PADDED_MAX_TOKENS = 1024
#: Packed graphs: batch buckets, and token buckets (powers of two up to 256, then four
#: per octave: the extra rows are under 20% of a bucket) up to MAX_GRAPH_TOKENS.
PACKED_BATCH_BUCKETS = (1, 4, 16, 64, 256)
MAX_GRAPH_TOKENS = 16384
TOKEN_BUCKETS = (
    (16, 32, 64, 128)
    + tuple(base * (4 + i) // 4 for base in (256, 512, 1024, 2048, 4096, 8192) for i in range(4))
    + (MAX_GRAPH_TOKENS,)
)
#: Longest extra sequence the unused rows of a token bucket are split into.
DUMMY_ROWS = 64
#: Graphs kept per model, and the bytes of their static inputs and outputs.
MAX_GRAPHS = 48
MAX_STATIC_BYTES = 512 << 20
#: Heads whose outputs are vocabulary-sized: they run after the replay, eagerly.
EAGER_HEADS = ("masked_lm", "pretraining")
#: The padded extent (B, S) travels as one device scalar B * _EXTENT + S.
_EXTENT = 1 << 20


def graphs_enabled(requested, device: torch.device) -> bool:
    """Resolve the ``cuda_graphs`` option: True/False, or None for the default."""
    if os.environ.get("BERTFAST_CUDA_GRAPHS", "").strip() in ("0", "false", "off"):
        return False
    if requested is None:
        return device.type == "cuda"
    if requested and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA device, the model is on {device}")
    return bool(requested)


def bucket(batch: int, seqlen: int, max_seq: int) -> tuple[int, int] | None:
    """The padded graph's ``(batch, seq)`` bucket of a ``[batch, seqlen]`` input, or
    None when it needs more than ``PADDED_MAX_TOKENS`` positions (or a bucket beyond
    the largest). ``max_seq`` (the position table) caps the sequence bucket."""
    bi = bisect.bisect_left(BATCH_BUCKETS, batch)
    si = bisect.bisect_left(SEQ_BUCKETS, seqlen)
    if bi == len(BATCH_BUCKETS) or si == len(SEQ_BUCKETS):
        return None
    b, s = BATCH_BUCKETS[bi], min(SEQ_BUCKETS[si], max_seq)
    if s < seqlen or b * s > PADDED_MAX_TOKENS:
        return None
    return b, s


def packed_bucket(batch: int, tokens: int) -> tuple[int, int] | None:
    """The packed graph's ``(batch, tokens)`` bucket of ``batch`` rows holding
    ``tokens`` real tokens, or None beyond the largest buckets."""
    bi = bisect.bisect_left(PACKED_BATCH_BUCKETS, batch)
    ti = bisect.bisect_left(TOKEN_BUCKETS, max(tokens, 1))
    if bi == len(PACKED_BATCH_BUCKETS) or ti == len(TOKEN_BUCKETS):
        return None
    return PACKED_BATCH_BUCKETS[bi], TOKEN_BUCKETS[ti]


def packed_max_seqlen(tokens: int, max_positions: int) -> int:
    """The static ``max_seqlen`` of a packed graph of ``tokens`` rows: a bound of any
    real row (the position table's size) and of the extra sequences."""
    return min(tokens, max(max_positions, DUMMY_ROWS))


def token_fields(head: str) -> frozenset:
    """Output fields of ``head`` with one value per token (``[B, S, ...]``); the
    others have one per row."""
    fields = {"last_hidden_state", "start_logits", "end_logits", "prediction_logits"}
    if head in ("token_classification", "electra_discriminator", "masked_lm"):
        fields.add("logits")
    return frozenset(fields)


# ------------------------------------------------------------ graph or stand-in
class _Captured:
    """A captured CUDA graph of ``fn`` and its static outputs."""

    def __init__(self, fn, device: torch.device, pool):
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up: lazy inits, autotuning, cuBLAS handles
            for _ in range(2):
                fn()
        current.wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn()

    def replay(self) -> None:
        self.graph.replay()


class _Eager:
    """Stands in for a graph where none is captured (``capture=False``): a replay
    recomputes ``fn`` and writes the results into the static outputs, as a graph
    replay does, so everything around it is the path a GPU runs."""

    def __init__(self, fn):
        self.fn = fn
        self.outputs = fn()

    def replay(self) -> None:
        new = self.fn()
        for name, t in self.outputs.items():
            t.copy_(new[name])


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class _PaddedHeadInput(H.HeadInput):
    """A head's input on the padded layout: hidden ``[B, S, H]`` (zero at padded
    positions) and its bool key mask. ``tokens`` are all ``B * S`` positions;
    ``unpack`` lays a per-token result out as ``[B, S, ...]`` with zeros at padded
    positions; ``first`` is each row's first real token (left padding too; zero for a
    row with none: its position 0 is padding)."""

    def __init__(self, hidden, keep, weight, backend, num_choices=None, rows=None):
        B, S, width = hidden.shape
        tokens = hidden.reshape(B * S, width)
        super().__init__(tokens, None, weight, self._unpack_padded, backend, num_choices)
        self.hidden = hidden
        self.keep = keep
        self.rows = torch.arange(B, device=hidden.device) if rows is None else rows

    def _unpack_padded(self, x: torch.Tensor) -> torch.Tensor:
        B, S = self.keep.shape
        x = x.view(B, S, *x.shape[1:])
        return torch.where(self.keep.view(B, S, *([1] * (x.dim() - 2))), x, 0)

    @property
    def empty_rows(self) -> torch.Tensor:
        return self._once("empty_rows", lambda: ~self.keep.any(1, keepdim=True))

    @property
    def first(self) -> torch.Tensor:
        def compute():
            at = self.keep.view(torch.uint8).argmax(1)  # the first real position (0 if none)
            return self.hidden[self.rows, at]

        return self._once("first", compute)

    @property
    def pooled(self) -> torch.Tensor | None:
        def compute():
            if self.weight("pooler.weight") is None:
                return None
            return torch.where(self.empty_rows, 0, H.pool(self.weight, self.first, self.backend))

        return self._once("pooled", compute)


# ------------------------------------------------------------------ entries
class _PaddedEntry:
    """One padded graph: static inputs ``[b, s]``, outputs of bucket shapes.

    The static id buffers only ever hold values that passed the checks (zeros at
    first, and zeroed again after a call that fails them), so what lies outside a
    call's ``[:B, :S]`` corner is always valid: the checks read the whole buffers,
    and only the mask needs the extent (columns ``>= S`` are not keys; rows ``>= B``
    are computed and never read)."""

    def __init__(self, cache: GraphCache, b: int, s: int, given: tuple[bool, bool, bool]):
        model = cache.model
        cfg = model.config
        dev = model.device
        self.model, self.b, self.s, self.given = model, b, s, given
        self.head_in_graph = cache.head_in_graph
        has_mask, has_types, has_pos = given

        def buf(dtype=torch.long):
            return torch.zeros(b, s, dtype=dtype, device=dev)

        self.extent = torch.zeros(1, dtype=torch.long, device=dev)  # B * _EXTENT + S
        self.ids = buf()
        self.mask = buf(torch.bool) if has_mask else None
        self.types = buf() if has_types else None
        self.pos = buf() if has_pos else None
        # constants of the graph (never written)
        self.cols = torch.arange(s, device=dev)[None, :]
        self.rows = torch.arange(b, device=dev)
        # row r is one of the batch's (r < B) exactly when row_ends[r] < the extent
        self.row_ends = (self.rows * _EXTENT + _EXTENT - 1)[:, None]
        self.zeros = buf() if cfg.has_token_types and not has_types else None
        self.arange = self.cols.expand(b, s).contiguous()  # default positions
        self.graph = cache._make(self._run)
        self.out = dict(self.graph.outputs)  # (the graph's own dict stays whole)
        self.flags = self.out.pop("_flags")
        tokens = token_fields(model.head) | {"_keep"}
        self.fields = [(name, name in tokens) for name in self.out]
        self.nbytes = _nbytes(
            [self.ids, self.mask, self.types, self.pos, self.zeros, self.flags]
            + list(self.out.values())
        )
        self._views = {}

    def _run(self) -> dict:
        model, cfg = self.model, self.model.config
        code = self.extent
        in_seq = self.cols < code % _EXTENT  # [1, s]: the batch's columns
        if self.mask is not None:
            keep = self.mask & in_seq
        else:
            keep = in_seq.expand(self.b, self.s).contiguous()
        flags = [*torch.aminmax(self.ids)]
        ids = self.ids.clamp(0, cfg.vocab_size - 1)  # bad ids compute, then raise
        types = self.zeros
        if self.types is not None:
            if cfg.has_token_types:
                flags += [*torch.aminmax(self.types)]
                types = self.types.clamp(0, cfg.type_vocab_size - 1)
            else:
                flags.append(self.types.any())
        top = cfg.max_position_embeddings - 1
        if self.pos is not None:
            flags += [*torch.aminmax(self.pos)]
            pos = self.pos.clamp(0, top)
        elif cfg.position_scheme == "roberta":  # counted over the batch's corner only
            real = (self.ids != cfg.pad_token_id) & in_seq & (self.row_ends < code)
            p = torch.cumsum(real, 1) * real + cfg.pad_token_id
            flags.append(p.max())
            pos = p.clamp(max=top)
        else:
            pos = self.arange
        h = model.encode_static(ids, keep, types, pos)
        out = EncoderOutput(last_hidden_state=h)
        if self.head_in_graph:
            mc = 1 if model.head == "multiple_choice" else None
            inp = _PaddedHeadInput(h, keep, model._w, model.backend, mc, self.rows)
            model.task_head(inp, out)
        outputs = dict(out.items())
        if not self.head_in_graph:
            outputs["_keep"] = keep
        outputs["_flags"] = torch.stack([f.to(torch.long) for f in flags])
        return outputs

    def _views_of(self, B: int, S: int):
        views = self._views.get((B, S))
        if views is None:
            buffers = (self.ids, self.mask, self.types, self.pos)
            inputs = tuple(None if t is None else t[:B, :S] for t in buffers)
            outputs = [
                (name, self.out[name][:B, :S] if per_token else self.out[name][:B])
                for name, per_token in self.fields
            ]
            checks = self.model._value_checks(self.given[1], self.given[2], S)
            views = self._views[(B, S)] = (inputs, outputs, B * _EXTENT + S, checks)
        return views

    def __call__(self, ids, mask, types, pos):
        """Copy in, replay, copy out: ``{field: tensor}``, once the value checks
        (``BertfastModel._value_checks``) passed on the values the graph computed
        (the one device-to-host read, after the replay)."""
        inputs, outputs, code, checks = self._views_of(*ids.shape)
        try:
            self.extent.fill_(code)
            inputs[0].copy_(ids)
            if mask is not None:
                inputs[1].copy_(mask)
            if types is not None:
                inputs[2].copy_(types)
            if pos is not None:
                inputs[3].copy_(pos)
            self.graph.replay()
            result = {name: t.clone(memory_format=torch.contiguous_format) for name, t in outputs}
            self.model._check_values(checks, self.flags.tolist())
        except BaseException:
            for t in (self.ids, self.types, self.pos):  # keep the buffers valid
                if t is not None:
                    t.zero_()
            raise
        return result


class _PackedEntry:
    """One packed graph: ``[tokens]`` static inputs, ``[batch]`` row lengths."""

    def __init__(self, cache: GraphCache, bt: int, tt: int):
        model = cache.model
        cfg = model.config
        dev = model.device
        self.model, self.bt, self.tt = model, bt, tt
        self.head_in_graph = cache.head_in_graph
        self.max_seqlen = packed_max_seqlen(tt, cfg.max_position_embeddings)
        self.ids = torch.zeros(tt, dtype=torch.long, device=dev)
        self.pos = torch.zeros(tt, dtype=torch.long, device=dev)
        self.types = torch.zeros_like(self.ids) if cfg.has_token_types else None
        self.lengths = torch.zeros(bt, dtype=torch.int32, device=dev)
        self.rows_used = 0  # lengths[rows_used:] are zero
        extra = -(-tt // DUMMY_ROWS)
        self.extra_ends = DUMMY_ROWS * torch.arange(1, extra + 1, dtype=torch.int32, device=dev)
        self.no_indices = torch.zeros(0, dtype=torch.long, device=dev)
        self.graph = cache._make(self._run)
        self.out = self.graph.outputs
        tokens = token_fields(model.head)
        self.fields = [(name, name in tokens) for name in self.out]
        self.nbytes = _nbytes([self.ids, self.pos, self.types, self.lengths])
        self.nbytes += _nbytes(self.out.values())

    def _run(self) -> dict:
        model = self.model
        cu = torch.nn.functional.pad(torch.cumsum(self.lengths, 0, dtype=torch.int32), (1, 0))
        # rows past the real tokens: sequences of at most DUMMY_ROWS rows, ending at tt
        extra = torch.clamp(cu[-1:] + self.extra_ends, max=self.tt)
        h = model.encode_packed_static(
            self.ids, self.pos, self.types, torch.cat([cu, extra]), self.max_seqlen
        )
        out = EncoderOutput(last_hidden_state=h)
        if self.head_in_graph:
            info = PackInfo(self.no_indices, cu, self.max_seqlen, self.bt, 0)
            mc = 1 if model.head == "multiple_choice" else None
            model.task_head(H.HeadInput(h, info, model._w, lambda t: t, model.backend, mc), out)
        return dict(out.items())

    def __call__(self, input_ids, pos, types, info: PackInfo, lengths):
        """Gather in and replay; the static outputs stay to be copied out."""
        B, T = info.batch, info.total_tokens
        _gather(self.ids, input_ids, info)
        _gather(self.pos, pos, info)
        if self.types is not None:
            _gather(self.types, types, info)
        used, self.rows_used = self.rows_used, max(self.rows_used, B)
        self.lengths[:B].copy_(lengths)
        if used > B:
            self.lengths[B:used].zero_()
        self.rows_used = B
        self.graph.replay()
        return T


def _gather(dst: torch.Tensor, src: torch.Tensor, info: PackInfo) -> None:
    """The real tokens of ``src`` ``[B, S]`` into ``dst[:T]`` (one op where it can)."""
    out = dst[: info.total_tokens]
    if info.dense:
        out.view(info.batch, info.seqlen).copy_(src)
        return
    flat, at = src, info.indices
    if src.stride(0) == 0:  # one row for all (default positions): gather by column
        flat, at = src[0], torch.remainder(info.indices, info.seqlen)
    flat = flat.reshape(-1)
    if flat.dtype == torch.long and flat.is_contiguous():
        torch.index_select(flat, 0, at, out=out)
    else:
        out.copy_(flat.index_select(0, at))


# ------------------------------------------------------------------ the cache
class GraphCache:
    """The graphs of one model, by key; see the module notes for the policy."""

    def __init__(self, model, capture: bool = True):
        self.model = model
        self.capture = capture
        self.head_in_graph = model.head not in EAGER_HEADS
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self.captures = 0
        self.static_bytes = 0
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._lock = threading.Lock()
        self._stream = None

    def _make(self, fn):
        """The graph of ``fn`` (its outputs in ``.outputs``), or its stand-in."""
        if not self.capture:
            return _Eager(fn)
        return _Captured(fn, self.model.device, self._pool)

    def _usable(self, input_ids) -> bool:
        if type(input_ids) is not torch.Tensor or torch.compiler.is_compiling():
            return False
        # the caller is capturing its own graph: stay eager inside it
        return not (self.capture and torch.cuda.is_current_stream_capturing())

    def _entry(self, key, make):
        """The entry of ``key``, made (captured) on first use; drops the least
        recently used entries beyond ``MAX_GRAPHS`` / ``MAX_STATIC_BYTES``. Call
        under the lock."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            return entry
        # inference tensors cannot be written outside inference mode: the static
        # buffers are plain tensors whatever mode the first call came in
        with torch.inference_mode(False), torch.no_grad():
            entry = make()
        self.entries[key] = entry
        self.captures += 1
        self.static_bytes += entry.nbytes
        while len(self.entries) > 1 and (
            len(self.entries) > MAX_GRAPHS or self.static_bytes > MAX_STATIC_BYTES
        ):
            _, old = self.entries.popitem(last=False)
            self.static_bytes -= old.nbytes
        return entry

    def _on_stream(self) -> None:
        """Order this call after the previous one when it comes on another stream
        (the static buffers and the shared pool are written by every replay)."""
        if not self.capture:
            return
        current = torch.cuda.current_stream(self.model.device)
        if self._stream is not None and self._stream != current:
            current.wait_stream(self._stream)
        self._stream = current

    # ---------------------------------------------------------- padded graphs
    def forward(self, input_ids, attention_mask, token_type_ids, position_ids, choices):
        """The model's outputs through a padded graph, or None when the input has no
        padded bucket (nothing was read from the device then)."""
        if not self._usable(input_ids) or input_ids.dim() != 2:
            return None
        model = self.model
        B, S = input_ids.shape
        key = bucket(B, S, model.config.max_position_embeddings)
        if key is None:
            return None
        mask, types, pos = model._check_inputs(
            input_ids, attention_mask, token_type_ids, position_ids
        )
        given = (mask is not None, types is not None, pos is not None)
        with self._lock:
            self._on_stream()
            entry = self._entry(("padded", *key, *given), lambda: _PaddedEntry(self, *key, given))
            result = entry(input_ids, mask, types, pos)
        keep = result.pop("_keep", None)
        return self._output(result, choices, keep=keep)

    def _output(self, result: dict, choices, keep=None, info=None) -> EncoderOutput:
        """An ``EncoderOutput`` of the copied-out fields; runs an eager head on them."""
        model = self.model
        if choices is not None and "logits" in result:
            result["logits"] = result["logits"].view(-1, choices)
        out = EncoderOutput(**result)
        if self.head_in_graph:
            return out
        h = out.last_hidden_state
        if info is not None:  # packed: h holds the real tokens
            out.last_hidden_state = model._unpack(h, info)
            inp = H.HeadInput(
                h, info, model._w, lambda t: model._unpack(t, info), model.backend, choices
            )
        else:
            inp = _PaddedHeadInput(h, keep, model._w, model.backend, choices)
        return model.task_head(inp, out)

    # ---------------------------------------------------------- packed graphs
    def _packed(self, input_ids, mask, types, pos, counts, copy_out):
        """Replay the packed graph that fits the batch, then ``copy_out(entry, info)``
        (under the lock: the static outputs are valid until the next replay); None
        when no graph fits (or while compiling)."""
        if counts is None or not self._usable(input_ids):
            return None
        model = self.model
        keep, lengths, total, longest = counts
        key = packed_bucket(input_ids.shape[0], total)
        max_pos = model.config.max_position_embeddings
        if key is None or longest > packed_max_seqlen(key[1], max_pos):
            return None
        info = model._pack_info(mask, counts)
        with self._lock:
            self._on_stream()
            entry = self._entry(("packed", *key), lambda: _PackedEntry(self, *key))
            entry(input_ids, pos, types, info, lengths)
            return copy_out(entry, info)

    def forward_packed(self, input_ids, mask, types, pos, counts, choices):
        """The model's outputs through a packed graph (after ``_prepare_counted``), or
        None when no packed graph fits the batch."""

        def copy_out(entry, info):
            T = info.total_tokens
            if not self.head_in_graph:  # the packed tokens, for the eager head
                return {"last_hidden_state": entry.out["last_hidden_state"][:T].clone()}, info
            result = {}
            for name, per_token in entry.fields:
                t = entry.out[name]
                result[name] = self._unpack(t[:T], info) if per_token else t[: info.batch].clone()
            return result, info

        got = self._packed(input_ids, mask, types, pos, counts, copy_out)
        if got is None:
            return None
        result, info = got
        return self._output(result, choices, info=None if self.head_in_graph else info)

    def _unpack(self, x: torch.Tensor, info: PackInfo) -> torch.Tensor:
        """A fresh ``[B, S, ...]`` tensor of the packed rows ``x`` (a static buffer)."""
        B, S = info.batch, info.seqlen
        if info.dense:
            return x.clone().view(B, S, *x.shape[1:])
        flat = x if x.dim() > 1 else x.unsqueeze(-1)
        out = ops.unpack_tokens(
            flat, info.indices, B * S, backend=self.model.backend, validate=False
        )
        return out.view(B, S, *x.shape[1:])

    def encode(self, input_ids, mask, types, pos, counts):
        """``BertfastModel.encode``'s ``(packed last hidden [T, H], PackInfo, None)``
        through a packed graph, or None when none fits."""

        def copy_out(entry, info):
            return entry.out["last_hidden_state"][: info.total_tokens].clone(), info, None

        return self._packed(input_ids, mask, types, pos, counts, copy_out)
