"""Load-time checks of what a user passes in: checkpoint folders, devices, backends.

Every function here turns a user mistake into one exception whose message says
what was wrong and what to do, before anything is loaded:

- :class:`CheckpointError` (a ``ValueError``) is the one error class for a
  checkpoint that cannot be used; :class:`CheckpointNotFoundError` (also a
  ``FileNotFoundError``) and :class:`CheckpointNotADirectoryError` (also a
  ``NotADirectoryError``) are its kinds for a path that is not a folder;
- :func:`checkpoint_folder` checks a checkpoint path (and explains that a Hub id
  such as ``bert-base-uncased`` must be downloaded first);
- :func:`checkpoint_file` confines every file a checkpoint names (weight shards,
  sentence-transformers modules) to its folder;
- :func:`resolve_device` checks a device (a CUDA device when none is visible says
  so, and which backends run here);
- :func:`check_backend` checks backend x device x dtype, so a backend that cannot
  run is refused at load, not at the first forward.

Messages stay one short line whatever the input: a config or file value is echoed
through :func:`short_repr`, file text (tensor keys, a library's error) through
:func:`one_line`, and a list of names through :func:`first_few`.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Iterable
from pathlib import PureWindowsPath

import torch

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointNotADirectoryError",
    "checkpoint_folder",
    "checkpoint_file",
    "short_repr",
    "one_line",
    "first_few",
    "resolve_device",
    "requested_backend",
    "check_backend",
    "runnable_backends",
    "load_options",
]


class CheckpointError(ValueError):
    """The checkpoint folder cannot be loaded (its message says why)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint folder, or a file it needs, does not exist."""


class CheckpointNotADirectoryError(CheckpointError, NotADirectoryError):
    """The checkpoint path is not a folder."""


# ---------------------------------------------------------------- messages
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 160
_SHORT.maxlong = 40
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxdict = 4
_SHORT.maxlevel = 2


def one_line(text, limit: int = 200) -> str:
    """``text`` (a tensor key, a library's error text) for a message: its ends when
    longer than ``limit`` characters, line breaks written as ``\\n``."""
    text = str(text)
    if len(text) > limit:
        text = f"{text[: limit // 2]}...{text[-(limit // 2) :]}"
    return text.replace("\r", "\\r").replace("\n", "\\n")


def short_repr(value) -> str:
    """``repr(value)`` for a message that echoes a config or file value: one line of
    at most about 200 characters however long the string, list, dict or integer
    (its ends are kept, the middle is ``...``)."""
    return one_line(_SHORT.repr(value))


def first_few(items: Iterable, n: int = 5) -> str:
    """The first ``n`` of ``items`` (each through :func:`one_line`), comma-separated,
    then ``... and N more``."""
    items = list(items)
    shown = ", ".join(one_line(item, 100) for item in items[:n])
    return shown if len(items) <= n else f"{shown} ... and {len(items) - n} more"


# ---------------------------------------------------------------- folders and files


def checkpoint_folder(path) -> str:
    """``path`` as a string, checked to be a readable folder holding config.json."""
    if isinstance(path, (bytes, bytearray)):
        path = os.fsdecode(bytes(path))
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"checkpoint path must be a str or os.PathLike, got {type(path).__name__}")
    text = os.fspath(path)
    folder = os.path.expanduser(text)
    if not os.path.exists(folder):
        raise CheckpointNotFoundError(f"checkpoint folder {text} does not exist")
    if not os.path.isdir(folder):
        raise CheckpointNotADirectoryError(
            f"checkpoint path {text} is not a folder (expected a Hugging Face checkpoint "
            f"folder holding config.json and the weights)"
        )
    if not os.access(folder, os.R_OK | os.X_OK):
        raise CheckpointError(f"checkpoint folder {text} is not readable (permissions)")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise CheckpointNotFoundError(
            f"{text} is not a Hugging Face checkpoint folder: no config.json in it"
        )
    return folder


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


def checkpoint_file(folder, name, what: str) -> str:
    """``folder/name`` for a file (or folder) the checkpoint names, refused unless it
    stays inside the checkpoint folder: ``name`` must be a non-empty relative path
    with no ``..`` part, and must not resolve through a symlink to outside the folder
    (except into the ``blobs`` of the Hugging Face cache repo that a
    ``snapshots/<revision>`` folder belongs to). ``what`` says who names it and starts
    the message after the folder: ``"weight file"``, ``"model.safetensors.index.json
    names"``, ... Raises :class:`CheckpointError`."""
    folder = os.fspath(folder)
    shown = short_repr(name)
    if not isinstance(name, str) or not name or "\0" in name:
        raise CheckpointError(f"{folder}: {what} {shown}, which is not a file name")
    if (
        os.path.isabs(name)
        or name.startswith(("/", "\\"))
        or os.path.splitdrive(name)[0]
        or PureWindowsPath(name).anchor
    ):
        raise CheckpointError(
            f"{folder}: {what} the absolute path {shown}; files a checkpoint names must "
            f"be relative to its folder"
        )
    if ".." in name.replace("\\", "/").split("/"):
        raise CheckpointError(
            f"{folder}: {what} {shown}, which leaves the checkpoint folder; files a "
            f"checkpoint names must lie inside it"
        )
    path = os.path.join(folder, name)
    root = os.path.realpath(folder)
    real = os.path.realpath(path)
    if not _inside(real, root):
        snapshots = os.path.dirname(root)
        blobs = os.path.join(os.path.dirname(snapshots), "blobs")
        if not (os.path.basename(snapshots) == "snapshots" and _inside(real, blobs)):
            raise CheckpointError(
                f"{folder}: {what} {shown}, a symlink to {one_line(real)}, outside the "
                f"checkpoint folder; copy the file into the folder instead"
            )
    return path


# ---------------------------------------------------------------- devices
def runnable_backends(device_type: str, dtype: torch.dtype | None = None) -> list[str]:
    """Backends that can run on ``device_type`` (and ``dtype``) in this process."""
    from .ops import dispatch

    out = []
    for name, reason in dispatch.backend_status(device_type).items():
        if reason is not None:
            continue
        if dtype is not None and dtype not in getattr(dispatch.get_backend(name), "dtypes", ()):
            continue
        out.append(name)
    return out


def _no_cuda_reason() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    extra = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return (
        f"torch {torch.__version__} is built with CUDA {torch.version.cuda} but sees no GPU{extra}"
    )


def resolve_device(device) -> torch.device:
    """``device`` as a ``torch.device`` bertfast can run on, or a ValueError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"invalid device {device!r} ({exc}); use 'cpu' or 'cuda[:N]'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            here = ", ".join(runnable_backends("cpu")) or "none"
            raise ValueError(
                f"device {str(device)!r} asked for, but no CUDA device is visible "
                f"({_no_cuda_reason()}); use device='cpu' (backends that run here: {here})"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(
                f"device {str(device)!r} does not exist: torch sees {count} "
                f"CUDA device(s) (cuda:0..cuda:{count - 1})"
            )
    elif dev.type != "cpu":
        raise ValueError(
            f"device {str(device)!r}: bertfast runs on 'cpu' and 'cuda' devices, not {dev.type!r}"
        )
    return dev


# ---------------------------------------------------------------- backends
def requested_backend(backend) -> str:
    """The backend name a call with ``backend`` asks for (``BERTFAST_BACKEND``
    overrides ``"auto"``); ValueError for a name bertfast does not know."""
    from .ops import dispatch

    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    return dispatch._requested(backend)


def check_backend(backend, device: torch.device, dtype: torch.dtype) -> str:
    """Refuse, at load, a backend that cannot run models on ``device`` in ``dtype``
    (``BackendError`` naming the reason and the backends that can). Returns the
    requested name (``"auto"`` or a backend)."""
    from .ops import dispatch

    name = requested_backend(backend)
    if name == "auto":
        return name
    env = " (from BERTFAST_BACKEND)" if backend == "auto" else ""
    reason = dispatch.why_not_here(name, device.type)
    if reason is None and dtype not in dispatch.get_backend(name).dtypes:
        reason = f"it does not support {dtype}"
    if reason is None:
        return name
    here = runnable_backends(device.type, dtype)
    raise dispatch.BackendError(
        f"backend {name!r}{env} cannot run on {device} with {dtype}: {reason}; backends "
        f"that can: {', '.join(['auto'] + here)}"
    )


def load_options(device, dtype, backend) -> torch.device:
    """Check what a load is asked for before any file is read: ``dtype`` a floating
    torch dtype (TypeError), ``device`` usable here (ValueError), ``backend`` (and
    ``BERTFAST_BACKEND``) able to run on them (ValueError / BackendError). Returns the
    device."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"dtype must be a floating torch.dtype (torch.float32, torch.float16, "
            f"torch.bfloat16), got {dtype!r}"
        )
    device = resolve_device(device)
    check_backend(backend, device, dtype)
    return device
