#!/usr/bin/env bash
# Installs, from Debian 12 packages, whatever FlashSampler needs to build and
# test that is not already installed (clang, its sanitizer/libFuzzer runtimes
# and llvm-symbolizer are for scripts/sanitizers.sh and scripts/fuzz.sh; stress-ng for
# scripts/stress-test.sh). Idempotent: a second run installs nothing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librandom123-dev nlohmann-json3-dev libopenblas-dev
  libgtest-dev libgmock-dev
  python3 python3-venv prometheus
  libssl-dev openssl
  prometheus-cpp-dev
  clang libclang-rt-14-dev llvm
  stress-ng
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
