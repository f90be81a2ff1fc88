#!/usr/bin/env bash
# Builds and runs the CPU tests under sanitizers (FLASHSAMPLER_CUDA=OFF, clang):
#   asan: build-asan/, every test labelled cpu under ASan + UBSan
#         (FLASHSAMPLER_SANITIZE=address,undefined via FLASHSAMPLER_FUZZ=ON, so the
#         same folder also builds the fuzz targets for scripts/fuzz.sh).
#   tsan: build-tsan/, the tests of our threaded components (dynamic batcher, worker
#         pool, tiled sampler, CPU engine, the local channel's server in one
#         process, the bearer token's swap and its file watcher) under TSan. The gRPC server paths
#         (server_e2e_test, hostile_client_test) are not run under TSan: Debian's
#         gRPC is not instrumented, and its call objects, allocated and handed
#         between threads inside libgrpc, produce dozens of reports per run that
#         TSan cannot tell from real ones (they run under ASan+UBSan instead).
# Usage: scripts/sanitizers.sh [asan|tsan|all] [CTEST_ARG...] (default all); any
# further arguments go to ctest as they are (e.g. -N to build and list only,
# --output-junit FILE for scripts/stress-test.sh). Extra environment:
#   FLASHSAMPLER_SANITIZE_JOBS  build parallelism (default: nproc)
# Any sanitizer report fails its test (halt_on_error / -fno-sanitize-recover).
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
shift || true
ctest_args=("$@")
jobs="${FLASHSAMPLER_SANITIZE_JOBS:-$(nproc)}"
source scripts/phase-times.sh
bash scripts/setup.sh

# -O1 keeps the instrumented tests fast enough while compiling quicker than -O2;
# no NDEBUG, so assert() stays live.
common=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
        -DCMAKE_BUILD_TYPE=RelWithDebInfo
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1"
        -DFLASHSAMPLER_CUDA=OFF -DFLASHSAMPLER_BUILD_TESTS=ON
        "-DFLASHSAMPLER_PYTHON_ENV=$PWD/build/pyenv")
symbolizer="$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)"

run_asan() {
  cmake -S . -B build-asan "${common[@]}" -DFLASHSAMPLER_FUZZ=ON -DFLASHSAMPLER_SANITIZE=
  phase asan-build cmake --build build-asan -j"$jobs"
  bash scripts/python_env.sh build/pyenv
  # The server child processes of the e2e tests inherit these. A small
  # quarantine keeps the hostile-client test's memory bound meaningful (freed
  # blocks are held back up to this size before reuse).
  # The Python client, manifest and PromQL checks test no C++ of ours beyond
  # what the e2e tests run here; they run in the normal build.
  # The goodness-of-fit suites draw millions of samples through the same code
  # the other tiled- and controlled-sampler tests cover: minutes each under
  # ASan, nothing new. So do verify_chain_test's chi-square suites (the
  # small-batch draft-row tests in the same binary still run).
  GTEST_FILTER='-TiledSamplerGoodnessOfFit.*:*ControlledSamplerFit*:*VerifyChainExactness*:VerifyChainEngine.ControlledRowsUseTheFilteredDistribution' \
  ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:quarantine_size_mb=32:detect_stack_use_after_return=0${symbolizer:+:external_symbolizer_path=$symbolizer}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0" \
    phase asan-tests ctest --test-dir build-asan --output-on-failure --no-tests=error -L cpu -j"$jobs" \
      -E '^(python_client_test|python_client_torch_test|hf_generate_test|deploy_manifests_test|prometheus_queries_test)$' "${ctest_args[@]}"
}

run_tsan() {
  cmake -S . -B build-tsan "${common[@]}" -DFLASHSAMPLER_FUZZ=OFF -DFLASHSAMPLER_SANITIZE=thread
  local tests=(dynamic_batcher_test completion_pool_test worker_pool_test tiled_sampler_test cpu_engine_test
               local_channel_server_test bearer_token_auth_test token_file_watcher_test)
  phase tsan-build cmake --build build-tsan -j"$jobs" --target "${tests[@]}"
  local pattern
  pattern="^($(IFS='|'; echo "${tests[*]}"))\$"
  # As under ASan, no goodness-of-fit suites (statistics, not threading; the
  # thread-count tests of the tiled sampler stay).
  GTEST_FILTER='-TiledSamplerGoodnessOfFit.*' \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp${symbolizer:+:external_symbolizer_path=$symbolizer}" \
    phase tsan-tests ctest --test-dir build-tsan --output-on-failure --no-tests=error -R "$pattern" -j1 "${ctest_args[@]}"
}

case "$which" in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_asan; run_tsan ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
