"""The cpu backend's encoder runner: the embeddings and every encoder layer of a
model on packed tokens, with the backend's functions called directly.

``runner(backend, config, embeddings, layers, parameters)`` (through
``bertfast.ops.encoder_runner``) resolves, once per model, device and dtype, whether
the encoder may skip the ops' public entry points: only where ``backend`` (and
``BERTFAST_BACKEND``) resolves to ``cpu`` for every op of the encoder, on one device
and dtype, and ``dispatch.select`` gives each op the cpu backend's own function. The
:class:`CpuEncoder` it returns then runs

- ``embed(ids, pos, types)``: embedding sum + LayerNorm (+ the ALBERT/ELECTRA
  projection);
- ``forward(ids, pos, types, info, attention_dtype)``: both in one native call
  (``cpu.encoder_forward``) where every layer would be one (below), else None;
- ``pool(h, info, mode, normalize)``: one vector per sequence of the output, in one
  native call (``cpu.pool_packed``), or None;
- ``layers(h, info, states, attention_dtype)``: every layer by
  ``config.layer_schedule()``; one native call per layer where every GEMM runs on the
  C++ GEMM (``cpu.encoder_layer``), else op by op in row blocks
  (``cpu.weights.layer_blocks``: rows padded to a size oneDNN is given, blocks small
  enough for malloc to reuse).

No per-call checks or dispatch: the caller validated the inputs (the model's value
checks) and made every activation; the weights were checked at load (shapes) and
here (dtype, device); the C++ bindings check every size they rely on regardless.
Callers take it in plain eager mode only (not while compiling or under a
torch_dispatch mode: those must see the registered ops).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch import nn

from .. import cpu as _cpu
from .. import dispatch as _dispatch
from ..native import contig as _c
from . import weights as _cpu_weights

try:  # int8 weights (absent in builds without the helper module)
    from . import int8 as _quant
except ImportError:
    _quant = None

#: An encoder layer's linear layers, in order.
GEMMS = ("qkv", "attn_out", "ffn_in", "ffn_out")
#: Its LayerNorms, in order.
NORMS = ("attn_ln", "ffn_ln")


class LayerOperands(NamedTuple):
    """Every layer's operands for ``cpu.encoder_forward``, in schedule order: ``gemms``
    (fp32: 4 panels a layer; int8: packed, column sums, scales of each, 12 a layer),
    their ``biases`` (4 a layer), ``norms`` (4 a layer), ``splits`` (int8: each
    layer's split mask; None for fp32), the FFN width, activation and LayerNorm eps."""

    gemms: list
    biases: list
    norms: list
    splits: list | None
    intermediate: int
    act: str
    eps: float


class Plan(NamedTuple):
    """The cpu backend's implementations of the encoder's ops; each takes the op's
    arguments without ``backend``."""

    embed_layernorm: object
    linear: object
    linear_gelu: object
    add_layernorm: object
    attention_varlen: object


def _param(mod: nn.Module, path: str) -> torch.Tensor:
    """``mod.<a>.<b>`` by dict lookups (no ``nn.Module.__getattr__``)."""
    *parts, leaf = path.split(".")
    for part in parts:
        mod = mod._modules[part]
    return mod._parameters[leaf]


def resolve_plan(backend: str, config, embeddings: nn.Module, layers: nn.Module, parameters):
    """The :class:`Plan` for a model whose encoder is ``embeddings`` + ``layers``
    (``parameters``: all of the model's, head included), or None where the encoder
    must run through the ops' entry points."""
    word = embeddings._parameters["word"]
    if word.device.type != "cpu" or type(word) is not nn.Parameter:
        return None
    try:  # the model runs on the cpu backend here (dispatch.resolve) ...
        if _dispatch.resolve(backend, "cpu").name != "cpu":
            return None
    except ValueError:  # an unknown backend name: the checked path says so
        return None
    dtype, device = word.dtype, word.device
    for p in parameters:
        if p.dtype != dtype or p.device != device:
            return None  # mixed weights: the op checks name the culprit
    L = layers._modules[str(config.layer_schedule()[0])]
    w_in = _param(L, "ffn_in.weight")
    x = word.new_empty(0, w_in.shape[1])
    ids = torch.zeros(0, dtype=torch.int64)
    types_table = embeddings._parameters.get("token_type")
    samples = {
        "embed_layernorm": (
            ids,
            ids,
            ids if types_table is not None else None,
            word,
            embeddings._parameters["position"],
            types_table,
            _param(embeddings, "ln.weight"),
            _param(embeddings, "ln.bias"),
            config.layer_norm_eps,
        ),
        "linear": (x, w_in, None),
        "linear_gelu": (x, w_in, None, config.hidden_act),
        "add_layernorm": (x, x, None, x[:, 0], x[:, 0], config.layer_norm_eps),
        "attention_varlen": (
            word.new_empty(0, 3 * config.hidden_size),
            torch.zeros(1, dtype=torch.int32),
            0,
            config.num_heads,
            config.head_dim**-0.5,
        ),
    }
    cpu = _dispatch.get_backend("cpu")
    impls = {}
    # ... and select gives each encoder op the cpu backend's own function for this
    # input (not a wrapper: bertfast tune wraps select to see every op)
    for op, args in samples.items():
        try:
            impl = _dispatch.select(op, backend, "cpu", dtype, args)
        except (_dispatch.BackendError, ValueError):
            return None
        if getattr(cpu, "ops", {}).get(op) is not impl:
            return None
        impls[op] = impl
    return Plan(*(impls[name] for name in Plan._fields))


def runner(backend: str, config, embeddings: nn.Module, layers: nn.Module, parameters):
    """A :class:`CpuEncoder` for the model, or None (see :func:`resolve_plan`)."""
    plan = resolve_plan(backend, config, embeddings, layers, parameters)
    return None if plan is None else CpuEncoder(plan, config, embeddings, layers)


class CpuEncoder:
    """The encoder of one model on the cpu backend's functions (see the module)."""

    def __init__(self, plan: Plan, config, embeddings: nn.Module, layers: nn.Module):
        self.plan = plan
        self.config = config
        self._embeddings = embeddings
        self._layers = layers
        # (the tensors held when made, their operands for encoder_forward at up to
        # SMALL_ROWS rows): see _forward_operands
        self._forward_cache = None

    def _held(self):
        """The tensors the model holds now, in the order ``encoder_forward`` takes
        them: the embedding tables, LayerNorm and projection, then per scheduled
        layer its four GEMM weights and biases and its two LayerNorms."""
        mods, params = self._embeddings._modules, self._embeddings._parameters
        ln = mods["ln"]._parameters
        held = [params["word"], params["position"], params.get("token_type")]
        held += (ln["weight"], ln["bias"])
        if self.config.has_projection:
            project = mods["project"]._parameters
            held += (project["weight"], project["bias"])
        layers = self._layers._modules
        for idx in self.config.layer_schedule():
            L = layers[str(idx)]._modules
            for name in GEMMS:
                p = L[name]._parameters
                held += (p["weight"], p["bias"])
            for name in NORMS:
                p = L[name]._parameters
                held += (p["weight"], p["bias"])
        return held

    def _forward_operands(self, tokens: int, seqlen):
        """``(embedding operands, LayerOperands)`` for ``encoder_forward`` on
        ``tokens`` packed tokens, or None where some layer would not run as one native
        call (``layers``' conditions: no padding rows, one row block, every GEMM on
        the C++ GEMM or int8). Made from what the model holds at this call; kept for
        the next call at up to ``cpu.weights.small_rows`` rows (of the weights' dtype:
        any such call takes the same panels) while the model holds the same tensor
        objects (a parameter replaced, or weights unpacked and packed again,
        makes them afresh). Kept operands come with a third element, the same
        operands held on the C++ side (``cpu.HeldOperands``), released with them."""
        cfg = self.config
        held = self._held()
        e = 7 if cfg.has_projection else 5  # embedding tensors
        if len(held) == e:
            return None  # no layer
        word = held[0]
        weights = held[e : e + 8 : 2]
        rows, attn_blocks, blocks = _cpu_weights.layer_blocks(
            tokens, weights, word.element_size(), seqlen
        )
        if rows != tokens or len(attn_blocks) != 1 or len(blocks) != 1:
            return None
        small = tokens <= _cpu_weights.small_rows(word.dtype)
        cache = self._forward_cache
        if (
            small
            and cache is not None
            and len(cache[0]) == len(held)
            and all(map(operator.is_, cache[0], held))
        ):
            return cache[1]
        operands = _make_forward_operands(cfg, held, e, tokens)
        if small and operands is not None:  # kept: held on the C++ side as well
            operands = (*operands, _cpu.HeldOperands(*operands))
            self._forward_cache = (held, operands)
        else:
            self._forward_cache = None
        return operands

    def forward(self, ids, pos, types, info, attention_dtype=None):
        """The embeddings and every encoder layer of packed tokens in one native call
        (``cpu.encoder_forward``): the same kernels in the same order as :meth:`embed`
        then :meth:`layers`, so the same result bit for bit. None where a layer would
        not run as one call (see :meth:`_forward_operands`), fp32 weights' attention
        would run in another dtype, or ``cpu.FUSED_FORWARD`` / ``cpu.FUSED_LAYER`` is
        off. int8 weights' attention runs in ``attention_dtype`` (None: fp32, or bf16)."""
        if not (_cpu.FUSED_FORWARD and _cpu.FUSED_LAYER):
            return None
        operands = self._forward_operands(ids.shape[0], info.seqlen if info.dense else None)
        if operands is None:
            return None
        embedding, layers, *held = operands
        if attention_dtype is not None and layers.splits is None:
            return None
        cfg = self.config
        return _cpu.encoder_forward(
            ids, pos, types if embedding[2] is not None else None, embedding,
            info.cu_seqlens, info.max_seqlen, cfg.num_heads, cfg.head_dim**-0.5, layers,
            attention_dtype, held[0] if held else None,
        )  # fmt: skip

    def embed(self, ids, pos, types):
        """Embedding sum + LayerNorm of packed tokens (+ the projection)."""
        cfg, plan = self.config, self.plan
        mods = self._embeddings._modules
        params = self._embeddings._parameters
        h = plan.embed_layernorm(
            ids,
            pos,
            types,
            params["word"],
            params["position"],
            params["token_type"] if types is not None else None,
            mods["ln"]._parameters["weight"],
            mods["ln"]._parameters["bias"],
            cfg.layer_norm_eps,
        )
        if cfg.has_projection:
            project = mods["project"]._parameters
            h = plan.linear(h, project["weight"], project["bias"])
        return h

    def pool(self, h, info, mode: str, normalize: bool):
        """One vector per sequence of the packed output ``h`` (``info``: its
        ``PackInfo``) in one native call: ``mode`` (``cls``, ``mean``,
        ``mean_sqrt_len``, ``lasttoken``), L2-normalised when ``normalize``; fp32
        ``[B, H]``. None for another mode or an ``h`` that is not fp32 (the caller
        pools in torch)."""
        if mode not in _cpu.POOLINGS or h.dtype != torch.float32:
            return None
        return _cpu.pool_packed(h, info.cu_seqlens, mode, normalize)

    def layers(self, h, info, states=None, attention_dtype=None):
        """Every encoder layer on packed tokens ``h`` (``info``: the batch's
        ``PackInfo``); each layer's output is appended to ``states`` when given.
        ``attention_dtype``: the dtype attention runs in (int8 models), None: h's."""
        cfg = self.config
        eps, act = cfg.layer_norm_eps, cfg.hidden_act
        nh, scale = cfg.num_heads, cfg.head_dim**-0.5
        cu, max_len = info.cu_seqlens, info.max_seqlen
        linear, linear_gelu = self.plan.linear, self.plan.linear_gelu
        add_ln, attention = self.plan.add_layernorm, self.plan.attention_varlen
        layers = self._layers._modules
        schedule = cfg.layer_schedule()
        # Zero rows up to a row count every GEMM runs on oneDNN at (a sequence of their
        # own for attention, dropped at the end), and row blocks that keep activations
        # small enough for malloc to reuse: see cpu_weights.layer_blocks.
        rows = tokens = h.shape[0]
        attn_blocks, blocks = [(0, rows, None)], [(0, rows)]
        if schedule:
            first = layers[str(schedule[0])]._modules
            weights = [first[n]._parameters["weight"] for n in GEMMS]
            seq = info.seqlen if info.dense else None
            rows, attn_blocks, blocks = _cpu_weights.layer_blocks(
                tokens, weights, h.element_size(), seq
            )
        if rows != tokens:
            h = torch.cat([h, h.new_zeros(rows - tokens, h.shape[1])])
            cu = torch.cat([cu, cu.new_full((1,), rows)])
            max_len = max(max_len, rows - tokens)
        attn_blocks = [(b, e, cu if n is None else cu[: n + 1]) for b, e, n in attn_blocks]
        blocks = [(b, e, None) for b, e in blocks]
        spare = None  # a free [rows, H] tensor: a previous h no hidden state keeps

        ad = attention_dtype

        def attention_block(L, x, cu_block, out):
            qkv, proj, ln = L["qkv"]._parameters, L["attn_out"]._parameters, L["attn_ln"]
            y = linear(x, qkv["weight"], qkv["bias"])
            if ad is None:
                ctx = attention(y, cu_block, max_len, nh, scale)
            else:  # bf16 (quant.attention_dtype): what encoder_layer_int8 runs
                ctx = _cpu.attention_varlen_bf16(y, cu_block, max_len, nh, scale)
            a = linear(ctx, proj["weight"], None)
            ln = ln._parameters
            return add_ln(a, x, proj["bias"], ln["weight"], ln["bias"], eps, out=out)

        def ffn_block(L, x, _, out):
            ffn_in, ffn_out = L["ffn_in"]._parameters, L["ffn_out"]._parameters
            f = linear_gelu(x, ffn_in["weight"], ffn_in["bias"], act)
            o = linear(f, ffn_out["weight"], None)
            ln = L["ffn_ln"]._parameters
            return add_ln(o, x, ffn_out["bias"], ln["weight"], ln["bias"], eps, out=out)

        def in_blocks(step, L, h, blocks):
            """``step`` on each block of rows; in more than one block, each block's
            LayerNorm writes its rows of the new h (cpu add_layernorm's ``out``)."""
            nonlocal spare
            if len(blocks) == 1:
                return step(L, h, blocks[0][2], None)
            out, spare = (spare if spare is not None else torch.empty_like(h)), None
            for begin, end, extra in blocks:
                step(L, h[begin:end], extra, out[begin:end])
            spare = h if states is None else None
            return out

        # Few rows (every GEMM on the C++ GEMM, or int8, in one block): one native call
        # per layer, the same kernels in the same order (cpu.encoder_layer; None for
        # fp32 weights with attention in another dtype).
        whole = len(attn_blocks) == 1 and len(blocks) == 1

        def native_layer(L, x):
            p = [L[n]._parameters for n in GEMMS]
            l1, l2 = L["attn_ln"]._parameters, L["ffn_ln"]._parameters
            return _cpu.encoder_layer(
                x, cu, max_len, nh, scale,
                [q["weight"] for q in p], [q["bias"] for q in p],
                (l1["weight"], l1["bias"], l2["weight"], l2["bias"]), act, eps, ad,
            )  # fmt: skip

        for idx in schedule:
            L = layers[str(idx)]._modules
            out = native_layer(L, h) if whole else None
            if out is not None:
                h = out
            else:
                h = in_blocks(attention_block, L, h, attn_blocks)
                h = in_blocks(ffn_block, L, h, blocks)
            if states is not None:
                states.append(h[:tokens])
        return h[:tokens]


def _make_forward_operands(cfg, held, e: int, tokens: int):
    """``CpuEncoder._forward_operands``' operands from the tensors ``held`` (``e``
    embedding tensors first), or None (a GEMM not on the C++ GEMM at ``tokens`` rows,
    nor int8 in every layer)."""
    word, position, types, ln_w, ln_b = held[:5]
    project = project_bias = None
    if e == 7:
        w = held[5]
        project = (
            _cpu_weights.packed_for_call(w, tokens)
            if isinstance(w, _cpu_weights.PackedWeight)
            else None
        )
        if project is None or project.is_mkldnn:
            return None
        project_bias = _c(held[6])
    embedding = (
        _c(word), _c(position), _c(types), _c(ln_w), _c(ln_b), project, project_bias,
        cfg.hidden_size,
    )  # fmt: skip
    gemms, biases, norms, splits = [], [], [], []
    intermediate = None
    for i in range(e, len(held), 12):
        w, b, n = held[i : i + 8 : 2], held[i + 1 : i + 8 : 2], held[i + 8 : i + 12]
        if intermediate is None:
            intermediate = w[2].shape[0]
        elif w[2].shape[0] != intermediate:
            return None  # layers of different widths: a call per layer
        q = _quant.gemm_operands(w, b) if _quant is not None else None
        if q is not None:
            gemms += q[0]
            biases += q[1]
            splits.append(q[2])
        else:
            panels = _cpu_weights.layer_panels(w, tokens)
            if panels is None:
                return None
            gemms += panels
            biases += map(_c, b)
        norms += map(_c, n)
    if splits and len(splits) * 12 != len(gemms):
        return None  # int8 and fp32 layers mixed
    layers = LayerOperands(
        gemms, biases, norms, splits or None, intermediate, cfg.hidden_act,
        float(cfg.layer_norm_eps),
    )  # fmt: skip
    return embedding, layers
