#!/usr/bin/env bash
# collect_libs.sh DEST BINARY...: copies the binaries to DEST/bin and every
# shared library they load to DEST/lib, except the C runtime and the CUDA
# libraries, which the CUDA runtime image (and the driver) provide.
set -euo pipefail
dest="$1"; shift
mkdir -p "$dest/bin" "$dest/lib"
for bin in "$@"; do
  install -m 0755 "$bin" "$dest/bin/"
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*|libnvidia*) ;;
      *) cp -Ln "$lib" "$dest/lib/" ;;
    esac
  done
done
strip --strip-unneeded "$dest"/bin/* "$dest"/lib/* 2>/dev/null || true
