"""``bertfast.presets``: built-in architectures with random weights, written as complete
Hugging Face folders that bertfast, transformers and sentence-transformers load alike."""

from __future__ import annotations

import json

import pytest
import torch

from bertfast import presets
from bertfast.ops.parity import END_TO_END_ATOL
from bertfast.presets import PRESETS, Preset, materialize, resolve

transformers = pytest.importorskip("transformers")

TINY = Preset(
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=80,
    vocab_size=500,
    max_position_embeddings=64,
    sentence=True,
)


def test_published_architectures():
    base = transformers.BertConfig()  # transformers' defaults are BERT-base's
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "type_vocab_size",
    ):
        assert getattr(PRESETS["bert-base"], key) == getattr(base, key), key
    large = PRESETS["bert-large"]
    assert (
        large.hidden_size,
        large.num_hidden_layers,
        large.num_attention_heads,
        large.intermediate_size,
    ) == (1024, 24, 16, 4096)
    packaged = presets.packaged_minilm()
    if packaged is not None:
        cfg = json.loads((packaged / "config.json").read_text())
        mini = PRESETS["minilm-l6"]
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            assert getattr(mini, key) == cfg[key], key


def test_folder_loads_in_transformers_and_bertfast(tmp_path):
    import bertfast
    from bertfast.tokenizer import Tokenizer

    folder = materialize(TINY, tmp_path / "tiny", seed=3)
    ref, info = transformers.AutoModel.from_pretrained(str(folder), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # not the trivial initialisation: biases and LayerNorms are drawn too
    assert ref.encoder.layer[0].attention.self.query.bias.abs().max() > 0.05
    assert (ref.embeddings.LayerNorm.weight - 1).abs().max() > 0.05

    texts = ["Hello world, this is a test.", "naïve façade — déjà vu 3.14", ""]
    ours = Tokenizer.from_pretrained(folder)(texts)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))(
        texts, padding=True, return_tensors="pt"
    )
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert (ours["input_ids"] == 100).float().mean() < 0.2  # mostly real pieces, few [UNK]

    model = bertfast.from_pretrained(folder, backend="torch")
    with torch.no_grad():
        expect = ref.eval()(**theirs).last_hidden_state
        got = model(
            ours["input_ids"],
            attention_mask=ours["attention_mask"],
            token_type_ids=ours["token_type_ids"],
        ).last_hidden_state
    real = ours["attention_mask"].bool()
    assert (got[real] - expect[real]).abs().max() < END_TO_END_ATOL


def test_sentence_transformers_layout(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from bertfast.embedder import Embedder

    folder = materialize(TINY, tmp_path / "tiny")
    texts = ["one sentence", "and another, longer sentence with more words"]
    ours = Embedder.from_pretrained(folder, backend="torch").encode(texts)
    theirs = st.SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert abs(ours - theirs).max() < 1e-5
    assert abs((ours**2).sum(-1) - 1).max() < 1e-5  # normalised, as the layout says


def test_deterministic_and_reused(tmp_path):
    a = materialize(TINY, tmp_path / "a", seed=1)
    b = materialize(TINY, tmp_path / "b", seed=1)
    c = materialize(TINY, tmp_path / "c", seed=2)
    read = lambda f: (f / "model.safetensors").read_bytes()  # noqa: E731
    assert read(a) == read(b) and read(a) != read(c)
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert materialize(TINY, tmp_path / "a", seed=1) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten


def test_resolve(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTFAST_PRESET_CACHE", str(tmp_path))
    assert resolve(str(tmp_path)) == tmp_path  # an existing folder is itself
    with pytest.raises(ValueError, match="neither a checkpoint folder nor a built-in"):
        resolve("bert-huge")
    with pytest.raises(ValueError, match="unknown preset"):
        materialize("bert-huge")
    monkeypatch.setattr(presets, "packaged_minilm", lambda: None)
    with pytest.raises(ValueError, match="minilm-l6"):
        resolve("minilm")
    monkeypatch.setitem(PRESETS, "minilm-l6", TINY)  # keep the test small
    path = resolve(None)
    assert path.parent == tmp_path and (path / "modules.json").is_file()
