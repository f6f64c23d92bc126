"""The main job: ``Embedder.encode`` on real text vs sentence-transformers, one process each.

Each provider (sentence-transformers fp32 and bf16; bertfast fp32, bf16 and int8)
loads in a worker process of its own and encodes the shipped accuracy corpus (599 real
texts, or the first ``--limit``) with batch_size 32; rounds rotate the provider order,
each provider settles before its timed passes. The table gives the median seconds per
full pass, texts/s, tokens/s, ``x sentence-transformers`` (fp32) and each row's
per-sentence cosine against sentence-transformers fp32; the targets (fp32 >= 1.8x, bf16
>= 6x on an AMX machine) are tracked, not asserted. The library is
``bertfast/bench/main_job.py``.

    # everything, the default checkpoint (all-MiniLM-L6-v2), 3 rounds of 2 passes
    python benchmarks/main_job.py --markdown main_job.md --json main_job.json

    # fp32 only, a quick look on the first 64 texts
    python benchmarks/main_job.py --providers sentence-transformers,bertfast \\
        --limit 64 --rounds 1 --n 1

    # another checkpoint, 4 threads per provider
    python benchmarks/main_job.py --model /path/to/checkpoint --threads 4
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bertfast.bench import main_job
from bertfast.bench.isolated import ISOLATION_MODES


def _providers(text: str) -> list[str]:
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [n for n in names if n not in main_job.PROVIDERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown provider(s) {', '.join(map(repr, bad)) or '(none given)'}; "
            f"choose from {', '.join(main_job.PROVIDERS)}"
        )
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"need a whole number of at least 1, not {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--providers",
        type=_providers,
        default=list(main_job.PROVIDERS),
        help=f"comma-separated, among {', '.join(main_job.PROVIDERS)} (default: all)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder (default: bertfast's default checkpoint, all-MiniLM-L6-v2)",
    )
    p.add_argument("--rounds", type=_positive, default=3, help="rounds (default: 3)")
    p.add_argument(
        "--n", type=_positive, default=2, help="timed passes per provider per round (default: 2)"
    )
    p.add_argument(
        "--limit", type=_positive, default=None, help="the first N texts (default: all 599)"
    )
    p.add_argument(
        "--threads",
        type=_positive,
        default=None,
        help="torch threads per provider (default: this process's torch.get_num_threads())",
    )
    p.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        default="process",
        help="a worker process per provider, or all in this one (default: process)",
    )
    p.add_argument("--markdown", default=None, help="write the table here (else stdout only)")
    p.add_argument("--json", default=None, help="write the header and rows (raw times) here")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    command = "python benchmarks/main_job.py " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    model = args.model
    if model is None:
        from bertfast.embedder import default_checkpoint

        try:
            model = default_checkpoint()
        except Exception as exc:
            p.error(f"--model: no default checkpoint ({exc})")
    elif not Path(model).is_dir():
        p.error(f"--model: {model} is not a checkpoint folder")
    result = main_job.run(
        model,
        providers=args.providers,
        rounds=args.rounds,
        n=args.n,
        limit=args.limit,
        threads=args.threads,
        isolation=args.isolation,
        command=command,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    table = main_job.format_markdown(result)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        main_job.write_json(args.json, result)
    return 0 if result.rows else 1


if __name__ == "__main__":
    sys.exit(main())
