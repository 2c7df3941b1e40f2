#!/usr/bin/env bash
# Installs the Debian packages troupe builds with (when missing), configures and builds.
# Usage: tools/setup.sh [BUILD_DIR]   (default: build). Extra CMake flags: TROUPE_CMAKE_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

packages=(g++ cmake ninja-build pkg-config doctest-dev libcli11-dev libtomlplusplus-dev capnproto libcapnp-dev libcaf-dev libspdlog-dev
          libcpp-httplib-dev nlohmann-json3-dev curl python3 prometheus)
# The HTTP API's test drives it with the official openai npm package.
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "setup: configuring $build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${TROUPE_CMAKE_FLAGS:-} >/dev/null
echo "setup: building ($(nproc) jobs)"
cmake --build "$build_dir" -j "$(nproc)"
