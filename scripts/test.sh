#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything and runs
# the whole test suite with ctest. On a machine without a GPU the tests labelled
# `gpu` are excluded (they would fail loudly there); with a GPU everything runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase-times.sh
phase setup bash scripts/setup.sh
phase configure cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHSAMPLER_BUILD_TESTS=ON
phase build cmake --build build -j"$(nproc)"
phase python-env bash scripts/python_env.sh build/pyenv
phase hf-env bash scripts/hf_env.sh build/hfenv
exclude=()
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }; then
  echo "test.sh: no GPU on this machine: excluding tests labelled gpu"
  exclude=(-LE gpu)
fi
phase tests ctest --test-dir build --output-on-failure --no-tests=error -j"$(nproc)" "${exclude[@]}" "$@"
