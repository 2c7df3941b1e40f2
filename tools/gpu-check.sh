#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: runs the GPU suite (every CUDA kernel
# against its CPU reference; the GPU shard against the stories260K reference), then a
# troupe-node serving stories260K from cuda:0 against troupe-run on the CPU (the node test
# of tests/tools/), the same with two GPU stages in two processes (deploy/pp2-gpu.toml,
# joined by a device link where there are two devices), then the decode benchmark on a synthetic 1B model (BF16, batch 1, 8 and
# 64) beside the device's copy bandwidth, and the serving benchmark (troupe-perf serve, c=1
# and c=16 in three rounds) on the synthetic 110M Q8_0 model with BF16 weights on the
# device. Bounded to 8 minutes.
#   tools/gpu-check.sh [BUILD_DIR]     builds the CUDA targets in BUILD_DIR (default build)
#                                      when this machine has CMake and nvcc, else uses it as it is
#   tools/gpu-check.sh --bundle DIR    runs a folder made by tools/gpu-bundle.sh elsewhere
#                                      (for a GPU machine with none of troupe's libraries)
# Needs the NVIDIA driver and the CUDA runtime and cuBLAS libraries of CUDA 13 (the
# toolkit's lib64, the nvidia-* Python wheels' folders, or LD_LIBRARY_PATH); NCCL
# (libnccl.so.2, found the same way) for the tensor-parallel cases over NCCL.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the comment above, as help
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
deadline=$((SECONDS + 480))
left() { echo $((deadline - SECONDS)); }

# CUDA's libraries: the toolkit's, else any folder holding libcublas.so.13.
add_lib() { export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $lib ]] && add_lib "$lib"; done
if ! grep -q 'libcublas.so.13' <<<"$(ldconfig -p)" && ! compgen -G '/usr/local/cuda/lib64/libcublas.so.13*' >/dev/null; then
  while read -r found; do add_lib "$(dirname "$found")"; done < <(find / -xdev -name 'libcublas*.so.13' 2>/dev/null | head -4)
  while read -r found; do add_lib "$(dirname "$found")"; done < <(find / -xdev -name 'libcudart.so.13' 2>/dev/null | head -2)
fi
# NCCL, which tensor-parallel GPU shards load when they start (the suite's NCCL cases are
# skipped without it): the toolkit's, the system's, else any folder holding it.
if ! grep -q 'libnccl.so.2' <<<"$(ldconfig -p)" && ! compgen -G '/usr/local/cuda/lib64/libnccl.so.2*' >/dev/null; then
  while read -r found; do add_lib "$(dirname "$found")"; done < <(find / -xdev -name 'libnccl.so.2' 2>/dev/null | head -2)
fi

if [[ ${1:-} == --bundle ]]; then
  root=$(cd "${2:?usage: tools/gpu-check.sh --bundle DIR}" && pwd)
  add_lib "$root/lib"
  grep -q 'libstdc++.so.6' <<<"$(ldconfig -p)" || add_lib "$root/lib/fallback"
  shared=$root/shared
else
  root=${1:-build}
  if command -v cmake >/dev/null && { command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }; then
    echo "gpu-check: building the CUDA kernels, tests and tools in $root"
    cmake -S . -B "$root" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" -DTROUPE_CUDA=ON >/dev/null
    timeout "$(left)" cmake --build "$root" --target gpu_test troupe-perf make-model troupe-node troupe-client troupe-run -j "$(nproc)"
  fi
  shared=${TROUPE_SHARED_DIR:-$(cd .. && pwd)/shared}
fi
export TROUPE_SHARED_DIR=$shared

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
[[ -x $root/tests/gpu_test ]] || { echo "gpu-check: no gpu_test in $root/tests (build it with CUDA first)"; exit 1; }
rc=0
# The suite's three parts (tests/kernels/cuda/gpu_main.cpp): one device, NCCL, two devices.
# Each ends with its counts of cases run, skipped and failed; a part this machine cannot
# run says why and exits 77.
summary=()
for needs in device nccl two_devices; do
  part_rc=0
  timeout "$(left)" "$root/tests/gpu_test" --needs=$needs ${GPU_TEST_FLAGS:-} | tee "${TMPDIR:-/tmp}/gpu-part.out" || part_rc=${PIPESTATUS[0]}
  case $part_rc in
    0) summary+=("$(grep '^gpu suite' "${TMPDIR:-/tmp}/gpu-part.out" || echo "gpu suite (needs $needs): passed")") ;;
    77) [[ $needs == device ]] && { echo "gpu-check: no CUDA device visible; nothing ran"; exit 77; }
        summary+=("gpu suite (needs $needs): skipped, $(tail -1 "${TMPDIR:-/tmp}/gpu-part.out")") ;;
    *) summary+=("$(grep '^gpu suite' "${TMPDIR:-/tmp}/gpu-part.out" || echo "gpu suite (needs $needs)"): FAILED (exit $part_rc)")
       rc=1 ;;
  esac
done
printf 'gpu-check: %s\n' "${summary[@]}"
# Serving through the actors on the device against troupe-run's greedy output on the CPU
# (the node test): a deploy/ topology with FP32 weights, rewritten by the sed arguments
# that follow its name (and what to call it).
serve_check() {
  local what=$1 file=$2 topology
  shift 2
  topology=$(mktemp --suffix=.toml)
  sed -e "s|\.\./\.\./shared|$shared|" "$@" "deploy/$file" >"$topology"
  grep -q '^\[gpu\]' "$topology" || printf '\n[gpu]\n' >>"$topology"
  sed -i -e '/^weights *=/d' -e 's|^\[gpu\]|[gpu]\nweights = "f32"|' "$topology"
  if timeout "$(left)" tests/tools/node_client_test.sh "$root" "$topology" "$shared/models/stories260K"; then
    echo "gpu-check: troupe-node served $what as troupe-run does on the CPU"
  else
    echo "gpu-check: serving $what failed"
    rc=1
  fi
  rm -f "$topology"
}
if [[ -x $root/tools/troupe-node && -x $root/tools/troupe-client && -x $root/tools/troupe-run ]]; then
  serve_check "one stage on cuda:0" single.toml -e 's|devices = \["cpu"\]|devices = ["cuda:0"]|'
  # Two stages in two processes: on two devices their hidden states go over a device link
  # (NCCL); on one, both stages share cuda:0, NCCL refuses a link within one device, and
  # they go through the host. The same output either way.
  second=$([[ $(nvidia-smi -L 2>/dev/null | wc -l) -ge 2 ]] && echo 1 || echo 0)
  serve_check "two stages on cuda:0 and cuda:$second" pp2-gpu.toml -e "s|cuda:1|cuda:$second|"
fi
if [[ -x $root/tools/troupe-perf && -x $root/tools/make-model ]]; then
  model=${TMPDIR:-/tmp}/troupe-syn1b.bf16.gguf
  [[ -f $model ]] || timeout "$(left)" "$root/tools/make-model" "$model" --preset 1b --type bf16
  timeout "$(left)" "$root/tools/troupe-perf" gpu "$model" -b 1,8,64 -n 64 --weights bf16 ${GPU_BENCH_FLAGS:-} || rc=$?
  # The serving benchmark of BENCHMARKS.md (the engine loop: 128-token prompts, 128
  # outputs) with the forward pass on cuda:0: throughput at 16 requests against 1.
  model=${TMPDIR:-/tmp}/troupe-syn110m.q8_0.gguf
  [[ -f $model ]] || timeout "$(left)" "$root/tools/make-model" "$model" --preset 110m --separate-classifier --type q8_0
  timeout "$(left)" "$root/tools/troupe-perf" serve "$model" --device cuda:0 --weights bf16 -c 1,16 --rounds 3 || rc=$?
fi
exit "$rc"
