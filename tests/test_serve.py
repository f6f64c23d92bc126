"""Ray Serve: ``bertfast.ray.serve_app`` and ``bertfast serve --ray`` over real HTTP on
localhost, on a local 2-CPU Ray cluster started here. The request handling is the
embedded server's (bertfast.serving.protocol, tests/test_server.py); these tests check
that the Ray deployment answers through it.

The reference is :meth:`bertfast.Embedder.encode` (normalised, as both APIs answer
by default) of the same texts in this process.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from bertfast.bench.serving import free_port  # noqa: E402
from bertfast.embedder import Embedder  # noqa: E402
from bertfast.ray import serve_app  # noqa: E402
from bertfast.serving.protocol import Limits  # noqa: E402

from . import tiny_embedder  # noqa: E402

pytestmark = pytest.mark.slow
MAX_BATCH = 16
LIMIT = 64  # the tiny checkpoint's position table


def call(base, path, body=None, method=None, raw=None, timeout=120):
    """(status, parsed JSON body) of one HTTP request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_embedder.make_checkpoint(tmp_path_factory.mktemp("tiny"), max_positions=LIMIT)


@pytest.fixture(scope="module")
def reference(ckpt):
    return Embedder.from_pretrained(ckpt)


def test_serve_command(ckpt, reference, tmp_path):
    # `bertfast serve` in the foreground: answers, then stops cleanly on SIGINT.
    # (First in this file: it starts its own local cluster before the fixture's.)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertfast",
            "serve",
            "--ray",
            "--model",
            str(ckpt),
            "--port",
            str(port),
            "--max-batch-size",
            "8",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    watchdog = threading.Timer(300, proc.kill)  # a start-up that never ends fails the test
    watchdog.start()
    try:
        seen = []
        for line in proc.stdout:  # "bertfast serve: ..." comes once the app is running
            seen.append(line)
            if line.startswith("bertfast serve:"):
                break
        else:
            raise AssertionError((seen[-5:], proc.communicate()[1][-3000:]))
        assert call(base, "/health")[0] == 200
        status, body = call(base, "/embed", {"inputs": ["the cat sat", "hello world"]})
        assert status == 200
        np.testing.assert_allclose(
            body, reference.encode(["the cat sat", "hello world"], normalize=True), atol=1e-5
        )
        assert call(base, "/info")[1]["max_batch_size"] == 8
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "bertfast serve: stopping" in err


@pytest.fixture(scope="module")
def server(ckpt):
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:  # a failed start still shuts Ray down: no later module inherits it
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            serve_app(ckpt, max_batch_size=MAX_BATCH, batch_wait_timeout_s=0.02),
            name="bertfast",
            route_prefix="/",
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def test_200_concurrent_requests_batched(server, reference):
    texts = tiny_embedder.corpus(200, seed=11)
    # Some requests carry two texts: replies must go back to the right request.
    requests = [[t] if i % 5 else [t, texts[(i + 1) % 200]] for i, t in enumerate(texts)]
    before = call(server, "/stats")[1]

    def one(inputs):
        return call(server, "/embed", {"inputs": inputs})

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(one, requests))
    assert all(status == 200 for status, _ in replies), [r for r in replies if r[0] != 200][:3]
    for inputs, (_, vectors) in zip(requests, replies):
        np.testing.assert_allclose(vectors, reference.encode(inputs, normalize=True), atol=1e-5)
    after = call(server, "/stats")[1]
    assert after["requests"] - before["requests"] == 200
    assert after["texts"] - before["texts"] == sum(map(len, requests))
    assert after["max_requests_per_batch"] > 1  # concurrent requests shared model batches
    assert after["max_texts_per_batch"] <= MAX_BATCH


def test_openai_endpoint(server, reference):
    texts = ["the quick brown fox", "a lazy dog"]
    expect = reference.encode(texts, normalize=True)
    status, body = call(server, "/v1/embeddings", {"input": texts, "model": "tiny"})
    assert status == 200 and body["object"] == "list" and body["model"] == "tiny"
    assert [d["index"] for d in body["data"]] == [0, 1]
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], expect, atol=1e-5)
    tokens = sum(len(ids) for ids, _ in reference.tokenizer.tokenize(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    status, body = call(server, "/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
    assert status == 200
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, expect[0], atol=1e-5)
    # TEI: a single string, normalize false, truncation on request.
    status, body = call(server, "/embed", {"inputs": texts[0], "normalize": False})
    np.testing.assert_allclose(body, reference.encode([texts[0]], normalize=False), atol=1e-5)
    long_text = " ".join(["cat"] * 200)
    status, body = call(server, "/embed", {"inputs": [long_text], "truncate": True})
    assert status == 200
    np.testing.assert_allclose(body, reference.encode([long_text], normalize=True), atol=1e-5)


NESTED = b"[" * 50_000
SURROGATE = b'{"inputs": ["ok", "\\ud800"]}'


@pytest.mark.parametrize(
    "path,body,raw,status,words",
    [
        ("/embed", None, b"{not json", 400, "not JSON"),
        ("/embed", None, NESTED, 400, "nested too deeply"),
        ("/embed", None, SURROGATE, 422, "'inputs[1]' holds a lone surrogate"),
        ("/embed", {"inputs": []}, None, 400, "empty"),
        ("/embed", {"inputs": ["ok", 3]}, None, 422, "inputs[1]' must be a string"),
        ("/embed", {"inputs": [None]}, None, 422, "must be a string, not null"),
        ("/embed", {"inputs": ["a"] * (MAX_BATCH + 1)}, None, 413, "batch limit"),
        ("/embed", {"inputs": [" ".join(["cat"] * 200)]}, None, 413, "tokens, more than"),
        ("/embed", {"text": "no inputs"}, None, 422, "'inputs'"),
        ("/v1/embeddings", None, b"\xff\xfe", 400, "not JSON"),
        ("/v1/embeddings", {"input": []}, None, 400, "empty"),
        ("/v1/embeddings", {"input": ["ok", {"a": 1}]}, None, 400, "must be a string"),
        ("/v1/embeddings", {"input": ["a"] * (MAX_BATCH + 1)}, None, 400, "batch limit"),
        ("/v1/embeddings", {"input": " ".join(["cat"] * 200)}, None, 400, "tokens, more than"),
        ("/v1/embeddings", {"input": [[1, 2, 3]]}, None, 400, "token ids"),
        ("/nowhere", {"inputs": ["a"]}, None, 404, "no endpoint"),
    ],
)
def test_bad_requests_get_4xx(server, path, body, raw, status, words):
    got, reply = call(server, path, body, raw=raw, method="POST")
    assert got == status, reply
    message = reply["error"]["message"] if path == "/v1/embeddings" else reply["error"]
    assert words in message, message
    # ...and the server still answers.
    assert call(server, "/embed", {"inputs": ["still alive"]})[0] == 200


def test_serve_app_arguments():
    with pytest.raises(ValueError, match="max_batch_size"):
        serve_app(None, max_batch_size=0)
    with pytest.raises(TypeError, match="unexpected"):
        serve_app(None, colour="blue")
    with pytest.raises(ValueError, match="must not exceed max_batch_size"):
        serve_app(None, max_batch_size=8, limits=Limits(max_client_batch_size=16))
