"""``bertfast tune``: the command line of :mod:`bertfast.tune` (time every kernel
candidate of a model's ops on this GPU and write its winners table)."""

from __future__ import annotations

from . import options
from ._common import UserError, torch_device, torch_dtype

NAME = "tune"


def add_parser(sub) -> None:
    p = sub.add_parser(
        NAME,
        help="time every kernel candidate of a model's ops on this GPU; write its winners table",
        description="Run a model's forward on each shape, record its op calls, time every "
        "candidate (backend, variant, forced Triton config) per shape bucket, check each "
        "against the reference and write the fastest that passed per (op, dtype, bucket) "
        "as this GPU's winners table, which backend='auto' then follows on CUDA.",
    )
    options.add_model(p)
    p.add_argument(
        "--shapes",
        default=None,
        help="comma list of BxS (full) or rBxMEANxMAX (ragged) batches "
        "(default: 1x128,32x128,64x256; --dry-run: 2x16,r4x8x32)",
    )
    options.add_device(p, default=None, help="CUDA device (default: cuda)")
    p.add_argument(
        "--dtype",
        default=None,
        help="comma list of float16, bfloat16, float32 (default: float16; --dry-run: float32)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="table file or folder (default: the user winners folder, $BERTFAST_WINNERS_DIR "
        "or ~/.cache/bertfast/winners, file named after the GPU and versions)",
    )
    p.add_argument("--rows", default=None, help="also append every measurement to this .jsonl")
    p.add_argument(
        "--seconds", type=float, default=0.2, help="timing budget per candidate (default: 0.2)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="the whole path on the CPU with a tiny model and the CPU candidates; the table "
        "is keyed by a fake device (used only when BERTFAST_WINNERS names it)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Check every argument (one line each), then tune and write the table."""
    import torch

    from ..bench import parse_shape
    from ..tune import DRY_RUN_SHAPES, resolve_model, tune
    from ..validate import CheckpointError

    if args.dry_run:
        if args.device not in (None, "cpu"):
            raise UserError(f"--dry-run runs on the CPU; drop --device {args.device}")
        device = torch.device("cpu")
    else:
        try:
            kind = torch.device(args.device or "cuda").type
        except (RuntimeError, TypeError, ValueError):
            kind = torch_device(args.device).type  # its one-line error
        if kind != "cuda":
            raise UserError(
                "bertfast tune measures GPU kernels: --device cpu is refused "
                "(--dry-run runs the whole path on the CPU with a tiny model)"
            )
        if not torch.cuda.is_available():
            raise UserError(
                "bertfast tune needs a CUDA GPU and torch sees none "
                "(--dry-run runs the whole path on the CPU with a tiny model)"
            )
        device = torch_device(args.device or "cuda")
    names = [n.strip() for n in (args.dtype or "").split(",") if n.strip()]
    names = names or ["float32" if args.dry_run else "float16"]
    bad = [n for n in names if n not in options.DTYPES]
    if bad:
        raise UserError(f"--dtype {bad[0]!r} is not one of {', '.join(options.DTYPES)}")
    if args.seconds <= 0:
        raise UserError(f"--seconds must be positive, not {args.seconds}")
    try:
        text = args.shapes or (DRY_RUN_SHAPES if args.dry_run else "1x128,32x128,64x256")
        shapes = [parse_shape(s.strip()) for s in text.split(",") if s.strip()]
        if not shapes:
            raise ValueError("--shapes names no shape")
        model = resolve_model(args.model, args.dry_run)
    except (ValueError, CheckpointError, TypeError, ImportError) as exc:
        raise UserError(str(exc)) from None
    print(
        f"# bertfast tune: {model or 'tiny dry-run model'} on {device}, {', '.join(names)}, "
        f"shapes {', '.join(label for label, _ in shapes)}"
    )
    try:
        tune(
            model,
            device,
            [torch_dtype(n) for n in names],
            shapes,
            out=args.out,
            rows_path=args.rows,
            seconds=args.seconds,
            dry_run=args.dry_run,
            made_by=f"bertfast tune --model {args.model or 'default'} --shapes {text} "
            f"--dtype {','.join(names)}{' --dry-run' if args.dry_run else ''}",
        )
    except (CheckpointError, OSError) as exc:
        raise UserError(str(exc)) from None
    return 0
