#!/usr/bin/env bash
# Builds the libFuzzer targets (FLASHSAMPLER_FUZZ=ON, clang, ASan + UBSan) and
# runs each for a bounded time, starting from the committed seeds in
# fuzz/corpus/<target>/. New corpus entries go to a scratch folder in the build
# folder, never into the repository.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
#   Targets run in parallel, FLASHSAMPLER_FUZZ_JOBS at a time (default: nproc),
#   each for the full SECONDS_PER_TARGET; every target's log is kept in
#   <build>/fuzz-work/<target>/log and printed (its tail) when it fails.
#   FLASHSAMPLER_FUZZ_BUILD  build folder (default build-fuzz; scripts/sanitizers.sh's
#                            build-asan is configured for fuzzing too and can be reused)
# A crash stops with a non-zero status and names the input: copy it into
# fuzz/regressions/<target>/ (the tests in tests/fuzz/ replay it) and fix the bug.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request_bytes request_edits region_descriptor local_frame safetensors sampling_params)
build="${FLASHSAMPLER_FUZZ_BUILD:-build-fuzz}"
jobs="${FLASHSAMPLER_FUZZ_JOBS:-$(nproc)}"
[ "$jobs" -ge 1 ] || jobs=1
bash scripts/setup.sh

if ! grep -q '^FLASHSAMPLER_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHSAMPLER_CUDA=OFF -DFLASHSAMPLER_BUILD_TESTS=OFF \
    -DFLASHSAMPLER_FUZZ=ON
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/%/_fuzz}"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# One target: its own corpus scratch folder, artifacts and log; its exit
# status goes to $work/rc (the caller reads it after the wait).
run_target() {
  local t="$1" work="$build/fuzz-work/$1" rc=0
  "$build/bin/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" "fuzz/corpus/$t" >"$work/log" 2>&1 || rc=$?
  echo "$rc" >"$work/rc"
}

# Targets run `jobs` at a time (one per core), each for the full `seconds`:
# N targets take about ceil(N / jobs) * seconds of wall time.
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  mkdir -p "$work/corpus" "$work/artifacts"
  rm -f "$work/rc"
done
echo "fuzz.sh: ${targets[*]}: ${seconds}s each, $jobs at a time" >&2
pids=()
for t in "${targets[@]}"; do
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || true
    pids=("${pids[@]:1}")
  fi
  run_target "$t" &
  pids+=("$!")
done
for pid in "${pids[@]}"; do wait "$pid" || true; done

status=0
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  rc="$(cat "$work/rc" 2>/dev/null || echo missing)"
  if [ "$rc" != 0 ]; then
    echo "fuzz.sh: $t FAILED (exit status $rc); last lines of $work/log:" >&2
    tail -n 40 "$work/log" >&2 || true
    ls -1 "$work/artifacts" >&2
    status=1
  else
    echo "fuzz.sh: $t ok: $(grep -E '^stat::number_of_executed_units' "$work/log" | tr -d '\n'); $(grep -E '^Done' "$work/log" || true)" >&2
  fi
done
exit "$status"
