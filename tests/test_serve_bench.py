"""The serving benchmark's library (bertfast/bench/serving.py) and command line
(benchmarks/serve_bench.py), against the trivial server started here as a process of
its own (no model, no infinity): the load generator's statistics, its engines, error and
reconnect counting, the server process lifecycle (start, readiness, stop, kill after the
grace period, leftover processes), the rounds' order and the Markdown table.

Nothing here asserts a speed; the closed-loop test bounds what a delay implies.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bertfast.bench import serving
from bertfast.bench.sweep import read_rows
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 20.0


def _trivial(**options) -> serving.ServerProcess:
    return serving.ServerProcess(
        serving.trivial_spec(**options), start_timeout_s=START_TIMEOUT_S, grace_s=5.0
    )


@pytest.fixture(scope="module")
def trivial():
    with _trivial() as server:
        yield server


def test_percentile_is_numpys_linear_percentile():
    rng = random.Random(3)
    for n in (1, 2, 7, 100, 1001):
        values = sorted(rng.expovariate(1.0) for _ in range(n))
        for q in (0, 1, 50, 90, 99, 99.9, 100):
            assert serving.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert math.isnan(serving.percentile([], 50))
    with pytest.raises(ValueError):
        serving.percentile([1.0], 101)


def test_queries_are_fixed_distinct_and_short():
    a, b = serving.make_queries(2000), serving.make_queries(2000)
    assert a == b and len(set(a)) == 2000
    assert all(3 <= len(q.split()) <= 12 for q in a)
    assert serving.make_queries(200, seed=1) != a[:200]
    assert json.loads(serving.request_body(a[0])) == {"input": a[0], "model": "all-MiniLM-L6-v2"}
    assert json.loads(serving.request_body(a[0], "tei")) == {"inputs": a[0]}
    with pytest.raises(ValueError):
        serving.request_body("x", "grpc")


def test_parse_head():
    parse = serving._parse_head
    assert parse(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX: y") == (200, 12, False, False)
    assert parse(b"HTTP/1.1 503 Busy\r\ntransfer-encoding: chunked") == (503, None, True, False)
    assert parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0")[3] is True
    assert parse(b"HTTP/1.0 200 OK\r\nContent-Length: 0")[3] is True
    assert parse(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0")[3] is False
    with pytest.raises(ValueError):
        parse(b"garbage")


def test_raw_connection_reads_chunked_and_close_delimited_answers():
    """A hand-written server: a chunked answer (with a trailer), then one whose body ends
    when the server closes; the raw client reads both whole."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n"
            )
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 201 Created\r\n\r\nuntil the end")
            conn.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = serving._RawConnection("127.0.0.1", port, timeout=10)
        request = serving._request_bytes("127.0.0.1", port, "/x", b"{}")
        assert client.exchange(request) == (200, b"hello, world")
        assert client.buf == b""
        assert client.exchange(request) == (201, b"until the end")
        assert client.sock is None  # closed: the next request opens a new connection
    finally:
        thread.join(10)
        listener.close()


@pytest.mark.parametrize("engine", serving.ENGINES)
def test_load_generator_against_the_trivial_server(trivial, engine):
    result = serving.run_load(
        trivial.host,
        trivial.port,
        clients=3,
        duration_s=0.6,
        warmup_s=0.2,
        engine=engine,
        server_pids=trivial.pids,
    )
    assert result.requests > 0 and result.errors == {}
    assert result.latencies_s == sorted(result.latencies_s) and result.latencies_s[0] > 0
    assert result.sent >= result.requests
    row = result.row()
    assert row["engine"] == engine and row["clients"] == 3
    assert row["requests_per_s"] == pytest.approx(result.requests / 0.6, rel=1e-3)
    assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert row["client_cpu_s"] > 0 and row["client_cpu_us_per_request"] > 0
    assert row["server_cpu_s"] is not None and row["server_cpu_s"] >= 0
    json.dumps(row)  # a JSON line


def test_tei_route_and_query_offsets(trivial):
    result = serving.run_load(
        trivial.host,
        trivial.port,
        clients=2,
        duration_s=0.3,
        warmup_s=0.0,
        path="/embed",
        route="tei",
        queries=["one query", "two queries"],
        offset=5,
    )
    assert result.requests > 0 and result.errors == {}


def test_errors_are_counted_by_kind_and_closed_connections_reopened():
    with _trivial(fail_every=5, close_every=3) as server:
        result = serving.run_load(server.host, server.port, clients=2, duration_s=0.6, warmup_s=0.1)
    answered = result.requests + result.error_count
    assert set(result.errors) == {"status 500"}
    assert 0.1 < result.errors["status 500"] / answered < 0.3  # every 5th POST fails
    assert result.row()["errors"] == result.error_count


def test_closed_loop_waits_for_each_answer():
    """Each client has one request in flight: with a 20 ms delay per answer, 2 clients
    complete at most 2 * (window / 20 ms) + 2 requests, each taking >= 20 ms."""
    with _trivial(delay_ms=20) as server:
        result = serving.run_load(server.host, server.port, clients=2, duration_s=0.5, warmup_s=0.1)
    assert 0 < result.requests <= 2 * 0.5 / 0.020 + 2
    assert result.latencies_s[0] >= 0.019


def test_a_hung_server_is_a_timeout_not_a_hang():
    with _trivial(delay_ms=5000) as server:
        t0 = time.perf_counter()
        result = serving.run_load(
            server.host, server.port, clients=2, duration_s=1.0, warmup_s=0.0, timeout_s=0.3
        )
        assert time.perf_counter() - t0 < 10
    assert result.requests == 0 and result.errors.get("timeout", 0) >= 2


def test_stop_kills_after_the_grace_period_and_reports_leftovers():
    server = serving.ServerProcess(
        serving.trivial_spec(ignore_sigterm=True, spawn_child=True),
        start_timeout_s=START_TIMEOUT_S,
        grace_s=0.5,
        settle_s=0.5,
    )
    with server:
        assert server.ready_s is not None and server.first_answer_s >= server.ready_s
        assert server.dim == 384
        assert len(server.pids()) == 2  # the server and the child it forgot
    info = server.stop_info
    assert info["killed"] is True
    assert len(info["leftovers"]) == 1 and "time.sleep(600)" in info["leftovers"][0]
    pid = int(info["leftovers"][0].split()[0])
    deadline = time.time() + 5
    while serving._proc_stat(pid) is not None and time.time() < deadline:
        time.sleep(0.05)
    assert serving._proc_stat(pid) is None


def test_sigterm_stops_a_well_behaved_server_without_leftovers(tmp_path):
    server = serving.ServerProcess(
        serving.trivial_spec(), start_timeout_s=START_TIMEOUT_S, log_path=tmp_path / "t.log"
    )
    with server:
        pass
    assert server.stop_info["killed"] is False and server.stop_info["leftovers"] == []
    assert "trivial server on" in (tmp_path / "t.log").read_text()


def test_a_server_that_exits_early_is_an_error_with_its_log(tmp_path):
    spec = serving.ServerSpec(
        name="broken",
        argv=[sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"],
    )
    server = serving.ServerProcess(spec, start_timeout_s=START_TIMEOUT_S, log_path=tmp_path / "b")
    with pytest.raises(serving.ServerError, match="code 3(.|\n)*no model here"):
        with server:
            pass
    assert server.stop_info is not None


def test_answer_dim_checks_the_vector():
    assert serving._answer_dim(b'{"data": [{"embedding": [0.5, 1]}]}', "openai") == 2
    assert serving._answer_dim(b"[[1.0, 2.0, 3.0]]", "tei") == 3
    for bad in (b"{}", b"not json", b'{"data": [{"embedding": []}]}'):
        with pytest.raises(serving.ServerError):
            serving._answer_dim(bad, "openai")


def test_server_specs():
    ray_only = {"default": "ray", "help": "--max-batch-size N --cpus-per-replica C"}
    spec = serving.bertfast_spec("/m", threads=2, serve_help=ray_only, python="py")
    assert spec.name == "bertfast" and spec.facts["mode"] == "ray" and "--ray" not in spec.argv
    assert spec.argv[:4] == ["py", "-m", "bertfast", "serve"] and "{port}" in spec.argv
    assert spec.argv[-2:] == ["--cpus-per-replica", "2"]
    assert spec.env["OMP_NUM_THREADS"] == "2"
    with pytest.raises(serving.ServerError):
        serving.bertfast_spec("/m", mode="embedded", serve_help=ray_only)
    both = {"default": "embedded", "help": "--threads N --ray --cpus-per-replica C"}
    spec = serving.bertfast_spec("/m", threads=2, serve_help=both, extra_args=["--x"])
    assert spec.name == "bertfast" and spec.facts["mode"] == "embedded"
    assert "--ray" not in spec.argv and "--cpus-per-replica" not in spec.argv
    assert spec.argv[-3:] == ["--threads", "2", "--x"]
    spec = serving.bertfast_spec("/m", mode="ray", threads=2, serve_help=both)
    assert spec.name == "bertfast-ray" and "--ray" in spec.argv
    assert spec.argv[-2:] == ["--cpus-per-replica", "2"]

    spec = serving.infinity_spec("/nowhere/bin/infinity_emb", "/m", threads=2)
    assert spec.argv[:2] == ["/nowhere/bin/infinity_emb", "v2"]
    assert "--no-vector-disk-cache" in spec.argv and spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.path("openai") == "/embeddings" and spec.path("tei") is None
    assert spec.version is None


def _load_cli():
    return load_script("benchmarks/serve_bench.py")


def test_rounds_alternate_and_the_table_has_ratios(tmp_path, capsys):
    """Two trivial servers posing as bertfast and infinity: the order flips between
    rounds, every level and start is a JSON line, and the table (here and from the
    command line's --report) carries the ratios."""
    specs = []
    for name in ("bertfast", "infinity"):
        spec = serving.trivial_spec()
        spec.name, spec.version = name, "test"
        specs.append(spec)
    jsonl = tmp_path / "serving.jsonl"
    lines = []
    rows = serving.run_servers(
        specs,
        [1, 2],
        duration_s=0.3,
        warmup_s=0.1,
        rounds=2,
        jsonl=jsonl,
        log_dir=tmp_path / "logs",
        start_timeout_s=START_TIMEOUT_S,
        grace_s=5.0,
        command="serve_bench --test",
        machine={"cpu": "test cpu", "logical_cpus": os.cpu_count()},
        say=lines.append,
    )
    assert read_rows(jsonl) == rows
    starts = [(r["server"], r["round"]) for r in rows if r["row"] == "server"]
    assert starts == [("bertfast", 1), ("infinity", 1), ("infinity", 2), ("bertfast", 2)]
    levels = [r for r in rows if r["row"] == "level"]
    assert len(levels) == 8 and {r["clients"] for r in levels} == {1, 2}
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in levels)
    assert all(r["leftovers"] == [] and r["error"] is None for r in rows if r["row"] == "server")
    assert any("x2:" in line for line in lines)
    table = serving.format_markdown(rows)
    assert "serve_bench --test" in table and "test cpu" in table
    assert "| bertfast / infinity req/s | bertfast / infinity p99 |" in table
    ratio_rows = [ln for ln in table.splitlines() if ln.startswith(("| 1 | ", "| 2 | "))]
    assert any(ln.count("x |") == 2 for ln in ratio_rows)

    cli = _load_cli()
    out = tmp_path / "serving.md"
    assert cli.main(["--report", str(jsonl), "--markdown", str(out)]) == 0
    assert out.read_text() == table


def test_cli_rejects_unknown_servers():
    cli = _load_cli()
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--servers", "bertfast,tei"])
    args = cli.parser().parse_args(["--servers", "trivial", "--clients", "1,8"])
    assert args.servers == ["trivial"] and args.clients == [1, 8]
