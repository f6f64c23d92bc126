"""What the commands share at run time: the user-error type and the checks that turn a
user's mistake (a device torch cannot use, a checkpoint that is not there, a backend
that cannot run, an unreachable Ray cluster) into one :class:`UserError` line."""

from __future__ import annotations

import sys
from pathlib import Path


class UserError(Exception):
    """A mistake on the user's side: ``bertfast: error: <message>``, exit status 2."""


def torch_dtype(name: str):
    """The torch dtype of a ``--dtype`` choice."""
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def torch_device(name: str):
    """A ``--device`` value, checked (a CUDA device that is not there is one line)."""
    from ..validate import resolve_device

    try:
        return resolve_device(name)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def checkpoint_path(arg: str | None) -> Path:
    """The checkpoint folder a command names (a folder, or a Hub id resolved to its
    snapshot in the Hugging Face cache: bertfast.hub), or the packaged default when
    None."""
    from ..embedder import default_checkpoint
    from ..hub import resolve
    from ..validate import CheckpointError

    try:
        if arg is None:
            return Path(default_checkpoint())
        return Path(resolve(arg))
    except (ImportError, CheckpointError, TypeError) as exc:
        raise UserError(str(exc)) from None


def model_folder(model: str | None) -> str:
    """``bench`` / ``accuracy`` --model: a built-in name (bertfast.presets) or a
    checkpoint folder, checked (``ValueError`` / ``CheckpointError``, not UserError:
    those commands print their own ``bertfast bench: error:`` line)."""
    from .. import hub
    from ..presets import PRESETS, resolve

    if model is None or model == "minilm" or model in PRESETS:
        return str(resolve(model))
    return hub.resolve(model)


def backend_env() -> None:
    """``BERTFAST_BACKEND`` must name a backend (it overrides ``--backend auto``)."""
    from ..validate import requested_backend

    try:
        requested_backend("auto")
    except ValueError as exc:
        raise UserError(str(exc)) from None


def check_quantize_args(args) -> None:
    """--quantize int8 with --device / --dtype / --backend that have no int8 kernels:
    one line, before anything loads (Ray: before any actor starts)."""
    import torch

    from ..ops.cpu import int8 as quant

    try:
        device = torch.device(args.device) if args.device else torch.device("cpu")
        reason = quant.unsupported_reason(device, torch_dtype(args.dtype), args.backend)
    except (RuntimeError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if reason is not None:
        raise UserError(f"--quantize int8: {reason}")


def load_embedder(path: Path, args, dtype=None):
    """The Embedder of ``path`` with the command's --device / --dtype / --backend /
    --max-length / --quantize; every loading failure is one UserError line."""
    from ..embedder import Embedder
    from ..ops.dispatch import BackendError
    from ..validate import CheckpointError

    device = torch_device(args.device)
    if getattr(args, "quantize", None):
        check_quantize_args(args)
    try:
        return Embedder.from_pretrained(
            path,
            device=device,
            dtype=dtype or torch_dtype(args.dtype),
            backend=args.backend,
            max_length=getattr(args, "max_length", None),
            quantize=getattr(args, "quantize", None),
        )
    except (CheckpointError, BackendError) as exc:
        raise UserError(str(exc)) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot load checkpoint {path}: {exc}") from None


def read_lines(name: str) -> list[str]:
    """The lines of a UTF-8 text file (``-``: stdin)."""
    if name == "-":
        return sys.stdin.read().splitlines()
    path = Path(name)
    if not path.exists():
        raise UserError(f"input file {name!r} does not exist")
    if path.is_dir():
        raise UserError(f"input {name!r} is a folder, not a text file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UserError(f"input file {name!r} is not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot read input file {name!r}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- Ray (encode --ray, serve)
def ray_error(exc: BaseException) -> str:
    """The user-facing cause inside a Ray task error, as one line."""
    import re

    chain, seen = [], set()
    while isinstance(exc, BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = getattr(exc, "cause", None) or exc.__cause__
    inner = chain[-1]
    if "ray" not in type(inner).__module__.split(".")[0] and str(inner).strip():
        return str(inner).strip().splitlines()[0]
    # Ray's wrappers carry the original error as a "SomeError: message" line of text.
    pattern = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")
    for error in reversed(chain):
        for line in str(error).splitlines():
            match = pattern.match(line.strip())
            if match and not any(
                word in line
                for word in (
                    "RayTaskError",
                    "UserCodeException",
                    "RaySystemError",
                    "ray.exceptions",
                )
            ):
                name, message = match.groups()
                return (
                    message
                    if name in ("ValueError", "TypeError", "CheckpointError")
                    else f"{name}: {message}"
                )
    lines = str(chain[0]).strip().splitlines()
    return lines[-1] if lines else type(chain[0]).__name__


def init_ray(address: str | None):
    """``ray``, connected to the cluster at ``address`` or to a new local one."""
    try:
        import ray
    except ImportError:
        raise UserError(
            "this needs Ray, which is not installed: run `pip install bertfast[ray]`"
        ) from None
    if not ray.is_initialized():
        try:
            ray.init(address=address or None, include_dashboard=False, logging_level="warning")
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = f"the Ray cluster at {address!r}" if address else "a local Ray cluster"
            raise UserError(f"cannot start or reach {where}: {exc}") from None
    return ray
