#!/usr/bin/env bash
# troupe-bench against a real troupe-node, over HTTP and Cap'n Proto: every request
# completes, and the request and token counts it reports (both APIs together) equal the
# server's /metrics.
# Usage: bench_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2
scratch

single_topology "$src" "$work"
start_node "$work/t.toml" "$work"
http=$http_url capnp=$capnp_url

# No --model: troupe-bench asks the server's /v1/models.
timeout 120 "$build/tools/troupe-bench" --endpoint "$http" --requests 20 --concurrency 4 \
  --output-tokens 24 --shared-prefix 30 --prompt-words 40 --json "$work/http.json" >/dev/null 2>"$work/http.err" ||
  fail "http run: $(cat "$work/http.err")"
grep -q "model stories260K (the server's /v1/models)" "$work/http.err" || fail "served model: $(cat "$work/http.err")"
timeout 120 "$build/tools/troupe-bench" --endpoint "$capnp" --requests 12 --rate 50 --output-tokens 16 \
  --json "$work/capnp.json" >/dev/null || fail "capnp run"
timeout 120 "$build/tools/troupe-bench" --endpoint "$capnp" --requests 4 --sweep-concurrency 1,2 --output-tokens 8 \
  --json "$work/sweep.json" --svg "$work/sweep.svg" >/dev/null || fail "sweep run"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [x["concurrency"] for x in d] == [1, 2]' "$work/sweep.json" || fail "sweep json"
grep -q '<polyline' "$work/sweep.svg" || fail "sweep chart"
curl -s "$http/metrics" >"$work/metrics"
# Multi-turn chat (after the snapshot, so the counts above stay exact): every turn's
# prompt carries the conversation so far, so prompts grow.
timeout 120 "$build/tools/troupe-bench" --endpoint "$http" --model stories260K --chat --turns 3 --requests 3 \
  --concurrency 3 --output-tokens 8 --prompt-words 10 --json "$work/chat.json" >/dev/null || fail "multi-turn run"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["completed"] == 3 and d["prompt_tokens"] > 3 * 3 * 12, d' \
  "$work/chat.json" || fail "multi-turn prompts did not grow"
# A sweep's levels repeat their prompts, which the prefix cache then holds; with
# --fresh-prompts each level draws its own.
for fresh in "" --fresh-prompts; do
  timeout 120 "$build/tools/troupe-bench" --endpoint "$http" --model stories260K --requests 4 --sweep-concurrency 2,2 \
    $fresh --prompt-words 80 --output-tokens 4 --seed 7 --json "$work/levels$fresh.json" >/dev/null || fail "sweep $fresh"
done
python3 - "$work/levels.json" "$work/levels--fresh-prompts.json" <<'PY' || fail "--fresh-prompts"
import json, sys
same, fresh = (json.load(open(p)) for p in sys.argv[1:3])
assert same[1]["cached_prompt_tokens"] > 0.5 * same[1]["prompt_tokens"], same[1]
assert fresh[1]["cached_prompt_tokens"] < 0.2 * fresh[1]["prompt_tokens"], fresh[1]
PY
python3 - "$work" <<'PY' || fail "counts disagree"
import json, re, sys
w = sys.argv[1]
h = json.load(open(f"{w}/http.json"))
c = json.load(open(f"{w}/capnp.json"))
s = json.load(open(f"{w}/sweep.json"))
m = open(f"{w}/metrics").read()
def metric(name):
    return int(float(re.search(rf"^{re.escape(name)} (\S+)$", m, re.M).group(1)))
# /metrics counts both APIs: the HTTP run, the Cap'n Proto run and the sweep's two levels.
runs = [h, c] + s
finished = metric('troupe_requests_total{outcome="stop"}') + metric('troupe_requests_total{outcome="length"}')
assert h["completed"] == 20 and h["errors"] == 0, h
assert c["completed"] == 12 and c["output_tokens"] == 12 * 16, c
assert finished == sum(r["completed"] for r in runs), (finished, [r["completed"] for r in runs])
generated = sum(r["output_tokens"] for r in runs)
assert metric("troupe_generated_tokens_total") == generated, (metric("troupe_generated_tokens_total"), generated)
assert metric("troupe_prompt_tokens_total") == sum(r["prompt_tokens"] for r in runs)
for d in (h, c):
    for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert 0 < d[k]["p50"] <= d[k]["p90"] <= d[k]["p99"] <= d[k]["max"], (k, d[k])
PY
echo "troupe-bench: counts match /metrics; percentiles ordered"
