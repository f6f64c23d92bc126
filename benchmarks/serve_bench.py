"""Serving benchmark (issue 26): HTTP embedding servers side by side, one process each.

Starts each server in turn (``bertfast serve``; infinity-emb, the peer; or the trivial
server that answers at once), drives it with N closed-loop clients per level (one short
query per request, OpenAI route by default), stops it, and alternates the order over
rounds so that the ratios come from one run. Every level and every start is one JSON
line (appended as it comes); the Markdown table (ratios against infinity) is written at
the end, or from a JSON-lines file with ``--report``. The library is
``bertfast/bench/serving.py``.

    # bertfast vs infinity, the default levels (1, 4, 16, 32 clients), 2 rounds
    python benchmarks/serve_bench.py --servers bertfast,infinity \\
        --infinity-bin /work/infinity-venv/bin/infinity_emb \\
        --jsonl serving.jsonl --markdown serving.md

    # the load generator's ceiling: the trivial server, client and server on own cores
    python benchmarks/serve_bench.py --servers trivial --clients 1,4,16 --rounds 1 \\
        --duration 5 --warmup 1 --client-cpus 0

    # the table again from rows already measured
    python benchmarks/serve_bench.py --report serving.jsonl --markdown serving.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from bertfast.bench import serving
from bertfast.bench.sweep import read_rows

SERVERS = ("bertfast", "bertfast-ray", "infinity", "trivial")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"need non-negative integers: {text!r}")
    return values


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in SERVERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"servers are among {', '.join(SERVERS)}, not {bad}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--servers",
        type=_names,
        default=["bertfast", "infinity"],
        help="comma-separated, in the first round's order: bertfast (`bertfast serve` "
        "as it starts by default), bertfast-ray (`bertfast serve --ray`, once the flag "
        "exists), infinity, trivial (default: bertfast,infinity)",
    )
    p.add_argument(
        "--clients", type=_ints, default=[1, 4, 16, 32], help="client levels (default: 1,4,16,32)"
    )
    p.add_argument(
        "--duration", type=float, default=15.0, help="measured seconds per level (default: 15)"
    )
    p.add_argument(
        "--warmup", type=float, default=3.0, help="warm-up seconds per level (default: 3)"
    )
    p.add_argument("--rounds", type=int, default=2, help="rounds, order reversed each (default: 2)")
    p.add_argument("--route", choices=serving.ROUTES, default="openai", help="(default: openai)")
    p.add_argument(
        "--engine",
        choices=serving.ENGINES,
        default="raw",
        help="load generator: raw sockets per client thread (the cheapest), http.client "
        "per thread, or one asyncio loop (default: raw)",
    )
    p.add_argument("--model", default=None, help="checkpoint folder (default: all-MiniLM-L6-v2)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="every server's thread budget (OMP/MKL threads; Ray replicas' CPUs) "
        "(default: the server's CPUs)",
    )
    p.add_argument(
        "--client-cpus",
        type=_ints,
        default=None,
        help="pin the load generator to these CPUs, e.g. 0 (default: not pinned)",
    )
    p.add_argument(
        "--server-cpus",
        type=_ints,
        default=None,
        help="pin the servers to these CPUs (default: the others when --client-cpus is "
        "given, else not pinned)",
    )
    p.add_argument(
        "--infinity-bin",
        default=os.environ.get("INFINITY_EMB_BIN") or shutil.which("infinity_emb"),
        help="the infinity_emb executable of its own venv (default: $INFINITY_EMB_BIN, "
        "else infinity_emb on PATH)",
    )
    p.add_argument("--infinity-batch-size", type=int, default=32, help="(default: 32)")
    p.add_argument("--bertfast-args", default="", help="extra `bertfast serve` arguments")
    p.add_argument("--infinity-args", default="", help="extra `infinity_emb v2` arguments")
    p.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds to first answer (300)"
    )
    p.add_argument(
        "--grace", type=float, default=30.0, help="seconds after SIGTERM before a kill (30)"
    )
    p.add_argument("--jsonl", default=None, help="append one JSON line per level and start")
    p.add_argument("--markdown", default=None, help="write the table here (else stdout)")
    p.add_argument("--log-dir", default=None, help="server logs (default: next to --jsonl)")
    p.add_argument(
        "--report", default=None, metavar="JSONL", help="only make the table from these rows"
    )
    return p


def build_specs(args) -> list[serving.ServerSpec]:
    model = args.model
    if model is None and any(n != "trivial" for n in args.servers):
        import bertfast

        model = bertfast.default_checkpoint()
    threads = args.threads
    if threads is None:
        cpus = args.server_cpus or (
            sorted(os.sched_getaffinity(0) - set(args.client_cpus or []))
            if args.client_cpus
            else sorted(os.sched_getaffinity(0))
        )
        threads = len(cpus) or 1
    specs = []
    serve_help = None
    for name in args.servers:
        if name.startswith("bertfast"):
            serve_help = serve_help or serving.bertfast_serve_modes()
            specs.append(
                serving.bertfast_spec(
                    model,
                    mode="ray" if name == "bertfast-ray" else "default",
                    threads=threads,
                    extra_args=shlex.split(args.bertfast_args),
                    serve_help=serve_help,
                )
            )
        elif name == "infinity":
            if not args.infinity_bin:
                raise SystemExit("infinity: no infinity_emb found; pass --infinity-bin")
            specs.append(
                serving.infinity_spec(
                    args.infinity_bin,
                    model,
                    threads=threads,
                    batch_size=args.infinity_batch_size,
                    extra_args=shlex.split(args.infinity_args),
                )
            )
        else:
            specs.append(serving.trivial_spec())
    return specs


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    command = "python benchmarks/serve_bench.py " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    if args.report:
        rows = read_rows(args.report)
    else:
        specs = build_specs(args)
        log_dir = args.log_dir or (
            str(Path(args.jsonl).with_suffix("")) + "-logs" if args.jsonl else None
        )
        rows = serving.run_servers(
            specs,
            args.clients,
            duration_s=args.duration,
            warmup_s=args.warmup,
            rounds=args.rounds,
            route=args.route,
            engine=args.engine,
            client_cpus=args.client_cpus,
            server_cpus=args.server_cpus,
            jsonl=args.jsonl,
            log_dir=log_dir,
            start_timeout_s=args.start_timeout,
            grace_s=args.grace,
            command=command,
            say=lambda line: print(line, flush=True),
        )
    table = serving.format_markdown(rows, None if args.report else command)
    if args.markdown:
        Path(args.markdown).write_text(table)
        print(f"wrote {args.markdown}")
    else:
        print(table)
    failed = [
        r for r in rows if r.get("row") == "server" and (r.get("error") or r.get("leftovers"))
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
