#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: builds the CUDA kernels, their tests and
# the tools if this machine has nvcc and CMake (else uses BUILD_DIR as it came, built
# elsewhere with tools/setup.sh), runs the GPU suite (every CUDA kernel against its CPU
# reference; the GPU shard against the stories260K reference), then the decode benchmark
# on a synthetic 1B model (BF16, batch 1, 8 and 64) beside the device's copy bandwidth.
# Bounded to 8 minutes. Needs the CUDA runtime and cuBLAS libraries (the toolkit's lib64,
# or LD_LIBRARY_PATH).
# Usage: tools/gpu-check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
deadline=$((SECONDS + 480))
for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $lib ]] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if command -v cmake >/dev/null && { command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }; then
  echo "gpu-check: building the CUDA kernels and tests in $build"
  cmake -S . -B "$build" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" -DTROUPE_CUDA=ON >/dev/null
  timeout $((deadline - SECONDS)) cmake --build "$build" --target gpu_kernels_test troupe-perf make-model -j "$(nproc)"
fi
test_bin=$build/tests/gpu_kernels_test
[[ -x $test_bin ]] || { echo "gpu-check: no $test_bin (build it with CUDA first)"; exit 1; }
rc=0
timeout $((deadline - SECONDS)) "$test_bin" || rc=$?
case $rc in
  0) echo "gpu-check: every GPU test passed" ;;
  77) echo "gpu-check: no CUDA device visible; nothing ran"; exit 77 ;;
  *) echo "gpu-check: GPU tests failed (exit $rc)" ;;
esac
if [[ -x $build/tools/troupe-perf && -x $build/tools/make-model ]]; then
  model=${TMPDIR:-/tmp}/troupe-syn1b.bf16.gguf
  [[ -f $model ]] || timeout $((deadline - SECONDS)) "$build/tools/make-model" "$model" --preset 1b --type bf16
  timeout $((deadline - SECONDS)) "$build/tools/troupe-perf" gpu "$model" -b 1,8,64 -n 64 --weights bf16 || rc=$?
fi
exit "$rc"

