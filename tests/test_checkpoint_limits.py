"""Checkpoint files that claim too much or are malformed (issue 27, items 5 and 6):
config sizes are bounded by the weights before anything proportional to them is
built, every message is one short line whatever the files hold, and the
sentence-transformers files obey the same containment rule as weight files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import bertfast
from bertfast import cli
from bertfast.checkpoint import CheckpointError
from bertfast.embedder import Embedder, read_sentence_config
from bertfast.validate import first_few, short_repr
from tests import tiny_embedder
from tests.models import build, edit_config, save

_ST = "sentence_transformers.models."


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A saved 3-layer BertModel (hidden 96, vocab 101, 40 positions, 2 token types)."""
    return save(build("bert", "base"), str(tmp_path_factory.mktemp("bert")))


@pytest.fixture
def folder(base_dir, tmp_path):
    """A private copy of base_dir to damage."""
    d = str(tmp_path / "ckpt")
    shutil.copytree(base_dir, d)
    return d


def _refused(folder, *words) -> str:
    """Loading ``folder`` raises one CheckpointError: one short line holding ``words``."""
    with pytest.raises(CheckpointError) as e:
        bertfast.from_pretrained(folder, backend="torch")
    msg = str(e.value)
    _assert_one_short_line(msg, folder)
    for word in words:
        assert word in msg, msg
    return msg


def _assert_one_short_line(msg: str, folder) -> None:
    """No line break, and short once the folder path (as long as the machine's
    temporary folder makes it) is left out."""
    assert "\n" not in msg and "\r" not in msg, msg[:1000]
    assert len(msg.replace(str(folder), "")) < 500, msg[:1000]


# ------------------------------------------------------------- sizes vs the weights
@pytest.mark.parametrize("layers", [10**6, 10**7])
def test_huge_layer_count_is_refused_before_building_anything(folder, layers):
    """Was: 10**6 took 14 s and 3.7 GB for a 336-million-character message, 10**7 a
    MemoryError (a name for every configured layer was built before any weight)."""
    edit_config(folder, num_hidden_layers=layers)
    _refused(
        folder,
        f"num_hidden_layers={layers}",
        "weights hold 3 layer(s) (layers.0 .. layers.2)",
        "layers.3.qkv.weight",
    )


def test_huge_layer_count_in_a_bin_checkpoint(tmp_path):
    """pytorch_model.bin: the shapes come from torch.load(mmap=True)'s metadata."""
    d = save(build("bert", "base"), str(tmp_path / "bin"), "bin")
    edit_config(d, num_hidden_layers=10**6)
    _refused(d, "num_hidden_layers=1000000", "3 layer(s)")


def test_huge_layer_count_named_as_the_config_spells_it(tmp_path):
    d = save(build("distilbert", "base"), str(tmp_path / "db"))
    edit_config(d, n_layers=10**6)
    _refused(d, "n_layers=1000000", "2 layer(s) (layers.0 .. layers.1)")


@pytest.mark.parametrize(
    "field,value,held",
    [
        ("vocab_size", 10**9, 101),
        ("max_position_embeddings", 10**6, 40),
        ("hidden_size", 96 * 1000, 96),
        ("intermediate_size", 10**6, 200),
        ("type_vocab_size", 10**5, 2),
    ],
)
def test_size_larger_than_the_weights_names_field_value_and_weights(folder, field, value, held):
    """Was: a shape error naming the tensor, not the config field."""
    edit_config(folder, **{field: value})
    _refused(folder, f"config.json says {field}={value}", f"the weights hold {held} (")


@pytest.mark.parametrize(
    "changes,words",
    [
        (
            dict(num_hidden_groups=10**6, num_hidden_layers=10**6),
            ("num_hidden_groups=1000000", "2 layer group(s)"),
        ),
        (dict(inner_group_num=10**6), ("inner_group_num=1000000", "2 layer(s) per group")),
    ],
)
def test_albert_huge_groups_are_refused(tmp_path, changes, words):
    """Was: groups x inner layers names built (2 million layers' worth) before any
    weight was read."""
    d = save(build("albert", "base"), str(tmp_path / "albert"))  # 2 groups x 2 layers
    edit_config(d, **changes)
    _refused(d, *words)


def test_many_missing_weights_list_the_first_few(folder):
    """Was: every missing name, however many."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    save_file({k: v for k, v in sd.items() if not k.endswith(".bias")}, path)
    msg = _refused(folder, "missing 19 weight(s)", "embeddings.ln.bias, layers.0.qkv.bias")
    assert msg.endswith("... and 14 more"), msg


# ------------------------------------------------------------- echoed values
# A huge value for each field (built when the test runs, not at collection).
_HUGE = {
    "model_type": lambda: "x" * 10**7,
    "hidden_size": lambda: "9" * 10**7,
    "hidden_act": lambda: "gelu\n" * 10**6,
    "num_attention_heads": lambda: ["a\nb"] * 10**5,
    "num_hidden_layers": lambda: int("9" * 4000),
    "id2label": lambda: "y" * 10**6,
}


@pytest.mark.parametrize("field", list(_HUGE))
def test_huge_config_values_give_one_short_line(folder, field):
    """Was: the value echoed whole (a 10 MB string, a 4000-digit number, line breaks);
    a 4000-digit layer count looped over the configured layers without end."""
    edit_config(folder, **{field: _HUGE[field]()})
    _refused(folder, field if field != "model_type" else "model_type 'xxx")


def test_many_architectures_give_one_short_line(folder):
    edit_config(folder, model_type="gpt2", architectures=[f"Arch{i}" for i in range(10**5)])
    _refused(folder, "Arch0, Arch1, Arch2 ... and 99997 more")


def test_short_repr_and_first_few():
    assert short_repr("abc") == "'abc'" and short_repr([3]) == "[3]" and short_repr(96.5) == "96.5"
    assert short_repr("a\nb") == "'a\\nb'"
    long = short_repr("z" * 10**7)
    assert len(long) < 200 and long.startswith("'zzz") and "..." in long
    assert first_few(range(3)) == "0, 1, 2"
    assert first_few(range(8), 2) == "0, 1 ... and 6 more"


# ------------------------------------------------------- sentence-transformers files
def _st_folder(root: Path, pooling_path="1_Pooling", pooling=None) -> Path:
    """A folder with sentence-transformers files only (enough for
    read_sentence_config): Transformer -> Pooling at ``pooling_path``."""
    root.mkdir(parents=True, exist_ok=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _ST + "Transformer"},
        {"idx": 1, "name": "1", "path": pooling_path, "type": _ST + "Pooling"},
    ]
    (root / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (root / "1_Pooling").mkdir(exist_ok=True)
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return root


_CLS = {"word_embedding_dimension": 32, "pooling_mode_cls_token": True}


def _outside_pooling(tmp_path) -> Path:
    """A valid CLS pooling config outside every checkpoint folder."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(_CLS))
    return outside


def _refused_st(folder, *words) -> str:
    with pytest.raises(CheckpointError) as e:
        read_sentence_config(folder)
    msg = str(e.value)
    _assert_one_short_line(msg, folder)
    for word in words:
        assert word in msg, msg
    return msg


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_pooling_path_must_stay_inside_the_folder(tmp_path, how):
    """Was: the pooling config read from outside the checkpoint folder."""
    outside = _outside_pooling(tmp_path)
    name = "../outside" if how == "dotdot" else str(outside)
    folder = _st_folder(tmp_path / "ckpt", pooling_path=name)
    msg = _refused_st(folder, "modules.json", name)
    assert ("leaves the checkpoint folder" if how == "dotdot" else "absolute path") in msg


@pytest.mark.parametrize("link", ["folder", "file", "modules.json", "sentence_bert_config.json"])
def test_symlinks_out_of_the_folder_are_refused(tmp_path, link):
    """The pooling folder, the pooling config, modules.json or
    sentence_bert_config.json as a symlink to a file outside: refused like a weight
    file. Was: read."""
    outside = _outside_pooling(tmp_path)
    folder = _st_folder(tmp_path / "ckpt", pooling=None if link == "folder" else _CLS)
    if link == "folder":
        os.symlink(outside, folder / "1_Pooling")
    elif link == "file":
        os.remove(folder / "1_Pooling" / "config.json")
        os.symlink(outside / "config.json", folder / "1_Pooling" / "config.json")
    elif link == "modules.json":
        shutil.move(folder / link, outside / link)
        os.symlink(outside / link, folder / link)
    else:
        (outside / link).write_text(json.dumps({"max_seq_length": 8}))
        os.symlink(outside / link, folder / link)
    _refused_st(folder, "outside the checkpoint folder", os.path.realpath(outside))


def test_symlinks_inside_the_folder_are_read(tmp_path):
    folder = _st_folder(tmp_path / "ckpt", pooling_path="pool")
    (folder / "real").mkdir()
    (folder / "real" / "config.json").write_text(json.dumps(_CLS))
    os.symlink("real", folder / "pool")
    assert read_sentence_config(folder).pooling == ("cls",)


def test_hf_cache_snapshot_with_blob_symlinks_loads(tmp_path):
    """A Hugging Face cache snapshot: every file, the pooling config included, is a
    symlink into the repo's blobs/. Not 'leaving the folder' (today too)."""
    src = tiny_embedder.make_checkpoint(tmp_path / "src", size="micro")
    _st_folder(src, pooling=_CLS)
    (src / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    repo = tmp_path / "models--x--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    for i, file in enumerate(sorted(p for p in src.rglob("*") if p.is_file())):
        shutil.copy(file, blobs / f"blob{i}")
        rel = file.relative_to(src)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        up = os.path.join(*[".."] * (len(rel.parts) + 1))  # out of snapshots/abc123/...
        os.symlink(os.path.join(up, "blobs", f"blob{i}"), snap / rel)
    assert os.path.islink(snap / "1_Pooling" / "config.json")
    embedder = Embedder.from_pretrained(snap, backend="torch")
    assert embedder.pooling == ("cls",) and embedder.max_length == 16
    assert embedder.encode("the cat sat").shape == (32,)


@pytest.mark.parametrize(
    "file,content,words",
    [
        # modules.json not a list (a CheckpointError already), and each entry's shape
        ("modules.json", {"a": 1}, ("modules.json", "list of modules")),
        ("modules.json", None, ("modules.json", "list of modules", "None")),
        ("modules.json", ["x"], ("modules.json", "module 0 must be an object", "'x'")),
        ("modules.json", [None], ("modules.json", "module 0 must be an object")),
        ("modules.json", [{"type": 3, "path": "p"}], ("modules.json", "module 0's type", "3")),
        (
            "modules.json",
            [{"type": _ST + "Pooling", "path": 3}],
            ("modules.json", "module 0's path", "3"),
        ),
        (
            "modules.json",
            [{"type": _ST + "Pooling", "path": None}],
            ("modules.json", "module 0's path", "None"),
        ),
        # sentence_bert_config.json
        ("sentence_bert_config.json", None, ("sentence_bert_config.json", "JSON object")),
        ("sentence_bert_config.json", [256], ("sentence_bert_config.json", "JSON object")),
        (
            "sentence_bert_config.json",
            {"max_seq_length": "256"},
            ("sentence_bert_config.json", "max_seq_length", "'256'"),
        ),
        (
            "sentence_bert_config.json",
            {"max_seq_length": True},
            ("sentence_bert_config.json", "max_seq_length", "True"),
        ),
        # the pooling config
        ("1_Pooling/config.json", [1], ("1_Pooling", "JSON object", "[1]")),
        ("1_Pooling/config.json", None, ("1_Pooling", "JSON object", "None")),
        ("1_Pooling/config.json", {"pooling_mode": 3}, ("1_Pooling", "pooling_mode", "3")),
        (
            "1_Pooling/config.json",
            {"pooling_mode_mean_tokens": "yes"},
            ("1_Pooling", "pooling_mode_mean_tokens", "'yes'"),
        ),
    ],
)
def test_malformed_sentence_transformers_files(tmp_path, file, content, words):
    """Was: AttributeError / TypeError (a traceback from the CLI), or the bad value
    silently used or ignored."""
    folder = _st_folder(tmp_path / "ckpt", pooling={"pooling_mode_mean_tokens": True})
    (folder / file).write_text(json.dumps(content))
    _refused_st(folder, *words)


def test_null_max_seq_length_and_the_shipped_layout_are_read(tmp_path):
    folder = _st_folder(tmp_path / "ckpt", pooling={"pooling_mode": "mean", "include_prompt": True})
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": None}))
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST + "Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))  # 2_Normalize need not exist
    got = read_sentence_config(folder)
    assert (got.pooling, got.normalize, got.max_seq_length) == (("mean",), True, None)


def test_pooling_path_empty_is_the_folder_itself(tmp_path):
    """Path "" names the folder: its config.json is the model's, which enables no
    pooling mode (sentence-transformers fails on it too): refused, as before."""
    folder = _st_folder(tmp_path / "ckpt", pooling_path="")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    _refused_st(folder, "enables no pooling mode")


# ------------------------------------------------------------------------- CLI
@pytest.fixture
def st_checkpoint(tmp_path):
    folder = tiny_embedder.make_checkpoint(tmp_path / "st", size="micro")
    return _st_folder(folder, pooling={"pooling_mode_mean_tokens": True})


@pytest.mark.parametrize(
    "damage,words",
    [
        ("modules", ("modules.json", "module 0 must be an object")),
        ("pooling", ("leaves the checkpoint folder",)),
        ("layers", ("num_hidden_layers=10000000",)),
    ],
)
def test_cli_broken_checkpoint_is_one_error_line(st_checkpoint, tmp_path, capsys, damage, words):
    """Was: a traceback (AttributeError; MemoryError) or a silently used outside file."""
    if damage == "modules":
        (st_checkpoint / "modules.json").write_text('["x"]')
    elif damage == "pooling":
        _outside_pooling(tmp_path)
        _st_folder(st_checkpoint, pooling_path="../outside")
    else:
        edit_config(str(st_checkpoint), num_hidden_layers=10**7)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    code = cli.main(["encode", str(st_checkpoint), "--input", str(texts), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("bertfast: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err and not out.exists()
    for word in words:
        assert word in err, err
