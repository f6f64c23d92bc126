"""Scripts of the repository that the package does not ship (``benchmarks/``,
``tools/``), loaded as modules for the tests that drive them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str) -> ModuleType:
    """The script at ``relpath`` (from the repository root), executed as a module."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
