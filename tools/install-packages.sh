#!/usr/bin/env bash
# Installs the Debian packages troupe builds, tests and serves with, those that are missing
# (with sudo when not root). tools/setup.sh and the CI build variants call it.
set -euo pipefail
packages=(g++ clang cmake ninja-build pkg-config doctest-dev libcli11-dev libtomlplusplus-dev capnproto libcapnp-dev libcaf-dev libspdlog-dev
          libcpp-httplib-dev libboost-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev curl python3 prometheus
          python3-torch   # (the model families' test compares logits with a torch reference; troupe-train)
          python3-numpy   # (KV eviction's served test computes each policy's output independently)
          libopenblas0-pthread   # (torch's matrix products: Debian's reference BLAS is several times slower)
          systemd python3-yaml   # (troupe-launch export's test verifies units, reads manifests)
          chromium               # (the status page's test renders it headless)
          libhiredis-dev redis-server   # (the KV cache's Redis tier; its tests start a server)
          libssl-dev openssl)           # (TLS between nodes; its test plays strangers with openssl s_client)
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
