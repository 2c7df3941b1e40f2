#!/usr/bin/env bash
# The kernel tests built for the portable x86-64 baseline, the ISA tools/gpu-bundle.sh
# ships (no AVX2 or AVX-512 at compile time; VNNI and AMX still chosen at run time), and
# run: every CPU kernel's portable code against its definition. Release, without CUDA,
# into BUILD_DIR (default build-portable).
# Extra CMake flags: TROUPE_CMAKE_FLAGS.
# Usage: tools/test-portable.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-portable}
tools/install-packages.sh
echo "test-portable: configuring $dir (TROUPE_ISA=portable, no CUDA)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_ISA=portable -DTROUPE_CUDA=OFF ${TROUPE_CMAKE_FLAGS:-} >/dev/null
echo "test-portable: building the kernel tests ($(nproc) jobs)"
cmake --build "$dir" -j "$(nproc)" --target kernels_test
cd "$dir"
ctest --output-on-failure -j "$(nproc)" --timeout 600 -R '^kernels_test:'
