#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test, then fuzzes the
# parsers of outside input for a bounded time (tools/fuzz.sh; TROUPE_FUZZ_SECONDS per
# target, 30 by default; 0 skips the fuzzing).
#
# The fuzz targets need a second build (clang, AddressSanitizer and UBSan, into
# build-sanitize). It compiles in the background at the lowest priority while the suite
# runs: the process tests leave a core idle much of the time, and it takes those cycles,
# not theirs. TROUPE_SANITIZED_TARGETS names more targets for that build (.ci/run adds the
# unit suites tools/test-sanitized.sh runs next).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${TROUPE_FUZZ_SECONDS:-30}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "test: TROUPE_FUZZ_SECONDS is a whole number of seconds, not '$seconds'" >&2; exit 2; }
t0=$SECONDS
tools/setup.sh build
echo "test: built in $((SECONDS - t0)) s"
background=
if ((seconds > 0)); then
  tools/configure-sanitized.sh build-sanitize
  # shellcheck disable=SC2086
  setsid nice -n 19 cmake --build build-sanitize -j "$(nproc)" --target fuzz_targets fuzz_make_seeds ${TROUPE_SANITIZED_TARGETS:-} \
    >build-sanitize/background.log 2>&1 &
  background=$!
  echo "test: the sanitized build compiles beside the suite (build-sanitize/background.log)"
fi
t1=$SECONDS
status=0
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600) || status=$?
echo "test: the suite ran in $((SECONDS - t1)) s"
if ((status != 0)); then
  [[ -z $background ]] || kill -- "-$background" 2>/dev/null || true  # (its own process group)
  exit "$status"
fi
if [[ -n $background ]]; then
  t2=$SECONDS
  wait "$background" || { tail -50 build-sanitize/background.log; echo "test: the sanitized build failed" >&2; exit 1; }
  echo "test: waited $((SECONDS - t2)) s for the sanitized build"
fi
((seconds == 0)) || tools/fuzz.sh --seconds "$seconds" build-sanitize
echo "test: every part passed in $((SECONDS - t0)) s"
