"""The embedded HTTP embedding server (``bertfast serve``, bertfast.serving) over real
HTTP on 127.0.0.1.

Servers run in this process (uvicorn in a background thread, on a socket bound to a free
port before it starts, so the first request simply waits in the backlog), except one
test that runs ``python -m bertfast serve`` and stops it with SIGTERM. The reference is
:meth:`bertfast.Embedder.encode` of the same texts by a second Embedder of the same
tiny checkpoint (tests/tiny_embedder.py, ``micro``), never the server's own.

Where a test needs the model to be busy (queue full, timeout, shutdown with requests in
flight) it holds the batcher's ``model_lock``, which the model thread takes around each
round, and waits for the state it needs (``Batcher.running`` / ``waiting``) instead of
sleeping.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from bertfast import cli
from bertfast.embedder import Embedder
from bertfast.serving import batcher as batching
from bertfast.serving import protocol
from bertfast.serving.app import Settings, address, bind, create_app, make_server
from bertfast.serving.protocol import Limits

from . import tiny_embedder

LIMIT = 64  # the micro checkpoint's token limit (its position table)
KEY = "s3cret-key"
ATOL = 1e-5


# ---------------------------------------------------------------- helpers
@dataclass
class Reply:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def message(self) -> str:
        error = self.json()["error"]
        return error["message"] if isinstance(error, dict) else error


def call(base, path, body=None, *, raw=None, method=None, key=None, timeout=60) -> Reply:
    """One HTTP request with urllib (a new connection each time)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, dict(exc.headers), exc.read())


def wait_until(condition, what: str, timeout: float = 30.0) -> None:
    """Wait for ``condition()`` (a state of the server), checking every 10 ms."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        pause.wait(0.01)


@dataclass
class Running:
    base: str
    app: object  # the EmbeddingServer
    uvicorn: object


@contextlib.contextmanager
def running(embedder, **overrides):
    """An embedded server on 127.0.0.1:<free port> in a background thread."""
    settings = Settings(**{"model_name": "tiny", "batch_wait_ms": 20.0, **overrides})
    app = create_app(embedder, settings)
    sock = bind("127.0.0.1", 0)
    server = make_server(app, settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield Running(address(sock), app.state.server, server)
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
    assert not thread.is_alive(), "the server did not stop"
    assert not app.state.server.batcher._thread.is_alive(), "the model thread did not stop"


def metric(base, name: str, key=None, **labels) -> float:
    """The value of one sample of ``/metrics`` (0 when the series does not exist yet)."""
    text = call(base, "/metrics", key=key).body.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def reference(micro):
    return Embedder.from_pretrained(micro)


@pytest.fixture(scope="module")
def server_embedder(micro):
    return Embedder.from_pretrained(micro)


@pytest.fixture(scope="module")
def server(server_embedder):
    with running(server_embedder) as handle:
        yield handle


@pytest.fixture(scope="module")
def strict(server_embedder):
    """Small limits and an API key."""
    limits = Limits(max_client_batch_size=4, max_input_chars=1000, max_body_bytes=64 * 1024)
    with running(server_embedder, limits=limits, api_key=KEY) as handle:
        yield handle


def long_text(words: int) -> str:
    return " ".join(tiny_embedder.WORDS[i % 30] for i in range(words))


# ---------------------------------------------------------------- every route
def test_embed_route_matches_encode(server, reference):
    texts = ["the cat sat on the mat", "hello world", "a quick brown fox jumped"]
    reply = call(server.base, "/embed", {"inputs": texts})
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    np.testing.assert_allclose(reply.json(), reference.encode(texts, normalize=True), atol=ATOL)
    # one string, normalize false
    reply = call(server.base, "/embed", {"inputs": texts[1], "normalize": False})
    np.testing.assert_allclose(
        reply.json(), reference.encode([texts[1]], normalize=False), atol=ATOL
    )


def test_openai_route_matches_encode(server, reference):
    texts = ["the quick brown fox", "a lazy dog"]
    expect = reference.encode(texts, normalize=True)
    reply = call(server.base, "/v1/embeddings", {"input": texts, "model": "mine"})
    body = reply.json()
    assert reply.status == 200 and body["object"] == "list" and body["model"] == "mine"
    assert [d["index"] for d in body["data"]] == [0, 1]
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], expect, atol=ATOL)
    tokens = sum(len(ids) for ids, _ in reference.tokenizer.tokenize(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    body = call(
        server.base,
        "/v1/embeddings",
        {"input": texts[0], "encoding_format": "base64", "dimensions": reference.dim},
    ).json()
    assert body["model"] == "tiny"  # the server's name when the request names none
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, expect[0], atol=ATOL)


def test_get_routes(server, reference):
    assert call(server.base, "/health").json() == {"status": "ok"}
    info = call(server.base, "/info").json()
    import bertfast

    assert info["model"] == "tiny" and info["dim"] == reference.dim
    assert info["max_input_tokens"] == LIMIT and info["dtype"] == "float32"
    assert info["bertfast_version"] == bertfast.__version__ and info["server"] == "embedded"
    assert info["max_batch_size"] == 32 and info["max_batch_tokens"] == 16384
    assert info["batch_wait_ms"] == 20.0 and info["max_client_batch_size"] == 32
    assert info["api_key"] is False
    stats = call(server.base, "/stats").json()
    assert {"batches", "requests", "texts", "tokens", "queue_texts", "rss_bytes"} <= set(stats)
    reply = call(server.base, "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(reply.body.decode())}
    assert {
        "bertfast_requests",
        "bertfast_request_duration_seconds",
        "bertfast_batch_texts",
        "bertfast_batch_tokens",
        "bertfast_queue_texts",
        "bertfast_tokens",
    } <= names


def test_model_name_defaults_to_the_checkpoint_folder(micro):
    from bertfast.serving.protocol import model_name

    assert model_name(micro) == Path(micro).name
    assert model_name("/c/models--BAAI--bge-small-en/snapshots/0a1b2c") == "BAAI/bge-small-en"


# ---------------------------------------------------------------- truncation
def test_truncation_on_every_route(micro, tmp_path, reference):
    text = long_text(200)  # ~200 tokens, over the limit of 64
    # a copy of the checkpoint with a default prompt, which the server must prepend too
    folder = tmp_path / "prompted"
    shutil.copytree(micro, folder)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"})
    )
    prompted = Embedder.from_pretrained(folder)
    expect = Embedder.from_pretrained(folder).encode([text, "a cat"], normalize=True)
    assert not np.allclose(expect[1], reference.encode("a cat", normalize=True), atol=1e-3)
    with running(prompted, auto_truncate=True) as s:
        reply = call(s.base, "/v1/embeddings", {"input": [text, "a cat"]})
        assert reply.status == 200
        got = [d["embedding"] for d in reply.json()["data"]]
        np.testing.assert_allclose(got, expect, atol=ATOL)
        np.testing.assert_allclose(
            call(s.base, "/embed", {"inputs": [text, "a cat"]}).json(), expect, atol=ATOL
        )
        # a TEI request may still refuse truncation
        reply = call(s.base, "/embed", {"inputs": ["ok", text], "truncate": False})
        assert reply.status == 413 and "'inputs[1]'" in reply.message


def test_truncation_asked_per_request(server, reference):
    text = long_text(200)
    reply = call(server.base, "/embed", {"inputs": [text], "truncate": True})
    assert reply.status == 200
    np.testing.assert_allclose(reply.json(), reference.encode([text], normalize=True), atol=ATOL)
    # without it: 413 naming the text, suggesting what this route offers
    reply = call(server.base, "/embed", {"inputs": ["fine", text]})
    assert reply.status == 413
    assert "'inputs[1]' has 202 tokens, more than the limit of 64" in reply.message
    assert '"truncate": true' in reply.message
    # the OpenAI route has no such field: its message does not offer one
    reply = call(server.base, "/v1/embeddings", {"input": [text]})
    assert reply.status == 400 and "'input[0]'" in reply.message
    assert 'truncate"' not in reply.message and "--auto-truncate" in reply.message


def test_five_megabyte_text_with_truncation(server, reference):
    text = long_text(1_250_000)  # 5.1 MB
    assert len(text) > 5_000_000
    with ThreadPoolExecutor(2) as pool:
        big = pool.submit(call, server.base, "/embed", {"inputs": [text], "truncate": True})
        small = pool.submit(call, server.base, "/embed", {"inputs": ["a cat"]})
        assert small.result().status == 200
        reply = big.result()
    assert reply.status == 200
    np.testing.assert_allclose(reply.json(), reference.encode([text], normalize=True), atol=ATOL)
    # without truncation the same text is refused, named, after counting only its start
    reply = call(server.base, "/embed", {"inputs": [text]})
    assert reply.status == 413 and "'inputs[0]' has more than 64 tokens" in reply.message


# ---------------------------------------------------------------- bad requests
NESTED = b"[" * 50_000
SURROGATE = b'{"inputs": ["fine", "bad \\ud800 text"]}'


@pytest.mark.parametrize(
    "path,body,raw,status,words",
    [
        ("/embed", None, b"{not json", 400, "not JSON"),
        ("/embed", None, NESTED, 400, "nested too deeply"),
        ("/v1/embeddings", None, NESTED, 400, "nested too deeply"),
        ("/embed", None, b"\xff\xfe\xfd", 400, "not JSON"),
        ("/embed", [1, 2], None, 422, "a JSON object with 'inputs'"),
        ("/embed", {"inputs": 3}, None, 422, "'inputs' must be a string or a list"),
        ("/embed", {"inputs": ["ok", 3]}, None, 422, "'inputs[1]' must be a string, not a number"),
        ("/embed", {"inputs": [None]}, None, 422, "must be a string, not null"),
        ("/embed", {"inputs": "a", "normalize": "yes"}, None, 422, "'normalize' must be true"),
        ("/embed", {"inputs": []}, None, 400, "empty list"),
        ("/embed", {"inputs": ["a"] * 33}, None, 413, "33 texts, more than the batch limit of 32"),
        ("/embed", None, SURROGATE, 422, "'inputs[1]' holds a lone surrogate (U+D800"),
        ("/v1/embeddings", {"input": []}, None, 400, "empty list"),
        ("/v1/embeddings", {"input": ["ok", {"a": 1}]}, None, 400, "'input[1]' must be a str"),
        ("/v1/embeddings", {"input": ["a"] * 33}, None, 400, "batch limit of 32"),
        ("/v1/embeddings", {"input": [[1, 2, 3]]}, None, 400, "token ids"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "hex"}, None, 400, "'float'"),
        ("/v1/embeddings", {"input": "a", "dimensions": 7}, None, 400, "'dimensions' must be 32"),
        ("/nowhere", {"inputs": ["a"]}, None, 404, "no endpoint /nowhere"),
    ],
)
def test_bad_requests_get_4xx(server, path, body, raw, status, words):
    reply = call(server.base, path, body, raw=raw, method="POST")
    assert reply.status == status, reply.body
    assert words in reply.message, reply.message
    if path == "/v1/embeddings":
        assert reply.json()["error"]["type"] == "invalid_request_error"
    else:
        assert reply.json()["error_type"]
    assert call(server.base, "/embed", {"inputs": ["still alive"]}).status == 200


def test_wrong_method_and_route(server):
    reply = call(server.base, "/embed", method="GET")
    assert reply.status == 405 and reply.message == "/embed takes POST, not GET"
    assert reply.headers["allow"] == "POST"
    assert call(server.base, "/health", {"x": 1}, method="POST").status == 405
    reply = call(server.base, "/v2/whatever", method="GET")
    assert reply.status == 404 and "POST /embed" in reply.message
    assert metric(server.base, "bertfast_requests_total", route="other", status="404") >= 1


def test_limits(strict):
    base = strict.base
    reply = call(base, "/embed", {"inputs": ["a"] * 5}, key=KEY)
    assert reply.status == 413 and "batch limit of 4" in reply.message
    reply = call(base, "/embed", {"inputs": ["ok", "x" * 1001]}, key=KEY)
    assert reply.status == 413
    assert "'inputs[1]' has 1,001 characters, more than this server's limit of 1,000" in (
        reply.message
    )
    raw = json.dumps({"inputs": ["cat " * 20_000]}).encode()  # 80 kB > 64 KiB
    for path in ("/embed", "/v1/embeddings"):  # the size cap is 413 on both routes
        reply = call(base, path, raw=raw, key=KEY)
        assert reply.status == 413 and "larger than this server's limit of 65,536" in (
            reply.message
        )
    assert call(base, "/embed", {"inputs": ["ok"]}, key=KEY).status == 200


def test_api_key(strict, reference):
    base = strict.base
    for key in (None, "wrong", KEY + "x", ""):
        for path in ("/embed", "/v1/embeddings"):
            reply = call(base, path, {"inputs": ["a"], "input": ["a"]}, key=key)
            assert reply.status == 401, (path, key)
            assert "Authorization: Bearer" in reply.message
            assert reply.headers["www-authenticate"].startswith("Bearer")
        for path in ("/info", "/stats", "/metrics"):
            assert call(base, path, key=key).status == 401, (path, key)
    assert call(base, "/health").status == 200  # stays open for probes
    reply = call(base, "/embed", {"inputs": ["a cat"]}, key=KEY)
    assert reply.status == 200
    np.testing.assert_allclose(reply.json(), reference.encode(["a cat"], normalize=True), atol=ATOL)
    assert call(base, "/info", key=KEY).json()["api_key"] is True
    assert call(base, "/metrics", key=KEY).status == 200


# ---------------------------------------------------------------- load
def test_32_concurrent_clients(server, reference):
    texts = tiny_embedder.corpus(320, seed=5)
    requests = [[t] if i % 4 else [t, texts[(i + 7) % 320]] for i, t in enumerate(texts)]
    before = call(server.base, "/stats").json()
    ok_before = metric(server.base, "bertfast_requests_total", route="/embed", status="200")

    def one(inputs):
        return call(server.base, "/embed", {"inputs": inputs})

    with ThreadPoolExecutor(32) as pool:
        replies = list(pool.map(one, requests))
    assert [r.status for r in replies] == [200] * len(requests)
    for inputs, reply in zip(requests, replies):
        np.testing.assert_allclose(
            reply.json(), reference.encode(inputs, normalize=True), atol=ATOL
        )
    after = call(server.base, "/stats").json()
    assert after["requests"] - before["requests"] == len(requests)
    assert after["texts"] - before["texts"] == sum(map(len, requests))
    assert after["max_requests_per_batch"] > 1  # concurrent requests shared model batches
    assert after["max_texts_per_batch"] <= 32
    ok = metric(server.base, "bertfast_requests_total", route="/embed", status="200")
    assert ok - ok_before == len(requests)
    assert metric(server.base, "bertfast_batch_texts_count") == after["batches"]


def _post_in_thread(pool, base, inputs):
    return pool.submit(call, base, "/embed", {"inputs": inputs})


def test_queue_full_gets_429(server_embedder, reference):
    with running(server_embedder, max_queue=2, batch_wait_ms=0.0) as s:
        batcher = s.app.batcher
        with ThreadPoolExecutor(4) as pool:
            with batcher.model_lock:  # the model thread stops before its next round
                first = _post_in_thread(pool, s.base, ["the first"])
                wait_until(lambda: batcher.running == 1, "the first request is in a round")
                queued = [_post_in_thread(pool, s.base, [t]) for t in ("second", "third")]
                wait_until(lambda: batcher.waiting == 2, "two texts wait")
                reply = call(s.base, "/embed", {"inputs": ["refused"]})
                assert reply.status == 429 and reply.headers["retry-after"] == "1"
                assert "busy (2 texts are waiting, its queue holds 2)" in reply.message
                reply = call(s.base, "/v1/embeddings", {"input": "refused"})
                assert reply.status == 429
                assert reply.json()["error"]["type"] == "rate_limit_error"
            done = [first.result()] + [f.result() for f in queued]
        assert [r.status for r in done] == [200, 200, 200]
        for reply, text in zip(done, ("the first", "second", "third")):
            np.testing.assert_allclose(
                reply.json(), reference.encode([text], normalize=True), atol=ATOL
            )
        assert metric(s.base, "bertfast_requests_total", route="/embed", status="429") == 1


def test_request_timeout(server_embedder, reference):
    with running(server_embedder, request_timeout_s=0.5, batch_wait_ms=0.0) as s:
        batcher = s.app.batcher
        with ThreadPoolExecutor(2) as pool:
            with batcher.model_lock:
                running_one = _post_in_thread(pool, s.base, ["in a round"])
                wait_until(lambda: batcher.running == 1, "a request is in a round")
                queued = _post_in_thread(pool, s.base, ["queued"])
                for reply in (running_one.result(), queued.result()):
                    assert reply.status == 504
                    assert "request timeout of 0.5 s" in reply.message
                assert batcher.waiting == 0  # the queued one left the queue
        # the round that was running completes; the server goes on
        wait_until(lambda: batcher.stats.as_dict()["batches"] == 1, "the round completes")
        reply = call(s.base, "/embed", {"inputs": ["after"]})
        assert reply.status == 200
        np.testing.assert_allclose(
            reply.json(), reference.encode(["after"], normalize=True), atol=ATOL
        )
        assert batcher.stats.as_dict()["requests"] == 2  # the queued one never ran


def test_shutdown_finishes_requests_in_flight(server_embedder, reference):
    with running(server_embedder, batch_wait_ms=0.0) as s:
        batcher = s.app.batcher
        host, port = s.base.removeprefix("http://").split(":")
        with ThreadPoolExecutor(3) as pool:
            with batcher.model_lock:
                first = _post_in_thread(pool, s.base, ["in a round"])
                wait_until(lambda: batcher.running == 1, "a request is in a round")
                second = _post_in_thread(pool, s.base, ["queued", "two"])
                wait_until(lambda: batcher.waiting == 2, "a request waits")
                s.uvicorn.should_exit = True  # what SIGTERM does

                def refused():
                    with socket.socket() as probe:
                        return probe.connect_ex((host, int(port))) != 0

                wait_until(refused, "the server stops accepting connections")
            replies = [first.result(), second.result()]
        assert [r.status for r in replies] == [200, 200]
        np.testing.assert_allclose(
            replies[1].json(), reference.encode(["queued", "two"], normalize=True), atol=ATOL
        )


# ---------------------------------------------------------------- answer bodies
def _vectors_of(route: str, body: bytes) -> np.ndarray:
    value = json.loads(body)  # the standard library's parser, not the writer's
    rows = value if route == protocol.TEI else [d["embedding"] for d in value["data"]]
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "json"])
@pytest.mark.parametrize("route", [protocol.TEI, protocol.OPENAI])
def test_answers_carry_the_exact_float32_values(route, fast, monkeypatch):
    if fast:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(protocol, "_orjson", None)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3, 40)).astype(np.float32)
    vectors[0, :4] = [1e-38, -3.4e38, 1e-45, 0.1]  # tiny, huge, subnormal, inexact
    key = "inputs" if route == protocol.TEI else "input"
    request = protocol.parse_embed(
        route, json.dumps({key: ["a", "b", "c"]}).encode(), Limits(), dim=40, auto_truncate=False
    )
    body = protocol.embed_response(request, vectors, 7, "m")
    got = _vectors_of(route, body)
    # each number reads back as the float32 it was, bit for bit
    assert np.array_equal(got.astype(np.float32), vectors)
    if fast:  # the shortest text for a float32: it need not equal the float64 widening
        assert body.count(b"0.1,") + body.count(b"0.1]") >= 1


@pytest.mark.parametrize("route", [protocol.TEI, protocol.OPENAI])
def test_non_finite_vector_is_a_500_naming_its_input(route):
    vectors = np.ones((3, 4), dtype=np.float32)
    vectors[1, 2] = np.nan
    key = "inputs" if route == protocol.TEI else "input"
    request = protocol.parse_embed(
        route, json.dumps({key: ["a", "b", "c"]}).encode(), Limits(), dim=4, auto_truncate=False
    )
    with pytest.raises(protocol.RequestError) as info:
        protocol.embed_response(request, vectors, 3, "m")
    assert info.value.status == 500 and f"'{key}[1]'" in info.value.message
    assert "NaN" in info.value.message
    if route == protocol.OPENAI:  # base64 carries the values as they are
        request.encoding_format = "base64"
        body = json.loads(protocol.embed_response(request, vectors, 3, "m"))
        got = np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), dtype="<f4")
        assert np.isnan(got[2]) and np.array_equal(got[[0, 1, 3]], vectors[1, [0, 1, 3]])


def test_server_answers_without_orjson_and_refuses_non_finite(
    server_embedder, reference, monkeypatch
):
    """Both answer paths of the app (rendered on the event loop with orjson, in a worker
    thread without it) over HTTP, and a model that yields NaN gets a 500, not a body
    with NaN in it (which is not JSON)."""
    texts = ["the cat sat on the mat", "a quick brown fox jumped"]
    expect = reference.encode(texts, normalize=True)
    with running(server_embedder) as handle:
        for fast in (True, False):
            if not fast:
                monkeypatch.setattr(protocol, "_orjson", None)
            reply = call(handle.base, "/v1/embeddings", {"input": texts})
            assert reply.status == 200
            np.testing.assert_allclose(_vectors_of(protocol.OPENAI, reply.body), expect, atol=ATOL)
        batcher = handle.app.batcher
        real = batcher.run
        batcher.run = lambda items, flags: np.full((len(items), reference.dim), np.nan, np.float32)
        try:
            reply = call(handle.base, "/embed", {"inputs": texts})
        finally:
            batcher.run = real
        assert reply.status == 500 and "'inputs[0]'" in reply.message


# ---------------------------------------------------------------- the batcher alone
def test_embed_items_equals_encode(server_embedder, reference):
    texts = tiny_embedder.corpus(40, seed=3) + [long_text(100)]
    items = server_embedder.tokenizer.tokenize(texts)
    flags = [i % 2 == 0 for i in range(len(texts))]
    got = batching.embed_items(server_embedder, items, flags, batch_size=8, max_tokens=256)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(got[i], reference.encode(text, normalize=flags[i]), atol=ATOL)


def test_batcher_rounds_respect_budgets_and_drain():
    rounds = []

    def run(items, flags):
        rounds.append(len(items))
        return np.zeros((len(items), 1), dtype=np.float32)

    b = batching.Batcher(run, max_batch_size=4, max_batch_tokens=100, max_queue=10)
    item = ([1] * 10, [0] * 10)
    futures = [b.submit([item] * n, True) for n in (3, 2, 1, 4)]  # queued before the start
    with pytest.raises(batching.QueueFull):
        b.submit([item], True)  # 10 texts wait
    b.start()
    b.close()
    assert [f.result().shape[0] for f in futures] == [3, 2, 1, 4]
    assert rounds == [3, 3, 4]  # whole requests, oldest first, within 4 texts
    with pytest.raises(batching.Closed):
        b.submit([item], True)
    # the token budget, and one request larger than every budget still runs
    rounds.clear()
    b = batching.Batcher(run, max_batch_size=32, max_batch_tokens=25, max_queue=100)
    futures = [b.submit([item] * n, False) for n in (2, 1, 5)]
    b.start()
    b.close()
    assert rounds == [2, 1, 5] and all(f.done() for f in futures)


# ---------------------------------------------------------------- memory
@pytest.mark.slow
def test_memory_stays_flat(server):
    """RSS (``/proc/self/statm`` of the server's process, through ``/stats``) after 2,000
    requests is within 16 MiB of RSS after the first 200 (which warm up the threads, the
    allocator's arenas and the caches). The bound: growth measured here was 0.3 MB over
    the 1,800 requests, so 16 MiB is 50x that noise, and it fails on any leak of 9.3 kB or
    more per request, e.g. keeping each request's body, token ids and ~1.2 kB answer
    with their Python objects; a smaller leak needs more requests to show."""
    texts = tiny_embedder.corpus(64, seed=9)
    counter = iter(range(10**9))
    lock = threading.Lock()

    def work(n):
        for _ in range(n):
            with lock:
                i = next(counter)
            inputs = [texts[i % 64], texts[(i * 7) % 64]]
            assert call(server.base, "/embed", {"inputs": inputs}).status == 200

    def burst(total):
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, [total // 4] * 4))

    burst(200)
    first = call(server.base, "/stats").json()["rss_bytes"]
    burst(1800)
    last = call(server.base, "/stats").json()["rss_bytes"]
    assert last - first < 16 * 2**20, (first, last)


# ---------------------------------------------------------------- the command
@pytest.mark.parametrize(
    "argv,words",
    [
        (["--replicas", "2"], "--replicas is a Ray Serve option: add --ray"),
        (["--gpus-per-replica", "1"], "--gpus-per-replica is a Ray Serve option"),
        (["--ray", "--max-queue", "5"], "--max-queue is an option of the embedded server"),
        (["--ray", "--threads", "2"], "--threads is an option of the embedded server"),
        (["--port", "70000"], "--port must be between 0 and 65535"),
        (["--max-queue", "0"], "--max-queue must be at least 1"),
        (["--batch-wait-ms", "-1"], "--batch-wait-ms must be >= 0"),
        (["--request-timeout-s", "0"], "--request-timeout-s must be > 0"),
        (["--api-key", ""], "--api-key is empty"),
        (
            ["--ray", "--max-batch-size", "8", "--max-client-batch-size", "16"],
            "must not exceed --max-batch-size (8) with --ray",
        ),
        (["--model", "/no/such/folder"], "/no/such/folder"),
    ],
)
def test_serve_user_errors(argv, words, capsys):
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertfast: error: ") and words in err[0], err


def test_serve_help_groups_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for group in ("model:", "HTTP:", "batching:", "request limits:", "Ray Serve (--ray):"):
        assert group in out
    text = " ".join(out.split())
    assert "--node-ip-address" in text and "listen on all interfaces" in text


@contextlib.contextmanager
def cli_server(micro, cwd, env, *options):
    """``python -m bertfast serve`` on the micro checkpoint and a free port: yields the
    process and the address it printed; killed if still running at the end, and by a
    watchdog if a start or stop takes over 120 s."""
    argv = [sys.executable, "-m", "bertfast", "serve", "--model", str(micro), "--port", "0"]
    proc = subprocess.Popen(
        [*argv, *options],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        line = proc.stdout.readline()
        assert line.startswith("bertfast serve: "), (line, proc.stderr.read()[-2000:])
        yield proc, line.split(" on ", 1)[1].split()[0]
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.slow
def test_cli_serves_and_stops_on_sigterm_under_load(micro, reference, tmp_path):
    """``python -m bertfast serve``: prints its address, answers, starts no process, and
    on SIGTERM under load finishes what it accepted (every request gets a 200 or a
    connection error, never a 5xx), writes no temporary file and exits 0."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), BERTFAST_API_KEY="")
    options = ("--batch-wait-ms", "10", "--threads", "1")
    with cli_server(micro, tmp_path, env, *options) as (proc, base):
        assert base.startswith("http://127.0.0.1:")
        assert call(base, "/health").status == 200
        assert _children(proc.pid) == []

        texts = tiny_embedder.corpus(16, seed=2)
        results: list = []
        enough, stop = threading.Event(), threading.Event()

        def client(c: int):
            i = 0
            while not stop.is_set():
                inputs = [texts[(c + i) % 16]]
                i += 1
                try:
                    reply = call(base, "/embed", {"inputs": inputs}, timeout=60)
                except (ConnectionError, urllib.error.URLError) as exc:
                    results.append(("refused", inputs, exc))
                    return
                results.append((reply.status, inputs, reply.body))
                if len(results) >= 40:
                    enough.set()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        assert enough.wait(60), "the clients got no answers"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
        stop.set()
        for t in threads:
            t.join(60)
    assert proc.returncode == 0, err[-3000:]
    assert "bertfast serve: stopping" in err and "bertfast serve: stopped" in err
    statuses = {r[0] for r in results}
    assert statuses <= {200, "refused"}, [r[:2] for r in results if r[0] not in (200, "refused")]
    answered = [r for r in results if r[0] == 200]
    assert len(answered) >= 40
    for _, inputs, body in answered[-8:]:
        np.testing.assert_allclose(
            json.loads(body), reference.encode(inputs, normalize=True), atol=ATOL
        )
    assert list(tmp.iterdir()) == []  # no temporary file left


def test_cli_model_runs_on_the_default_threads(micro, tmp_path):
    """Without ``--threads`` the model thread gets torch's default thread count, not the
    one thread the CLI loads the model with (bertfast/cli/serve.py): ``/info`` reports
    the default a fresh interpreter in the same environment has."""
    env = dict(os.environ, BERTFAST_API_KEY="")
    default = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    with cli_server(micro, tmp_path, env) as (proc, base):
        assert call(base, "/info").json()["threads"] == int(default)
        assert call(base, "/embed", {"inputs": ["hello world"]}).status == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err[-3000:]
