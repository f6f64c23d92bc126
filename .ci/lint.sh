#!/usr/bin/env bash
# Linters over the whole tree, at the versions .pre-commit-config.yaml pins:
# ruff (lint + format check; config in pyproject.toml) and clang-format (C++/CUDA;
# config in .clang-format). Runs from any copy of the tree (no git needed).
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pip install -q "ruff==0.17.6" "clang-format==23.1.5"
ruff check .
ruff format --check .
find csrc kernels -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
  xargs -0 clang-format --dry-run -Werror
