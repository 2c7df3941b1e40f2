#!/usr/bin/env bash
# Prefill/decode disaggregation against colocation, for BENCHMARKS.md: the synthetic 110M
# Q8_0 model on the machine's two cores either way, serving two clients at once, both with
# Poisson arrivals (the same offered load for either layout): chats (CHAT_WORDS-word
# prompts, 64 output tokens, CHAT_RATE a second) and long documents (LONG_WORDS-word
# prompts, over 1,000 tokens, 16 output tokens, LONG_RATE a second); prefill chunks of 256
# tokens. Colocated: one replica, one process with two threads, taking both kinds.
# Disaggregated: a prefill replica and a decode replica, one process and one thread each
# (written the way deploy/disagg.toml is). The same workload (SEED) alternated RUNS times;
# prints each run, then a Markdown table of medians: the chats' inter-token latency (what a
# long prompt computed beside running streams stalls), their TTFT and the documents', and
# output throughput.
#
# Sized to the machine: the interference shows in the chats' ITL p99 only where more than
# 1% of their tokens come from a step that also computes a document's chunk. So unless
# LONG_RATE is given, documents arrive often enough to keep the colocated replica
# prefilling BUSY (default 0.25) of the time: LONG_RATE = BUSY / (a document's tokens /
# the prompt tokens a second both threads compute, measured first by troupe-perf
# prefill). The run lasts about DURATION seconds (default 120) for both kinds.
#   tools/bench-disagg.sh
#   LONG_RATE=0.05 LONG_REQUESTS=6 tools/bench-disagg.sh     a fixed load instead
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
SEED=${SEED:-1}  # every run the same arrivals and prompts
DURATION=${DURATION:-120}
BUSY=${BUSY:-0.25}
CHAT_WORDS=${CHAT_WORDS:-30}
CHAT_RATE=${CHAT_RATE:-0.6}
CHAT_REQUESTS=${CHAT_REQUESTS:-$(awk -v r="$CHAT_RATE" -v s="$DURATION" 'BEGIN { printf "%d", r * s + 0.5 }')}
LONG_WORDS=${LONG_WORDS:-1000}
tools/setup.sh build >&2
source tools/bench-models.sh
# (A context of 2,048 tokens, for prompts past 1,000.)
model=$(bench_model syn110m-ctx2k.q8_0.gguf --type q8_0 --context 2048)
if [[ -z ${LONG_RATE:-} ]]; then
  perf=$(mktemp)
  build/tools/troupe-perf -j 2 -r 1 --json "$perf" prefill "$model" -p 1024 >/dev/null
  prefill=$(python3 -c 'import json, sys; print(next(r["value"] for r in json.load(open(sys.argv[1])) if r["unit"] == "tok/s"))' "$perf")
  rm -f "$perf"
  # (A document of LONG_WORDS words is about 1.035 tokens a word.)
  LONG_RATE=$(awk -v b="$BUSY" -v p="$prefill" -v w="$LONG_WORDS" 'BEGIN { printf "%.3f", b / (w * 1.035 / p) }')
  echo "sized to this machine: prefill $prefill tokens/s with 2 threads; documents at $LONG_RATE a second keep" \
       "a colocated replica prefilling $BUSY of the time" >&2
fi
LONG_REQUESTS=${LONG_REQUESTS:-$(awk -v r="$LONG_RATE" -v s="$DURATION" 'BEGIN { n = int(r * s + 0.5); print n < 4 ? 4 : n }')}
echo "load: chats $CHAT_REQUESTS at $CHAT_RATE a second, documents $LONG_REQUESTS at $LONG_RATE a second" >&2
bench_cluster_scratch
topology() {  # NAME
  cat >"$work/$1.toml" <<TOML
[model]
path = "$model"
name = "s110m"
[gateway]
node = "n0"
capnp = "127.0.0.1:$(free_port)"
[kv]
num_blocks = 256
[scheduler]
max_running = 16
max_step_tokens = 256
$(layout_toml "$1" 512)
TOML
}
configs=(colocated disaggregated)
for c in "${configs[@]}"; do topology "$c"; done
declare -A itl99 itl50 cttft cttft99 lttft tput
summary() {  # CHAT.json LONG.json
  python3 - "$1" "$2" <<'PY'
import json, sys
c, l = (json.load(open(p)) for p in sys.argv[1:3])
for r in (c, l):
    assert r["errors"] == 0, r.get("errors_by_kind")
assert l["prompt_tokens"] / l["completed"] >= 1000, "long prompts of %.0f tokens" % (l["prompt_tokens"] / l["completed"])
tok_s = (c["output_tokens"] + l["output_tokens"]) / max(c["duration_s"], l["duration_s"])
print("%.0f %.0f %.0f %.0f %.0f %.1f %.0f" % (c["itl_ms"]["p99"], c["itl_ms"]["p50"], c["ttft_ms"]["p50"], c["ttft_ms"]["p99"],
                                             l["ttft_ms"]["p50"], tok_s, l["prompt_tokens"] / l["completed"]))
PY
}
for run in $(seq 1 "$RUNS"); do
  for cfg in "${configs[@]}"; do
    url=$(launch_http "$work/$cfg.toml")
    build/tools/troupe-bench --endpoint "$url" --requests "$LONG_REQUESTS" --rate "$LONG_RATE" --prompt-words "$LONG_WORDS" \
      --output-tokens 16 --seed $((SEED + 100)) --json "$work/long.json" >/dev/null &
    long=$!
    build/tools/troupe-bench --endpoint "$url" --requests "$CHAT_REQUESTS" --rate "$CHAT_RATE" --prompt-words "$CHAT_WORDS" \
      --output-tokens 64 --seed "$SEED" --json "$work/chat.json" >/dev/null
    wait "$long"
    read -r i99 i50 ct ct99 lt tp ltok < <(summary "$work/chat.json" "$work/long.json")
    itl99[$cfg]+="$i99 "
    itl50[$cfg]+="$i50 "
    cttft[$cfg]+="$ct "
    cttft99[$cfg]+="$ct99 "
    lttft[$cfg]+="$lt "
    tput[$cfg]+="$tp "
    echo "run $run, $cfg: chat ITL p99 $i99 ms (p50 $i50), chat TTFT p50 $ct ms (p99 $ct99), document TTFT p50 $lt ms ($ltok-token prompts), $tp output tok/s" >&2
    launch down "$work/$cfg.toml" >/dev/null
  done
done
base=$(echo "${itl99[colocated]}" | median)
echo "| layout | chat ITL p99 (ms), runs | median | chat ITL p50 | chat TTFT p50 | chat TTFT p99 | document TTFT p50 | output tok/s | ITL p99 against colocated |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for cfg in "${configs[@]}"; do
  m=$(echo "${itl99[$cfg]}" | median)
  echo "| $cfg | ${itl99[$cfg]}| $m | $(echo "${itl50[$cfg]}" | median) | $(echo "${cttft[$cfg]}" | median) | $(echo "${cttft99[$cfg]}" | median) | $(echo "${lttft[$cfg]}" | median) | $(echo "${tput[$cfg]}" | median) | $(ratio "$base" "$m") |"
done
