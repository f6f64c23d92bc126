"""The ``bertfast`` command (also ``python -m bertfast``).

    bertfast info                      what this installation can run
    bertfast encode [CKPT] --input texts.txt --output vectors.npy
                                       (.txt/.jsonl/.csv/.parquet -> .npy/.parquet/.jsonl,
                                       streamed; --ray [ADDRESS] for Ray Data)
    bertfast serve  [--model CKPT]     HTTP embedding server (one process; --ray for Ray Serve)
    bertfast check  [CKPT]             bertfast vs transformers on sample sentences
    bertfast tune   ...                time kernel candidates, write this GPU's winners
    bertfast bench  ...                benchmarks (on bertfast.bench)
    bertfast accuracy ...              bf16 / int8 vs fp32 on the shipped corpus
                                       (bertfast.bench.accuracy)

One module per command (``info``, ``encode`` with ``encode_ray``, ``serve``, ``check``,
``tune``, ``bench``, ``accuracy``), each with ``NAME``, ``add_parser(subparsers)`` and
``run``; the options several commands share are defined once in ``options``, the run-time
helpers in ``_common``. ``bench`` and ``accuracy`` (``RAW_ARGS``) parse their own
arguments: ``run`` gets them unparsed.

User errors (a missing file, an unreadable checkpoint, a backend that cannot run)
print one ``bertfast: error: ...`` line and exit with status 2 (:class:`UserError`);
``check`` exits 1 when parity fails, an interrupted command 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import accuracy, bench, check, encode, info, serve, tune
from ._common import UserError, backend_env

__all__ = ["main", "build_parser", "UserError", "COMMANDS"]

#: The commands, in the order ``bertfast --help`` lists them.
COMMANDS = (info, encode, serve, check, tune, bench, accuracy)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="bertfast", description="Fast runtime for BERT-family text encoders."
    )
    parser.add_argument("--version", action="version", version=f"bertfast {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="{" + ",".join(c.NAME for c in COMMANDS) + "}"
    )
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    raw = {c.NAME: c for c in COMMANDS if getattr(c, "RAW_ARGS", False)}
    try:
        if argv and argv[0] in raw:
            backend_env()
            return raw[argv[0]].run(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command != info.NAME:
            backend_env()
        return args.func(args)
    except UserError as exc:
        print(f"bertfast: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bertfast: interrupted", file=sys.stderr)
        return 130
