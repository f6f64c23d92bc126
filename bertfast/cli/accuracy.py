"""``bertfast accuracy``: the command line of the accuracy contract (bf16 / int8
sentence vectors against bertfast fp32 on the shipped corpus); the contract, the
measurements and the report are :mod:`bertfast.bench.accuracy`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import options
from ._common import model_folder

__all__ = ["main", "build_parser"]

NAME = "accuracy"
#: ``bertfast accuracy ARGS``: the top-level parser hands ARGS over unparsed to :func:`run`.
RAW_ARGS = True


def add_parser(sub) -> None:
    sub.add_parser(
        NAME,
        help="bf16 / int8 sentence vectors vs fp32 on the shipped corpus (the accuracy contract)",
        add_help=False,
    )


def run(argv: Sequence[str]) -> int:
    return int(main(list(argv)) or 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bertfast accuracy",
        description="Low-precision sentence vectors (bf16, int8; --peers: ONNX Runtime and "
        "CTranslate2 int8) against bertfast fp32 on the shipped corpus: min / mean cosine "
        "and top-10 retrieval overlap, as a Markdown table (--json: also a JSON file).",
    )
    p.add_argument(
        "--model",
        default="minilm",
        help="checkpoint folder, Hub id or 'minilm' (the packaged all-MiniLM-L6-v2, the default; "
        "the contract is stated for it)",
    )
    p.add_argument(
        "--dtype",
        action="append",
        choices=("bf16", "bfloat16"),
        help="check this dtype (default: bf16 and int8 both when neither --dtype nor "
        "--quantize is given)",
    )
    p.add_argument("--quantize", action="append", choices=("int8",), help="check int8")
    p.add_argument("--peers", action="store_true", help="also ONNX Runtime and CTranslate2 int8")
    p.add_argument(
        "--no-reference-check",
        action="store_true",
        help="skip the transformers fp32 row (the independent check of the reference)",
    )
    options.add_threads(p)
    p.add_argument("--json", default=None, metavar="OUT", help="also write the report here")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a variant that ran breaks the contract",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    import torch

    from ..bench import accuracy
    from ..validate import CheckpointError

    def error(message: str) -> int:
        print(f"bertfast accuracy: error: {message}", file=sys.stderr)
        return 2

    try:
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be at least 1, not {args.threads}")
        path = Path(model_folder(args.model))
        if args.json:
            out = Path(args.json)
            if out.is_dir():
                raise ValueError(f"--json {args.json!r} is a folder")
            if not out.parent.exists():
                raise ValueError(f"--json: folder {str(out.parent)!r} does not exist")
    except (ValueError, CheckpointError, TypeError) as exc:
        return error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = [] if args.no_reference_check else ["transformers-fp32"]
    if not args.dtype and not args.quantize:
        variants += ["bertfast-bf16", "bertfast-int8"]
    if args.dtype:
        variants.append("bertfast-bf16")
    if args.quantize:
        variants.append("bertfast-int8")
    if args.peers:
        variants += list(accuracy.INT8_PEERS)
    try:
        report = accuracy.run(path, variants, log=lambda line: print(f"  {line}", file=sys.stderr))
    except (ValueError, CheckpointError, OSError) as exc:
        return error(str(exc))
    print(accuracy.format_markdown(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if args.check and accuracy.contract_failures(report) else 0
