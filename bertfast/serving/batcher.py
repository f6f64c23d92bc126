"""Dynamic batching: tokenised requests in, sentence vectors out, on one model thread.

- :func:`embed_items`: the model step both servers share. Tokenised texts are sorted
  longest first, cut into forwards of at most ``batch_size`` texts and ``max_tokens``
  padded tokens (:func:`bertfast.embedder.token_budget_batches`) and run through
  :meth:`bertfast.Embedder.embed_tokenized` (the model runs them padding-free),
  normalised per text where asked. These are the pieces :meth:`bertfast.Embedder.encode`
  runs, in the same order, so a text's vector equals ``encode([text])``'s (to float
  rounding: a forward's other rows change the GEMMs' blocking, not the maths).
- :class:`BatchStats`: what ``/stats`` reports (batches, and requests / texts / tokens
  per batch), thread-safe.
- :class:`Batcher` (embedded server): a queue of requests and one model thread. A round
  starts when the queue holds ``max_batch_size`` texts or ``max_batch_tokens`` tokens, or
  when its oldest request has waited ``batch_wait_s`` (default 0: at once, continuous
  batching); it takes whole requests, oldest first, while they fit both budgets (at
  least one), and runs them with :func:`embed_items`. While a round runs, new requests
  are tokenised elsewhere and queue up: the next round starts at once with all of them,
  so batches grow with the load and a lone request never waits for company.
  ``max_queue`` bounds the texts waiting (:class:`QueueFull` past it, unless the queue
  is empty, so a request bigger than the queue still runs alone). :meth:`Batcher.close`
  stops taking requests and finishes every queued one before the thread ends.

Results travel in :class:`concurrent.futures.Future` objects (thread-safe; an asyncio
caller wraps them with :func:`asyncio.wrap_future`). A request cancelled while queued is
dropped from the queue; one cancelled while its round runs is computed and discarded.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..embedder import token_budget_batches

__all__ = ["embed_items", "BatchStats", "Batcher", "QueueFull", "Closed"]

Items = Sequence[tuple[Sequence[int], Sequence[int]]]


def embed_items(
    embedder,
    items: Items,
    normalize: Sequence[bool],
    *,
    batch_size: int = 32,
    max_tokens: int | None = 16384,
) -> np.ndarray:
    """float32 ``[len(items), dim]``: the vector of each tokenised text (``items`` as
    :meth:`bertfast.tokenizer.Tokenizer.tokenize` returns them), L2-normalised where
    ``normalize[i]``, in input order (see the module docstring)."""
    n = len(items)
    out = np.empty((n, embedder.dim), dtype=np.float32)
    if not n:
        return out
    order = sorted(range(n), key=lambda i: -len(items[i][0]))
    flags = [bool(x) for x in normalize]
    for index in token_budget_batches(
        [len(items[i][0]) for i in order], order, batch_size, max_tokens
    ):
        wanted = [flags[i] for i in index]
        if all(wanted) or not any(wanted):  # the Embedder normalises (or not) them all
            vectors = embedder.embed_tokenized([items[i] for i in index], wanted[0])
        else:
            vectors = embedder.embed_tokenized([items[i] for i in index])
            unit = F.normalize(vectors, p=2.0, dim=-1)
            keep = torch.tensor(wanted, device=vectors.device).unsqueeze(-1)
            vectors = torch.where(keep, unit, vectors)
        out[index] = vectors.float().cpu().numpy()
    return out


class BatchStats:
    """Counts of model batches by requests, texts and tokens per batch (``/stats``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: collections.Counter = collections.Counter()
        self.texts: collections.Counter = collections.Counter()
        self.tokens = 0
        self.max_tokens = 0

    def record(self, requests: int, texts: int, tokens: int = 0) -> None:
        with self._lock:
            self.requests[requests] += 1
            self.texts[texts] += 1
            self.tokens += tokens
            self.max_tokens = max(self.max_tokens, tokens)

    def as_dict(self) -> dict:
        with self._lock:
            requests, texts = dict(self.requests), dict(self.texts)
            tokens, max_tokens = self.tokens, self.max_tokens
        return {
            "batches": sum(requests.values()),
            "requests": sum(k * v for k, v in requests.items()),
            "texts": sum(k * v for k, v in texts.items()),
            "tokens": tokens,
            "max_requests_per_batch": max(requests, default=0),
            "max_texts_per_batch": max(texts, default=0),
            "max_tokens_per_batch": max_tokens,
            "requests_per_batch": {str(k): v for k, v in sorted(requests.items())},
            "texts_per_batch": {str(k): v for k, v in sorted(texts.items())},
        }


class QueueFull(Exception):
    """The queue holds ``waiting`` texts and ``max_queue`` is ``limit``."""

    def __init__(self, waiting: int, limit: int):
        super().__init__(f"{waiting} texts waiting, queue limit {limit}")
        self.waiting, self.limit = waiting, limit


class Closed(Exception):
    """The batcher is closing: it takes no new request."""


@dataclass(eq=False)
class _Job:
    items: Items
    normalize: bool
    tokens: int
    future: Future
    enqueued: float = field(default_factory=time.monotonic)


#: run(items, normalize flags) -> float32 [len(items), dim]
Runner = Callable[[list, list], np.ndarray]
#: on_batch(requests, texts, tokens, seconds)
BatchHook = Callable[[int, int, int, float], None]


class Batcher:
    """Queue + model thread (see the module docstring). ``run`` computes one round's
    vectors (the app passes :func:`embed_items` bound to its embedder); ``on_batch`` is
    called after each round; ``threads`` sets torch's CPU threads in the model thread.

    ``model_lock`` is held by the model thread around each round: holding it elsewhere
    pauses the model between rounds (tests use it to fill the queue on purpose)."""

    def __init__(
        self,
        run: Runner,
        *,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        batch_wait_s: float = 0.0,
        max_queue: int = 1024,
        on_batch: BatchHook | None = None,
        threads: int | None = None,
    ):
        for name, value in (
            ("max_batch_size", max_batch_size),
            ("max_batch_tokens", max_batch_tokens),
            ("max_queue", max_queue),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, not {batch_wait_s!r}")
        self.run, self.on_batch, self.threads = run, on_batch, threads
        self.max_batch_size, self.max_batch_tokens = max_batch_size, max_batch_tokens
        self.batch_wait_s, self.max_queue = float(batch_wait_s), max_queue
        self.stats = BatchStats()
        self.model_lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: collections.deque[_Job] = collections.deque()
        self._texts = 0  # texts in the queue
        self._tokens = 0  # tokens in the queue
        self._running = 0  # texts in the round being computed
        self._closing = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ the caller's side
    @property
    def waiting(self) -> int:
        """Texts in the queue (taken by no round yet)."""
        return self._texts

    @property
    def running(self) -> int:
        """Texts in the round the model thread is on (0 between rounds)."""
        return self._running

    def full(self) -> bool:
        """Whether a request would be refused now (a cheap check before tokenising)."""
        return self._texts >= self.max_queue

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="bertfast-model", daemon=True)
            self._thread.start()

    def submit(self, items: Items, normalize: bool, tokens: int | None = None) -> Future:
        """Queue one request's tokenised texts; its future gets their vectors (float32
        ``[len(items), dim]``) or the model's exception. Raises :class:`QueueFull` or
        :class:`Closed`."""
        n = len(items)
        if tokens is None:
            tokens = sum(len(ids) for ids, _ in items)
        job = _Job(items, bool(normalize), int(tokens), Future())
        job.future.add_done_callback(self._forget)
        with self._cond:
            if self._closing:
                raise Closed()
            if self._texts and self._texts + n > self.max_queue:
                raise QueueFull(self._texts, self.max_queue)
            self._queue.append(job)
            self._texts += n
            self._tokens += job.tokens
            self._cond.notify()
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Take no new request, finish the queued ones, end the model thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _forget(self, future: Future) -> None:
        """A future cancelled while its request waits: take the request off the queue."""
        if not future.cancelled():
            return
        with self._cond:
            for job in self._queue:
                if job.future is future:
                    self._queue.remove(job)
                    self._texts -= len(job.items)
                    self._tokens -= job.tokens
                    break

    # ------------------------------------------------------------ the model thread
    def _ready(self) -> bool:
        return self._texts >= self.max_batch_size or self._tokens >= self.max_batch_tokens

    def _take(self) -> list[_Job]:
        """Whole requests, oldest first, while they fit (at least one); the caller holds
        the condition."""
        jobs: list[_Job] = []
        texts = tokens = 0
        while self._queue:
            job = self._queue[0]
            n = len(job.items)
            if jobs and (
                texts + n > self.max_batch_size or tokens + job.tokens > self.max_batch_tokens
            ):
                break
            self._queue.popleft()
            self._texts -= n
            self._tokens -= job.tokens
            texts, tokens = texts + n, tokens + job.tokens
            # RUNNING: a cancel from now on no longer succeeds (the result is computed)
            if job.future.set_running_or_notify_cancel():
                jobs.append(job)
        return jobs

    def _next_round(self) -> list[_Job] | None:
        """Block until a round is due; None when closing with nothing left."""
        with self._cond:
            while True:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return None
                deadline = self._queue[0].enqueued + self.batch_wait_s
                while self._queue and not self._closing and not self._ready():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                jobs = self._take()
                if jobs:
                    return jobs

    def _loop(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while True:
            jobs = self._next_round()
            if jobs is None:
                return
            items = [item for job in jobs for item in job.items]
            flags = [job.normalize for job in jobs for _ in job.items]
            tokens = sum(job.tokens for job in jobs)
            start = time.perf_counter()
            self._running = len(items)
            try:
                with self.model_lock:
                    vectors = self.run(items, flags)
            except BaseException as exc:  # the requests fail, the thread goes on
                for job in jobs:
                    job.future.set_exception(exc)
                continue
            finally:
                self._running = 0
            seconds = time.perf_counter() - start
            self.stats.record(len(jobs), len(items), tokens)
            if self.on_batch is not None:
                self.on_batch(len(jobs), len(items), tokens, seconds)
            at = 0
            for job in jobs:
                n = len(job.items)
                job.future.set_result(vectors[at : at + n])
                at += n
