#!/usr/bin/env bash
# Builds the libFuzzer targets (FLASHSAMPLER_FUZZ=ON, clang, ASan + UBSan) and
# runs each for a bounded time, starting from the committed seeds in
# fuzz/corpus/<target>/. New corpus entries go to a scratch folder in the build
# folder, never into the repository.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
#   FLASHSAMPLER_FUZZ_BUILD  build folder (default build-fuzz; scripts/sanitizers.sh's
#                            build-asan is configured for fuzzing too and can be reused)
# A crash stops with a non-zero status and names the input: copy it into
# fuzz/regressions/<target>/ (the tests in tests/fuzz/ replay it) and fix the bug.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request_bytes request_edits safetensors)
build="${FLASHSAMPLER_FUZZ_BUILD:-build-fuzz}"
bash scripts/setup.sh

if ! grep -q '^FLASHSAMPLER_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHSAMPLER_CUDA=OFF -DFLASHSAMPLER_BUILD_TESTS=OFF \
    -DFLASHSAMPLER_FUZZ=ON
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/%/_fuzz}"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  mkdir -p "$work/corpus" "$work/artifacts"
  echo "fuzz.sh: $t for ${seconds}s" >&2
  if ! "$build/bin/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
      "$work/corpus" "fuzz/corpus/$t" >"$work/log" 2>&1; then
    echo "fuzz.sh: $t FAILED; last lines of $work/log:" >&2
    tail -n 40 "$work/log" >&2
    ls -1 "$work/artifacts" >&2
    status=1
  else
    grep -E '^stat::number_of_executed_units|^Done' "$work/log" >&2 || true
  fi
done
exit "$status"
