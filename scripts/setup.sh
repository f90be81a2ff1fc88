#!/usr/bin/env bash
# Installs, from Debian 12 packages, whatever FlashSampler needs to build and
# test that is not already installed (clang, its sanitizer/libFuzzer runtimes
# and llvm-symbolizer are for scripts/sanitizers.sh and scripts/fuzz.sh; stress-ng for
# scripts/stress-test.sh), then the CUTLASS / CuTe headers the Hopper stage-1
# kernel (kernels/cuda/fused_sample_sm90.cu) is built on: the PyPI package
# nvidia-cutlass, pinned, unpacked into .deps/ (git-ignored; CMake's
# FLASHSAMPLER_CUTLASS finds its include folder there). Idempotent: a second run
# installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The CUTLASS release whose headers we compile against. 4.2.0.0 ships CUTLASS
# 4.2's C++ tree (cutlass/ and cute/ under cutlass_library/source/include),
# with the SM90 TMA + WGMMA warp-specialized collective mainloops
# (cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp).
# Changing it: update CUTLASS_PIP_VERSION in CMakeLists.txt too.
cutlass_version=4.2.0.0
cutlass_dir=.deps/nvidia-cutlass-${cutlass_version}

packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librandom123-dev nlohmann-json3-dev libopenblas-dev
  libgtest-dev libgmock-dev
  python3 python3-venv python3-pip prometheus
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

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Headers only: --no-deps skips the package's Python dependencies (the CuTe
# DSL's runtime), which the C++ build never uses. --target installs outside
# any environment (and is exempt from Debian's externally-managed check).
# Installed into a temporary folder and renamed, so an interrupted run leaves
# no half tree that the check below would take for complete.
if [ ! -f "$cutlass_dir/cutlass_library/source/include/cute/tensor.hpp" ]; then
  echo "setup: installing nvidia-cutlass==${cutlass_version} into ${cutlass_dir}" >&2
  rm -rf "$cutlass_dir.partial"
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
    --target "$cutlass_dir.partial" "nvidia-cutlass==${cutlass_version}"
  rm -rf "$cutlass_dir"
  mv "$cutlass_dir.partial" "$cutlass_dir"
fi
