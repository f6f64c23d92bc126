"""``bertfast serve``: an HTTP embedding server in the foreground until SIGTERM or Ctrl-C.

By default the embedded server (bertfast.serving.app): one process, the model loaded
once, dynamic batching in process. ``--ray`` runs the Ray Serve deployment
(bertfast.ray.serve_app) instead, for several replicas or machines. Both answer the same
routes with the same request handling (bertfast.serving.protocol).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import time

from . import options
from ._common import UserError, check_quantize_args, checkpoint_path, init_ray, ray_error

NAME = "serve"

#: Defaults of the options whose default depends on the server (None in the parser, so
#: that an option given to the server that lacks it is one clear error).
DEFAULTS = dict(
    max_batch_size=32,
    max_batch_tokens=16384,
    batch_wait_ms=0.0,
    max_queue=1024,
    request_timeout_s=60.0,
    max_client_batch_size=32,
    max_input_chars=8_000_000,
    max_body_mb=16.0,
    replicas=1,
)
#: Ray Serve's batch wait: its @serve.batch forms a batch only while it waits (the
#: embedded server's model thread batches whatever queued while it ran, so it need not).
RAY_BATCH_WAIT_MS = 5.0
#: Options only the embedded server has, and only Ray Serve has.
EMBEDDED_ONLY = ("max_batch_tokens", "max_queue", "request_timeout_s", "threads", "access_log")
RAY_ONLY = ("replicas", "address", "cpus_per_replica", "gpus_per_replica")
API_KEY_ENV = "BERTFAST_API_KEY"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME,
        help="HTTP embedding server (POST /embed, POST /v1/embeddings); --ray for Ray Serve",
        description="Serve a checkpoint over HTTP with dynamic batching: POST /embed "
        "(text-embeddings-inference), POST /v1/embeddings (OpenAI), GET /health, /info, "
        "/stats, /metrics (Prometheus). By default one process holds the model and "
        "batches the requests itself; --ray deploys it on Ray Serve instead (several "
        "replicas, GPUs or machines). Runs in the foreground; SIGTERM or Ctrl-C "
        "finishes the requests in flight and exits.",
        epilog="Security: the server listens on --host only (default 127.0.0.1, this "
        "machine). Listening on another address without --api-key lets anyone who "
        "reaches the port use the model. With --ray, --host applies to Ray Serve's HTTP "
        "proxy only: Ray's own processes (GCS server, raylet, workers, agents) listen on "
        "all interfaces. `ray start --node-ip-address IP` (ray.init(_node_ip_address=IP)) "
        "sets the address the node advertises to the others, not where those servers "
        "bind (ray 2.60 here: with 127.0.0.1 they still listened on 0.0.0.0), so keep a "
        "Ray cluster on a private network or behind a firewall.",
    )
    model = p.add_argument_group("model")
    model.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="checkpoint folder or Hub id (default: all-MiniLM-L6-v2, bertfast[demo])",
    )
    model.add_argument(
        "--model-name",
        default=None,
        metavar="NAME",
        help="the model's name in /info and OpenAI answers (default: the checkpoint folder's name)",
    )
    options.add_backend(model, help="kernel backend (default: auto)")
    options.add_device(
        model, default=None, help="torch device (default: a GPU when torch sees one, else cpu)"
    )
    options.add_dtype(model)
    options.add_quantize(model)
    options.add_max_length(model, help="token limit per text (default: the checkpoint's)")
    model.add_argument(
        "--threads",
        type=int,
        metavar="N",
        default=None,
        help="torch CPU threads for the model (default: torch's own; embedded server only)",
    )

    http = p.add_argument_group("HTTP")
    http.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    http.add_argument(
        "--port", type=int, default=8000, metavar="N", help="port, 0 for any (default: 8000)"
    )
    http.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: "
        f"${API_KEY_ENV} when set, else no key; the variable keeps the key out of `ps`)",
    )
    http.add_argument(
        "--request-timeout-s",
        type=float,
        metavar="S",
        default=None,
        help=f"answer 504 after this long (default: {DEFAULTS['request_timeout_s']:g})",
    )
    http.add_argument(
        "--access-log", action="store_true", help="log every request on stderr (uvicorn's)"
    )

    batching = p.add_argument_group("batching")
    batching.add_argument(
        "--max-batch-size",
        type=int,
        metavar="N",
        default=None,
        help=f"texts per model batch (default: {DEFAULTS['max_batch_size']})",
    )
    batching.add_argument(
        "--max-batch-tokens",
        type=int,
        metavar="N",
        default=None,
        help=f"tokens per model batch (default: {DEFAULTS['max_batch_tokens']})",
    )
    batching.add_argument(
        "--batch-wait-ms",
        type=float,
        metavar="MS",
        default=None,
        help="how long a batch waits to fill (default: 0 ms: the model runs what queued "
        "while it was busy, so batches form under load without delaying a lone request; "
        f"--ray: {RAY_BATCH_WAIT_MS:g} ms)",
    )
    batching.add_argument(
        "--max-queue",
        type=int,
        metavar="N",
        default=None,
        help=f"texts waiting for the model, past which requests get 429 with Retry-After "
        f"(default: {DEFAULTS['max_queue']})",
    )

    limits = p.add_argument_group("request limits")
    limits.add_argument(
        "--max-client-batch-size",
        type=int,
        metavar="N",
        default=None,
        help=f"texts per request (default: {DEFAULTS['max_client_batch_size']}; with "
        "--ray at most --max-batch-size, which is its default there)",
    )
    limits.add_argument(
        "--max-input-chars",
        type=int,
        metavar="N",
        default=None,
        help=f"characters per text (default: {DEFAULTS['max_input_chars']:,})",
    )
    limits.add_argument(
        "--max-body-mb",
        type=float,
        metavar="MB",
        default=None,
        help=f"request body size in MiB, a hard cap (default: {DEFAULTS['max_body_mb']:g})",
    )
    limits.add_argument(
        "--auto-truncate",
        action="store_true",
        help="truncate texts over the token limit instead of answering 413 (a /embed "
        'request may also send "truncate": true)',
    )

    ray = p.add_argument_group("Ray Serve (--ray)")
    ray.add_argument(
        "--ray",
        action="store_true",
        help="deploy on Ray Serve (bertfast[ray]) instead of serving from this process",
    )
    ray.add_argument("--replicas", type=int, default=None, help="model replicas (default: 1)")
    ray.add_argument(
        "--cpus-per-replica", type=float, default=None, help="CPUs per replica (default: Ray's)"
    )
    ray.add_argument(
        "--gpus-per-replica",
        type=float,
        default=None,
        help="GPUs per replica, 1 gives one replica per GPU (default: Ray's)",
    )
    ray.add_argument(
        "--address", default=None, help="Ray cluster to join (default: start a local one)"
    )
    p.set_defaults(func=run)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check(args) -> argparse.Namespace:
    """The options checked (one UserError line per mistake) and completed with the
    defaults of the server they run."""
    if args.ray:
        given = [n for n in EMBEDDED_ONLY if getattr(args, n) not in (None, False)]
        if given:
            raise UserError(f"{_flag(given[0])} is an option of the embedded server, not of --ray")
    else:
        given = [n for n in RAY_ONLY if getattr(args, n) is not None]
        if given:
            raise UserError(
                f"{_flag(given[0])} is a Ray Serve option: add --ray (without it one "
                "process serves one model)"
            )
    if args.ray and args.max_client_batch_size is None:
        args.max_client_batch_size = args.max_batch_size or DEFAULTS["max_batch_size"]
    if args.ray and args.batch_wait_ms is None:
        args.batch_wait_ms = RAY_BATCH_WAIT_MS
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be between 0 and 65535, not {args.port}")
    for name in (
        "max_batch_size",
        "max_batch_tokens",
        "max_queue",
        "max_client_batch_size",
        "max_input_chars",
        "replicas",
    ):
        if getattr(args, name) < 1:
            raise UserError(f"{_flag(name)} must be at least 1, not {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, not {args.threads}")
    if args.batch_wait_ms < 0:
        raise UserError(f"--batch-wait-ms must be >= 0, not {args.batch_wait_ms:g}")
    for name in ("request_timeout_s", "max_body_mb"):
        if not getattr(args, name) > 0:
            raise UserError(f"{_flag(name)} must be > 0, not {getattr(args, name):g}")
    if args.ray and args.max_client_batch_size > args.max_batch_size:
        raise UserError(
            f"--max-client-batch-size ({args.max_client_batch_size}) must not exceed "
            f"--max-batch-size ({args.max_batch_size}) with --ray (a request is one item "
            "of a Ray Serve batch)"
        )
    if args.api_key == "":
        raise UserError("--api-key is empty: give a key, or leave the option out")
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    return args


def _limits(args):
    from ..serving.protocol import Limits

    return Limits(
        max_client_batch_size=args.max_client_batch_size,
        max_input_chars=args.max_input_chars,
        max_body_bytes=max(1, int(args.max_body_mb * 1024 * 1024)),
    )


def _warn_if_open(args) -> None:
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and args.api_key is None:
        print(
            f"bertfast serve: warning: listening on {args.host} without --api-key: anyone "
            "who can reach this port can use the model",
            file=sys.stderr,
            flush=True,
        )


def run(args) -> int:
    args = _check(args)
    path = checkpoint_path(args.model)
    _warn_if_open(args)
    if args.ray:
        return _run_ray(args, path)
    return _run_embedded(args, path)


def _run_embedded(args, path) -> int:
    """The embedded server, in the foreground; 0 after a SIGTERM / Ctrl-C stop."""
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UserError(
            f"the server needs {exc.name}, which is not installed: run "
            "`pip install bertfast[serve]`"
        ) from None
    import torch

    from ..serving import app as server_app
    from ..serving.protocol import model_name
    from ._common import load_embedder

    threads = args.threads or torch.get_num_threads()
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    # The model loads on this thread with one OpenMP thread and runs on the server's
    # model thread with `threads`: a thread that ran a parallel region keeps a pool of
    # OpenMP workers for good, and with two pools' threads on a machine's CPUs libgomp
    # stops spin-waiting between parallel regions (every region of a forward then
    # wakes its workers from sleep). benchmarks/results/cpu-amd-epyc-avx2-2t/notes.md
    torch.set_num_threads(1)
    embedder = load_embedder(path, args)
    settings = server_app.Settings(
        model_name=args.model_name or model_name(path),
        limits=_limits(args),
        auto_truncate=args.auto_truncate,
        max_batch_size=args.max_batch_size,
        max_batch_tokens=args.max_batch_tokens,
        batch_wait_ms=args.batch_wait_ms,
        max_queue=args.max_queue,
        request_timeout_s=args.request_timeout_s,
        api_key=args.api_key,
        threads=threads,
    )

    def ready(base: str) -> None:
        print(
            f"bertfast serve: {settings.model_name} ({path}) on {base} (POST /embed, POST "
            f"/v1/embeddings, GET /health /info /stats /metrics; batches of up to "
            f"{args.max_batch_size} texts / {args.max_batch_tokens} tokens, wait "
            f"{args.batch_wait_ms:g} ms{', API key required' if args.api_key else ''}); "
            "Ctrl-C stops",
            flush=True,
        )

    try:
        server_app.serve(
            embedder,
            settings,
            args.host,
            args.port,
            on_ready=ready,
            on_stop=lambda: print("bertfast serve: stopping", file=sys.stderr, flush=True),
            log_level="info" if args.access_log else "warning",
            access_log=args.access_log,
        )
    except OSError as exc:
        raise UserError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    print("bertfast serve: stopped", file=sys.stderr, flush=True)
    return 0


def _run_ray(args, path) -> int:
    """The Ray Serve deployment in the foreground until Ctrl-C / SIGTERM."""
    import signal

    ray = init_ray(args.address)
    from ray import serve

    from ..ray import serve_app

    kwargs = dict(dtype=args.dtype, backend=args.backend, max_length=args.max_length)
    if args.quantize:
        check_quantize_args(args)
        kwargs["quantize"] = args.quantize
    if args.device:
        kwargs["device"] = args.device
    app = serve_app(
        str(path),
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000.0,
        num_replicas=args.replicas,
        num_cpus=args.cpus_per_replica,
        num_gpus=args.gpus_per_replica,
        auto_truncate=args.auto_truncate,
        model_name=args.model_name,
        api_key=args.api_key,
        limits=_limits(args),
        **kwargs,
    )
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name="bertfast", route_prefix="/")
    except KeyboardInterrupt:
        serve.shutdown()
        raise
    except Exception as exc:
        serve.shutdown()
        raise UserError(f"cannot start the server: {ray_error(exc)}") from None

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    base = f"http://{args.host}:{args.port}"
    print(
        f"bertfast serve: {path} on {base} with Ray Serve (POST /embed, POST "
        f"/v1/embeddings, GET /health /info /stats; max batch {args.max_batch_size} texts, "
        f"wait {args.batch_wait_ms:g} ms, {args.replicas} replica(s)); Ctrl-C stops",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("bertfast serve: stopping", file=sys.stderr, flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
