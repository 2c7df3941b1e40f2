#!/usr/bin/env bash
# Packs what the GPU check needs into one folder, for a GPU machine that has the NVIDIA
# driver and CUDA runtime but no package manager and none of troupe's other libraries:
# the GPU test suite, troupe-perf and make-model, and troupe-node, troupe-client and
# troupe-run for serving through the actors (built here with CUDA, for the portable x86-64
# baseline so that any host CPU runs them), the shared libraries they need beyond glibc and
# CUDA's own, and the stories260K files the tests read.
# Run it on a machine set up with tools/setup.sh, then on the GPU machine:
#   tools/gpu-check.sh --bundle DIR
# Usage: tools/gpu-bundle.sh [DIR]   (default: gpu-bundle; the build goes to build-gpu)
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above, as help
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
shared=${TROUPE_SHARED_DIR:-../shared}
echo "gpu-bundle: building the CUDA targets in build-gpu (portable ISA)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_ISA=portable -DTROUPE_CUDA=ON >/dev/null
tools=(troupe-perf make-model troupe-node troupe-client troupe-run)
cmake --build build-gpu --target gpu_test "${tools[@]}" -j "$(nproc)"
rm -rf "$out"
# tools/ as in a build folder, so that the process tests (tests/tools/) take the bundle as one.
mkdir -p "$out/tests" "$out/tools" "$out/lib/fallback" "$out/shared/models/stories260K" "$out/shared/reference"
bins=(build-gpu/tests/gpu_test)
cp build-gpu/tests/gpu_test "$out/tests/"
for t in "${tools[@]}"; do
  cp "build-gpu/tools/$t" "$out/tools/"
  bins+=("build-gpu/tools/$t")
done
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
