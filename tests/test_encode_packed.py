"""BertfastModel.encode_packed (sequences back to back, no padding) and the
Embedder's packed path (embed_tokenized, pool_packed).

References: transformers' own forward of the same random model at every real token
(END_TO_END_ATOL, as test_optimize.py), and bertfast's padded ``encode`` of the same
sequences, which runs the same kernels on the same rows: equal bit for bit. Pooling:
``pool`` on the padded layout.
"""

import pytest
import torch

import bertfast
from bertfast.embedder import PACKED_POOLING, pool, pool_packed
from bertfast.ops.parity import END_TO_END_ATOL

from .models import FAMILIES, VOCAB, build, pad_id, save

LENGTHS = (5, 1, 9, 3)


def _sequences(family, lengths=LENGTHS, seed=0):
    """Random ids per sequence (one real token equal to the pad id, which RoBERTa's
    positions skip) and token types where the family has them."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(2, VOCAB, (n,), generator=g) for n in lengths]
    if lengths[0] > 2:
        ids[0][2] = pad_id(family)
    types = None
    if family in ("bert", "albert", "electra"):
        types = [(torch.arange(n) >= n // 2).long() for n in lengths]
    return ids, types


def _padded(family, ids, types):
    B, S = len(ids), max(len(x) for x in ids)
    batch = {
        "input_ids": torch.full((B, S), pad_id(family), dtype=torch.long),
        "attention_mask": torch.zeros(B, S, dtype=torch.long),
    }
    if types is not None:
        batch["token_type_ids"] = torch.zeros(B, S, dtype=torch.long)
    for b, x in enumerate(ids):
        batch["input_ids"][b, : len(x)] = x
        batch["attention_mask"][b, : len(x)] = 1
        if types is not None:
            batch["token_type_ids"][b, : len(x)] = types[b]
    return batch


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(family, transformers model, bertfast model) of one family."""
    family = request.param
    hf = build(family)
    folder = save(hf, str(tmp_path_factory.mktemp(family)))
    return family, hf, bertfast.from_pretrained(folder)


@pytest.mark.parametrize("lengths", [LENGTHS, (7,), (4, 4, 4)], ids=["ragged", "one", "equal"])
def test_encode_packed_matches_transformers_and_padded_encode(pair, lengths):
    family, hf, model = pair
    ids, types = _sequences(family, lengths)
    batch = _padded(family, ids, types)
    with torch.inference_mode():
        expected = hf(**batch).last_hidden_state
        h_pad, info_pad, _ = model.encode(
            batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")
        )
        h, info = model.encode_packed(
            torch.cat(ids), list(lengths), None if types is None else torch.cat(types)
        )
    real = batch["attention_mask"].bool()
    assert h.shape == (sum(lengths), hf.config.hidden_size)
    assert (h - expected[real]).abs().max().item() <= END_TO_END_ATOL
    assert torch.equal(h, h_pad)  # the same kernels on the same rows
    assert torch.equal(info.cu_seqlens, info_pad.cu_seqlens)
    assert info.dense == info_pad.dense and info.max_seqlen == info_pad.max_seqlen
    # the PackInfo places the rows where the padded layout has them
    unpacked = model._unpack(h, info)
    assert torch.equal(unpacked[real], h) and not unpacked[~real].any()


@pytest.mark.parametrize("lengths", [LENGTHS, (7,), (4, 4, 4)], ids=["ragged", "one", "equal"])
@pytest.mark.parametrize("with_types", [True, False], ids=["types", "no-types"])
def test_host_lists_equal_encode_packed(pair, lengths, with_types):
    """``_encode_packed_host`` (the Embedder's: ids as Python lists, checked and laid
    out on the host) gives encode_packed's hidden states and PackInfo, bit for bit,
    RoBERTa's positions (one real token is the pad id) included."""
    family, _, model = pair
    ids, types = _sequences(family, lengths)
    flat = torch.cat(ids)
    flat_types = torch.cat(types) if types is not None and with_types else None
    with torch.inference_mode():
        h, info = model.encode_packed(flat, list(lengths), flat_types)
        h_host, info_host, pooled = model._encode_packed_host(
            flat.tolist(), list(lengths), None if flat_types is None else flat_types.tolist()
        )
    assert pooled is None  # none asked for
    assert torch.equal(h_host, h)
    for field in ("indices", "cu_seqlens"):
        a, b = getattr(info_host, field), getattr(info, field)
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert (info_host.max_seqlen, info_host.batch, info_host.seqlen, info_host.dense) == (
        info.max_seqlen, info.batch, info.seqlen, info.dense,
    )  # fmt: skip


def test_encode_packed_types_default_to_zero(pair):
    family, _, model = pair
    ids, _ = _sequences(family)
    flat = torch.cat(ids)
    with torch.inference_mode():
        h, _ = model.encode_packed(flat, list(LENGTHS))
        h0, _ = model.encode_packed(flat, list(LENGTHS), torch.zeros_like(flat))
    assert torch.equal(h, h0)


def _bert(tmp_path):
    return bertfast.from_pretrained(save(build("bert"), str(tmp_path / "bert")))


@pytest.mark.parametrize(
    "ids, lengths, types, error, match",
    [
        ([[1, 2, 3]], [3], None, ValueError, r"\[total_tokens\]"),
        ([1, 2, 3], [2], None, ValueError, "sum to 2 but input_ids holds 3"),
        ([1, 2, 3], [], None, ValueError, "no sequence"),
        ([1, 2, 3], [3, 0], None, ValueError, "each at least 1"),
        ([1, 2, 3], [True, 2], None, TypeError, "each at least 1"),
        ([1, 2, 3], 3, None, TypeError, "not int"),
        ([1, 2, 3], [1.5, 1.5], None, TypeError, "each at least 1"),
        ([1, 2, VOCAB], [3], None, IndexError, "input_ids contains"),
        ([1, -2, 3], [3], None, IndexError, "input_ids contains -2"),
        ([1, 2, 3], [3], [0, 0], ValueError, "token_type_ids has shape"),
        ([1, 2, 3], [3], [0, 5, 0], IndexError, "token_type_ids contains 5"),
    ],
)
def test_encode_packed_refuses_bad_inputs(tmp_path, ids, lengths, types, error, match):
    model = _bert(tmp_path)
    ids = torch.tensor(ids)
    types = None if types is None else torch.tensor(types)
    with pytest.raises(error, match=match):
        model.encode_packed(ids, lengths, types)


@pytest.mark.parametrize(
    "family, ids, types",
    [
        ("bert", [1, 2, VOCAB], None),
        ("bert", [1, -2, 3], None),
        ("bert", [1, 2, 3], [0, 5, 0]),
        ("bert", [1, 2, 3], [0, -1, 0]),
        ("distilbert", [1, 2, 3], [0, 1, 0]),
        ("roberta", [1, VOCAB + 3, 3], None),
    ],
)
def test_host_lists_refuse_what_encode_packed_refuses(tmp_path, family, ids, types):
    """Each bad value gives the host path the error encode_packed gives, word for word."""
    model = bertfast.from_pretrained(save(build(family), str(tmp_path / family)))
    with pytest.raises((IndexError, ValueError)) as want:
        model.encode_packed(
            torch.tensor(ids), [len(ids)], None if types is None else torch.tensor(types)
        )
    with pytest.raises(type(want.value)) as got:
        model._encode_packed_host(ids, [len(ids)], types)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_host_lists_refuse_a_sequence_past_the_positions(tmp_path, family):
    model = bertfast.from_pretrained(save(build(family), str(tmp_path / family)))
    n = model.config.max_position_embeddings + 1
    with pytest.raises(ValueError) as want:
        model.encode_packed(torch.full((n,), 5), [n])
    with pytest.raises(ValueError) as got:
        model._encode_packed_host([5] * n, [n], None)
    assert str(got.value) == str(want.value) and "position" in str(got.value)


def test_encode_packed_refuses_a_sequence_past_the_positions(tmp_path):
    model = _bert(tmp_path)
    n = model.config.max_position_embeddings + 1
    with pytest.raises(ValueError, match="position"):
        model.encode_packed(torch.ones(n, dtype=torch.long), [n])
    with pytest.raises(TypeError, match="integer ids"):
        model.encode_packed(torch.ones(3), [3])


@pytest.mark.parametrize(
    "modes", [(m,) for m in PACKED_POOLING] + [PACKED_POOLING], ids=lambda m: "+".join(m)
)
@pytest.mark.parametrize("lengths", [LENGTHS, (6,)], ids=["ragged", "one"])
def test_pool_packed_equals_pool_on_the_padded_layout(modes, lengths):
    g = torch.Generator().manual_seed(1)
    T, H = sum(lengths), 16
    h = torch.randn(T, H, generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    B, S = len(lengths), max(lengths)
    padded = torch.zeros(B, S, H)
    mask = torch.zeros(B, S, dtype=torch.long)
    for b, n in enumerate(lengths):
        padded[b, :n] = h[cu[b] : cu[b + 1]]
        mask[b, :n] = 1
    info = bertfast.ops.PackInfo(torch.arange(T), cu, S, B, S, dense=len(set(lengths)) == 1)
    torch.testing.assert_close(pool_packed(h, info, modes), pool(padded, mask, modes))


def test_pool_packed_refuses_padded_only_modes():
    info = bertfast.ops.PackInfo(torch.arange(2), torch.tensor([0, 2], dtype=torch.int32), 2, 1, 2)
    with pytest.raises(ValueError, match="max"):
        pool_packed(torch.zeros(2, 4), info, "max")


def test_pool_packed_propagates_nan():
    info = bertfast.ops.PackInfo(
        torch.arange(3), torch.tensor([0, 2, 3], dtype=torch.int32), 2, 2, 2
    )
    h = torch.zeros(3, 4)
    h[1, 2] = float("nan")
    out = pool_packed(h, info, "mean")
    assert out[0, 2].isnan() and not out[1].isnan().any() and not out[0, :2].isnan().any()


@pytest.mark.parametrize("pooling", [("mean",), ("cls", "max"), ("weightedmean",)])
def test_embed_tokenized_equals_the_padded_batch(tmp_path, pooling):
    """Packed where the model and poolings allow it, padded otherwise: the same
    vectors either way, and ``encode`` returns them."""
    from .tiny_embedder import corpus, make_checkpoint

    emb = bertfast.Embedder.from_pretrained(make_checkpoint(tmp_path))
    emb.pooling = pooling
    emb.dim = emb.model.config.hidden_size * len(pooling)
    texts = corpus(5, min_words=1)
    items = emb.tokenizer.tokenize(texts)
    packs = emb._packs(items)
    assert packs == all(m in PACKED_POOLING for m in pooling)
    expected = emb.embed_batch(emb.tokenizer.collate(items))
    torch.testing.assert_close(emb.embed_tokenized(items), expected, rtol=0, atol=1e-6)
    got = emb.encode(texts, normalize=False, convert_to="torch")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_embed_tokenized_pads_an_empty_text(tmp_path):
    """A tokenised text without a token (a tokenizer that adds no specials) runs
    padded, where it pools to zeros."""
    from .tiny_embedder import make_checkpoint

    emb = bertfast.Embedder.from_pretrained(make_checkpoint(tmp_path))
    items = [([2, 5, 3], [0, 0, 0]), ([], [])]
    assert not emb._packs(items)
    out = emb.embed_tokenized(items)
    assert out.shape == (2, emb.dim) and not out[1].any() and out[0].any()


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize(
    "pooling",
    [("cls",), ("mean",), ("mean_sqrt_len",), ("lasttoken",), ("cls", "mean"), ("max",)],
)
def test_embed_tokenized_pools_natively_where_it_can(tmp_path, monkeypatch, pooling, normalize):
    """One pooling of the four the CPU kernel has (and its normalising) runs in one
    native call on the runner's output (``CpuEncoder.pool``); two poolings, or one it
    has not, pool in torch. Every way gives the padded batch's vectors, normalised
    with ``F.normalize`` where asked, and ``encode`` and the server's ``embed_items``
    return them."""
    from bertfast.ops.cpu.encoder import CpuEncoder
    from bertfast.serving.batcher import embed_items

    from .tiny_embedder import corpus, make_checkpoint

    emb = bertfast.Embedder.from_pretrained(make_checkpoint(tmp_path))
    emb.pooling = pooling
    emb.dim = emb.model.config.hidden_size * len(pooling)
    texts = corpus(5, min_words=1)
    items = emb.tokenizer.tokenize(texts)
    expected = emb.embed_batch(emb.tokenizer.collate(items))
    if normalize:
        expected = torch.nn.functional.normalize(expected, p=2.0, dim=-1)
    native = []
    real = CpuEncoder.pool

    def spy(*a, **k):
        out = real(*a, **k)
        native.append(out is not None)
        return out

    monkeypatch.setattr(CpuEncoder, "pool", spy)
    got = emb.embed_tokenized(items, normalize)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # two poolings: torch pools the packed rows; max: the padded path
    assert native == ([True] if len(pooling) == 1 and pooling[0] in PACKED_POOLING else [])
    enc = emb.encode(texts, normalize=normalize, convert_to="torch")
    torch.testing.assert_close(enc, expected, rtol=0, atol=1e-6)
    served = embed_items(emb, items, [normalize] * len(items))
    torch.testing.assert_close(torch.from_numpy(served), expected, rtol=0, atol=1e-6)
    mixed = embed_items(emb, items, [i % 2 == 0 for i in range(len(items))])
    raw = emb.embed_batch(emb.tokenizer.collate(items))
    for i in range(len(items)):
        want = torch.nn.functional.normalize(raw[i], dim=-1) if i % 2 == 0 else raw[i]
        torch.testing.assert_close(torch.from_numpy(mixed[i]), want, rtol=0, atol=1e-6)
