"""``GET /metrics``: the embedded server's Prometheus metrics, in a private
:class:`prometheus_client.CollectorRegistry` (so two servers in one process, or a host
application's own metrics, never mix).

=====================================  =========  ==========================================
name                                   type       what
=====================================  =========  ==========================================
``bertfast_requests_total``            counter    requests answered, by ``route`` and ``status``
``bertfast_request_duration_seconds``  histogram  time from the request to its answer, by ``route``
``bertfast_batch_requests``            histogram  requests per model batch
``bertfast_batch_texts``               histogram  texts per model batch
``bertfast_batch_tokens``              histogram  tokens per model batch
``bertfast_batch_duration_seconds``    histogram  model time per batch
``bertfast_queue_texts``               gauge      texts waiting for the model
``bertfast_tokens_total``              counter    tokens embedded
``bertfast_texts_total``               counter    texts embedded
``process_*``                          various    the process's CPU time, memory, open files
=====================================  =========  ==========================================

``route`` is one of the server's paths, or ``other`` for an unknown path (a scan of
random paths must not create a series per path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["Metrics"]

_POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """The metrics of one server; ``routes``: the label values of ``route`` (others
    become ``other``); ``queue_texts``: a function giving the queue depth when scraped."""

    def __init__(self, routes: Iterable[str], queue_texts: Callable[[], float]):
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
        )
        from prometheus_client.process_collector import ProcessCollector

        #: the exposition format's media type, for the answer's Content-Type
        self.content_type = CONTENT_TYPE_LATEST

        self.routes = frozenset(routes)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "bertfast_requests", "Requests answered", ("route", "status"), registry=r
        )
        self.latency = Histogram(
            "bertfast_request_duration_seconds",
            "Time from a request to its answer",
            ("route",),
            registry=r,
        )
        self.batch_requests = Histogram(
            "bertfast_batch_requests", "Requests per model batch", buckets=_POWERS, registry=r
        )
        self.batch_texts = Histogram(
            "bertfast_batch_texts", "Texts per model batch", buckets=_POWERS, registry=r
        )
        self.batch_tokens = Histogram(
            "bertfast_batch_tokens", "Tokens per model batch", buckets=_TOKENS, registry=r
        )
        self.batch_seconds = Histogram(
            "bertfast_batch_duration_seconds", "Model time per batch", registry=r
        )
        self.queue = Gauge("bertfast_queue_texts", "Texts waiting for the model", registry=r)
        self.queue.set_function(queue_texts)
        self.tokens = Counter("bertfast_tokens", "Tokens embedded", registry=r)
        self.texts = Counter("bertfast_texts", "Texts embedded", registry=r)
        ProcessCollector(registry=r)

    def route(self, path: str) -> str:
        return path if path in self.routes else "other"

    def request(self, path: str, status: int, seconds: float) -> None:
        route = self.route(path)
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def batch(self, requests: int, texts: int, tokens: int, seconds: float) -> None:
        self.batch_requests.observe(requests)
        self.batch_texts.observe(texts)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)
        self.tokens.inc(tokens)
        self.texts.inc(texts)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
