"""The serving benchmark (issue 26): HTTP embedding servers side by side, each in a
process of its own, driven by one closed-loop load generator.

Three parts, used by ``benchmarks/serve_bench.py``:

- **The load generator** (:func:`run_load`): ``clients`` concurrent clients, each a
  closed loop (send one request, wait for the answer, send the next) on one persistent
  keep-alive connection, for ``warmup_s`` then a measured window of ``duration_s``. A
  request counts when its answer arrives inside the window; its latency is send to last
  byte. Each request embeds one short query (<= 12 words) from :func:`make_queries`, a
  fixed seeded list of 8,192 varied sentences, walked on from level to level (a server
  cache sees few repeats). Routes: OpenAI (``POST /v1/embeddings``, ``{"input":
  text, "model": name}``, the default) or TEI (``POST /embed``, ``{"inputs": text}``).
  Engines (``ENGINES``): ``raw`` (one thread per client, a socket and a pre-built
  request, the response read with a small HTTP/1.1 parser: the cheapest), ``http.client``
  (one ``http.client.HTTPConnection`` per thread), ``asyncio`` (one event loop, asyncio
  streams). It reports requests/s, p50/p90/p99 latency, errors by kind, and its own CPU
  seconds over the window (``getrusage``: nothing else runs in the process meanwhile),
  so that CPU per request shows whether the client could be the bottleneck; the server
  process tree's CPU over the same window comes from ``/proc``.
- **Server processes** (:class:`ServerProcess`): one command line (:class:`ServerSpec`;
  ``{port}`` in it is a fresh free port per start) in a new session, optionally pinned to
  CPUs, polled on its health route, then one real embedding request whose answer is
  checked (start-to-first-answer); stopped with SIGTERM, the process group killed after a
  grace period, and every process it started (children seen while it ran, and anything
  left in its session) checked afterwards: one still alive is a *leftover*, reported and
  killed.
- **The run and its rows** (:func:`run_servers`): one server at a time, every client
  level per start, the server order alternating over rounds (A B, B A, ...) so that the
  ratios come from one run; one JSON line per level and per server start, appended as
  they come (``bertfast.bench.sweep.append_row``, imported where used: this file
  also runs as a script); :func:`format_markdown` makes the table with ratios
  against the ``infinity`` rows.

:func:`trivial_server` is a server that answers at once (a canned 384-float embedding):
the tests' server, and the measure of the highest rate the load generator can drive.
This file imports only the standard library at module level and runs as a script
(``python -I serving.py trivial-server --port P``), so that the trivial server starts
without torch.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ENGINES",
    "ROUTES",
    "make_queries",
    "request_body",
    "percentile",
    "LoadResult",
    "run_load",
    "ServerSpec",
    "ServerProcess",
    "ServerError",
    "free_port",
    "bertfast_spec",
    "bertfast_serve_modes",
    "infinity_spec",
    "trivial_spec",
    "machine_facts",
    "run_servers",
    "format_markdown",
    "trivial_server",
]

ENGINES = ("raw", "http.client", "asyncio")
ROUTES = ("openai", "tei")
#: seconds a client waits for one answer before it counts a timeout and reconnects
REQUEST_TIMEOUT_S = 60.0
#: the ``model`` field of an OpenAI request (infinity serves the checkpoint under it)
SERVED_MODEL = "all-MiniLM-L6-v2"

# ----------------------------------------------------------------------------- queries


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",")]


_TOPICS = _words(
    "python decorators, a sourdough starter, tax returns, solar panels, "
    "a used car, kubernetes pods, a job interview, vitamin d, a mortgage, "
    "the french revolution, climate change, a marathon, home wifi, "
    "an electric bike, sql joins, a passport renewal, black holes, "
    "a wedding speech, houseplants, a credit score, machine learning, "
    "a leaking tap, jet lag, remote work, a startup pitch"
)
_VERBS = _words(
    "fix, learn, choose, clean, compare, start, explain, improve, cancel, install, "
    "plan, repair, understand, store, measure, speed up"
)
_THINGS = _words(
    "laptop, phone battery, garden, bike chain, coffee machine, printer, "
    "dishwasher, router, knee, back pain, dog, cat, car engine, fridge, "
    "password manager, resume, kitchen sink, roof, headphones, bank account"
)
_PROBLEMS = _words(
    "keep overheating, make a clicking noise, stop working at night, "
    "drain so fast, smell strange, fail after an update, not turn on, run slowly, "
    "leak water"
)
_PLACES = _words(
    "lisbon, tokyo, denver, the alps, cape town, oslo, my city, the coast, berlin, "
    "rural areas, mexico city, a small town"
)
_ADJECTIVES = _words(
    "cheap, quiet, reliable, fast, healthy, simple, durable, beginner, affordable, "
    "lightweight, family friendly, eco friendly"
)
_AUDIENCES = _words(
    "students, beginners, seniors, small teams, kids, runners, new parents, "
    "remote workers, travellers, landlords"
)
_TEMPLATES = [
    "how do I {verb} {topic}",
    "how to {verb} a {thing} quickly",
    "why does my {thing} {problem}",
    "best {adj} {thing} for {audience}",
    "what is the difference between {topic} and {topic2}",
    "{topic} explained for {audience}",
    "{adj} places to visit in {place}",
    "is it worth it to {verb} {topic} in {place}",
    "tips to {verb} {topic} for {audience}",
    "when should I {verb} my {thing}",
    "{adj} {thing} under fifty dollars",
    "what {audience} should know about {topic}",
    "can you {verb} a {thing} without tools",
    "weather in {place} next week",
    "how long does it take to {verb} {topic}",
    "common mistakes when you {verb} {topic}",
]


def make_queries(n: int = 8192, seed: int = 0) -> list[str]:
    """``n`` distinct short queries (3 to 12 words, search-box style), the same for the
    same ``seed``."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        text = rng.choice(_TEMPLATES).format(
            verb=rng.choice(_VERBS),
            topic=rng.choice(_TOPICS),
            topic2=rng.choice(_TOPICS),
            thing=rng.choice(_THINGS),
            problem=rng.choice(_PROBLEMS),
            place=rng.choice(_PLACES),
            adj=rng.choice(_ADJECTIVES),
            audience=rng.choice(_AUDIENCES),
        )
        words = text.split()[:12]
        text = " ".join(words)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def request_body(text: str, route: str = "openai", model: str = SERVED_MODEL) -> bytes:
    """The JSON body of one embedding request on ``route`` (``ROUTES``)."""
    if route == "openai":
        body = {"input": text, "model": model}
    elif route == "tei":
        body = {"inputs": text}
    else:
        raise ValueError(f"route must be one of {ROUTES}, not {route!r}")
    return json.dumps(body, separators=(",", ":")).encode()


def _request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


# ------------------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending values, linearly interpolated
    between closest ranks (numpy's default); NaN for no values."""
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], not {q}")
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@dataclass
class LoadResult:
    """One load level: answers completed inside the measured window."""

    clients: int
    duration_s: float
    warmup_s: float
    engine: str
    route: str
    latencies_s: list[float]  # successful answers, ascending
    errors: dict[str, int]  # "status 500": 3, "timeout": 1, ...
    client_cpu_s: float
    server_cpu_s: float | None = None
    sent: int = 0  # requests sent, warm-up and the tail included
    reconnects: int = 0

    @property
    def requests(self) -> int:
        return len(self.latencies_s)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s

    def latency_ms(self, q: float) -> float:
        return 1000.0 * percentile(self.latencies_s, q)

    def row(self) -> dict:
        """The JSON-able summary (no per-request latencies)."""
        answered = self.requests + self.error_count
        lat = self.latencies_s
        return {
            "clients": self.clients,
            "engine": self.engine,
            "route": self.route,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "requests": self.requests,
            "requests_per_s": round(self.requests_per_s, 3),
            "p50_ms": _round(self.latency_ms(50)),
            "p90_ms": _round(self.latency_ms(90)),
            "p99_ms": _round(self.latency_ms(99)),
            "mean_ms": _round(1000.0 * sum(lat) / len(lat)) if lat else None,
            "max_ms": _round(1000.0 * lat[-1]) if lat else None,
            "errors": self.error_count,
            "error_kinds": dict(sorted(self.errors.items())),
            "client_cpu_s": round(self.client_cpu_s, 4),
            "client_cpu_us_per_request": (
                round(1e6 * self.client_cpu_s / answered, 1) if answered else None
            ),
            "client_cores": round(self.client_cpu_s / self.duration_s, 3),
            "server_cpu_s": None if self.server_cpu_s is None else round(self.server_cpu_s, 3),
            "server_cpu_ms_per_request": (
                round(1e3 * self.server_cpu_s / answered, 3)
                if self.server_cpu_s is not None and answered
                else None
            ),
            "sent": self.sent,
            "reconnects": self.reconnects,
        }


def _round(x: float | None, digits: int = 3) -> float | None:
    if x is None or x != x:
        return None
    return round(x, digits)


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------------- the HTTP bits


class _Closed(ConnectionError):
    """The server closed the connection; ``fresh`` when no byte of an answer came."""

    def __init__(self, fresh: bool):
        super().__init__("connection closed by the server")
        self.fresh = fresh


def _parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, content length or None, chunked, server closes) of a response head."""
    lines = head.split(b"\r\n")
    status_line = lines[0]
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"bad status line {status_line[:80]!r}")
    status = int(parts[1])
    close = parts[0] == b"HTTP/1.0"
    length, chunked = None, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            value = value.strip().lower()
            close = value == b"close" or (close and value != b"keep-alive")
    return status, length, chunked, close


class _RawConnection:
    """One keep-alive HTTP/1.1 connection over a plain socket; :meth:`exchange` sends a
    pre-built request and reads the whole answer."""

    def __init__(self, host: str, port: int, timeout: float = REQUEST_TIMEOUT_S):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self.buf = b""
        self.used = False
        self.reconnects = 0

    def connect(self) -> None:
        self.close()
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.buf, self.used = sock, b"", False

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None

    def abort(self) -> None:
        """Unblock a thread waiting on this connection (from another thread)."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _recv(self, fresh: bool) -> bytes:
        chunk = self.sock.recv(262144)
        if not chunk:
            raise _Closed(fresh)
        return chunk

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """(status, body); a reused connection the server had closed is reopened and the
        request sent again, once."""
        if self.sock is None:
            self.connect()
        reused = self.used
        try:
            return self._exchange(request)
        except (_Closed, BrokenPipeError, ConnectionResetError) as exc:
            if not reused or (isinstance(exc, _Closed) and not exc.fresh):
                raise
            self.reconnects += 1
            self.connect()
            return self._exchange(request)

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        self.used = True
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            buf += self._recv(fresh=not buf)
            end = buf.find(b"\r\n\r\n")
        status, length, chunked, close = _parse_head(buf[:end])
        rest = buf[end + 4 :]
        if chunked:
            body, rest = self._read_chunked(rest)
        elif length is not None:
            while len(rest) < length:
                rest += self._recv(fresh=False)
            body, rest = rest[:length], rest[length:]
        else:  # the body ends when the server closes
            parts = [rest]
            while True:
                chunk = self.sock.recv(262144)
                if not chunk:
                    break
                parts.append(chunk)
            body, rest, close = b"".join(parts), b"", True
        self.buf = rest
        if close:
            self.close()
        return status, body

    def _read_chunked(self, rest: bytes) -> tuple[bytes, bytes]:
        parts = []
        while True:
            while (i := rest.find(b"\r\n")) < 0:
                rest += self._recv(fresh=False)
            size = int(rest[:i].split(b";", 1)[0], 16)
            rest = rest[i + 2 :]
            if size == 0:  # trailers, then an empty line
                while (j := rest.find(b"\r\n")) != 0:
                    if j < 0:
                        rest += self._recv(fresh=False)
                    else:
                        rest = rest[j + 2 :]
                return b"".join(parts), rest[2:]
            while len(rest) < size + 2:
                rest += self._recv(fresh=False)
            parts.append(rest[:size])
            rest = rest[size + 2 :]


class _HttpClientConnection:
    """The same job with the standard library's :mod:`http.client`."""

    def __init__(self, host: str, port: int, path: str, timeout: float = REQUEST_TIMEOUT_S):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.path = path
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        self.reconnects = 0

    def exchange(self, body: bytes) -> tuple[int, bytes]:
        try:
            self.conn.request("POST", self.path, body=body, headers=self.headers)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.reconnects += 1
            self.conn.close()
            self.conn.request("POST", self.path, body=body, headers=self.headers)
            response = self.conn.getresponse()
        data = response.read()
        if response.will_close:
            self.conn.close()
        return response.status, data

    def close(self) -> None:
        self.conn.close()

    def abort(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError, asyncio.TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, (_Closed, http.client.RemoteDisconnected, asyncio.IncompleteReadError)):
        return "closed"
    if isinstance(exc, (ConnectionError, OSError)):
        return "connection"
    return type(exc).__name__


def _http_get(host: str, port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _http_post(
    host: str, port: int, path: str, body: bytes, timeout: float = REQUEST_TIMEOUT_S
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# --------------------------------------------------------------------- load generator


class _Window:
    """The run's clock: warm-up until ``start``, measured until ``end``."""

    def __init__(self, warmup_s: float, duration_s: float):
        self.begin = time.perf_counter()
        self.start = self.begin + warmup_s
        self.end = self.start + duration_s


class _Tally:
    """One client's record (only its own thread or task writes it)."""

    __slots__ = ("latencies", "errors", "sent")

    def __init__(self):
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.sent = 0

    def add(self, window: _Window, t0: float, t1: float, outcome: int | str) -> None:
        if not window.start <= t1 < window.end:
            return
        if outcome == 200:
            self.latencies.append(t1 - t0)
        else:
            key = f"status {outcome}" if isinstance(outcome, int) else outcome
            self.errors[key] = self.errors.get(key, 0) + 1


def run_load(
    host: str,
    port: int,
    clients: int,
    duration_s: float = 15.0,
    warmup_s: float = 3.0,
    *,
    path: str = "/v1/embeddings",
    route: str = "openai",
    model: str = SERVED_MODEL,
    queries: Sequence[str] | None = None,
    engine: str = "raw",
    offset: int = 0,
    server_pids: Callable[[], Iterable[int]] | None = None,
    seed: int = 0,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> LoadResult:
    """Drive ``clients`` closed-loop clients against ``host:port`` for ``warmup_s`` +
    ``duration_s`` seconds and count what completes in the second part.

    ``server_pids``, when given, names the server's processes; their CPU time over the
    window is recorded too. Client ``i`` walks the query list from ``offset + i *
    len(queries) // clients`` on (pass the ``sent`` of the previous level as ``offset`` to
    go on where it stopped).
    """
    if clients < 1:
        raise ValueError(f"clients must be at least 1, not {clients}")
    if duration_s <= 0 or warmup_s < 0:
        raise ValueError("duration_s must be > 0 and warmup_s >= 0")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    queries = list(queries) if queries is not None else make_queries(seed=seed)
    bodies = [request_body(q, route, model) for q in queries]
    offsets = [(offset + (i * len(bodies)) // clients) % len(bodies) for i in range(clients)]
    tallies = [_Tally() for _ in range(clients)]
    window = _Window(warmup_s, duration_s)
    marks: dict[str, float] = {}

    def mark(name: str) -> None:  # the /proc walk stays outside the client's window
        if server_pids is not None and name == "start":
            marks["start_server"] = _tree_cpu_seconds(server_pids())
        marks[f"{name}_cpu"] = _cpu_seconds()
        if server_pids is not None and name == "end":
            marks["end_server"] = _tree_cpu_seconds(server_pids())

    if engine == "asyncio":
        reconnects = asyncio.run(
            _run_asyncio(host, port, path, bodies, offsets, tallies, window, mark, timeout_s)
        )
    else:
        reconnects = _run_threads(
            host, port, path, bodies, offsets, tallies, window, mark, engine, timeout_s
        )
    latencies = sorted(x for t in tallies for x in t.latencies)
    errors: dict[str, int] = {}
    for t in tallies:
        for k, v in t.errors.items():
            errors[k] = errors.get(k, 0) + v
    server_cpu = None
    if server_pids is not None and "start_server" in marks and "end_server" in marks:
        server_cpu = marks["end_server"] - marks["start_server"]
    return LoadResult(
        clients=clients,
        duration_s=duration_s,
        warmup_s=warmup_s,
        engine=engine,
        route=route,
        latencies_s=latencies,
        errors=errors,
        client_cpu_s=marks["end_cpu"] - marks["start_cpu"],
        server_cpu_s=server_cpu,
        sent=sum(t.sent for t in tallies),
        reconnects=reconnects,
    )


def _run_threads(host, port, path, bodies, offsets, tallies, window, mark, engine, timeout_s):
    if engine == "raw":
        payloads = [_request_bytes(host, port, path, b) for b in bodies]
        conns = [_RawConnection(host, port, timeout_s) for _ in offsets]
    else:
        payloads = bodies
        conns = [_HttpClientConnection(host, port, path, timeout_s) for _ in offsets]
    n = len(payloads)

    def client(i: int) -> None:
        conn, tally, k = conns[i], tallies[i], offsets[i]
        end = window.end
        clock = time.perf_counter
        while True:
            t0 = clock()
            if t0 >= end:
                break
            payload = payloads[k]
            k = k + 1 if k + 1 < n else 0
            tally.sent += 1
            try:
                outcome = conn.exchange(payload)[0]
            except Exception as exc:  # every failure is a counted error
                outcome = _error_kind(exc)
                conn.close()
                t1 = clock()
                tally.add(window, t0, t1, outcome)
                time.sleep(0.01)  # a dead server must not turn the client into a spin loop
                continue
            tally.add(window, t0, clock(), outcome)
        conn.close()

    threads = [
        threading.Thread(target=client, args=(i,), name=f"load-client-{i}", daemon=True)
        for i in range(len(conns))
    ]
    for t in threads:
        t.start()
    _sleep_until(window.start)
    mark("start")
    _sleep_until(window.end)
    mark("end")
    deadline = time.perf_counter() + timeout_s + 5.0
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    if any(t.is_alive() for t in threads):  # a hung server: unblock the stragglers
        for c in conns:
            c.abort()
        for t in threads:
            t.join(5.0)
    return sum(c.reconnects for c in conns)


async def _run_asyncio(host, port, path, bodies, offsets, tallies, window, mark, timeout_s):
    payloads = [_request_bytes(host, port, path, b) for b in bodies]
    n = len(payloads)
    reconnects = [0]

    async def exchange(reader, writer, payload):
        writer.write(payload)
        head = await reader.readuntil(b"\r\n\r\n")
        status, length, chunked, close = _parse_head(head[:-4])
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readline() not in (b"\r\n", b""):
                        pass
                    break
                await reader.readexactly(size + 2)
        elif length is not None:
            await reader.readexactly(length)
        else:
            await reader.read()
            close = True
        return status, close

    async def client(i: int) -> None:
        tally, k = tallies[i], offsets[i]
        reader = writer = None
        used = False
        while True:
            t0 = time.perf_counter()
            if t0 >= window.end:
                break
            payload = payloads[k]
            k = k + 1 if k + 1 < n else 0
            tally.sent += 1
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                    used = False
                try:
                    status, close = await asyncio.wait_for(
                        exchange(reader, writer, payload), timeout_s
                    )
                except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
                    partial = getattr(exc, "partial", b"")
                    if not used or partial:
                        raise
                    reconnects[0] += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    status, close = await asyncio.wait_for(
                        exchange(reader, writer, payload), timeout_s
                    )
                used = True
                if close:
                    writer.close()
                    writer = None
                tally.add(window, t0, time.perf_counter(), status)
            except Exception as exc:  # every failure is a counted error
                tally.add(window, t0, time.perf_counter(), _error_kind(exc))
                if writer is not None:
                    writer.close()
                    writer = None
                await asyncio.sleep(0.01)
        if writer is not None:
            writer.close()

    tasks = [asyncio.create_task(client(i)) for i in range(len(offsets))]
    await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
    mark("start")
    await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
    mark("end")
    _, pending = await asyncio.wait(tasks, timeout=timeout_s + 5.0)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5.0)
    return reconnects[0]


def _sleep_until(t: float) -> None:
    while (left := t - time.perf_counter()) > 0:
        time.sleep(min(left, 0.5))


# -------------------------------------------------------------------- processes (/proc)


def _proc_stat(pid: int) -> tuple[int, int, int, float, int] | None:
    """(ppid, pgid, session, CPU seconds, start time in ticks) of a live process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[0] == b"Z":  # a zombie has finished: it holds no CPU and needs no kill
        return None
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    return int(fields[1]), int(fields[2]), int(fields[3]), cpu, int(fields[19])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _tree_cpu_seconds(pids: Iterable[int]) -> float:
    total = 0.0
    for pid in pids:
        st = _proc_stat(pid)
        if st is not None:
            total += st[3]
    return total


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def free_port(low: int = 20000, high: int = 32000) -> int:
    """A free TCP port between Ray's worker ports (10002-19999) and Linux's ephemeral
    range (32768-60999), so that no process a server starts meanwhile takes it."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {low} and {high}")


# ----------------------------------------------------------------------------- servers


@dataclass
class ServerSpec:
    """How to start one server and talk to it. ``{port}`` in ``argv`` is replaced by a
    free port at each start; ``env`` is added to this process's environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    openai_path: str | None = "/v1/embeddings"
    tei_path: str | None = "/embed"
    model: str = SERVED_MODEL
    version: str | None = None
    facts: dict = field(default_factory=dict)  # recorded with every row (mode, threads, ...)

    def path(self, route: str) -> str | None:
        return self.openai_path if route == "openai" else self.tei_path


class ServerError(RuntimeError):
    """A server that exited, or did not answer, before it was ready."""


class ServerProcess:
    """One run of a :class:`ServerSpec`: ``start()``, ``wait_ready()``, ``stop()`` (or
    a ``with`` block: start and ready on entry, stop on exit)."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        host: str = "127.0.0.1",
        cpus: Sequence[int] | None = None,
        log_path: str | os.PathLike | None = None,
        route: str = "openai",
        start_timeout_s: float = 300.0,
        grace_s: float = 30.0,
        settle_s: float = 5.0,
    ):
        self.spec, self.host, self.route = spec, host, route
        self.settle_s = settle_s
        self.cpus = sorted(cpus) if cpus else None
        self.log_path = Path(log_path) if log_path else None
        self.start_timeout_s, self.grace_s = start_timeout_s, grace_s
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None
        self.first_answer_s: float | None = None
        self.dim: int | None = None
        self.stop_info: dict | None = None
        self._seen: dict[int, tuple[int, str]] = {}  # pid -> (start ticks, command)
        self._t0 = 0.0
        self._log = None

    # -- start
    def start(self) -> ServerProcess:
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in self.spec.argv]
        env = dict(os.environ)
        env.update(self.spec.env)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # closed in stop()
            self._log.write(f"\n=== {time.strftime('%F %T')} {argv}\n".encode())
            self._log.flush()
        cpus = self.cpus

        def pin():  # in the child, before exec: the server and all it starts
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        self._t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log if self._log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=pin if cpus is not None else None,
        )
        return self

    def wait_ready(self) -> ServerProcess:
        """Poll the health route until it answers 200, then send one embedding request
        and check its answer (one vector): ``ready_s`` and ``first_answer_s`` are the
        seconds since the start."""
        deadline = self._t0 + self.start_timeout_s
        while True:
            self._check_alive()
            try:
                status, _ = _http_get(self.host, self.port, self.spec.health_path, timeout=2.0)
                if status == 200:
                    break
            except OSError:
                pass
            if time.perf_counter() > deadline:
                raise ServerError(f"{self.spec.name}: not healthy after {self.start_timeout_s:g} s")
            time.sleep(0.2)
        self.ready_s = time.perf_counter() - self._t0
        path = self.spec.path(self.route)
        if path is None:
            raise ServerError(f"{self.spec.name} has no {self.route} route")
        body = request_body("is this server ready to answer", self.route, self.spec.model)
        while True:
            self._check_alive()
            try:
                status, data = _http_post(self.host, self.port, path, body)
            except OSError:
                status, data = None, b""
            if status == 200:
                self.dim = _answer_dim(data, self.route)
                break
            if time.perf_counter() > deadline:
                raise ServerError(
                    f"{self.spec.name}: POST {path} answered {status}: {data[:300]!r}"
                )
            time.sleep(0.5)
        self.first_answer_s = time.perf_counter() - self._t0
        self.snapshot()
        return self

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise ServerError(
                f"{self.spec.name} exited with code {self.proc.returncode} before it was "
                f"ready; log tail:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, "rb") as f:
            text = f.read()[-20000:].decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- processes
    def snapshot(self) -> None:
        """Remember every process this server has started so far (descendants and its
        session), so that :meth:`stop` can find any left behind."""
        if self.proc is None:
            return
        stats = {pid: st for pid in _all_pids() if (st := _proc_stat(pid)) is not None}
        root = self.proc.pid
        mine = {root} if root in stats else set()
        mine |= {pid for pid, st in stats.items() if st[2] == root}  # its session
        grew = True
        while grew:
            new = {pid for pid, st in stats.items() if st[0] in mine and pid not in mine}
            mine |= new
            grew = bool(new)
        for pid in mine:
            if pid not in self._seen:
                self._seen[pid] = (stats[pid][4], _cmdline(pid))

    def pids(self) -> list[int]:
        """The server's processes now (its tree; refreshed on each call)."""
        self.snapshot()
        return [pid for pid in self._seen if self._alive(pid)]

    def _alive(self, pid: int) -> bool:
        st = _proc_stat(pid)
        return st is not None and st[4] == self._seen[pid][0]

    # -- stop
    def stop(self) -> dict:
        """SIGTERM, the process group killed after ``grace_s``, then any process it
        started that is still alive ``settle_s`` later is a leftover: reported and
        killed. Returns ``{"stop_s", "exit_code", "killed", "leftovers"}``."""
        if self.stop_info is not None:
            return self.stop_info
        if self.proc is None:
            return {}
        self.snapshot()
        t0 = time.perf_counter()
        killed = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            killed = True
            _killpg(self.proc.pid)
            self.proc.wait(10)
        stop_s = time.perf_counter() - t0
        self.snapshot_session()
        deadline = time.perf_counter() + self.settle_s  # orphaned workers exit on their own
        while (alive := [p for p in self._seen if self._alive(p)]) and (
            time.perf_counter() < deadline
        ):
            time.sleep(0.2)
        leftovers = [f"{pid} {self._seen[pid][1]}" for pid in alive]
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _killpg(self.proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.stop_info = {
            "stop_s": round(stop_s, 3),
            "exit_code": self.proc.returncode,
            "killed": killed,
            "leftovers": leftovers,
        }
        return self.stop_info

    def snapshot_session(self) -> None:
        """After the leader is gone: what is still in its session or process group."""
        root = self.proc.pid
        for pid in _all_pids():
            st = _proc_stat(pid)
            if st is not None and (st[2] == root or st[1] == root) and pid not in self._seen:
                self._seen[pid] = (st[4], _cmdline(pid))

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _answer_dim(data: bytes, route: str) -> int:
    """The length of the one vector in an embedding answer; ServerError if there is none."""
    try:
        answer = json.loads(data)
        vector = answer["data"][0]["embedding"] if route == "openai" else answer[0]
        if not isinstance(vector, list) or not vector:
            raise TypeError("not a list of numbers")
        float(vector[0])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ServerError(f"not an embedding answer ({exc}): {data[:200]!r}") from None
    return len(vector)


# ------------------------------------------------------------------------ server specs


def _thread_env(threads: int | None) -> dict[str, str]:
    if not threads:
        return {}
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def bertfast_serve_modes(python: str = sys.executable) -> dict[str, str]:
    """What ``python -m bertfast serve --help`` offers: ``{"default": "embedded" or
    "ray", "help": text}``; ``--ray`` in it means the default is the embedded server."""
    out = subprocess.run(
        [python, "-m", "bertfast", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise ServerError(f"`bertfast serve --help` failed: {text[-500:]}")
    return {"default": "embedded" if "--ray" in text else "ray", "help": text}


def bertfast_spec(
    model_path: str,
    *,
    mode: str = "default",
    threads: int | None = None,
    python: str = sys.executable,
    extra_args: Sequence[str] = (),
    serve_help: dict | None = None,
) -> ServerSpec:
    """``python -m bertfast serve``: ``mode`` "default" (what the command runs without
    ``--ray``), "ray" (``--ray`` where the flag exists, else the default, which is Ray
    Serve then) or "embedded". The thread budget: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
    for all, and ``--cpus-per-replica threads`` (Ray) or ``--threads threads`` (embedded)
    where ``--help`` lists the flag."""
    info = serve_help or bertfast_serve_modes(python)
    has_ray_flag = info["default"] == "embedded"
    argv = [python, "-m", "bertfast", "serve", "--model", str(model_path)]
    argv += ["--host", "127.0.0.1", "--port", "{port}"]
    if mode == "default":
        mode = info["default"]
    elif mode == "embedded" and not has_ray_flag:
        raise ServerError("`bertfast serve` has no embedded server yet (only Ray Serve)")
    elif mode == "ray" and has_ray_flag:
        argv.append("--ray")
    elif mode not in ("ray", "embedded"):
        raise ValueError(f"mode must be default, ray or embedded, not {mode!r}")
    if mode == "ray" and threads and "--cpus-per-replica" in info["help"]:
        argv += ["--cpus-per-replica", str(threads)]
    elif mode == "embedded" and threads and "--threads" in info["help"]:
        argv += ["--threads", str(threads)]
    argv += list(extra_args)
    try:
        from importlib.metadata import version

        ver = version("bertfast")
    except Exception:  # a version is a fact to record
        ver = None
    from ..info import git_revision

    git = git_revision(mark_dirty=True)
    name = "bertfast-ray" if mode == "ray" and has_ray_flag else "bertfast"
    return ServerSpec(
        name=name,
        argv=argv,
        env=_thread_env(threads),
        version=f"{ver} ({git})" if git else ver,
        facts={"mode": mode, "threads": threads},
    )


def infinity_spec(
    executable: str,
    model_path: str,
    *,
    threads: int | None = None,
    batch_size: int = 32,
    extra_args: Sequence[str] = (),
) -> ServerSpec:
    """``infinity_emb v2`` on the torch engine, CPU, fp32, no vector cache (it would
    answer repeated texts from disk), offline, no telemetry."""
    argv = [executable, "v2", "--model-id", str(model_path), "--served-model-name", SERVED_MODEL]
    argv += ["--engine", "torch", "--device", "cpu", "--dtype", "float32"]
    argv += ["--batch-size", str(batch_size), "--no-vector-disk-cache"]
    argv += ["--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"]
    argv += list(extra_args)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    env["INFINITY_ANONYMOUS_USAGE_STATS"] = "0"
    env.update(_thread_env(threads))
    python = Path(executable).with_name("python")
    ver = None
    if python.exists():
        out = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('infinity-emb'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        ver = out.stdout.strip() or None
    return ServerSpec(
        name="infinity",
        argv=argv,
        env=env,
        openai_path="/embeddings",
        tei_path=None,
        version=ver,
        facts={"threads": threads, "batch_size": batch_size, "engine": "torch"},
    )


def trivial_spec(**options) -> ServerSpec:
    """The trivial server (:func:`trivial_server`) as a process; ``options`` become its
    flags (``delay_ms=5`` -> ``--delay-ms 5``, ``spawn_child=True`` -> ``--spawn-child``)."""
    argv = [sys.executable, "-I", str(Path(__file__).resolve()), "trivial-server"]
    argv += ["--host", "127.0.0.1", "--port", "{port}"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (None, False):
            argv += [flag, str(value)]
    return ServerSpec(name="trivial", argv=argv, version="-", facts=dict(options))


def machine_facts() -> dict:
    """The CPU (model, logical CPUs) and Python, recorded with every row."""
    from ..info import cpu_info

    info = cpu_info()
    return {
        "cpu": info["model"],
        "logical_cpus": info["logical_cpus"],
        "python": sys.version.split()[0],
    }


# -------------------------------------------------------------------------------- runs


@dataclass
class _Plan:
    """What every server start of one :func:`run_servers` shares."""

    levels: Sequence[int]
    duration_s: float
    warmup_s: float
    route: str
    engine: str
    server_cpus: list[int] | None
    jsonl: str | os.PathLike | None
    log_dir: str | os.PathLike | None
    start_timeout_s: float
    grace_s: float
    common: dict
    say: Callable[[str], None]
    queries: list[str] = field(default_factory=make_queries)
    offset: int = 0  # where the next level starts in ``queries``


def run_servers(
    specs: Sequence[ServerSpec],
    levels: Sequence[int] = (1, 4, 16, 32),
    *,
    duration_s: float = 15.0,
    warmup_s: float = 3.0,
    rounds: int = 2,
    route: str = "openai",
    engine: str = "raw",
    client_cpus: Sequence[int] | None = None,
    server_cpus: Sequence[int] | None = None,
    jsonl: str | os.PathLike | None = None,
    log_dir: str | os.PathLike | None = None,
    start_timeout_s: float = 300.0,
    grace_s: float = 30.0,
    command: str | None = None,
    machine: dict | None = None,
    say: Callable[[str], None] = print,
) -> list[dict]:
    """Every spec at every client level, one server process at a time, ``rounds`` times
    with the order reversed every other round. Returns the rows (also appended to
    ``jsonl``): ``{"row": "server", ...}`` per start, ``{"row": "level", ...}`` per level.
    ``client_cpus`` pins this process (the load generator); the servers get
    ``server_cpus``, by default the CPUs this process had that the client does not get
    (all of them when the client is not pinned)."""
    before = sorted(os.sched_getaffinity(0))
    if server_cpus is None and client_cpus:
        server_cpus = [c for c in before if c not in set(client_cpus)] or before
    plan = _Plan(
        levels=list(levels),
        duration_s=duration_s,
        warmup_s=warmup_s,
        route=route,
        engine=engine,
        server_cpus=sorted(server_cpus) if server_cpus else None,
        jsonl=jsonl,
        log_dir=log_dir,
        start_timeout_s=start_timeout_s,
        grace_s=grace_s,
        common={
            "route": route,
            "engine": engine,
            "client_cpus": sorted(client_cpus) if client_cpus else None,
            "server_cpus": sorted(server_cpus) if server_cpus else None,
            "machine": machine if machine is not None else machine_facts(),
            "command": command,
        },
        say=say,
    )
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    rows: list[dict] = []
    try:
        for rnd in range(rounds):
            order = list(specs) if rnd % 2 == 0 else list(reversed(specs))
            for spec in order:
                plan.offset = 0  # every server gets the same query sequence
                rows += _run_one(spec, rnd + 1, plan)
    finally:
        if client_cpus:
            os.sched_setaffinity(0, before)
    return rows


def _run_one(spec: ServerSpec, rnd: int, plan: _Plan) -> list[dict]:
    from .sweep import append_row

    say = plan.say
    base = {"server": spec.name, "version": spec.version, "round": rnd, **spec.facts}
    path = spec.path(plan.route)
    if path is None:
        say(f"{spec.name}: no {plan.route} route, skipped")
        return []
    log = Path(plan.log_dir) / f"{spec.name}-round{rnd}.log" if plan.log_dir else None
    server = ServerProcess(
        spec,
        cpus=plan.server_cpus,
        log_path=log,
        route=plan.route,
        start_timeout_s=plan.start_timeout_s,
        grace_s=plan.grace_s,
    )
    rows = []
    say(f"round {rnd}: starting {spec.name} ({spec.version})")
    server.start()
    error = None
    try:
        server.wait_ready()
        say(
            f"  {spec.name}: healthy after {server.ready_s:.1f} s, first answer after "
            f"{server.first_answer_s:.1f} s (dim {server.dim})"
        )
        for clients in plan.levels:
            load = os.getloadavg()[0]
            result = run_load(
                server.host,
                server.port,
                clients,
                plan.duration_s,
                plan.warmup_s,
                path=path,
                route=plan.route,
                model=spec.model,
                queries=plan.queries,
                offset=plan.offset,
                engine=plan.engine,
                server_pids=server.pids,
            )
            plan.offset += result.sent
            row = {"row": "level", **base, **result.row(), "loadavg_1m_before": load}
            row.update(plan.common)
            rows.append(row)
            if plan.jsonl is not None:
                append_row(plan.jsonl, row)
            say(
                f"  {spec.name} x{clients}: {row['requests_per_s']:.1f} req/s, p50 "
                f"{row['p50_ms']} ms, p99 {row['p99_ms']} ms, errors {row['errors']}, client "
                f"{row['client_cpu_us_per_request']} us CPU/req, server "
                f"{row['server_cpu_ms_per_request']} ms CPU/req"
            )
    except ServerError as exc:
        error = str(exc)
        say(f"  {spec.name}: {error}")
    finally:
        stop = server.stop()
    if stop.get("leftovers"):
        say(f"  {spec.name}: LEFTOVER processes killed: {stop['leftovers']}")
    row = {
        "row": "server",
        **base,
        "ready_s": _round(server.ready_s),
        "first_answer_s": _round(server.first_answer_s),
        "dim": server.dim,
        **stop,
        "error": error,
        "argv": [a.replace("{port}", str(server.port)) for a in spec.argv],
        "env": spec.env,
        "log": str(log) if log else None,
        **plan.common,
    }
    rows.append(row)
    if plan.jsonl is not None:
        append_row(plan.jsonl, row)
    say(f"  {spec.name}: stopped in {stop.get('stop_s')} s (exit {stop.get('exit_code')})")
    return rows


# ------------------------------------------------------------------------------ report


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ms(x: float | None) -> str:
    return _fmt(x, 2 if x is not None and x < 10 else 1)


def format_markdown(rows: Sequence[dict], command: str | None = None) -> str:
    """The serving table: per client level and server the mean over rounds of req/s and
    latency percentiles (req/s per round beside it), and the ratios of every other server
    to ``infinity``: req/s ratio (higher is better) and p99 ratio (lower is better)."""
    levels = [r for r in rows if r.get("row") == "level"]
    starts = [r for r in rows if r.get("row") == "server"]
    first = (levels or starts or [{}])[0]
    command = command or first.get("command")
    machine = first.get("machine") or {}
    servers: list[str] = []
    for r in levels + starts:
        if r["server"] not in servers:
            servers.append(r["server"])
    out = ["# Serving benchmark", ""]
    if command:
        out += ["```bash", command, "```", ""]
    out.append(
        f"CPU: {machine.get('cpu')} ({machine.get('logical_cpus')} logical CPUs); route "
        f"{first.get('route')}, load generator `{first.get('engine')}`, client CPUs "
        f"{first.get('client_cpus') or 'any'}, server CPUs {first.get('server_cpus') or 'any'}; "
        f"{first.get('duration_s')} s measured after {first.get('warmup_s')} s warm-up per "
        "level; closed loop, one short query (<= 12 words) per request."
    )
    out.append("")
    for name in servers:
        r = next((x for x in starts + levels if x["server"] == name), {})
        facts = [f"{k} {r[k]}" for k in ("mode", "threads", "batch_size") if r.get(k)]
        line = f"- `{name}` {r.get('version')}" + (f" ({', '.join(facts)})" if facts else "")
        if r.get("argv"):
            env = [f"{k}={v}" for k, v in (r.get("env") or {}).items()]
            line += ": `" + " ".join(env + r["argv"]) + "`"
        out.append(line)
    out.append("")
    by: dict[tuple[int, str], list[dict]] = {}
    for r in levels:
        by.setdefault((r["clients"], r["server"]), []).append(r)
    clients_list = sorted({c for c, _ in by})
    out += [
        "| clients | server | req/s (per round) | p50 ms | p90 ms | p99 ms | errors "
        "| client CPU us/req | server CPU ms/req |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    summary: dict[tuple[int, str], dict] = {}
    for c in clients_list:
        for name in servers:
            rs = by.get((c, name))
            if not rs:
                continue
            s = {
                k: _mean([r.get(k) for r in rs])
                for k in (
                    "requests_per_s",
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "client_cpu_us_per_request",
                    "server_cpu_ms_per_request",
                )
            }
            summary[(c, name)] = s
            per_round = " / ".join(_fmt(r["requests_per_s"]) for r in rs)
            errors = sum(r.get("errors", 0) for r in rs)
            out.append(
                f"| {c} | {name} | **{_fmt(s['requests_per_s'])}** ({per_round}) "
                f"| {_ms(s['p50_ms'])} | {_ms(s['p90_ms'])} | {_ms(s['p99_ms'])} | {errors} "
                f"| {_fmt(s['client_cpu_us_per_request'], 0)} "
                f"| {_fmt(s['server_cpu_ms_per_request'], 2)} |"
            )
    others = [n for n in servers if n != "infinity"]
    if "infinity" in servers and others:
        out += ["", "Ratios against infinity (req/s: higher is better; p99: lower is better):", ""]
        out.append(
            "| clients | "
            + " | ".join(f"{n} / infinity req/s | {n} / infinity p99" for n in others)
            + " |"
        )
        out.append("|---:|" + "---:|---:|" * len(others))
        for c in clients_list:
            ref = summary.get((c, "infinity"))
            cells = []
            for n in others:
                s = summary.get((c, n))
                if not ref or not s or not ref["requests_per_s"] or not ref["p99_ms"]:
                    cells += ["-", "-"]
                    continue
                cells.append(f"{s['requests_per_s'] / ref['requests_per_s']:.2f}x")
                cells.append(f"{s['p99_ms'] / ref['p99_ms']:.2f}x")
            out.append(f"| {c} | " + " | ".join(cells) + " |")
    if starts:
        out += [
            "",
            "| server | round | healthy s | first answer s | stop s | exit | leftovers | error |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in starts:
            leftovers = "; ".join(r.get("leftovers") or []) or "none"
            out.append(
                f"| {r['server']} | {r['round']} | {_fmt(r.get('ready_s'))} "
                f"| {_fmt(r.get('first_answer_s'))} | {_fmt(r.get('stop_s'))} "
                f"| {r.get('exit_code')}{' (killed)' if r.get('killed') else ''} "
                f"| {leftovers} | {r.get('error') or ''} |"
            )
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------- trivial server

_TRIVIAL_VECTOR = [round(((i * 7919) % 1000) / 1000.0 - 0.5, 9) for i in range(384)]


def trivial_server(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    delay_ms: float = 0.0,
    fail_every: int = 0,
    close_every: int = 0,
    ignore_sigterm: bool = False,
    spawn_child: bool = False,
) -> None:
    """An HTTP/1.1 server that answers at once: ``GET /health`` 200, ``POST`` anything a
    canned OpenAI-style answer with one 384-float vector (``/embed``: a TEI answer), the
    size of a real one. ``delay_ms`` delays every POST answer but the first (the
    readiness check); ``fail_every`` k answers every
    k-th POST with 500; ``close_every`` k closes the connection after every k-th answer
    (``Connection: close``); ``ignore_sigterm`` makes it need a kill; ``spawn_child``
    starts a child in a session of its own that ignores SIGTERM and lives 10 minutes (a
    process a server forgets to stop). Runs until killed."""
    vector = json.dumps(_TRIVIAL_VECTOR, separators=(",", ":"))
    openai = (
        '{"object":"list","data":[{"object":"embedding","index":0,"embedding":'
        + vector
        + '}],"model":"trivial","usage":{"prompt_tokens":8,"total_tokens":8}}'
    ).encode()
    tei = f"[{vector}]".encode()

    def response(status: str, body: bytes, close: bool = False) -> bytes:
        head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\n"
        if close:
            head += "Connection: close\r\n"
        return (head + "\r\n").encode() + body

    canned = {
        "health": response("200 OK", b'{"status":"ok"}'),
        "openai": response("200 OK", openai),
        "openai-close": response("200 OK", openai, close=True),
        "tei": response("200 OK", tei),
        "tei-close": response("200 OK", tei, close=True),
        "fail": response("500 Internal Server Error", b'{"error":"asked to fail"}'),
        "missing": response("404 Not Found", b'{"error":"no such route"}'),
    }
    count = [0]

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool, bool]:  # reply, close, delay
        if method == b"GET":
            return canned["health" if path in (b"/health", b"/models") else "missing"], False, False
        count[0] += 1
        n = count[0]
        if fail_every and n % fail_every == 0:
            return canned["fail"], False, n > 1
        close = bool(close_every) and n % close_every == 0
        kind = "tei" if path == b"/embed" else "openai"
        return canned[kind + ("-close" if close else "")], close, n > 1

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, b""
            self.transport.get_extra_info("socket").setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
            )

        def data_received(self, data):
            self.buf += data
            while (end := self.buf.find(b"\r\n\r\n")) >= 0:
                head = self.buf[:end]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(self.buf) < end + 4 + length:
                    return
                self.buf = self.buf[end + 4 + length :]
                method, path = head.split(b" ", 2)[:2]
                reply, close, delay = answer(method, path)
                if delay and delay_ms > 0:
                    loop.call_later(delay_ms / 1000.0, self.send, reply, close)
                else:
                    self.send(reply, close)

        def send(self, reply, close):
            if self.transport.is_closing():
                return
            self.transport.write(reply)
            if close:
                self.transport.close()

    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spawn_child:
        subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "time.sleep(600)",
            ],
            start_new_session=True,
        )
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(
        loop.create_server(Protocol, host, port, reuse_address=True, backlog=1024)
    )
    print(f"trivial server on http://{host}:{port}", flush=True)
    try:
        loop.run_until_complete(server.serve_forever())
    finally:
        loop.close()


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the serving benchmark's helpers")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("trivial-server", help="a server that answers at once")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--close-every", type=int, default=0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--spawn-child", action="store_true")
    args = parser.parse_args(argv)
    trivial_server(
        args.host,
        args.port,
        delay_ms=args.delay_ms,
        fail_every=args.fail_every,
        close_every=args.close_every,
        ignore_sigterm=args.ignore_sigterm,
        spawn_child=args.spawn_child,
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
