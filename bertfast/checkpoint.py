"""Read a Hugging Face checkpoint folder into bertfast's canonical weight naming.

Supported weight files: ``model.safetensors``; sharded safetensors
(``model.safetensors.index.json``); ``pytorch_model.bin`` (and its sharded
``pytorch_model.bin.index.json``), read with ``torch.load(weights_only=True)``.
Keys may carry the family prefix (``bert.``, ``roberta.``, ``albert.``,
``electra.``, ``distilbert.``) or not; old ``gamma``/``beta`` LayerNorm names are
accepted.

Canonical names (``H`` hidden, ``E`` embedding width, ``V`` vocabulary, ``P``
positions, ``I`` intermediate; every linear has ``.weight [out, in]`` and
``.bias [out]``):

=================================  ==================================================
canonical                          what
=================================  ==================================================
``embeddings.word``                ``[V, E]`` word embeddings
``embeddings.position``            ``[P, E]``
``embeddings.token_type``          ``[Tt, E]`` (absent for DistilBERT)
``embeddings.ln.{weight,bias}``    ``[E]`` embedding LayerNorm
``embeddings.project.*``           ``[H, E]`` ALBERT ``embedding_hidden_mapping_in`` /
                                   ELECTRA ``embeddings_project``
``layers.{i}.qkv.*``               ``[3H, H]`` / ``[3H]``: Q, K, V concatenated
``layers.{i}.attn_out.*``          ``[H, H]`` attention output dense
``layers.{i}.attn_ln.*``           ``[H]`` LayerNorm after attention
``layers.{i}.ffn_in.*``            ``[I, H]`` FFN up-projection
``layers.{i}.ffn_out.*``           ``[H, I]`` FFN down-projection
``layers.{i}.ffn_ln.*``            ``[H]`` LayerNorm after the FFN
``pooler.*``                       ``[H, H]`` pooler dense
``mlm.dense.*`` / ``mlm.ln.*``     MLM transform (``[E, H]`` for ALBERT/ELECTRA)
``mlm.decoder.*``                  ``[V, E|H]`` / ``[V]``; weight tied to
                                   ``embeddings.word`` when the file omits it
``nsp.*`` / ``sop.*``              BERT next-sentence / ALBERT sentence-order
``classifier.dense.*``             RoBERTa/ELECTRA classification dense,
                                   DistilBERT ``pre_classifier``, ELECTRA summary
``classifier.out.*``               the final classifier (``classifier``,
                                   ``out_proj``)
``qa.*``                           ``qa_outputs``
``discriminator.{dense,out}.*``    ELECTRA discriminator predictions
=================================  ==================================================

ALBERT layers are stored once per (group, inner layer): ``layers.{g * inner_group_num
+ j}``; ``EncoderConfig.layer_schedule()`` maps depth to them.

Before any weight is read, the weight files' keys and shapes are listed from their
headers (safetensors) or pickled metadata (``torch.load(mmap=True)``), and
:func:`check_sizes` bounds every size in the config by what the weights hold: layer
count (ALBERT: groups and inner layers), hidden, embedding width, intermediate,
vocabulary, positions, token types (heads are bounded by hidden in ``config.py``). So
a config claiming a million layers fails at once, not after building a million
layers' worth of names.

Loading is tensor by tensor: only the weights the chosen head needs are read, each
is cast to the requested dtype and moved to the device as it is read, and the Q/K/V
parts of a layer are freed as soon as they are concatenated, so no second full copy
of the model is ever held. Every problem raises :class:`CheckpointError` (one class
for the package, a ``ValueError``; a missing folder or file is also a
``FileNotFoundError``) before anything is returned: missing or unreadable folder,
missing or corrupt weight file, a shard path in an index file that leaves the folder
(absolute, ``..``, or a symlink out of it; :func:`~bertfast.validate.checkpoint_file`),
unknown model_type, a bad config field, a config size larger than the weights hold, a
weight of the wrong shape or of a non-floating dtype, layers or token-type weights the
config does not declare, missing weights. Every message is one short line whatever
the files hold: echoed values are shortened, and a list of missing weights shows the
first few and how many more.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch

from .config import EncoderConfig
from .head_specs import head_weight_specs, resolve_head
from .validate import (
    CheckpointError,
    CheckpointNotFoundError,
    checkpoint_file,
    checkpoint_folder,
    first_few,
    one_line,
    short_repr,
)

__all__ = [
    "CheckpointError",
    "encoder_weight_specs",
    "canonical_name",
    "check_sizes",
    "convert",
    "load_checkpoint",
    "find_weight_files",
    "weight_shapes",
    "file_backed",
]

PREFIXES = {
    "bert": "bert.",
    "roberta": "roberta.",
    "albert": "albert.",
    "electra": "electra.",
    "distilbert": "distilbert.",
}


# --------------------------------------------------------------------- key maps
# (regex over the prefix-stripped key, canonical template). ``{i}`` is the layer
# index, ``{p}`` the linear's parameter (weight/bias). Q/K/V map to ``qkv`` with a
# part index, see _QKV.
_LIN = r"\.(?P<p>weight|bias)$"

_EMB = [
    (r"^embeddings\.word_embeddings\.weight$", "embeddings.word"),
    (r"^embeddings\.position_embeddings\.weight$", "embeddings.position"),
    (r"^embeddings\.token_type_embeddings\.weight$", "embeddings.token_type"),
    (r"^embeddings\.LayerNorm" + _LIN, "embeddings.ln.{p}"),
]

# The six linears/LayerNorms of an encoder layer, in the order _layer_rows takes them.
_LAYER_PARTS = ("qkv", "attn_out", "attn_ln", "ffn_in", "ffn_out", "ffn_ln")


def _layer_rows(layer: str, *modules: str) -> list:
    """Rows for one family's encoder layer: ``layer`` matches the layer's key prefix
    (capturing its index), ``modules`` are the submodule patterns of _LAYER_PARTS in
    order (the first captures ``qkv``)."""
    return [
        (layer + module + _LIN, f"layers.{{i}}.{part}.{{p}}")
        for part, module in zip(_LAYER_PARTS, modules, strict=True)
    ]


def _mlm_rows(head: str, dense: str, ln: str) -> list:
    """Rows for a masked-LM head under ``head``: its transform (``dense``, ``ln``),
    the decoder's weight and bias, and the separately stored output bias."""
    return [
        (head + dense + _LIN, "mlm.dense.{p}"),
        (head + ln + _LIN, "mlm.ln.{p}"),
        (head + r"decoder\.weight$", "mlm.decoder.weight"),
        (head + r"decoder\.bias$", "mlm.decoder.bias"),
        (head + r"bias$", "mlm.bias"),
    ]


_BERTLIKE = (
    _EMB
    + [(r"^embeddings_project" + _LIN, "embeddings.project.{p}")]
    + _layer_rows(
        r"^encoder\.layer\.(?P<i>\d+)\.",
        r"attention\.self\.(?P<qkv>query|key|value)",
        r"attention\.output\.dense",
        r"attention\.output\.LayerNorm",
        r"intermediate\.dense",
        r"output\.dense",
        r"output\.LayerNorm",
    )
    + [(r"^pooler\.dense" + _LIN, "pooler.{p}")]
    # heads
    + _mlm_rows(r"^cls\.predictions\.", r"transform\.dense", r"transform\.LayerNorm")
    + [(r"^cls\.seq_relationship" + _LIN, "nsp.{p}")]
    + _mlm_rows(r"^lm_head\.", r"dense", r"layer_norm")
    + [
        (r"^generator_predictions\.dense" + _LIN, "mlm.dense.{p}"),
        (r"^generator_predictions\.LayerNorm" + _LIN, "mlm.ln.{p}"),
        (r"^generator_lm_head" + _LIN, "mlm.decoder.{p}"),
        (r"^discriminator_predictions\.dense" + _LIN, "discriminator.dense.{p}"),
        (r"^discriminator_predictions\.dense_prediction" + _LIN, "discriminator.out.{p}"),
        (r"^classifier\.dense" + _LIN, "classifier.dense.{p}"),
        (r"^classifier\.out_proj" + _LIN, "classifier.out.{p}"),
        (r"^classifier" + _LIN, "classifier.out.{p}"),
        (r"^sequence_summary\.summary" + _LIN, "classifier.dense.{p}"),
        (r"^qa_outputs" + _LIN, "qa.{p}"),
    ]
)

_ALBERT = (
    _EMB
    + [(r"^encoder\.embedding_hidden_mapping_in" + _LIN, "embeddings.project.{p}")]
    + _layer_rows(
        r"^encoder\.albert_layer_groups\.(?P<g>\d+)\.albert_layers\.(?P<j>\d+)\.",
        r"attention\.(?P<qkv>query|key|value)",
        r"attention\.dense",
        r"attention\.LayerNorm",
        r"ffn",
        r"ffn_output",
        r"full_layer_layer_norm",
    )
    + [(r"^pooler" + _LIN, "pooler.{p}")]
    + _mlm_rows(r"^predictions\.", r"dense", r"LayerNorm")
    + [
        (r"^sop_classifier\.classifier" + _LIN, "sop.{p}"),
        (r"^classifier" + _LIN, "classifier.out.{p}"),
        (r"^qa_outputs" + _LIN, "qa.{p}"),
    ]
)

_DISTILBERT = (
    _EMB
    + _layer_rows(
        r"^transformer\.layer\.(?P<i>\d+)\.",
        r"attention\.(?P<qkv>q_lin|k_lin|v_lin)",
        r"attention\.out_lin",
        r"sa_layer_norm",
        r"ffn\.lin1",
        r"ffn\.lin2",
        r"output_layer_norm",
    )
    + [
        (r"^vocab_transform" + _LIN, "mlm.dense.{p}"),
        (r"^vocab_layer_norm" + _LIN, "mlm.ln.{p}"),
        (r"^vocab_projector" + _LIN, "mlm.decoder.{p}"),
        (r"^pre_classifier" + _LIN, "classifier.dense.{p}"),
        (r"^classifier" + _LIN, "classifier.out.{p}"),
        (r"^qa_outputs" + _LIN, "qa.{p}"),
    ]
)

# Fallback names: BERT/RoBERTa/ALBERT keep the MLM output bias as ``*.predictions.bias``
# (tied to ``decoder.bias``); an untied checkpoint has both and the decoder's wins.
_FALLBACK = {"mlm.bias": "mlm.decoder.bias"}

_QKV = {"query": 0, "key": 1, "value": 2, "q_lin": 0, "k_lin": 1, "v_lin": 2}

_TABLES = {
    "bert": _BERTLIKE,
    "roberta": _BERTLIKE,
    "electra": _BERTLIKE,
    "albert": _ALBERT,
    "distilbert": _DISTILBERT,
}
_COMPILED: dict[str, list] = {}


def _table(family: str):
    t = _COMPILED.get(family)
    if t is None:
        t = [(re.compile(rx), tpl) for rx, tpl in _TABLES[family]]
        _COMPILED[family] = t
    return t


def _match(cfg: EncoderConfig, key: str):
    """``(canonical name, qkv part, stored layer index)`` for a checkpoint key, whatever
    the config's layer count (``index`` None outside layers), or None when no table
    row matches. For ALBERT the index is ``(group, inner)``."""
    if not isinstance(key, str):
        return None
    prefix = PREFIXES[cfg.family]
    if key.startswith(prefix):
        key = key[len(prefix) :]
    if key.endswith(".gamma"):
        key = key[: -len(".gamma")] + ".weight"
    elif key.endswith(".beta"):
        key = key[: -len(".beta")] + ".bias"
    for rx, tpl in _table(cfg.family):
        m = rx.match(key)
        if m is None:
            continue
        g = m.groupdict()
        index = None
        if g.get("g") is not None:
            index = (int(g["g"]), int(g["j"]))
            g["i"] = index[0] * cfg.inner_group_num + index[1]
        elif g.get("i") is not None:
            index = int(g["i"])
        name = tpl.format(i=g.get("i"), p=g.get("p"))
        part = _QKV[g["qkv"]] if g.get("qkv") else None
        return name, part, index
    return None


def _beyond_config(cfg: EncoderConfig, index) -> bool:
    """Whether a stored layer index lies outside the layers the config declares."""
    if index is None:
        return False
    if isinstance(index, tuple):
        return index[0] >= cfg.num_hidden_groups or index[1] >= cfg.inner_group_num
    return index >= cfg.num_stored_layers


def canonical_name(cfg: EncoderConfig, key: str) -> tuple[str, int | None] | None:
    """``(canonical name, qkv part or None)`` for a checkpoint key, or None if the
    key is not one bertfast uses (buffers such as ``position_ids``, other heads,
    layers beyond the config's count...)."""
    found = _match(cfg, key)
    if found is None or _beyond_config(cfg, found[2]):
        return None
    return found[0], found[1]


def encoder_weight_specs(cfg: EncoderConfig) -> dict[str, tuple]:
    """Canonical encoder weight names -> expected shapes."""
    H, E, I = cfg.hidden_size, cfg.embedding_size, cfg.intermediate_size
    s: dict[str, tuple] = {
        "embeddings.word": (cfg.vocab_size, E),
        "embeddings.position": (cfg.max_position_embeddings, E),
        "embeddings.ln.weight": (E,),
        "embeddings.ln.bias": (E,),
    }
    if cfg.has_token_types:
        s["embeddings.token_type"] = (cfg.type_vocab_size, E)
    if cfg.has_projection:
        s["embeddings.project.weight"] = (H, E)
        s["embeddings.project.bias"] = (H,)
    for i in range(cfg.num_stored_layers):
        p = f"layers.{i}."
        s[p + "qkv.weight"] = (3 * H, H)
        s[p + "qkv.bias"] = (3 * H,)
        s[p + "attn_out.weight"] = (H, H)
        s[p + "attn_out.bias"] = (H,)
        s[p + "attn_ln.weight"] = (H,)
        s[p + "attn_ln.bias"] = (H,)
        s[p + "ffn_in.weight"] = (I, H)
        s[p + "ffn_in.bias"] = (I,)
        s[p + "ffn_out.weight"] = (H, I)
        s[p + "ffn_out.bias"] = (H,)
        s[p + "ffn_ln.weight"] = (H,)
        s[p + "ffn_ln.bias"] = (H,)
    return s


# ------------------------------------------------------------------ size bounds
# The config sizes each weight's axes hold (layer weights named without their
# ``layers.{i}.`` prefix; the Q/K/V parts are left out, attn_out carries H).
_SIZE_AXES = {
    "embeddings.word": ("vocab_size", "embedding_size"),
    "embeddings.position": ("max_position_embeddings", "embedding_size"),
    "embeddings.token_type": ("type_vocab_size", "embedding_size"),
    "embeddings.project.weight": ("hidden_size", "embedding_size"),
    "attn_out.weight": ("hidden_size", "hidden_size"),
    "ffn_in.weight": ("intermediate_size", "hidden_size"),
    "ffn_out.weight": ("hidden_size", "intermediate_size"),
}
_SIZE_ORDER = (
    "hidden_size",
    "embedding_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
)


def _says(cfg: EncoderConfig, field: str) -> str:
    """``config.json says <key>=<value>`` for a normalised size field."""
    value = short_repr(getattr(cfg, field))
    key = cfg.keys.get(field)
    if key is None:
        return f"config.json leaves {field} at its default {value}"
    return f"config.json says {key}={value}"


def _span(prefix: str, indices: Iterable[int]) -> str:
    """``layers.0 .. layers.5`` for contiguous indices from 0, else the first few."""
    indices = sorted(indices)
    if not indices:
        return "none"
    if indices == list(range(len(indices))) and len(indices) > 1:
        return f"{prefix}0 .. {prefix}{indices[-1]}"
    return first_few(f"{prefix}{i}" for i in indices)


def _first_gap(indices: set) -> int:
    i = 0
    while i in indices:
        i += 1
    return i


def check_sizes(cfg: EncoderConfig, shapes: Mapping[str, tuple], source: str = "checkpoint"):
    """Refuse a config that claims more than the weights hold, from the weights' keys
    and shapes alone (``weight_shapes``), before anything proportional to a config
    size is built: the layer count (ALBERT: groups, inner layers, and their product)
    by the layers present, each of hidden, embedding width, intermediate, vocabulary,
    positions and token types by the largest matching axis of the weights that carry
    it. After this every loop over layers (``encoder_weight_specs``) is bounded by the
    number of keys in the files. A config that claims less than the weights hold is
    left to :func:`convert` (a wrong shape, layers the config does not declare), and
    so is a weight that is missing altogether."""
    layers: set = set()  # stored layer indices present (ALBERT: (group, inner))
    held: dict[str, tuple[int, str, tuple]] = {}  # field -> (largest size, key, shape)
    for key, shape in shapes.items():
        found = _match(cfg, key)
        if found is None:
            continue
        name, part, index = found
        if index is not None:
            layers.add(index)
            name = name.split(".", 2)[2]
        if part is not None:
            continue
        for field, size in zip(_SIZE_AXES.get(name, ()), shape):
            if field not in held or size > held[field][0]:
                held[field] = (size, key, tuple(shape))
    _check_layer_count(cfg, layers, source)
    for field in _SIZE_ORDER:
        if field not in held:  # a missing weight: convert lists it
            continue
        size, key, shape = held[field]
        if getattr(cfg, field) > size:
            raise CheckpointError(
                f"{source}: {_says(cfg, field)}, but the weights hold {size} ({one_line(key)} "
                f"has shape {shape}); fix {cfg.keys.get(field, field)} to match the weights"
            )


def _check_layer_count(cfg: EncoderConfig, layers: set, source: str) -> None:
    if cfg.family != "albert":
        if cfg.num_layers > len(layers):
            gap = _first_gap(layers)
            raise CheckpointError(
                f"{source}: {_says(cfg, 'num_layers')}, but the weights hold {len(layers)} "
                f"layer(s) ({_span('layers.', layers)}), none for layers.{gap} "
                f"(layers.{gap}.qkv.weight, ...); fix {cfg.keys.get('num_layers', 'num_layers')} "
                f"to match the weights"
            )
        return
    groups = {g for g, _ in layers}
    inner = {j for _, j in layers}
    for field, count, have, what in (
        ("num_hidden_groups", cfg.num_hidden_groups, groups, "layer group(s)"),
        ("inner_group_num", cfg.inner_group_num, inner, "layer(s) per group"),
    ):
        if count > len(have):
            raise CheckpointError(
                f"{source}: {_says(cfg, field)}, but the weights hold {len(have)} {what} "
                f"({_span('', have)}); fix {field} to match the weights"
            )
    if cfg.num_stored_layers > len(layers):
        raise CheckpointError(
            f"{source}: config.json says num_hidden_groups={short_repr(cfg.num_hidden_groups)} "
            f"x inner_group_num={short_repr(cfg.inner_group_num)} layers, but the weights "
            f"hold {len(layers)} (group, inner layer) pair(s); fix them to match the weights"
        )


# ------------------------------------------------------------------ conversion
def convert(
    cfg: EncoderConfig,
    items: Iterable[tuple[str, Callable[[], torch.Tensor]]],
    head: str,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    source: str = "checkpoint",
) -> dict[str, torch.Tensor]:
    """Canonical weights from ``(key, get_tensor)`` pairs.

    ``get_tensor`` is only called for keys the encoder and ``head`` need. Tensors are
    cast to ``dtype`` on ``device`` as they are read (a new tensor; the source is
    never modified). Raises :class:`CheckpointError` on a wrong shape, a non-floating
    weight, layers or token-type weights the config does not declare, or missing
    weights. The weight names it expects are built from ``cfg``'s sizes: for a config
    read from files, bound them by the weights first (:func:`check_sizes`, as
    :func:`load_checkpoint` does).
    """
    required = encoder_weight_specs(cfg)
    head_req, optional = head_weight_specs(cfg, head)
    required.update(head_req)
    wanted = dict(required)
    wanted.update(optional)

    for alias, target in _FALLBACK.items():
        if target in wanted:
            wanted[alias] = wanted[target]
    out: dict[str, torch.Tensor] = {}
    pending: dict[str, list[torch.Tensor | None]] = {}
    H = cfg.hidden_size
    device = torch.device(device)

    def cast(t: torch.Tensor) -> torch.Tensor:  # floating point: checked when read
        return t.to(device=device, dtype=dtype, copy=False)

    extra_layers: list[tuple[object, str]] = []  # (stored index, key) beyond the config
    for key, get in items:
        found = _match(cfg, key)
        if found is None:
            continue
        name, part, index = found
        if _beyond_config(cfg, index):
            extra_layers.append((index, key))
            continue
        if (
            name == "embeddings.token_type"
            and not cfg.has_token_types
            and cfg.family != "distilbert"
        ):
            t = get()
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else "?"
            raise CheckpointError(
                f"{source}: config.json says type_vocab_size={cfg.type_vocab_size}, but the "
                f"weights hold token-type embeddings {one_line(key)} of shape {shape}; set "
                f"type_vocab_size to the number of rows of that tensor"
            )
        if name not in wanted or name in out:
            continue
        t = get()
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{source}: {one_line(key)} is not a tensor")
        if not t.is_floating_point():
            raise CheckpointError(
                f"{source}: weight {one_line(key)} (bertfast {name}) has dtype {t.dtype}; "
                f"weights must be floating point (float32, float16 or bfloat16)"
            )
        if part is None:
            if tuple(t.shape) != tuple(wanted[name]):
                raise CheckpointError(
                    f"{source}: weight {one_line(key)} (bertfast {name}) has shape "
                    f"{tuple(t.shape)}, expected {_shape(wanted[name])}"
                )
            out[name] = cast(t)
        else:
            expect = (H, H) if name.endswith("weight") else (H,)
            if tuple(t.shape) != expect:
                raise CheckpointError(
                    f"{source}: weight {one_line(key)} (part {'QKV'[part]} of bertfast {name}) "
                    f"has shape {tuple(t.shape)}, expected {_shape(expect)}"
                )
            parts = pending.setdefault(name, [None, None, None])
            parts[part] = cast(t)
            del t
            if all(p is not None for p in parts):
                out[name] = torch.cat(parts, 0)
                del pending[name]  # frees the three parts

    if extra_layers:
        _refuse_extra_layers(cfg, extra_layers, source)

    for alias, target in _FALLBACK.items():
        t = out.pop(alias, None)
        if t is not None and target not in out:
            out[target] = t

    # Tied MLM decoder: the file omits decoder.weight -> share the word embeddings.
    if "mlm.decoder.weight" in required and "mlm.decoder.weight" not in out:
        word = out.get("embeddings.word")
        if word is not None and tuple(word.shape) == tuple(required["mlm.decoder.weight"]):
            out["mlm.decoder.weight"] = word

    missing = [n for n in required if n not in out]
    if missing:
        partial = {
            n: [("Q", "K", "V")[i] for i, p in enumerate(v) if p is None]
            for n, v in pending.items()
        }
        detail = [
            f"{n} (missing part {'/'.join(partial[n])})" if n in partial else n for n in missing
        ]
        raise CheckpointError(
            f"{source}: missing {len(missing)} weight(s) needed by the {cfg.model_type} encoder "
            f"and the {head!r} head: {first_few(detail)}"
        )
    return out


def _shape(shape: tuple) -> str:
    """An expected shape for a message (its sizes come from the config: shortened)."""
    return "(" + ", ".join(short_repr(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _refuse_extra_layers(cfg: EncoderConfig, extra, source: str) -> None:
    """The weights hold layers the config does not declare: a wrong
    num_hidden_layers (or ALBERT group counts) would silently drop them."""
    index, key = max(extra, key=lambda e: e[0])
    if cfg.family == "albert":
        groups = max(cfg.num_hidden_groups, max(i[0] for i, _ in extra) + 1)
        inner = max(cfg.inner_group_num, max(i[1] for i, _ in extra) + 1)
        raise CheckpointError(
            f"{source}: the weights hold {groups} layer group(s) of {inner} layer(s) "
            f"(e.g. {one_line(key)}), but config.json says num_hidden_groups="
            f"{cfg.num_hidden_groups}, inner_group_num={cfg.inner_group_num}; fix the config "
            f"to match the weights"
        )
    field = cfg.keys.get("num_layers", "num_hidden_layers")
    raise CheckpointError(
        f"{source}: the weights hold {index + 1} layers (e.g. {one_line(key)}), but "
        f"config.json says {field}={cfg.num_layers}; fix {field} to match the weights"
    )


# ---------------------------------------------------------------------- files
def _weight_file(folder: str, name, index: str | None = None) -> str:
    """``folder/name``, refused unless it stays inside the checkpoint folder
    (:func:`~bertfast.validate.checkpoint_file`: no absolute path, no ``..``, no
    symlink out of the folder except into a Hugging Face cache repo's ``blobs``)."""
    return checkpoint_file(folder, name, f"{index} names" if index else "weight file")


def find_weight_files(folder: str) -> tuple[str, list[str]]:
    """``(format, files)`` with format ``safetensors`` or ``bin``."""

    def p(name):
        return os.path.join(folder, name)

    if os.path.isfile(p("model.safetensors")):
        return "safetensors", [_weight_file(folder, "model.safetensors")]
    for fmt, index in (
        ("safetensors", "model.safetensors.index.json"),
        ("bin", "pytorch_model.bin.index.json"),
    ):
        if os.path.isfile(p(index)):
            try:
                with open(p(index), encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                raise CheckpointError(
                    f"{p(index)} is not a valid shard index: {type(exc).__name__}: {one_line(exc)}"
                ) from exc
            if not isinstance(weight_map, dict):
                raise CheckpointError(
                    f"{p(index)} is not a valid shard index: weight_map "
                    f"must map tensor names to shard file names"
                )
            for key, shard in weight_map.items():
                if not isinstance(shard, str):
                    raise CheckpointError(
                        f"{p(index)}: weight_map[{short_repr(key)}] must be a shard file name, "
                        f"got {short_repr(shard)}"
                    )
            shards = sorted(set(weight_map.values()))
            paths = [_weight_file(folder, s, index) for s in shards]
            absent = [s for s, path in zip(shards, paths) if not os.path.isfile(path)]
            if absent:
                raise CheckpointNotFoundError(
                    f"{folder}: {len(absent)} shard(s) named in {index} are missing: "
                    f"{first_few(absent)}"
                )
            return fmt, paths
    if os.path.isfile(p("pytorch_model.bin")):
        return "bin", [_weight_file(folder, "pytorch_model.bin")]
    raise CheckpointNotFoundError(
        f"{folder}: no weights found (looked for model.safetensors, "
        f"model.safetensors.index.json, pytorch_model.bin, pytorch_model.bin.index.json)"
    )


def _safetensors_error(path: str, exc: Exception) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a readable safetensors file (truncated or corrupt?): {one_line(exc)}"
    )


def _open_safetensors(path: str):
    from safetensors import safe_open

    try:
        return safe_open(path, framework="pt", device="cpu")
    except Exception as exc:  # SafetensorError, OSError: corrupt/truncated header
        raise _safetensors_error(path, exc) from exc


def _load_bin(path: str) -> dict:
    """A ``.bin`` file's state dict, ``torch.load(weights_only=True)``: memory-mapped
    (tensor data is read when touched), or read whole for the legacy pre-zip format,
    which cannot be mapped."""
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            sd = torch.load(path, map_location="cpu", weights_only=True)  # legacy format
    except Exception as exc:
        raise CheckpointError(
            f"{path} is not a readable PyTorch weight file (truncated or corrupt?): {one_line(exc)}"
        ) from exc
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path} does not hold a state dict")
    return sd


def weight_shapes(fmt: str, files: list[str]) -> dict[str, tuple[int, ...]]:
    """Every tensor key in the weight files -> its shape, without reading tensor data:
    safetensors from the file headers, ``.bin`` from ``torch.load(mmap=True)``'s
    metadata (a legacy pre-zip ``.bin`` is read whole here and again when loaded).
    Entries that are not tensors are left out (:func:`convert` names them)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        if fmt == "safetensors":
            f = _open_safetensors(path)
            try:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
            except Exception as exc:
                raise _safetensors_error(path, exc) from exc
            finally:
                del f
        else:
            sd = _load_bin(path)
            for key, t in sd.items():
                if isinstance(key, str) and isinstance(t, torch.Tensor):
                    shapes[key] = tuple(t.shape)
            del sd
    return shapes


def _safetensors_items(files: list[str]) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    handles = []
    try:
        for path in files:
            handles.append((path, _open_safetensors(path)))
        for path, f in handles:
            for key in f.keys():

                def get(f=f, key=key, path=path):
                    try:
                        return f.get_tensor(key)
                    except Exception as exc:
                        raise CheckpointError(
                            f"{path}: cannot read tensor {one_line(key)} (truncated or "
                            f"corrupt?): {one_line(exc)}"
                        ) from exc

                yield key, get
    finally:
        handles.clear()


def _bin_items(files: list[str]) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    for path in files:
        sd = _load_bin(path)
        for key in list(sd.keys()):
            t = sd.pop(key)
            yield key, (lambda t=t: t)
            del t
        del sd


def _file_mappings() -> list[tuple[int, int]] | None:
    """The address ranges ``[start, end)`` of this process's file-backed mappings
    (``/proc/self/maps`` lines with a nonzero inode), sorted; None where that file
    cannot be read."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return None
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) >= 5 and fields[4] != "0":
            lo, hi = fields[0].split("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    ranges.sort()
    return ranges


def file_backed(tensors: Iterable[torch.Tensor]) -> list[bool]:
    """Whether each tensor's memory lies in a file mapping: a CPU tensor the reader
    returned as a view of the memory-mapped weight file (safetensors, and
    ``torch.load(mmap=True)``) rather than a copy. Such a tensor keeps the mapping,
    and the pages of the file it has read, in the process for as long as it lives.
    Where the mappings cannot be read (no ``/proc``), every non-empty CPU tensor
    counts as file-backed (copying it is the safe answer)."""
    ranges = _file_mappings()
    starts = [lo for lo, _ in ranges or ()]
    out = []
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0:
            out.append(False)
        elif ranges is None:
            out.append(True)
        else:
            ptr = t.data_ptr()
            i = bisect.bisect_right(starts, ptr) - 1
            out.append(i >= 0 and ptr < ranges[i][1])
    return out


def load_checkpoint(
    path,
    head: str | None = None,
    dtype: torch.dtype = torch.float32,
    device="cpu",
) -> tuple[EncoderConfig, str, dict[str, torch.Tensor]]:
    """Read ``path`` -> ``(config, resolved head, canonical weights)``."""
    folder = checkpoint_folder(path)
    cfg = EncoderConfig.from_json(folder)
    head = resolve_head(cfg, head)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    fmt, files = find_weight_files(folder)
    # Config sizes bounded by the weights before anything proportional to them is built.
    check_sizes(cfg, weight_shapes(fmt, files), source=folder)
    items = _safetensors_items(files) if fmt == "safetensors" else _bin_items(files)
    try:
        weights = convert(cfg, items, head, dtype=dtype, device=device, source=folder)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
    return cfg, head, weights


def release_freed_memory() -> None:
    """Give the heap pages freed so far back to the OS (glibc's ``malloc_trim``; a
    no-op where it is missing). A load frees what it read and did not keep (the fp32
    checkpoint tensors a ``quantize="int8"`` model replaces, the copies packing
    made), and glibc keeps such pages resident for reuse: all-MiniLM-L6-v2 in int8 held
    50 MB more after its load than after this (+114 MB against +64 MB)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
