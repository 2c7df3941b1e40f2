#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test, then fuzzes the
# parsers of outside input for a bounded time (tools/fuzz.sh; TROUPE_FUZZ_SECONDS per
# target, 60 by default; 0 leaves the fuzzing to the caller, as .ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)
seconds=${TROUPE_FUZZ_SECONDS:-60}
[[ $seconds == 0 ]] || tools/fuzz.sh --seconds "$seconds"
