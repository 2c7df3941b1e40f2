#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: runs the GPU suite (every CUDA kernel
# against its CPU reference; the GPU shard against the stories260K reference), then the
# decode benchmark on a synthetic 1B model (BF16, batch 1, 8 and 64) beside the device's
# copy bandwidth. Bounded to 8 minutes.
#   tools/gpu-check.sh [BUILD_DIR]     builds the CUDA targets in BUILD_DIR (default build)
#                                      when this machine has CMake and nvcc, else uses it as it is
#   tools/gpu-check.sh --bundle DIR    runs a folder made by tools/gpu-bundle.sh elsewhere
#                                      (for a GPU machine with none of troupe's libraries)
# Needs the NVIDIA driver and the CUDA runtime and cuBLAS libraries of CUDA 13 (the
# toolkit's lib64, the nvidia-* Python wheels' folders, or LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
deadline=$((SECONDS + 480))
left() { echo $((deadline - SECONDS)); }

# CUDA's libraries: the toolkit's, else any folder holding libcublas.so.13.
add_lib() { export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $lib ]] && add_lib "$lib"; done
if ! ldconfig -p | grep -q 'libcublas.so.13' && ! compgen -G '/usr/local/cuda/lib64/libcublas.so.13*' >/dev/null; then
  while read -r found; do add_lib "$(dirname "$found")"; done < <(find / -xdev -name 'libcublas*.so.13' 2>/dev/null | head -4)
  while read -r found; do add_lib "$(dirname "$found")"; done < <(find / -xdev -name 'libcudart.so.13' 2>/dev/null | head -2)
fi

if [[ ${1:-} == --bundle ]]; then
  bundle=$(cd "${2:?usage: tools/gpu-check.sh --bundle DIR}" && pwd)
  bin=$bundle/bin
  add_lib "$bundle/lib"
  ldconfig -p | grep -q 'libstdc++.so.6' || add_lib "$bundle/lib/fallback"
  export TROUPE_SHARED_DIR=$bundle/shared
else
  build=${1:-build}
  if command -v cmake >/dev/null && { command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }; then
    echo "gpu-check: building the CUDA kernels and tests in $build"
    cmake -S . -B "$build" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" -DTROUPE_CUDA=ON >/dev/null
    timeout "$(left)" cmake --build "$build" --target gpu_kernels_test troupe-perf make-model -j "$(nproc)"
  fi
  mkdir -p "$build/gpu-check-bin"
  for b in tests/gpu_kernels_test tools/troupe-perf tools/make-model; do
    [[ -x $build/$b ]] && ln -sf "$(cd "$build" && pwd)/$b" "$build/gpu-check-bin/"
  done
  bin=$build/gpu-check-bin
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
[[ -x $bin/gpu_kernels_test ]] || { echo "gpu-check: no gpu_kernels_test in $bin (build it with CUDA first)"; exit 1; }
rc=0
timeout "$(left)" "$bin/gpu_kernels_test" ${GPU_TEST_FLAGS:-} || rc=$?
case $rc in
  0) echo "gpu-check: every GPU test passed" ;;
  77) echo "gpu-check: no CUDA device visible; nothing ran"; exit 77 ;;
  *) echo "gpu-check: GPU tests failed (exit $rc)" ;;
esac
if [[ -x $bin/troupe-perf && -x $bin/make-model ]]; then
  model=${TMPDIR:-/tmp}/troupe-syn1b.bf16.gguf
  [[ -f $model ]] || timeout "$(left)" "$bin/make-model" "$model" --preset 1b --type bf16
  timeout "$(left)" "$bin/troupe-perf" gpu "$model" -b 1,8,64 -n 64 --weights bf16 ${GPU_BENCH_FLAGS:-} || rc=$?
fi
exit "$rc"
