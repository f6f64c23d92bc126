#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over the native CPU kernels.
#
# Builds bertfast._C CPU-only with -fsanitize=address,undefined in its own build
# directory (build/sanitize; the main build is left alone), stages it next to the
# package's Python sources and runs the op tests that reach the C++ kernels under
# it: the tests in tests/ops on the cpu backend, including the direct calls of
# every _C.cpu entry point with inconsistent sizes (tests/ops/test_native_safety.py).
# Any sanitizer report aborts the run with a non-zero status.
#
# Needs the environment of README's test command (torch, the test extras); run it
# from that environment: `.ci/sanitize.sh` (PYTHON=... to pick another interpreter).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
py="${PYTHON:-python}"
build="$repo/build/sanitize"
pkg="$build/pkg"

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBERTFAST_SKIP_CUDA=ON -DBERTFAST_SANITIZE=address,undefined \
  -DPython_EXECUTABLE="$(command -v "$py")" >/dev/null
cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)"

# The package's Python files (links) plus the sanitized extension.
rm -rf "$pkg"
mkdir -p "$pkg/bertfast"
for entry in "$repo"/bertfast/*; do
  case "$(basename "$entry")" in _C.*|__pycache__) continue ;; esac
  ln -s "$entry" "$pkg/bertfast/"
done
cp "$build"/_C*.so "$pkg/bertfast/"

# The ASan runtime must come first; libstdc++ must be loaded when it starts, or its
# __cxa_throw interceptor finds nothing to wrap and the first C++ exception aborts
# (python itself does not link libstdc++).
cc="${CXX:-c++}"
preload="$("$cc" -print-file-name=libasan.so) $("$cc" -print-file-name=libstdc++.so)"
export LD_PRELOAD="$preload${LD_PRELOAD:+ $LD_PRELOAD}"
# Python and torch are not instrumented: no leak report (their allocations would be
# reported), no alloc/dealloc pairing across the boundary; everything else aborts.
export ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export BERTFAST_TEST_BACKENDS=cpu
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

"$py" - "$pkg" "$@" <<'EOF'
import sys

pkg = sys.argv[1]
# Import the staged package, not an editable install's redirect or the source tree.
sys.meta_path[:] = [f for f in sys.meta_path
                    if type(f).__name__ != "ScikitBuildRedirectingFinder"]
sys.path.insert(0, pkg)
import bertfast
import bertfast._C

assert bertfast._C.__file__.startswith(pkg), bertfast._C.__file__
print(f"sanitized extension: {bertfast._C.__file__}", flush=True)

import pytest

sys.exit(pytest.main([
    # --capture=sys: a sanitizer report (written to fd 2) reaches the log even
    # though the process aborts in the middle of a test.
    "-q", "-p", "no:cacheprovider", "--capture=sys", "tests/ops",
    # The reference and the Triton kernels do not reach the native code.
    "--ignore=tests/ops/test_triton_backend.py", "--ignore=tests/ops/test_reference.py",
    "-m", "not gpu", "-k", "not triton",
    *sys.argv[2:],
]))
EOF
echo "sanitize: no AddressSanitizer / UBSan report"
