"""Config normalisation, canonical weight names, head choice, and every way a
checkpoint folder can be bad: each raises a clear exception and nothing loads."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch

import bertfast
from bertfast.checkpoint import (
    CheckpointError,
    canonical_name,
    convert,
    encoder_weight_specs,
    load_checkpoint,
)
from bertfast.config import SUPPORTED_MODEL_TYPES, EncoderConfig
from bertfast.heads import HEADS
from tests.models import build, edit_config, save


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A saved BertForPreTraining (pooler, MLM, NSP), 3 layers."""
    d = str(tmp_path_factory.mktemp("bert_pt"))
    save(build("bert", "pretraining"), d)
    return d


@pytest.fixture
def folder(base_dir, tmp_path):
    """A private copy of base_dir to damage."""
    d = str(tmp_path / "ckpt")
    shutil.copytree(base_dir, d)
    return d


def _write_config(path, **cfg):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


BERT_CFG = dict(
    model_type="bert",
    vocab_size=50,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=100,
    max_position_embeddings=32,
)


# ------------------------------------------------------------------------ config
def test_config_normalises_each_family(tmp_path):
    cases = {
        "bert": dict(BERT_CFG, hidden_act="gelu_fast"),
        "xlm-roberta": dict(
            BERT_CFG,
            model_type="xlm-roberta",
            hidden_act="gelu_new",
            pad_token_id=1,
            type_vocab_size=1,
        ),
        "albert": dict(
            BERT_CFG,
            model_type="albert",
            embedding_size=16,
            num_hidden_groups=2,
            inner_group_num=3,
            num_hidden_layers=4,
        ),
        "electra": dict(
            BERT_CFG, model_type="electra", embedding_size=32, hidden_act="gelu_pytorch_tanh"
        ),
        "distilbert": dict(
            model_type="distilbert",
            vocab_size=50,
            dim=64,
            n_layers=2,
            n_heads=4,
            hidden_dim=100,
            max_position_embeddings=32,
            activation="relu",
            architectures=["DistilBertForMaskedLM"],
            id2label={"0": "NEG", "1": "POS", "2": "MID"},
        ),
    }
    got = {
        k: EncoderConfig.from_json(_write_config(str(tmp_path / k), **v)) for k, v in cases.items()
    }
    assert got["bert"].hidden_act == "gelu_tanh" and got["bert"].position_scheme == "absolute"
    assert got["bert"].embedding_size == 64 and got["bert"].type_vocab_size == 2
    x = got["xlm-roberta"]
    assert (x.family, x.position_scheme, x.hidden_act, x.pad_token_id) == (
        "roberta",
        "roberta",
        "gelu_tanh",
        1,
    )
    assert x.max_seq_len == 32 - 2
    a = got["albert"]
    assert (a.embedding_size, a.num_hidden_groups, a.inner_group_num, a.hidden_act) == (
        16,
        2,
        3,
        "gelu_tanh",
    )  # ALBERT's default activation is gelu_new
    assert a.num_stored_layers == 6 and a.has_projection
    assert a.layer_schedule() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]
    e = got["electra"]
    assert e.has_projection and e.embedding_size == 32 and e.hidden_act == "gelu_tanh"
    d = got["distilbert"]
    assert (
        d.hidden_size,
        d.num_layers,
        d.num_heads,
        d.intermediate_size,
        d.hidden_act,
        d.type_vocab_size,
        d.layer_norm_eps,
    ) == (64, 2, 4, 100, "relu", 0, 1e-12)
    assert d.architectures == ("DistilBertForMaskedLM",)
    assert d.num_labels == 3 and d.id2label == {0: "NEG", 1: "POS", 2: "MID"}


def test_config_from_real_transformers_configs(tmp_path):
    import transformers as T

    for cls, fam in [
        (T.BertConfig, "bert"),
        (T.RobertaConfig, "roberta"),
        (T.CamembertConfig, "roberta"),
        (T.AlbertConfig, "albert"),
        (T.ElectraConfig, "electra"),
        (T.DistilBertConfig, "distilbert"),
    ]:
        d = str(tmp_path / cls.__name__)
        cls().save_pretrained(d)
        cfg = EncoderConfig.from_json(d)
        assert cfg.family == fam


def test_unknown_model_type_names_it_and_lists_supported(tmp_path):
    d = _write_config(str(tmp_path / "gpt"), **dict(BERT_CFG, model_type="gpt2"))
    with pytest.raises(ValueError) as e:
        EncoderConfig.from_json(d)
    msg = str(e.value)
    assert "'gpt2'" in msg
    assert all(t in msg for t in SUPPORTED_MODEL_TYPES)
    with pytest.raises(ValueError, match="gpt2"):
        bertfast.from_pretrained(d)


@pytest.mark.parametrize("act", ["silu", "quick_gelu", "swish"])
def test_unknown_activation(tmp_path, act):
    d = _write_config(str(tmp_path / act), **dict(BERT_CFG, hidden_act=act))
    with pytest.raises(ValueError, match=f"hidden_act={act!r}"):
        EncoderConfig.from_json(d)


def test_relative_positions_unsupported(tmp_path):
    d = _write_config(
        str(tmp_path / "rel"), **dict(BERT_CFG, position_embedding_type="relative_key")
    )
    with pytest.raises(ValueError, match="relative_key"):
        EncoderConfig.from_json(d)


def test_bad_config_json(tmp_path):
    d = tmp_path / "badjson"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        EncoderConfig.from_json(str(d))
    with pytest.raises(ValueError, match="hidden_size"):
        EncoderConfig.from_json(
            _write_config(
                str(tmp_path / "nohidden"),
                **{k: v for k, v in BERT_CFG.items() if k != "hidden_size"},
            )
        )
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig.from_json(
            _write_config(str(tmp_path / "heads"), **dict(BERT_CFG, num_attention_heads=5))
        )


# -------------------------------------------------------------- canonical names
def test_canonical_names_and_fused_qkv(base_dir):
    hf = build("bert", "pretraining")  # same seed as base_dir: identical weights
    model = bertfast.from_pretrained(base_dir, backend="torch")
    cfg = model.config
    names = set(dict(model.named_parameters(remove_duplicate=False)))
    assert set(encoder_weight_specs(cfg)) <= names
    assert {"pooler.weight", "mlm.decoder.weight", "mlm.decoder.bias", "nsp.weight"} <= names
    for i in range(cfg.num_layers):
        att = hf.bert.encoder.layer[i].attention.self
        want_w = torch.cat([att.query.weight, att.key.weight, att.value.weight])
        want_b = torch.cat([att.query.bias, att.key.bias, att.value.bias])
        assert torch.equal(model.layers._modules[str(i)].qkv.weight, want_w)
        assert torch.equal(model.layers._modules[str(i)].qkv.bias, want_b)
    assert model.layers._modules["0"].qkv.weight.shape == (3 * 96, 96)


def test_canonical_name_mapping_per_family():
    cfgs = {
        "bert": EncoderConfig.from_dict(dict(BERT_CFG)),
        "albert": EncoderConfig.from_dict(
            dict(
                BERT_CFG,
                model_type="albert",
                embedding_size=16,
                num_hidden_groups=2,
                inner_group_num=2,
            )
        ),
        "distilbert": EncoderConfig.from_dict(
            dict(
                model_type="distilbert",
                vocab_size=50,
                dim=64,
                n_layers=2,
                n_heads=4,
                hidden_dim=100,
            )
        ),
        "electra": EncoderConfig.from_dict(dict(BERT_CFG, model_type="electra", embedding_size=32)),
        "roberta": EncoderConfig.from_dict(dict(BERT_CFG, model_type="roberta")),
    }
    cases = [
        ("bert", "bert.encoder.layer.1.attention.self.key.weight", ("layers.1.qkv.weight", 1)),
        ("bert", "encoder.layer.0.output.LayerNorm.gamma", ("layers.0.ffn_ln.weight", None)),
        ("bert", "cls.predictions.transform.dense.bias", ("mlm.dense.bias", None)),
        ("bert", "bert.embeddings.position_ids", None),
        ("bert", "encoder.layer.7.output.dense.weight", None),  # beyond num_layers
        (
            "albert",
            "albert.encoder.albert_layer_groups.1.albert_layers.1.ffn_output.weight",
            ("layers.3.ffn_out.weight", None),
        ),
        ("albert", "encoder.embedding_hidden_mapping_in.bias", ("embeddings.project.bias", None)),
        ("albert", "sop_classifier.classifier.weight", ("sop.weight", None)),
        (
            "distilbert",
            "distilbert.transformer.layer.1.attention.v_lin.bias",
            ("layers.1.qkv.bias", 2),
        ),
        ("distilbert", "pre_classifier.weight", ("classifier.dense.weight", None)),
        ("distilbert", "vocab_projector.weight", ("mlm.decoder.weight", None)),
        ("electra", "electra.embeddings_project.weight", ("embeddings.project.weight", None)),
        (
            "electra",
            "discriminator_predictions.dense_prediction.bias",
            ("discriminator.out.bias", None),
        ),
        ("electra", "sequence_summary.summary.weight", ("classifier.dense.weight", None)),
        ("roberta", "classifier.out_proj.weight", ("classifier.out.weight", None)),
        ("roberta", "classifier.weight", ("classifier.out.weight", None)),
        ("roberta", "lm_head.layer_norm.bias", ("mlm.ln.bias", None)),
    ]
    for fam, key, want in cases:
        assert canonical_name(cfgs[fam], key) == want, (fam, key)


def test_albert_layers_are_shared_not_copied(tmp_path):
    d = save(build("albert", "base"), str(tmp_path / "albert"))
    model = bertfast.from_pretrained(d, backend="torch")
    cfg = model.config
    assert len(model.layers._modules) == cfg.num_hidden_groups * cfg.inner_group_num == 4
    assert len(cfg.layer_schedule()) == cfg.num_layers * cfg.inner_group_num


# ------------------------------------------------------------------ head choice
@pytest.mark.parametrize(
    "arch,head",
    [
        ("BertModel", "base"),
        ("BertForMaskedLM", "masked_lm"),
        ("BertForPreTraining", "pretraining"),
        ("BertForNextSentencePrediction", "next_sentence"),
        ("BertForSequenceClassification", "sequence_classification"),
        ("BertForTokenClassification", "token_classification"),
        ("BertForQuestionAnswering", "question_answering"),
        ("BertForMultipleChoice", "multiple_choice"),
        ("SomethingNew", "base"),
    ],
)
def test_head_from_architectures(arch, head):
    from bertfast.heads import resolve_head

    cfg = EncoderConfig.from_dict(dict(BERT_CFG, architectures=[arch]))
    assert resolve_head(cfg, None) == head
    ecfg = EncoderConfig.from_dict(
        dict(BERT_CFG, model_type="electra", architectures=["ElectraForPreTraining"])
    )
    assert resolve_head(ecfg, None) == "electra_discriminator"


def test_bad_head_names(base_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown head 'nope'"):
        bertfast.from_pretrained(base_dir, head="nope")
    assert "multiple_choice" in HEADS
    d = save(build("roberta", "base"), str(tmp_path / "rob"))
    with pytest.raises(ValueError, match="next_sentence"):
        bertfast.from_pretrained(d, head="next_sentence")
    d = save(build("distilbert", "base"), str(tmp_path / "db"))
    with pytest.raises(ValueError, match="pooler"):
        bertfast.from_pretrained(d, head="pooler")


def test_head_weights_missing_from_checkpoint(tmp_path):
    """A base checkpoint asked for a classification head: lists what is missing."""
    d = save(build("bert", "base"), str(tmp_path / "base"))
    with pytest.raises(CheckpointError, match="classifier.out.weight") as e:
        bertfast.from_pretrained(d, head="sequence_classification")
    assert "classifier.out.bias" in str(e.value)


# ------------------------------------------------------------------ bad folders
def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bertfast.from_pretrained(str(tmp_path / "nowhere"))


def test_path_is_a_file(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        bertfast.from_pretrained(str(f))


def test_missing_config(folder):
    os.remove(os.path.join(folder, "config.json"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        bertfast.from_pretrained(folder)


def test_missing_weight_file(folder):
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="no weights found"):
        bertfast.from_pretrained(folder)


def test_truncated_safetensors(folder):
    path = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        bertfast.from_pretrained(folder)


def test_corrupt_safetensors_header(folder):
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as f:
        f.write(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="safetensors"):
        bertfast.from_pretrained(folder)


def test_garbage_bin(folder):
    os.remove(os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "pytorch_model.bin"), "wb") as f:
        f.write(b"this is not a torch file")
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        bertfast.from_pretrained(folder)


def test_truncated_bin(folder):
    from safetensors.torch import load_file

    st = os.path.join(folder, "model.safetensors")
    b = os.path.join(folder, "pytorch_model.bin")
    torch.save(load_file(st), b)
    os.remove(st)
    assert bertfast.from_pretrained(folder, backend="torch") is not None  # intact loads
    with open(b, "r+b") as f:
        f.truncate(os.path.getsize(b) // 2)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        bertfast.from_pretrained(folder)


def test_bin_is_loaded_weights_only(folder):
    """A pickle that would run code is refused (torch.load(weights_only=True))."""
    st = os.path.join(folder, "model.safetensors")
    os.remove(st)
    torch.save({"x": torch.zeros(1), "f": _Evil()}, os.path.join(folder, "pytorch_model.bin"))
    with pytest.raises(CheckpointError):
        bertfast.from_pretrained(folder)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_sharded_with_a_missing_shard(tmp_path):
    d = save(build("bert", "base"), str(tmp_path / "sh"), "sharded")
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    assert len(shards) > 1
    os.remove(os.path.join(d, shards[-1]))
    with pytest.raises(FileNotFoundError, match=shards[-1]):
        bertfast.from_pretrained(d)


def test_bad_shard_index(tmp_path):
    d = save(build("bert", "base"), str(tmp_path / "sh"), "sharded")
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write("[]")
    with pytest.raises(CheckpointError, match="shard index"):
        bertfast.from_pretrained(d)


def test_wrong_shape_names_the_weight(folder):
    key = "bert.encoder.layer.1.intermediate.dense.weight"

    def reshape(sd):
        sd[key] = torch.zeros(199, 96)

    _edit_weights(folder, reshape)
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained(folder)
    msg = str(e.value)
    assert key in msg and "(199, 96)" in msg and "(200, 96)" in msg


def test_wrong_shape_of_a_qkv_part(folder):
    key = "bert.encoder.layer.0.attention.self.value.bias"
    _edit_weights(folder, lambda sd: sd.__setitem__(key, torch.zeros(95)))
    with pytest.raises(CheckpointError, match=r"value\.bias.*\(95,\).*\(96,\)"):
        bertfast.from_pretrained(folder)


def test_missing_weights_are_listed(folder):
    gone = [
        "bert.encoder.layer.2.output.dense.bias",
        "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.0.attention.self.key.weight",
    ]

    def drop(sd):
        for k in gone:
            del sd[k]

    _edit_weights(folder, drop)
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained(folder)
    msg = str(e.value)
    assert "missing 3 weight(s)" in msg
    for name in (
        "layers.2.ffn_out.bias",
        "embeddings.ln.weight",
        "layers.0.qkv.weight (missing part K)",
    ):
        assert name in msg


def test_config_weight_mismatch(folder):
    """config says 4 layers, the file has 3: the 4th layer's weights are missing."""
    edit_config(folder, num_hidden_layers=4)
    with pytest.raises(CheckpointError, match="layers.3.qkv.weight"):
        bertfast.from_pretrained(folder)


def _edit_weights(folder, fn):
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    fn(sd)
    save_file(sd, path, metadata={"format": "pt"})


# ------------------------------------------------------------- memory hygiene
def test_convert_never_touches_the_source_tensors(base_dir):
    """Casting makes new tensors: a user's state dict keeps its dtype and values."""
    hf = build("bert", "masked_lm")
    sd = hf.state_dict()
    before = {k: v.clone() for k, v in sd.items()}
    cfg = EncoderConfig.from_dict(hf.config.to_dict())
    out = convert(
        cfg, ((k, (lambda v=v: v)) for k, v in sd.items()), "masked_lm", dtype=torch.float16
    )
    assert all(t.dtype == torch.float16 for t in out.values())
    for k, v in sd.items():
        assert v.dtype == before[k].dtype and torch.equal(v, before[k])


def test_only_needed_tensors_are_read(base_dir):
    """A base-head load never reads MLM/NSP head tensors, and reads each once."""
    from bertfast.checkpoint import _safetensors_items, find_weight_files

    cfg = EncoderConfig.from_json(base_dir)
    _, files = find_weight_files(base_dir)
    reads = []

    def spy(items):
        for key, get in items:
            yield key, (lambda key=key, get=get: (reads.append(key), get())[1])

    convert(cfg, spy(_safetensors_items(files)), "base")
    assert reads and not any(k.startswith("cls.") for k in reads)
    assert len(reads) == len(set(reads))


def test_load_checkpoint_returns_config_head_weights(base_dir):
    cfg, head, weights = load_checkpoint(base_dir, dtype=torch.float16)
    assert head == "pretraining" and cfg.model_type == "bert"
    assert weights["embeddings.word"].dtype == torch.float16
    # tied decoder shares the word embedding tensor (no copy)
    assert weights["mlm.decoder.weight"] is weights["embeddings.word"]


def test_non_float_dtype_rejected(base_dir):
    with pytest.raises(TypeError, match="dtype"):
        bertfast.from_pretrained(base_dir, dtype=torch.int64)


def test_unknown_backend_rejected(base_dir):
    with pytest.raises(ValueError, match="unknown backend"):
        bertfast.from_pretrained(base_dir, backend="fastest")


def test_electra_summary_type_other_than_first(tmp_path):
    from bertfast.heads import resolve_head

    cfg = EncoderConfig.from_dict(
        dict(
            BERT_CFG,
            model_type="electra",
            summary_type="mean",
            architectures=["ElectraForMultipleChoice"],
        )
    )
    with pytest.raises(ValueError, match="summary_type='mean'"):
        resolve_head(cfg, None)


# ---------------------------------------------------------- strict loading (issue 11)
def _shard(tmp_path, name="sh"):
    """A sharded BERT checkpoint: (folder, index path, weight_map)."""
    d = save(build("bert", "base"), str(tmp_path / name), "sharded")
    index = os.path.join(d, "model.safetensors.index.json")
    with open(index) as f:
        data = json.load(f)
    return d, index, data


def _rewrite_index(index, data, shard, new_name):
    data["weight_map"] = {k: (new_name if v == shard else v) for k, v in data["weight_map"].items()}
    with open(index, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_shard_paths_must_stay_inside_the_folder(tmp_path, how):
    """The shard is real and readable outside the folder: it must still be refused."""
    d, index, data = _shard(tmp_path)
    shard = sorted(set(data["weight_map"].values()))[0]
    outside = tmp_path / "outside.safetensors"
    shutil.move(os.path.join(d, shard), outside)
    if how == "dotdot":
        name = "../outside.safetensors"
    elif how == "absolute":
        name = str(outside)
    else:
        name = "link.safetensors"
        os.symlink(outside, os.path.join(d, name))
    _rewrite_index(index, data, shard, name)
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained(d, backend="torch")
    msg = str(e.value)
    assert name in msg and "model.safetensors.index.json" in msg
    assert {
        "dotdot": "leaves the checkpoint folder",
        "absolute": "absolute path",
        "symlink": "outside the checkpoint folder",
    }[how] in msg


def test_symlinks_inside_the_folder_and_hf_cache_snapshots_load(tmp_path):
    """Symlinked shards inside the folder, and a Hugging Face cache snapshot whose
    files link into the repo's blobs/, are not 'leaving the folder'."""
    d, index, data = _shard(tmp_path)
    want = bertfast.from_pretrained(d, backend="torch").embeddings.word.clone()
    repo = tmp_path / "models--x--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, name in enumerate(sorted(os.listdir(d))):
        shutil.copy(os.path.join(d, name), blobs / f"blob{i}")
        os.symlink(os.path.join("..", "..", "blobs", f"blob{i}"), snap / name)
    got = bertfast.from_pretrained(str(snap), backend="torch")
    assert torch.equal(got.embeddings.word, want)


def test_weight_map_values_must_be_file_names(tmp_path):
    d, index, data = _shard(tmp_path)
    key = sorted(data["weight_map"])[0]
    data["weight_map"][key] = 3
    with open(index, "w") as f:
        json.dump(data, f)
    with pytest.raises(CheckpointError, match=rf"weight_map\['{re.escape(key)}'\].*got 3"):
        bertfast.from_pretrained(d, backend="torch")


def test_integer_weight_is_refused_by_name(folder):
    key = "bert.encoder.layer.1.output.dense.bias"
    _edit_weights(folder, lambda sd: sd.__setitem__(key, torch.ones(96, dtype=torch.int64)))
    with pytest.raises(CheckpointError, match=rf"{re.escape(key)}.*torch\.int64"):
        bertfast.from_pretrained(folder, backend="torch")


def test_fewer_layers_in_config_than_in_the_weights(folder):
    """config says 2 layers, the file holds 3: loading only 2 would be silently wrong."""
    edit_config(folder, num_hidden_layers=2)
    with pytest.raises(CheckpointError, match=r"3 layers.*num_hidden_layers=2"):
        bertfast.from_pretrained(folder, backend="torch")


def test_albert_groups_in_config_fewer_than_in_the_weights(tmp_path):
    d = save(build("albert", "base"), str(tmp_path / "albert"))  # 2 groups x 2 layers
    edit_config(d, num_hidden_groups=1)
    with pytest.raises(CheckpointError, match=r"2 layer group.*num_hidden_groups=1"):
        bertfast.from_pretrained(d, backend="torch")


def test_token_type_weights_with_type_vocab_size_zero(folder):
    edit_config(folder, type_vocab_size=0)
    with pytest.raises(
        CheckpointError, match=r"type_vocab_size=0.*token_type_embeddings.*\(2, 96\)"
    ):
        bertfast.from_pretrained(folder, backend="torch")


@pytest.mark.parametrize(
    "field,value",
    [
        ("hidden_size", 96.5),
        ("hidden_size", "96x"),
        ("hidden_size", "96"),
        ("num_attention_heads", 0),
        ("intermediate_size", -200),
        ("vocab_size", True),
        ("num_hidden_layers", [3]),
        ("type_vocab_size", -1),
        ("max_position_embeddings", 0),
        ("layer_norm_eps", 0),
        ("pad_token_id", -1),
    ],
)
def test_bad_config_sizes_name_field_and_value(folder, field, value):
    edit_config(folder, **{field: value})
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained(folder, backend="torch")
    msg = str(e.value)
    assert field in msg and repr(value) in msg, msg


def test_integral_float_sizes_are_accepted(folder):
    edit_config(folder, hidden_size=96.0, num_hidden_layers=3.0)
    cfg = bertfast.from_pretrained(folder, backend="torch").config
    assert cfg.hidden_size == 96 and isinstance(cfg.hidden_size, int)


def test_hidden_not_divisible_by_heads_names_both_fields(folder):
    edit_config(folder, num_attention_heads=5)
    with pytest.raises(CheckpointError, match="hidden_size 96.*num_attention_heads 5"):
        bertfast.from_pretrained(folder, backend="torch")


def test_unknown_model_type_or_architecture_lists_the_families(tmp_path):
    d = _write_config(
        str(tmp_path / "gpt"),
        **dict(BERT_CFG, model_type="gpt2", architectures=["GPT2LMHeadModel"]),
    )
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained(d)
    msg = str(e.value)
    assert "'gpt2'" in msg and "GPT2LMHeadModel" in msg
    for family in ("BERT", "RoBERTa", "ALBERT", "ELECTRA", "DistilBERT"):
        assert family in msg
    cfg = {k: v for k, v in BERT_CFG.items() if k != "model_type"}
    d = _write_config(str(tmp_path / "none"), **dict(cfg, architectures=["LlamaForCausalLM"]))
    with pytest.raises(CheckpointError, match=r"no model_type.*LlamaForCausalLM.*DistilBERT"):
        bertfast.from_pretrained(d)


def test_one_checkpoint_error_class():
    from bertfast import checkpoint, config, embedder, validate

    assert (
        bertfast.CheckpointError
        is checkpoint.CheckpointError
        is embedder.CheckpointError
        is config.CheckpointError
        is validate.CheckpointError
    )
    assert issubclass(bertfast.CheckpointError, ValueError)


def test_missing_folder_same_error_from_model_and_embedder(tmp_path):
    from bertfast.embedder import Embedder

    errors = []
    for load in (bertfast.from_pretrained, Embedder.from_pretrained):
        with pytest.raises(CheckpointError) as e:
            load(str(tmp_path / "missing"))
        assert isinstance(e.value, FileNotFoundError)
        errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1]


def test_uncached_hub_id_offline_says_so(tmp_path, monkeypatch):
    # no folder of that name here: a Hub id, looked up in the (empty, offline) cache
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained("bert-base-uncased")
    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    assert "bert-base-uncased is not in the Hugging Face cache" in msg
    assert "hf download bert-base-uncased" in msg
