"""``bertfast serve``: an HTTP embedding server on Ray Serve (bertfast.ray.serve_app),
in the foreground until Ctrl-C."""

from __future__ import annotations

import sys
import time

from . import options
from ._common import UserError, check_quantize_args, checkpoint_path, init_ray, ray_error

NAME = "serve"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME,
        help="HTTP embedding server on Ray Serve (POST /embed, POST /v1/embeddings)",
        description="Serve a checkpoint over HTTP with dynamic batching: POST /embed "
        "(text-embeddings-inference) and POST /v1/embeddings (OpenAI); runs in the "
        "foreground until Ctrl-C.",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="checkpoint folder (default: all-MiniLM-L6-v2, bertfast[demo])",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    options.add_backend(p, help="kernel backend (default: auto)")
    options.add_device(
        p, default=None, help="torch device (default: the replica's GPU if it has one, else cpu)"
    )
    options.add_dtype(p)
    options.add_max_length(p, help="token limit per text (default: the checkpoint's)")
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="texts per model batch, and per request (default: 32)",
    )
    p.add_argument(
        "--batch-wait-ms",
        type=float,
        default=5.0,
        help="how long a batch waits to fill (default: 5 ms)",
    )
    p.add_argument(
        "--auto-truncate",
        action="store_true",
        help="truncate texts over the token limit instead of answering 413",
    )
    p.add_argument("--replicas", type=int, default=1, help="model replicas (default: 1)")
    p.add_argument(
        "--cpus-per-replica", type=float, default=None, help="CPUs per replica (default: Ray's)"
    )
    p.add_argument(
        "--gpus-per-replica",
        type=float,
        default=None,
        help="GPUs per replica, 1 gives one replica per GPU (default: Ray's)",
    )
    options.add_quantize(p)
    p.add_argument(
        "--address", default=None, help="Ray cluster to join (default: start a local one)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the Ray Serve embedding app in the foreground until Ctrl-C."""
    import signal

    if not 0 < args.port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {args.port}")
    if args.max_batch_size < 1:
        raise UserError(f"--max-batch-size must be at least 1, not {args.max_batch_size}")
    if args.batch_wait_ms < 0:
        raise UserError(f"--batch-wait-ms must be >= 0, not {args.batch_wait_ms}")
    if args.replicas < 1:
        raise UserError(f"--replicas must be at least 1, not {args.replicas}")
    path = checkpoint_path(args.model)
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
        f"bertfast serve: {path} on {base} (POST /embed, POST /v1/embeddings, "
        f"GET /health /info /stats; max batch {args.max_batch_size} texts, wait "
        f"{args.batch_wait_ms:g} ms, {args.replicas} replica(s)); Ctrl-C stops",
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
