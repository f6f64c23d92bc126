"""bertfast's HTTP embedding servers: what they share, and the embedded one.

- :mod:`~bertfast.serving.protocol`: the API both servers speak (routes, API key,
  parsing, validation, limits, answers, every error message); no I/O, no framework.
- :mod:`~bertfast.serving.prepare`: body -> tokenised request, in worker threads.
- :mod:`~bertfast.serving.batcher`: the model step both servers share
  (:func:`~bertfast.serving.batcher.embed_items`) and the embedded server's queue and
  model thread (:class:`~bertfast.serving.batcher.Batcher`).
- :mod:`~bertfast.serving.metrics`: ``GET /metrics`` (Prometheus), embedded server.
- :mod:`~bertfast.serving.app`: the embedded server, a Starlette app on uvicorn in one
  process (``bertfast serve``).

The Ray Serve deployment (:class:`bertfast.ray.EmbeddingService`, ``bertfast serve
--ray``) uses ``protocol``, ``prepare`` and ``embed_items`` and batches with Ray's
``@serve.batch``. Install the embedded server's dependencies (starlette, uvicorn,
prometheus-client) with ``pip install bertfast[serve]``. Nothing is imported here: each
module is imported where it is used.
"""
