"""``bertfast encode``: texts to sentence vectors, streamed chunk by chunk through
bertfast.stream (.txt / .jsonl / .csv / .parquet in; .npy / .parquet / .jsonl out), or
through Ray Data with ``--ray`` (:mod:`bertfast.cli.encode_ray`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..stream import DEFAULT_CHUNK_SIZE
from . import encode_ray, options
from ._common import UserError, checkpoint_path, load_embedder

NAME = "encode"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME,
        help="texts -> sentence vectors, streamed (.npy, .parquet, .jsonl; --ray)",
        description="Encode a corpus chunk by chunk with bounded memory: .txt (one text per "
        "line), .jsonl (--field), .csv / .parquet (--column) in; .npy (row i = input "
        "row i), .parquet or .jsonl (id, --keep columns, embedding) out. With --ray, "
        "Parquet in and out through Ray Data.",
    )
    options.add_model_options(p)
    p.set_defaults(device=None)  # --ray: each actor picks its GPU; otherwise cpu
    p.add_argument(
        "--input",
        "-i",
        required=True,
        help="input file ('-': stdin, text lines): .txt (any other suffix too), "
        ".jsonl, .csv or .parquet; row i -> output row i",
    )
    p.add_argument(
        "--output",
        "-o",
        required=True,
        help=".npy (float32 [rows, dim]), .parquet or .jsonl (id, --keep columns, "
        "embedding); with --ray a folder of Parquet files",
    )
    p.add_argument(
        "--input-format",
        choices=("txt", "jsonl", "csv", "parquet"),
        default=None,
        help="input format (default: from the suffix; .txt otherwise)",
    )
    p.add_argument(
        "--field",
        "--column",
        dest="field",
        default="text",
        help="the text field (.jsonl) or column (.csv, .parquet) (default: text)",
    )
    p.add_argument(
        "--keep",
        action="append",
        metavar="COL[,COL...]",
        help="columns/fields copied next to the vectors (.parquet/.jsonl output)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="texts per model batch (default: 32)")
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help=f"rows read, encoded and written per step (default: "
        f"{DEFAULT_CHUNK_SIZE}; the memory bound and the --resume unit); with "
        "--ray the rows per actor call (default: 256)",
    )
    options.add_max_length(p)
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip rows that are not text (counted in a summary line; .npy rows "
        "hold NaN, .parquet/.jsonl leave their ids out) instead of stopping",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted .npy/.parquet run from its last finished chunk",
    )
    options.add_switch(p, "normalize", "L2-normalise the vectors (default: as the checkpoint says)")
    options.add_progress(p)
    options.add_threads(p)
    encode_ray.add_options(p)
    p.set_defaults(func=run)


def _encode_settings(args, embedder, checkpoint: dict[str, str]) -> dict:
    """What a resumed run must share with the run it continues: every setting that
    changes a vector, and the content of the checkpoint's files (``checkpoint``, from
    bertfast.fingerprint), not its path."""
    from .. import __version__

    return {
        "bertfast": __version__,
        "device": str(embedder.device),
        "dtype": args.dtype,
        "quantize": args.quantize,
        "backend": args.backend,
        "normalize": embedder.normalize if args.normalize is None else args.normalize,
        "max_length": embedder.max_length,
        "pooling": list(embedder.pooling),
        "field": args.field,
        "keep": list(args.keep),
        **checkpoint,
    }


def run(args) -> int:
    """Stream texts from a file into .npy / .parquet / .jsonl, chunk by chunk
    (bertfast.stream), or through Ray Data with --ray."""
    from .. import fingerprint, stream
    from ..validate import CheckpointError

    args.keep = [k for item in (args.keep or []) for k in item.split(",") if k]
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be at least 1, not {args.threads}")
        if args.ray is not None:
            raise UserError(
                "--threads sets this process's torch threads; with --ray use --cpus-per-actor"
            )
        import torch

        torch.set_num_threads(args.threads)
    if args.ray is not None:
        return encode_ray.run(args)
    args.device = args.device or "cpu"
    try:
        in_fmt = stream.input_format(args.input, args.input_format)
        if args.input != "-" and not Path(args.input).exists():
            raise UserError(f"input file {args.input!r} does not exist")
        stream.output_format(args.output)
        output = Path(args.output)
        if output.is_dir():
            raise UserError(f"output {args.output!r} is a folder")
        if not output.parent.exists():
            raise UserError(f"output folder {str(output.parent)!r} does not exist")
        if args.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, not {args.batch_size}")
        chunk_size = stream.DEFAULT_CHUNK_SIZE if args.chunk_size is None else args.chunk_size
        if chunk_size < 1:
            raise UserError(f"--chunk-size must be at least 1, not {chunk_size}")
        source = stream.open_source(args.input, in_fmt, args.field, args.keep)
    except stream.StreamError as exc:
        raise UserError(str(exc)) from None
    lock = None
    try:
        path = checkpoint_path(args.checkpoint)
        try:
            # One writer per output: taken before anything is read or loaded.
            lock = stream.lock_output(output)
            # Every row is checked (and counted) before the model loads.
            scanned = source.scan(args.skip_bad, progress=bool(args.progress))
        except stream.StreamError as exc:
            raise UserError(str(exc)) from None
        start = time.perf_counter()
        embedder = load_embedder(path, args)
        try:  # what a --resume compares: the checkpoint's bytes
            checkpoint = fingerprint.checkpoint_fingerprint(path)
        except (OSError, CheckpointError) as exc:
            raise UserError(f"cannot read checkpoint {path}: {exc}") from None
        loaded = time.perf_counter()
        try:
            summary = stream.encode_stream(
                embedder,
                source,
                output,
                chunk_size=chunk_size,
                batch_size=args.batch_size,
                normalize=args.normalize,
                skip_bad=args.skip_bad,
                resume=args.resume,
                show_progress=args.progress,
                settings=_encode_settings(args, embedder, checkpoint),
                scanned=scanned,
                lock=lock,
            )
        except stream.StreamError as exc:
            raise UserError(str(exc)) from None
        except OSError as exc:
            raise UserError(f"cannot write {args.output!r}: {exc.strerror or exc}") from None
        except KeyboardInterrupt:
            if stream.output_format(args.output) in ("npy", "parquet"):
                print(
                    f"bertfast: stopped; finished chunks are kept in "
                    f"{stream.partial_dir(output)}: rerun with --resume to continue",
                    file=sys.stderr,
                )
            raise
    finally:
        if lock is not None:
            lock.release()
        source.close()
    normalized = embedder.normalize if args.normalize is None else args.normalize
    shape = (
        f"shape {(summary.rows, embedder.dim)}"
        if output.suffix.lower() == ".npy"
        else f"{summary.rows - summary.skipped} rows of dim {embedder.dim}"
    )
    resumed = f", resumed at row {summary.resumed_from}" if summary.resumed_from else ""
    noun = "text" if summary.encoded == 1 else "texts"
    print(
        f"encoded {summary.encoded} {noun} with {path} -> {output} ({shape}, float32, "
        f"normalized={normalized}{resumed}); load {loaded - start:.2f} s, encode "
        f"{summary.seconds:.2f} s ({summary.rate:.1f} texts/s)"
    )
    if summary.skipped:
        held = "their rows hold NaN" if output.suffix.lower() == ".npy" else "their ids are absent"
        listed = "; ".join(bad.describe(source.name) for bad in summary.bad)
        more = ", ..." if summary.skipped > len(summary.bad) else ""
        rows = "row" if summary.skipped == 1 else "rows"
        print(f"skipped {summary.skipped} bad {rows} ({held}): {listed}{more}")
    return 0
