"""CUDA graphs (graphs.py): bucket choice, the padded and packed graph paths on CPU
(``capture=False``: the same static functions, each "replay" recomputing them into
the static outputs), and capture/replay on a GPU (marked ``gpu``).

Reference: the model's eager padding-free path (itself checked against transformers
in test_parity_transformers.py).
"""

from __future__ import annotations

import pytest
import torch

import bertfast
from bertfast import graphs

from .models import MAX_POS, VOCAB, build, make_batch, save
from .test_host_syncs import HostReads

CASES = [
    ("bert", "base"),  # the pooler
    ("bert", "sequence_classification"),
    ("roberta", "sequence_classification"),
    ("albert", "token_classification"),
    ("electra", "sequence_classification"),
    ("distilbert", "token_classification"),
    ("electra", "question_answering"),
    ("bert", "multiple_choice"),
    ("roberta", "masked_lm"),  # a head run after the replay (graphs.EAGER_HEADS)
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    return {
        (family, head): save(build(family, head), str(root / f"{family}-{head}"))
        for family, head in CASES
    }


def _pair(folder, backend="auto"):
    eager = bertfast.from_pretrained(folder, backend=backend)
    model = bertfast.from_pretrained(folder, backend=backend)
    model.enable_cuda_graphs(True, capture=False)
    return eager, model


def _batch(family, lengths, seq_len=None, left=False, seed=0, types=True):
    batch = make_batch(family, lengths=lengths, seq_len=seq_len, seed=seed, with_types=types)
    if left:  # left padding: real tokens at the end of each row
        batch = {k: v.flip(1) for k, v in batch.items()}
    return batch


def _choices(batch, C=2):
    """``[B, S]`` rows as ``[B / C, C, S]`` (B a multiple of C) for multiple choice."""
    return {k: v.view(-1, C, v.shape[-1]) for k, v in batch.items()}


def _assert_same(got, ref, atol=1e-5):
    assert set(got.keys()) == set(ref.keys()), (got.keys(), ref.keys())
    for name in ref.keys():
        a, b = got[name], ref[name]
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape)
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=name)


def _key_kinds(model):
    return [key[0] for key in model._graphs.entries]


# ------------------------------------------------------------------ buckets
def test_bucket_choice():
    assert graphs.bucket(1, 7, 512) == (1, 16)
    assert graphs.bucket(3, 16, 512) == (4, 16)
    assert graphs.bucket(5, 100, 512) == (8, 128)
    assert graphs.bucket(1, 512, 512) == (1, 512)
    assert graphs.bucket(32, 32, 512) == (32, 32)
    assert graphs.bucket(16, 128, 512) is None  # 2048 positions > PADDED_MAX_TOKENS
    assert graphs.bucket(33, 8, 512) is None  # batch beyond the largest bucket
    assert graphs.bucket(1, 513, 1024) is None  # sequence beyond the largest bucket
    assert graphs.bucket(2, 30, 40) == (2, 32)  # capped by the position table...
    assert graphs.bucket(2, 39, 40) == (2, 40)  # ...never below the input
    assert graphs.bucket(2, 41, 40) is None
    for b in graphs.BATCH_BUCKETS:
        for s in graphs.SEQ_BUCKETS:
            got = graphs.bucket(b, s, 512)
            assert got == ((b, s) if b * s <= graphs.PADDED_MAX_TOKENS else None)


def test_packed_bucket_choice():
    tb = graphs.TOKEN_BUCKETS
    assert list(tb) == sorted(set(tb)) and tb[-1] == graphs.MAX_GRAPH_TOKENS
    big = [t for t in tb if t > 256]
    assert all(b / a <= 1.25 for a, b in zip([256] + big, big))  # at most 20% extra rows
    assert graphs.packed_bucket(1, 5) == (1, 16)
    assert graphs.packed_bucket(1, 0) == (1, 16)  # every row empty
    assert graphs.packed_bucket(3, 100) == (4, 128)
    assert graphs.packed_bucket(40, 1112) == (64, 1280)
    assert graphs.packed_bucket(256, graphs.MAX_GRAPH_TOKENS) == (256, graphs.MAX_GRAPH_TOKENS)
    assert graphs.packed_bucket(257, 10) is None
    assert graphs.packed_bucket(10, graphs.MAX_GRAPH_TOKENS + 1) is None
    # the static max_seqlen bounds any real row (the position table) and the extra rows
    assert graphs.packed_max_seqlen(16, 512) == 16
    assert graphs.packed_max_seqlen(4096, 512) == 512
    assert graphs.packed_max_seqlen(4096, 40) == graphs.DUMMY_ROWS


def test_graphs_enabled(monkeypatch):
    assert graphs.graphs_enabled(None, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="needs a CUDA device"):
        graphs.graphs_enabled(True, torch.device("cpu"))
    monkeypatch.setenv("BERTFAST_CUDA_GRAPHS", "0")
    assert graphs.graphs_enabled(True, torch.device("cuda")) is False


def test_token_fields_match_the_heads():
    assert "logits" not in graphs.token_fields("sequence_classification")
    assert "logits" in graphs.token_fields("token_classification")
    assert {"start_logits", "end_logits"} <= graphs.token_fields("question_answering")
    assert "prediction_logits" in graphs.token_fields("pretraining")


# ------------------------------------------------------------------ parity
@pytest.mark.parametrize("family,head", CASES)
def test_padded_and_packed_graphs_match_eager(folders, family, head):
    """Every output field equals the eager path's: right and left padding, an empty
    row, no padding, with and without token types, through the padded graph (small
    batches) and the packed graph (a batch over PADDED_MAX_TOKENS positions)."""
    eager, model = _pair(folders[(family, head)])
    mc = head == "multiple_choice"
    batches = [
        _batch(family, (7, 3, 9, 1)),
        _batch(family, (5, 12, 0, 8), left=True, seed=1),
        _batch(family, (6, 6), seed=2),  # no padding
        _batch(family, (4, 11), seed=3, types=False),
        _batch(family, [31, 9, 1, 20] * 10, seq_len=32, seed=4),  # 40 x 32: packed
        _batch(family, [32] * 36, seed=5),  # 36 x 32, no padding: packed, dense
    ]
    for batch in batches:
        if mc:
            batch = _choices(batch)
        _assert_same(model(**batch), eager(**batch))
    # a mask-less call, and positions given
    ids = _batch(family, (10, 10), seed=6)["input_ids"]
    pos = torch.arange(10).flip(0) if family not in ("roberta",) else torch.arange(2, 12)
    for kw in ({}, {"position_ids": pos}):
        x = _choices({"input_ids": ids})["input_ids"] if mc else ids
        _assert_same(model(x, **kw), eager(x, **kw))
    kinds = _key_kinds(model)
    assert "padded" in kinds and "packed" in kinds, model._graphs.entries.keys()


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_backends(folders, backend):
    eager, model = _pair(folders[("bert", "sequence_classification")], backend)
    for batch in (_batch("bert", (5, 2, 8)), _batch("bert", [30, 3] * 20, seq_len=32)):
        _assert_same(model(**batch), eager(**batch))


def test_successive_calls_in_one_bucket_do_not_leak(folders):
    """A smaller call after a bigger one in the same bucket (stale ids, mask and
    lengths beyond the new corner must not count), and results that stay distinct
    and correct after the next replay overwrote the static outputs."""
    for family, head in [("bert", "sequence_classification"), ("roberta", "masked_lm")]:
        eager, model = _pair(folders[(family, head)])
        big = _batch(family, (16, 16, 16, 16), seed=1)  # padded bucket (4, 16), full
        small = _batch(family, (9, 2, 5), seed=2)  # same bucket, smaller corner
        left = _batch(family, (3, 7), seed=3, left=True)
        many = _batch(family, [32] * 64, seed=4)  # packed (64, 2048), 64 rows
        # same bucket, 50 rows: the 14 stale rows' lengths would end cu_seqlens past
        # the bucket's 2048 rows
        fewer = _batch(family, [37] * 50, seq_len=MAX_POS, seed=5)
        outs = [(b, model(**b)) for b in (big, small, left, big, many, fewer, many, fewer)]
        assert len(model._graphs.entries) == 3
        for b, out in outs:  # every result checked after all the replays
            _assert_same(out, eager(**b))
        # the full bucket (B == b, S == s): outputs are copies, not the buffers
        a, b = model(**big), model(**small)
        assert a.last_hidden_state.data_ptr() != b.last_hidden_state.data_ptr()
        _assert_same(a, eager(**big))


def _static_pointers(model):
    ptrs = set()
    for entry in model._graphs.entries.values():
        for t in list(vars(entry).values()) + list(entry.out.values()):
            if isinstance(t, torch.Tensor):
                ptrs.add(t.untyped_storage().data_ptr())
    return ptrs


def test_results_never_alias_static_buffers(folders):
    eager, model = _pair(folders[("bert", "multiple_choice")])
    for batch in (
        _choices(_batch("bert", [16] * 4)),  # padded (4, 16), exactly full
        _choices(_batch("bert", [16] * 64)),  # packed (64, 1024), exactly full
    ):
        out = model(**batch)
        for name, t in out.items():
            assert t.untyped_storage().data_ptr() not in _static_pointers(model), name
            assert t.is_contiguous(), name
        h, info, _ = model.encode(**{k: v.view(-1, v.shape[-1]) for k, v in batch.items()})
        assert h.untyped_storage().data_ptr() not in _static_pointers(model)


def test_packed_bucket_and_dummy_rows(folders):
    """A batch over PADDED_MAX_TOKENS positions runs in the packed graph of its (batch,
    real-token) bucket; the bucket's unused rows are extra sequences (cu_seqlens)."""
    eager, model = _pair(folders[("bert", "sequence_classification")])
    lengths = [31, 9, 1, 20, 0] * 8  # 40 rows, 488 real tokens of 1280 positions
    batch = _batch("bert", lengths, seq_len=32)
    _assert_same(model(**batch), eager(**batch))
    assert list(model._graphs.entries) == [("packed", 64, 512)]
    entry = model._graphs.entries[("packed", 64, 512)]
    assert entry.lengths.tolist() == lengths + [0] * 24
    # bounds any real row (the position table) and the extra sequences
    assert entry.max_seqlen == max(MAX_POS, graphs.DUMMY_ROWS)
    # Embedder's path (encode): the packed graph even for a small batch
    small = _batch("bert", (5, 3))
    h, info, states = model.encode(**small)
    h_ref, info_ref, _ = eager.encode(**small)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=0)
    assert states is None and info.total_tokens == 8
    assert ("packed", 4, 16) in model._graphs.entries


def test_graph_cache_drops_the_least_recently_used(folders, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    eager, model = _pair(folders[("bert", "sequence_classification")])
    batches = [_batch("bert", (5,)), _batch("bert", (5, 3)), _batch("bert", (20, 3))]
    for batch in batches + batches[:1]:
        _assert_same(model(**batch), eager(**batch))
    cache = model._graphs
    assert cache.captures == 4 and len(cache.entries) == 2  # the first one recaptured
    assert cache.static_bytes == sum(e.nbytes for e in cache.entries.values())


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_bad_values_raise_after_the_replay(folders, backend):
    """The graph computes on bad ids (clamped: the torch backend's embedding would
    fail on them) and the forward raises the eager path's error; no result comes
    back, and the next call in the bucket is right (the buffers were reset)."""
    eager, model = _pair(folders[("bert", "sequence_classification")], backend)
    good = _batch("bert", (3, 9, 5))  # the bad batches' bucket, a smaller corner

    def bad(edit):
        batch = _batch("bert", (4, 9, 2, 9), seed=1)
        edit(batch)
        return batch

    cases = [
        (bad(lambda b: b["input_ids"].__setitem__((1, 3), VOCAB)), IndexError,
         rf"input_ids contains {VOCAB}, outside \[0, {VOCAB}\) \(vocabulary size\)"),
        (bad(lambda b: b["input_ids"].__setitem__((3, 8), -5)), IndexError,
         "input_ids contains -5"),
        (bad(lambda b: b["token_type_ids"].__setitem__((0, 0), 2)), IndexError,
         r"token_type_ids contains 2, outside \[0, 2\)"),
        (dict(bad(lambda b: None), position_ids=torch.arange(9) + MAX_POS - 8), IndexError,
         f"position_ids contains {MAX_POS}"),
    ]  # fmt: skip
    for batch, exc, text in cases:
        with pytest.raises(exc, match=text):
            eager(**batch)
        with pytest.raises(exc, match=text):
            model(**batch)
        _assert_same(model(**good), eager(**good))
    # the same through the packed graph (its one read comes before the replay)
    many = _batch("bert", [30, 7] * 20, seq_len=32)
    many["input_ids"][17, 31] = VOCAB + 3
    with pytest.raises(IndexError, match=f"input_ids contains {VOCAB + 3}"):
        model(**many)


def test_family_specific_value_checks(folders):
    # RoBERTa: positions start at pad + 1, so 39 tokens need position 40 (of 40)
    eager, model = _pair(folders[("roberta", "sequence_classification")])
    ids = torch.randint(2, VOCAB, (1, MAX_POS - 1))
    for m in (eager, model):
        with pytest.raises(ValueError, match="at most 38 tokens"):
            m(ids)
    assert ("padded", 1, MAX_POS, False, False, False) in model._graphs.entries
    ok = ids[:, :-1]
    _assert_same(model(ok), eager(ok))
    # ...counted over the batch only: a padded row of pad ids is not counted
    batch = _batch("roberta", (MAX_POS - 2, 4))
    _assert_same(model(**batch), eager(**batch))
    # ...nor a stale row of an earlier call (33 ids, then zeros: not the pad id)
    full = _batch("roberta", (33,) * 4, seed=1)
    short = _batch("roberta", (10, 5, 20), seq_len=MAX_POS - 1, seed=2)  # bucket (4, 40)
    for batch in (full, short):
        _assert_same(model(**batch), eager(**batch))
    # DistilBERT has no token types: nonzero ones are refused, zeros are fine
    eager, model = _pair(folders[("distilbert", "token_classification")])
    batch = _batch("distilbert", (6, 2))
    for m in (eager, model):
        with pytest.raises(ValueError, match="no token type embeddings"):
            m(**batch, token_type_ids=batch["attention_mask"])
    zeros = torch.zeros_like(batch["input_ids"])
    _assert_same(model(**batch, token_type_ids=zeros), eager(**batch))


def test_metadata_errors_come_first(folders):
    _, model = _pair(folders[("bert", "sequence_classification")])
    x = torch.randint(2, VOCAB, (2, 5))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\)"):
        model(x, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="token_type_ids must hold integer ids"):
        model(x, token_type_ids=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="empty batch"):
        model(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="max_position_embeddings is 40"):
        model(torch.randint(2, VOCAB, (1, MAX_POS + 1)))
    assert model._graphs.entries == {}  # nothing was captured for them


# ------------------------------------------------------------------ host reads
def _reads_around_replay(model, batch, monkeypatch):
    """(reads before the replay, reads in all) of one forward."""
    model(**batch)  # capture
    seen = {}
    with HostReads(monkeypatch) as c:
        for entry in model._graphs.entries.values():
            replay = entry.graph.replay

            def marked(replay=replay):
                seen.setdefault("before", list(c.reads))
                replay()

            monkeypatch.setattr(entry.graph, "replay", marked)
        model(**batch)
    return seen["before"], c.reads


def test_padded_replay_reads_nothing_before_the_replay(folders, monkeypatch):
    """A small batch: no device-to-host read before the replay; one after it (the
    value checks, which waits for the replay)."""
    _, model = _pair(folders[("roberta", "sequence_classification")])
    for batch in (_batch("roberta", (9, 4, 0, 7)), {"input_ids": torch.full((1, 12), 5)}):
        before, reads = _reads_around_replay(model, batch, monkeypatch)
        assert before == [] and reads == ["tolist"], (before, reads)


def test_packed_replay_reads_once_before_the_replay(folders, monkeypatch):
    _, model = _pair(folders[("bert", "sequence_classification")])
    batch = _batch("bert", [30, 7] * 20, seq_len=32)
    before, reads = _reads_around_replay(model, batch, monkeypatch)
    assert before == reads == ["tolist"], (before, reads)


# ------------------------------------------------------------------ on a GPU
def _cuda_batch(batch):
    return {k: v.cuda() for k, v in batch.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("family,head", CASES)
def test_cuda_graph_replay_matches_eager_and_does_not_recapture(folders, family, head, dtype):
    folder = folders[(family, head)]
    eager = bertfast.from_pretrained(folder, device="cuda", dtype=dtype, cuda_graphs=False)
    model = bertfast.from_pretrained(folder, device="cuda", dtype=dtype)
    assert model._graphs is not None and model._graphs.capture
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    mc = head == "multiple_choice"  # rows in pairs: [B / 2, 2, S]
    batches = [
        _batch(family, (7, 4) if mc else (7,)),
        _batch(family, (5, 3, 9, 1)),
        _batch(family, (30, 2, 17, 11), left=True),
        _batch(family, [31, 9, 1, 20] * 10, seq_len=32),  # packed
    ]
    if mc:
        batches = [_choices(b) for b in batches]
    for _ in range(3):
        for batch in batches:
            batch = _cuda_batch(batch)
            _assert_same(model(**batch), eager(**batch), atol=tol)
    assert model._graphs.captures == len(batches)  # steady state: no recapture


@pytest.mark.gpu
def test_cuda_results_do_not_alias_and_bad_ids_leave_the_device_usable(folders):
    folder = folders[("bert", "sequence_classification")]
    eager = bertfast.from_pretrained(folder, device="cuda", cuda_graphs=False)
    model = bertfast.from_pretrained(folder, device="cuda", backend="torch")
    a, b = _cuda_batch(_batch("bert", (16,) * 4)), _cuda_batch(_batch("bert", (9, 2), seed=1))
    out_a, out_b = model(**a), model(**b)
    _assert_same(out_a, eager(**a))
    _assert_same(out_b, eager(**b))
    bad = _cuda_batch(_batch("bert", (5, 3)))
    bad["input_ids"][0, 1] = VOCAB  # the torch backend's embedding would assert on it
    with pytest.raises(IndexError, match=f"input_ids contains {VOCAB}"):
        model(**bad)
    torch.cuda.synchronize()  # no device-side assert happened
    _assert_same(model(**b), eager(**b))


@pytest.mark.gpu
def test_cuda_graph_replay_respects_caller_stream(folders):
    model = bertfast.from_pretrained(folders[("bert", "sequence_classification")], device="cuda")
    for batch in (_batch("bert", (9, 4)), _batch("bert", [30, 7] * 20, seq_len=32)):
        batch = _cuda_batch(batch)
        expected = model(**batch).last_hidden_state.clone()
        stream = torch.cuda.Stream()
        busy = torch.randn(4096, 4096, device="cuda")
        with torch.cuda.stream(stream):
            for _ in range(3):
                busy = busy @ busy.T / 4096  # unrelated work on another stream
            got = model(**batch).last_hidden_state
        torch.cuda.synchronize()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_cuda_padded_replay_syncs_once_after_the_replay(folders, monkeypatch):
    """CUDA's sync detector: one synchronizing call per forward, none before the
    replay (the value checks' read comes after it)."""
    import warnings

    model = bertfast.from_pretrained(folders[("bert", "sequence_classification")], device="cuda")
    batch = _cuda_batch(_batch("bert", (9, 4, 0, 7)))
    model(**batch)
    torch.cuda.synchronize()
    (entry,) = model._graphs.entries.values()
    marks = []
    replay = entry.graph.replay
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def marked():
            marks.append(sum("called a synchronizing" in str(w.message) for w in caught))
            replay()

        monkeypatch.setattr(entry.graph, "replay", marked)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model(**batch)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    assert marks == [0] and len(syncs) == 1, (marks, syncs)


def test_input_dtypes(folders):
    """Ids of any integer dtype and masks of any real dtype: the copy into the static
    buffers converts (the mask to the kernels' bool form, nonzero = real)."""
    eager, model = _pair(folders[("bert", "sequence_classification")])
    batch = _batch("bert", (7, 3, 5))
    for ids, mask in [
        (batch["input_ids"].int(), batch["attention_mask"].float() * 0.5),
        (batch["input_ids"].to(torch.int16), batch["attention_mask"].bool()),
        (batch["input_ids"], batch["attention_mask"].to(torch.uint8)),
    ]:
        types = batch["token_type_ids"].int()
        got = model(ids, attention_mask=mask, token_type_ids=types)
        _assert_same(got, eager(ids, attention_mask=mask, token_type_ids=types))


def test_first_call_in_inference_mode(folders):
    """Static buffers made under ``torch.inference_mode`` (Embedder's first call) are
    still written by later calls outside it."""
    eager, model = _pair(folders[("bert", "sequence_classification")])
    small, large = _batch("bert", (6, 2)), _batch("bert", [30, 7] * 20, seq_len=32)
    with torch.inference_mode():
        model(**small), model(**large), model.encode(**small)
    for batch in (small, large):
        _assert_same(model(**batch), eager(**batch))
    torch.testing.assert_close(model.encode(**small)[0], eager.encode(**small)[0])
