"""The tensor entry points of ``bertfast._C`` as Python functions.

The extension registers its kernels as torch operators through the LibTorch stable ABI
(``torch.ops.bertfast_cpu.*``, ``torch.ops.bertfast_cuda.*``; csrc/binding.h). Its
module init (csrc/module.cpp) calls :func:`attach` to put each on ``_C.cpu`` /
``_C.cuda`` as a function of the same name that raises an entry point's error as the
exception it names. Imports nothing of bertfast: the extension imports it while it
loads.
"""

from __future__ import annotations

import functools
import re

import torch

#: The tag an entry point's error carries (csrc/binding.h), and the exception it is.
_TAGGED = re.compile(r"(ValueError|TypeError|IndexError): (bertfast\._C\.[^\n]*)")
_KINDS = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError}


def python_error(exc: BaseException) -> BaseException:
    """The Python exception a native entry point meant: torch raises a tagged error
    ("TypeError: bertfast._C.cpu.<op>: ...") as RuntimeError, ValueError or
    IndexError; this is the tag's exception with the message after it, or ``exc``
    itself for an untagged one (a CUDA launch failure, torch's own errors)."""
    m = _TAGGED.search(str(exc))
    if m is None:
        return exc
    return _KINDS[m.group(1)](m.group(2).rstrip())


def _entry_point(op, namespace: str, name: str) -> object:
    """``op`` (a torch operator) as a function that raises what :func:`python_error`
    says, and arguments that do not fit its schema (which torch reports as
    "<namespace>::<name>() Expected a value of type ..." RuntimeError) as TypeError."""
    schema_error = f"{namespace}::{name}()"
    public = f"bertfast._C.{namespace.removeprefix('bertfast_')}.{name}"

    @functools.wraps(op)
    def call(*args, **kwargs):
        try:
            return op(*args, **kwargs)
        except (RuntimeError, ValueError, IndexError) as exc:
            text = str(exc)
            if type(exc) is RuntimeError and text.startswith(schema_error):
                first = text[len(schema_error) :].strip().splitlines()[0]
                raise TypeError(f"{public}: {first}") from None
            raise python_error(exc) from None

    return call


def attach(module, namespace: str) -> None:
    """Put every operator of ``torch.ops.<namespace>`` on ``module`` (``_C.cpu`` or
    ``_C.cuda``) as a function of the same name (the extension's registrations)."""
    prefix = namespace + "::"
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        name = qualified[len(prefix) :] if qualified.startswith(prefix) else ""
        if name and "." not in name:
            op = getattr(getattr(torch.ops, namespace), name)
            setattr(module, name, _entry_point(op, namespace, name))
