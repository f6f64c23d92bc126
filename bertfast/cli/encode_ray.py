"""``bertfast encode --ray``: Parquet in, Parquet out, through Ray Data (one model per
actor, bertfast.ray.embed_dataset)."""

from __future__ import annotations

import time
from pathlib import Path

from ._common import UserError, check_quantize_args, checkpoint_path, init_ray, ray_error


def add_options(p) -> None:
    """The "Ray Data (--ray)" option group of ``bertfast encode``."""
    ray_opts = p.add_argument_group("Ray Data (--ray)")
    ray_opts.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray Data: a local cluster, or the cluster at ADDRESS "
        "(e.g. ray://head:10001 or auto); write it as --ray=ADDRESS "
        "when a checkpoint follows",
    )
    ray_opts.add_argument(
        "--actors",
        type=int,
        default=None,
        help="model actors (default: 1; on a GPU cluster: the GPU count)",
    )
    ray_opts.add_argument(
        "--cpus-per-actor", type=float, default=None, help="CPUs per actor (default: Ray's)"
    )
    ray_opts.add_argument(
        "--gpus-per-actor",
        type=float,
        default=None,
        help="GPUs per actor, 1 gives one actor per GPU (default: Ray's)",
    )


def run(args) -> int:
    """--ray: Parquet in, Parquet out, through Ray Data (one model per actor)."""
    if "://" not in args.output and Path(args.output).suffix.lower() != ".parquet":
        raise UserError(
            f"with --ray, --output must be a .parquet folder (or a URI such as "
            f"s3://bucket/vectors/), not {args.output!r}"
        )
    if (
        args.input == "-"
        or (args.input_format or "parquet") != "parquet"
        or (
            "://" not in args.input
            and Path(args.input).suffix.lower() not in (".parquet", "")
            and not Path(args.input).is_dir()
        )
    ):
        raise UserError(
            "with --ray, --input must be a Parquet file or folder (convert other "
            "formats with `bertfast encode` without --ray, or read them with "
            "Ray Data and call bertfast.ray.embed_dataset)"
        )
    if args.resume:
        raise UserError("--resume works without --ray (Ray Data retries failed work itself)")
    output = args.output
    if "://" not in output:
        out = Path(output)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UserError(
                f"output {output!r} already exists; remove it or pick another name "
                "(Ray Data writes a folder of Parquet files)"
            )
        if not out.parent.exists():
            raise UserError(f"output folder {str(out.parent)!r} does not exist")
    for name, value in (
        ("--batch-size", args.batch_size),
        ("--chunk-size", args.chunk_size),
        ("--actors", args.actors),
    ):
        if value is not None and value < 1:
            raise UserError(f"{name} must be at least 1, not {value}")
    path = checkpoint_path(args.checkpoint)
    ray = init_ray(args.ray)
    from ..ray import embed_dataset, parquet_row_groups, read_row_groups, to_fixed_size_list

    try:
        groups, total = parquet_row_groups(args.input, args.field, args.keep)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    if args.progress is not None:
        ctx.enable_progress_bars = bool(args.progress)
    start = time.perf_counter()
    ds = ray.data.from_items(groups, override_num_blocks=max(1, len(groups)))
    ds = ds.map_batches(
        read_row_groups,
        batch_size=1,
        batch_format="numpy",
        fn_kwargs=dict(column=args.field, keep=args.keep, skip_bad=args.skip_bad),
    )
    kwargs = dict(
        dtype=args.dtype,
        backend=args.backend,
        max_length=args.max_length,
        normalize=args.normalize,
        encode_batch_size=args.batch_size,
    )
    if args.quantize:
        check_quantize_args(args)
        kwargs["quantize"] = args.quantize
    if args.device:
        kwargs["device"] = args.device
    ds = embed_dataset(
        ds,
        str(path),
        column=args.field,
        batch_size=args.chunk_size or 256,
        concurrency=args.actors or 1,
        num_cpus=args.cpus_per_actor,
        num_gpus=args.gpus_per_actor,
        **kwargs,
    )
    drop = [] if args.field in args.keep else [args.field]
    ds = ds.map_batches(to_fixed_size_list, batch_format="pyarrow", fn_kwargs={"drop": drop})
    try:
        ds.write_parquet(output)
    except Exception as exc:  # a Ray task error wraps the user's mistake
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"Ray Data run failed: {ray_error(exc)}") from None
    seconds = time.perf_counter() - start
    written = _parquet_rows(output)
    skipped = total - written
    print(
        f"encoded {written} text{'' if written == 1 else 's'} with {path} -> {output} "
        f"(Parquet folder, Ray Data, "
        f"{args.actors or 1} actor(s)); {seconds:.2f} s ({written / max(seconds, 1e-9):.1f} "
        "texts/s, start-up included)"
    )
    if skipped:
        print(
            f"skipped {skipped} bad {'row' if skipped == 1 else 'rows'} (null or not "
            "UTF-8 texts; their ids are absent)"
        )
    return 0


def _parquet_rows(path: str) -> int:
    from ..ray import parquet_row_groups

    return parquet_row_groups(path, column=None)[1]
