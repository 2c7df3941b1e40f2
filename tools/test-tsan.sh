#!/usr/bin/env bash
# The suites whose threads share state outside CAF, built with ThreadSanitizer and run:
# the kernels' thread pool (kernels_test, engine_test: every model run splits its work
# over threads), the KV tiers' writer and prefetch threads and the KV channel's sender and
# receiver (engine_test), the HTTP server's I/O and handler threads, the step link
# server, and TLS streams for step links and KV channels (the actors_test cases below).
# Built by clang at -O1 with line tables, without CUDA, into BUILD_DIR (default
# build-tsan). Any report fails the run.
#
# Left out: the distribution test of speculative sampling (26,000 sampled requests, two
# minutes under ThreadSanitizer, on the same threads as the greedy speculative tests that
# run here; the optimized build of tools/test.sh runs it), and tests whose actors exchange
# messages through CAF. Debian's CAF is not built with ThreadSanitizer, so the
# synchronization inside it (lock-free mailboxes, the scheduler's queues) is invisible,
# and every message handed from one thread to another reads as a race: a run of the
# whole actors_test gives about 3,300 reports, each with a CAF frame in one of its
# stacks, and suppressing those frames would suppress every report in an actor, real or
# not.
#
# With --build-only it builds and stops (.ci/run compiles it in the background).
# Usage: tools/test-tsan.sh [--build-only] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
dir=${1:-build-tsan}
tools/install-packages.sh
echo "test-tsan: configuring $dir (clang, ThreadSanitizer, -O1, no CUDA)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -gline-tables-only" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
  -DTROUPE_TSAN=ON -DTROUPE_CUDA=OFF ${TROUPE_CMAKE_FLAGS:-} >/dev/null
echo "test-tsan: building the suites ($(nproc) jobs)"
cmake --build "$dir" -j "$(nproc)" --target kernels_test engine_test actors_test
((build_only == 0)) || exit 0
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
cd "$dir"
actors='http server|http reader|a step link|capnps|tls step links|tls kv channels|secured step links|tls files'
ctest --output-on-failure -j "$(nproc)" --timeout 900 -R "^(kernels_test|engine_test):|^actors_test:($actors)" \
  -E "sampled output with speculation"
