"""CUDA-graph bucketing (graphs.py): bucket choice, the static path on CPU, and
capture/replay on a GPU (marked ``gpu``).

Reference: the model's padding-free eager path (itself checked against
transformers in test_parity_transformers.py).
"""

import pytest
import torch

import bertfast
from bertfast import graphs

from .models import build, save


def test_bucket_choice():
    assert graphs.bucket(1, 7, 512) == (1, 16)
    assert graphs.bucket(3, 16, 512) == (4, 16)
    assert graphs.bucket(5, 100, 512) == (8, 128)
    assert graphs.bucket(32, 256, 512) == (32, 256)
    assert graphs.bucket(33, 8, 512) is None  # batch beyond the largest bucket
    assert graphs.bucket(32, 512, 512) is None  # over MAX_BUCKET_TOKENS
    assert graphs.bucket(2, 30, 40) == (2, 32)  # capped by the position table...
    assert graphs.bucket(2, 39, 40) == (2, 40)  # ...never below the input


def test_graphs_enabled(monkeypatch):
    assert graphs.graphs_enabled(None, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="needs a CUDA device"):
        graphs.graphs_enabled(True, torch.device("cpu"))
    monkeypatch.setenv("BERTFAST_CUDA_GRAPHS", "0")
    assert graphs.graphs_enabled(True, torch.device("cuda")) is False


@pytest.fixture(scope="module", params=["bert", "roberta", "distilbert"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    save(build(request.param, "sequence_classification"), str(path))
    return path


def _batch(seqlens, vocab=100, pad=0):
    S = max(seqlens)
    ids = torch.randint(5, vocab, (len(seqlens), S))
    mask = (torch.arange(S)[None] < torch.tensor(seqlens)[:, None]).long()
    return ids.masked_fill(mask == 0, pad), mask


def test_static_bucketed_path_matches_eager(folder):
    eager = bertfast.from_pretrained(folder, backend="auto")
    static = bertfast.from_pretrained(folder, backend="auto")
    static.enable_cuda_graphs(True, capture=False)
    pad = 1 if "roberta" in str(folder) else 0
    for seqlens in ([7], [5, 3, 9], [16, 1]):
        ids, mask = _batch(seqlens, pad=pad)
        a = eager(ids, attention_mask=mask)
        b = static(ids, attention_mask=mask)
        real = mask.bool()
        torch.testing.assert_close(
            b.last_hidden_state[real], a.last_hidden_state[real], atol=1e-5, rtol=0
        )
        assert (b.last_hidden_state[~real] == 0).all()
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    # one entry per bucket, reused: (1,16) and (4,16) and (2,16)
    assert static._graphs.captures == len(static._graphs.entries) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_graph_replay_matches_eager_and_does_not_recapture(folder, dtype):
    eager = bertfast.from_pretrained(folder, device="cuda", dtype=dtype, cuda_graphs=False)
    model = bertfast.from_pretrained(folder, device="cuda", dtype=dtype)
    assert model._graphs is not None and model._graphs.capture
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for _ in range(3):
        for seqlens in ([7], [5, 3, 9], [30, 2, 17, 11]):
            ids, mask = _batch(seqlens)
            ids, mask = ids.cuda(), mask.cuda()
            a = eager(ids, attention_mask=mask).last_hidden_state
            b = model(ids, attention_mask=mask).last_hidden_state
            real = mask.bool()
            torch.testing.assert_close(b[real].float(), a[real].float(), atol=tol, rtol=tol)
    assert model._graphs.captures == 3  # steady state: no recapture


@pytest.mark.gpu
def test_cuda_graph_replay_respects_caller_stream(folder):
    model = bertfast.from_pretrained(folder, device="cuda")
    ids, mask = _batch([9, 4])
    ids, mask = ids.cuda(), mask.cuda()
    expected = model(ids, attention_mask=mask).last_hidden_state.clone()
    stream = torch.cuda.Stream()
    busy = torch.randn(4096, 4096, device="cuda")
    with torch.cuda.stream(stream):
        for _ in range(3):
            busy = busy @ busy.T / 4096  # unrelated work on another stream
        got = model(ids, attention_mask=mask).last_hidden_state
    torch.cuda.synchronize()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
