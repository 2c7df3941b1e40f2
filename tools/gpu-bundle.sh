#!/usr/bin/env bash
# Packs what the GPU check needs into one folder, for a GPU machine that has the NVIDIA
# driver and CUDA runtime but no package manager and none of troupe's other libraries:
# the GPU test suite, troupe-perf and make-model (built here with CUDA, for the portable
# x86-64 baseline so that any host CPU runs them), the shared libraries they need beyond
# glibc and CUDA's own, and the stories260K model and reference the end-to-end test reads.
# Run it on a machine set up with tools/setup.sh, then on the GPU machine:
#   tools/gpu-check.sh --bundle DIR
# Usage: tools/gpu-bundle.sh [DIR]   (default: gpu-bundle; the build goes to build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
shared=${TROUPE_SHARED_DIR:-../shared}
echo "gpu-bundle: building the CUDA targets in build-gpu (portable ISA)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_ISA=portable -DTROUPE_CUDA=ON >/dev/null
cmake --build build-gpu --target gpu_kernels_test troupe-perf make-model -j "$(nproc)"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/fallback" "$out/shared/models/stories260K" "$out/shared/reference"
bins=(build-gpu/tests/gpu_kernels_test build-gpu/tools/troupe-perf build-gpu/tools/make-model)
cp "${bins[@]}" "$out/bin/"
# Libraries beyond the C runtime and CUDA's (the GPU machine has its own driver and toolkit).
ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libcuda.so*|libcudart.so*|libcublas*.so*) ;;
    libstdc++.so*) cp -L "$lib" "$out/lib/fallback/" ;;  # used only where the machine has none
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
cp "$shared/models/stories260K/stories260K.bin" "$shared/models/stories260K/tok512.bin" "$out/shared/models/stories260K/"
cp "$shared/reference/stories260K_greedy.jsonl" "$out/shared/reference/"
du -sh "$out"
