#!/usr/bin/env bash
# Fuzzes the parsers of outside input (tests/fuzz: checkpoints, tokenizer files, the wire
# frames, the OpenAI bodies, topologies) for a bounded time, under AddressSanitizer and
# UBSan, and replays each target's regression inputs first. Builds the libFuzzer targets
# with clang into BUILD_DIR, the sanitized build's directory (tools/test-sanitized.sh
# builds its suites there), so the two share their libraries.
#
# Each target starts from its committed seeds (tests/fuzz/corpus/NAME, read only; the
# topology parser from deploy/) and keeps what it finds in a scratch directory. A crash,
# a leak, a timeout or running out of memory fails the run; the input that did it is kept
# under BUILD_DIR/fuzz/artifacts and named. When the fault is fixed, copy that input into
# tests/fuzz/regressions/NAME/.
#
# Usage: tools/fuzz.sh [--seconds N] [--make-seeds] [BUILD_DIR] [TARGET...]
#   --seconds N    fuzzing time per target (default 60); targets run two at a time
#   --make-seeds   rewrite tests/fuzz/corpus from the seed writer, and stop
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
make_seeds=0
args=()
while (($#)); do
  case $1 in
    --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
    --make-seeds) make_seeds=1; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ $seconds =~ ^[0-9]+$ ]] && ((seconds > 0)) || { echo "fuzz: --seconds takes a whole number above 0, not '$seconds'" >&2; exit 2; }
dir=${args[0]:-build-sanitize}
targets=("${args[@]:1}")
all_targets=(model_files tokenizer_files wire openai http_reader kv_records link_frames topology)
((${#targets[@]})) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz: no target '$t' (there are: ${all_targets[*]})" >&2; exit 2; }
done

tools/install-packages.sh
tools/configure-sanitized.sh "$dir"
echo "fuzz: building the targets in $dir ($(nproc) jobs)"
cmake --build "$dir" -j "$(nproc)" --target fuzz_targets fuzz_make_seeds
bin=$dir/tests/fuzz

if ((make_seeds)); then
  rm -rf tests/fuzz/corpus
  "$bin/fuzz_make_seeds" tests/fuzz/corpus
  echo "fuzz: seeds written:"
  for t in model_files tokenizer_files wire openai http_reader kv_records link_frames; do printf '  %-16s %3d files, %6d bytes\n' "$t" "$(ls tests/fuzz/corpus/$t | wc -l)" "$(cat tests/fuzz/corpus/$t/* | wc -c)"; done
  exit 0
fi

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp
work=$dir/fuzz
rm -rf "$work/found" "$work/logs"
mkdir -p "$work/found" "$work/logs" "$work/artifacts"

# Regressions: every input that once failed, run once each.
for t in "${targets[@]}"; do
  shopt -s nullglob
  inputs=(tests/fuzz/regressions/$t/*)
  shopt -u nullglob
  ((${#inputs[@]})) || continue
  if ! "$bin/fuzz_$t" -runs=1 "${inputs[@]}" >"$work/logs/$t.regressions" 2>&1; then
    echo "fuzz: $t fails one of its regression inputs:" >&2
    tail -40 "$work/logs/$t.regressions" >&2
    exit 1
  fi
  echo "fuzz: $t: ${#inputs[@]} regression inputs pass"
done

# The bounded runs, two targets at a time. -timeout: one input taking 10 s is a hang.
run() {
  local t=$1 seeds=tests/fuzz/corpus/$1
  [[ $t == topology ]] && seeds=deploy
  mkdir -p "$work/found/$t"
  "$bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$t-" \
    "$work/found/$t" "$seeds" >"$work/logs/$t" 2>&1
}
echo "fuzz: ${#targets[@]} targets, $seconds s each, two at a time"
declare -A pid_of
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= 2)); do wait -n || true; done
  run "$t" &
  pid_of[$t]=$!
done
failed=()
for t in "${targets[@]}"; do
  wait "${pid_of[$t]}" || failed+=("$t")
done

printf '%-16s %12s %8s %8s %8s %8s\n' target executions exec/s edges features corpus
for t in "${targets[@]}"; do
  log=$work/logs/$t
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*' | tail -1)
  read -r _ cov _ ft _ corp <<<"${last:-x - x - x -}"
  printf '%-16s %12s %8s %8s %8s %8s\n' "$t" "${runs:--}" "${rate:--}" "$cov" "$ft" "$corp"
done
if ((${#failed[@]})); then
  for t in "${failed[@]}"; do
    echo "fuzz: $t FAILED; its log ends:" >&2
    grep -v '^#[0-9]' "$work/logs/$t" | tail -40 >&2
    ls "$work/artifacts/$t-"* 2>/dev/null | sed 's/^/fuzz: the input: /' >&2
  done
  echo "fuzz: fix the fault, then copy the input into tests/fuzz/regressions/TARGET/" >&2
  exit 1
fi
echo "fuzz: no crash, leak, hang or memory blow-up in any target"
