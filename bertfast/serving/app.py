"""The embedded embedding server: one process, a Starlette ASGI app on uvicorn, the model
loaded once, dynamic batching in process.

A request's life (``POST /embed`` or ``/v1/embeddings``):

1. on the event loop: the API key (:func:`protocol.check_api_key`), the body read up to
   its size cap, a cheap early 429 when the queue is already full;
2. JSON parsing, validation and tokenisation (:class:`~bertfast.serving.prepare.Preparer`):
   on the event loop for a body of at most :data:`INLINE_BODY_BYTES` (a short query
   costs about 0.1 ms, less than the two thread switches it would take), else in a
   worker thread (``workers`` of them), so neither a 5 MB text nor a deeply nested body
   holds up the event loop or the model;
3. the batcher's queue (429 with ``Retry-After`` past ``max_queue`` texts), then a round
   on the model thread (:class:`~bertfast.serving.batcher.Batcher`);
4. the answer's JSON (:func:`protocol.embed_response`): on the event loop where
   ``orjson`` writes it (about 20 µs a vector), else in a worker thread.

Steps 2-4 run under the request timeout (504; a round already running still completes,
a request still queued leaves the queue). ``/health`` answers without the key;
``/info``, ``/stats`` and ``/metrics`` (:mod:`~bertfast.serving.metrics`) need it when
one is set.

:func:`create_app` builds the app around a loaded :class:`bertfast.Embedder`; its
lifespan starts the model thread and, at shutdown, drains it. :func:`serve` runs it in
the foreground: it binds the socket first (so the address it prints is the real one,
``port=0`` included), and on SIGTERM or Ctrl-C uvicorn stops accepting connections,
finishes the requests in flight, then the lifespan drains the batcher; the call returns
normally (a second Ctrl-C forces the exit). Nothing is written to disk and no process is
started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from . import protocol
from .batcher import Batcher, Closed, QueueFull, embed_items
from .prepare import Preparer
from .protocol import OPENAI, ROUTES, TEI, Limits, RequestError

__all__ = ["Settings", "EmbeddingServer", "create_app", "make_server", "bind", "serve"]


#: Bodies up to this size are parsed and tokenised on the event loop (at most a few
#: hundred characters of text: well under a millisecond); bigger ones in a worker thread.
INLINE_BODY_BYTES = 1024


@dataclass
class Settings:
    """The embedded server's settings (``bertfast serve`` options of the same names).

    ``model_name``: what ``/info`` and OpenAI answers call the model; ``limits``: per
    request (:class:`~bertfast.serving.protocol.Limits`); ``auto_truncate``: truncate
    texts past the token limit unless a TEI request says ``"truncate": false``;
    ``max_batch_size`` texts and ``max_batch_tokens`` tokens per model batch, which
    waits at most ``batch_wait_ms`` to fill; ``max_queue``: texts waiting, past which
    requests get 429; ``request_timeout_s``: per request (504); ``api_key``: required as
    ``Authorization: Bearer <key>`` when set; ``workers``: threads that parse, tokenise
    and render answers (None: 2, or 1 on a one-CPU machine); ``threads``: torch's CPU
    threads (None: torch's own)."""

    model_name: str = "model"
    limits: Limits = field(default_factory=Limits)
    auto_truncate: bool = False
    max_batch_size: int = 32
    max_batch_tokens: int = 16384
    batch_wait_ms: float = 0.0
    max_queue: int = 1024
    request_timeout_s: float = 60.0
    api_key: str | None = None
    workers: int | None = None
    threads: int | None = None

    def __post_init__(self):
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, not {self.request_timeout_s!r}")
        if self.workers is None:
            self.workers = max(1, min(2, os.cpu_count() or 1))
        if self.api_key == "":
            raise ValueError("api_key must not be empty (None: no key)")


class EmbeddingServer:
    """The request handling behind the app: the embedder, its preparer, batcher and
    metrics, and one handler per route (see the module docstring)."""

    def __init__(self, embedder, settings: Settings):
        from .metrics import Metrics

        self.embedder, self.settings = embedder, settings
        self.preparer = Preparer(embedder, settings.limits, auto_truncate=settings.auto_truncate)
        self.metrics = Metrics(ROUTES, lambda: self.batcher.waiting)
        run = functools.partial(
            embed_items,
            embedder,
            batch_size=settings.max_batch_size,
            max_tokens=settings.max_batch_tokens,
        )
        self.batcher = Batcher(
            run,
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            batch_wait_s=settings.batch_wait_ms / 1000.0,
            max_queue=settings.max_queue,
            on_batch=self.metrics.batch,
            threads=settings.threads,
        )
        self.pool: ThreadPoolExecutor | None = None
        self.started = time.time()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="bertfast-prep")
        self.batcher.start()

    def close(self) -> None:
        """Finish every queued request, then stop the model and worker threads."""
        self.batcher.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    # ------------------------------------------------------------ routes
    async def handle(self, request) -> Any:
        from starlette.responses import Response

        path = request.url.path
        start = time.perf_counter()
        try:
            _, needs_key = ROUTES[path]
            if needs_key:
                protocol.check_api_key(request.headers.get("authorization"), self.settings.api_key)
            if path in (TEI, OPENAI):
                body, media = await self._embed(request, path), "application/json"
            elif path == "/metrics":
                body, media = self.metrics.render(), self.metrics.content_type
            else:
                result = {"/health": _OK, "/info": self.info, "/stats": self.stats}[path]()
                body, media = protocol.json_bytes(result), "application/json"
            response = Response(body, media_type=media)
        except Exception as exc:
            response = self.refusal(path, exc)
        self.metrics.request(path, response.status_code, time.perf_counter() - start)
        return response

    def refusal(self, path: str, exc: BaseException):
        """The JSON answer to a refused (or failed) request."""
        from starlette.responses import Response

        if not isinstance(exc, RequestError):
            exc = protocol.model_failed(exc)
        status, body, headers = protocol.error_response(path, exc)
        return Response(body, status, headers, media_type="application/json")

    async def route_error(self, request, exc) -> Any:
        """Starlette's 404 / 405, answered as :func:`protocol.route_error` says."""
        start = time.perf_counter()
        path = request.url.path
        response = self.refusal(path, protocol.route_error(path, request.method, ROUTES))
        self.metrics.request(path, response.status_code, time.perf_counter() - start)
        return response

    async def _read_body(self, request) -> bytes:
        cap = self.settings.limits.max_body_bytes
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > cap:
            raise protocol.body_too_large(cap)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise protocol.body_too_large(cap)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _embed(self, request, path: str) -> bytes:
        if self.batcher.full():  # refused before its body is read or tokenised
            raise protocol.queue_full(self.batcher.waiting, self.batcher.max_queue)
        body = await self._read_body(request)
        timeout = self.settings.request_timeout_s
        try:
            return await asyncio.wait_for(self._answer(path, body), timeout)
        except asyncio.TimeoutError:
            raise protocol.timed_out(timeout) from None

    async def _answer(self, path: str, body: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        if len(body) <= INLINE_BODY_BYTES:
            prepared = self.preparer.prepare(path, body)
        else:
            prepared = await loop.run_in_executor(self.pool, self.preparer.prepare, path, body)
        try:
            future = self.batcher.submit(
                prepared.items, prepared.request.normalize, prepared.tokens
            )
        except QueueFull as exc:
            raise protocol.queue_full(exc.waiting, exc.limit) from None
        except Closed:
            raise protocol.shutting_down() from None
        vectors = await asyncio.wrap_future(future)
        if protocol.fast_json():
            return protocol.embed_response(
                prepared.request, vectors, prepared.tokens, self.settings.model_name
            )
        return await loop.run_in_executor(
            self.pool,
            protocol.embed_response,
            prepared.request,
            vectors,
            prepared.tokens,
            self.settings.model_name,
        )

    def info(self) -> dict[str, Any]:
        import torch

        s = self.settings
        info = protocol.describe_model(self.embedder, s.model_name)
        info.update(
            server="embedded",
            auto_truncate=s.auto_truncate,
            max_batch_size=s.max_batch_size,
            max_batch_tokens=s.max_batch_tokens,
            batch_wait_ms=s.batch_wait_ms,
            max_queue=s.max_queue,
            request_timeout_s=s.request_timeout_s,
            threads=s.threads or torch.get_num_threads(),
            workers=s.workers,
            api_key=s.api_key is not None,
            **asdict(s.limits),
        )
        return info

    def stats(self) -> dict[str, Any]:
        stats = self.batcher.stats.as_dict()
        stats.update(
            queue_texts=self.batcher.waiting,
            running_texts=self.batcher.running,
            rss_bytes=rss_bytes(),
            uptime_s=round(time.time() - self.started, 3),
        )
        return stats


_OK = functools.partial(dict, status="ok")


def rss_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``), None where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def create_app(embedder, settings: Settings):
    """A Starlette app serving ``embedder`` (a loaded :class:`bertfast.Embedder`); its
    :class:`EmbeddingServer` is ``app.state.server``. The model thread runs from the
    app's lifespan startup to its shutdown."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    server = EmbeddingServer(embedder, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, server.close)

    routes = [Route(path, server.handle, methods=[method]) for path, (method, _) in ROUTES.items()]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: server.route_error, 405: server.route_error},
    )
    app.state.server = server
    return app


# ---------------------------------------------------------------- running it
def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port); ``OSError`` when
    the address is taken or not this machine's."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.set_inheritable(False)
    except OSError:
        sock.close()
        raise
    return sock


def address(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def make_server(app, settings: Settings, log_level: str = "warning", access_log: bool = False):
    """A ``uvicorn.Server`` for ``app``: graceful shutdown waits for the requests in
    flight (at most the request timeout and a little more)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=int(settings.request_timeout_s) + 10,
        server_header=False,
    )
    return uvicorn.Server(config)


def serve(
    embedder,
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    on_ready: Callable[[str], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    log_level: str = "warning",
    access_log: bool = False,
) -> None:
    """Serve ``embedder`` on ``host``:``port`` until SIGTERM or Ctrl-C (see the module
    docstring); ``on_ready(address)`` is called once the socket listens, ``on_stop()``
    when the first SIGTERM / SIGINT arrives."""
    sock = bind(host, port)
    server = make_server(
        create_app(embedder, settings), settings, log_level=log_level, access_log=access_log
    )
    if on_stop is not None:
        server.handle_exit = _first_signal(server.handle_exit, on_stop)
    # uvicorn catches SIGINT / SIGTERM while it serves and, after its graceful shutdown,
    # raises the signal again for the handler it found: a no-op one here, so that a
    # requested stop returns normally (exit status 0) instead of killing the process.
    handled = (signal.SIGINT, signal.SIGTERM)
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _ignore) for sig in handled} if main else {}
    try:
        if on_ready is not None:
            on_ready(address(sock))
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def _ignore(signum, frame) -> None:
    pass


def _first_signal(handle_exit, on_stop):
    """uvicorn's signal handler, calling ``on_stop()`` first on the first signal."""
    called = []

    def handler(signum, frame):
        if not called:
            called.append(signum)
            on_stop()
        handle_exit(signum, frame)

    return handler
