#!/usr/bin/env bash
# Configures BUILD_DIR for the sanitized build that tools/test-sanitized.sh and
# tools/fuzz.sh share: clang (libFuzzer; and it compiles this unoptimized, instrumented
# code in about half the time g++ takes), AddressSanitizer and UBSan, Debug (-O0, the
# kernels -O1; line tables only, which is all a report's stack needs, in ~15% less compile
# time than full debug information), the fuzz targets and their coverage counters, no CUDA.
# Extra CMake flags: TROUPE_CMAKE_FLAGS (.ci/run's -DTROUPE_UNITY=ON, say).
# Usage: tools/configure-sanitized.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: tools/configure-sanitized.sh BUILD_DIR}
echo "configure-sanitized: $dir (clang, AddressSanitizer and UBSan, -O0 with -O1 kernels, fuzz targets, no CUDA)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
  -DTROUPE_SANITIZE=ON -DTROUPE_FUZZ=ON -DTROUPE_CUDA=OFF ${TROUPE_CMAKE_FLAGS:-} >/dev/null
