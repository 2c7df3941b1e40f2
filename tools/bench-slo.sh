#!/usr/bin/env bash
# Goodput under SLO against offered load, for BENCHMARKS.md: one replica of the synthetic
# 110M Q8_0 model (one node, two threads), Poisson arrivals at each of RATES requests/s
# (troupe-bench --sweep-rate; steps of 64 tokens; the prefix cache off, since each level repeats the same
# prompts), prompts of 150 words and 32 output tokens, every request in
# a class with TTFT_MS and TPOT_MS targets. Side by side: SLO admission on (a request the
# replica cannot serve in time is refused at once) and off (the class orders the queue,
# nothing is refused). Goodput: requests per second that met both targets. Prints a
# Markdown table, and writes docs/img/goodput.svg (goodput and TTFT p99 against load).
#   tools/bench-slo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=${RATES:-"0.5 1 1.5 2 3 4"}
TTFT_MS=${TTFT_MS:-3000}
TPOT_MS=${TPOT_MS:-250}
REQUESTS=${REQUESTS:-40}
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
bench_cluster_scratch
topology() {  # NAME ADMISSION
  cat >"$work/$1.toml" <<TOML
[model]
path = "$model"
name = "s110m"
[gateway]
node = "n0"
capnp = "127.0.0.1:$(free_port)"
[kv]
prefix_caching = false  # each level sends the same prompts: measure their computing
[scheduler]
max_running = 16
max_step_tokens = 64  # prompt chunks small enough to leave decoding a chance at its TPOT
default_class = "chat"
slo_admission = $2
[[class]]
name = "chat"
ttft_ms = $TTFT_MS
tpot_ms = $TPOT_MS
[[node]]
name = "n0"
host = "127.0.0.1"
port = $(free_port)
threads = 2
[[replica]]
name = "r0"
stages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]
TOML
}
configs=(admission-on admission-off)
topology admission-on true
topology admission-off false
for cfg in "${configs[@]}"; do
  url=$(launch_http "$work/$cfg.toml")
  # A few requests first, so that no level pays for a cold start (and the estimates have steps).
  build/tools/troupe-bench --endpoint "$url" --requests 4 --concurrency 1 --prompt-words 150 --output-tokens 32 >/dev/null
  # shellcheck disable=SC2086
  build/tools/troupe-bench --endpoint "$url" --sweep-rate $RATES --requests "$REQUESTS" --prompt-words 150 \
    --output-tokens 32 --slo-ttft-ms "$TTFT_MS" --slo-tpot-ms "$TPOT_MS" --json "$work/$cfg.json" >&2 || true  # refusals count as errors
  [[ -s $work/$cfg.json ]] || { echo "troupe-bench wrote no results for $cfg" >&2; exit 1; }
  launch down "$work/$cfg.toml" >/dev/null
done
python3 - "$work" "$TTFT_MS" "$TPOT_MS" "${configs[@]}" <<'PY'
import json, sys
work, ttft, tpot, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
runs = {c: json.load(open(f"{work}/{c}.json")) for c in configs}
print("| SLO admission | offered (req/s) | served (req/s) | refused | goodput (req/s) | met | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in configs:
    for l in runs[c]:
        n = l["completed"] + l["errors"]
        met = l["goodput_requests_per_s"] * l["duration_s"]
        print("| %s | %g | %.2f | %d | %.2f | %.0f%% | %.0f / %.0f | %.0f / %.0f |" % (
            c.replace("admission-", ""), l["rate"], l["requests_per_s"], l["errors"], l["goodput_requests_per_s"],
            100 * met / n if n else 0, l["ttft_ms"]["p50"], l["ttft_ms"]["p99"], l["tpot_ms"]["p50"], l["tpot_ms"]["p99"]))
# The chart: goodput (left axis) and TTFT p99 (right axis) against offered load.
W, H, L, R, T, B = 720, 420, 70, 80, 50, 60
xs = sorted({l["rate"] for c in configs for l in runs[c]})
xmax = max(xs)
gmax = max(max(l["goodput_requests_per_s"] for l in runs[c]) for c in configs) * 1.15 or 1
tmax = max(max(l["ttft_ms"]["p99"] for l in runs[c]) for c in configs) * 1.15 or 1
X = lambda x: L + (W - L - R) * x / xmax
Y = lambda v, m: H - B - (H - T - B) * v / m
out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' font-family='sans-serif' font-size='12'>",
       "<rect width='100%' height='100%' fill='white'/>",
       f"<text x='{W/2}' y='18' text-anchor='middle' font-size='14'>Goodput under SLO (TTFT {ttft} ms, TPOT {tpot} ms), one replica, synthetic 110M Q8_0</text>",
       f"<line x1='{L}' y1='{H-B}' x2='{W-R}' y2='{H-B}' stroke='black'/>",
       f"<line x1='{L}' y1='{T}' x2='{L}' y2='{H-B}' stroke='black'/>",
       f"<line x1='{W-R}' y1='{T}' x2='{W-R}' y2='{H-B}' stroke='black'/>",
       f"<text x='{W/2}' y='{H-20}' text-anchor='middle'>offered load (requests/s, Poisson)</text>",
       f"<text x='15' y='{H/2}' transform='rotate(-90 15 {H/2})' text-anchor='middle'>goodput (requests/s within SLO)</text>",
       f"<text x='{W-12}' y='{H/2}' transform='rotate(90 {W-12} {H/2})' text-anchor='middle'>TTFT p99 (ms, dashed)</text>"]
for t in range(5):
    y = T + (H - T - B) * t / 4
    out.append(f"<line x1='{L}' y1='{y}' x2='{W-R}' y2='{y}' stroke='#ddd'/>")
    out.append(f"<text x='{L-5}' y='{y+4}' text-anchor='end'>{gmax*(4-t)/4:.2f}</text>")
    out.append(f"<text x='{W-R+5}' y='{y+4}'>{tmax*(4-t)/4:.0f}</text>")
for x in xs:
    out.append(f"<text x='{X(x)}' y='{H-B+16}' text-anchor='middle'>{x:g}</text>")
colors = {"admission-on": "#1f77b4", "admission-off": "#d62728"}
for i, c in enumerate(configs):
    ls = runs[c]
    pts = " ".join(f"{X(l['rate'])},{Y(l['goodput_requests_per_s'], gmax)}" for l in ls)
    out.append(f"<polyline fill='none' stroke='{colors[c]}' stroke-width='2' points='{pts}'/>")
    pts = " ".join(f"{X(l['rate'])},{Y(l['ttft_ms']['p99'], tmax)}" for l in ls)
    out.append(f"<polyline fill='none' stroke='{colors[c]}' stroke-width='1.5' stroke-dasharray='5,4' points='{pts}'/>")
    for l in ls:
        out.append(f"<circle cx='{X(l['rate'])}' cy='{Y(l['goodput_requests_per_s'], gmax)}' r='3' fill='{colors[c]}'/>")
    out.append(f"<rect x='{L+10+i*230}' y='{T-16}' width='10' height='10' fill='{colors[c]}'/>")
    out.append(f"<text x='{L+24+i*230}' y='{T-7}'>SLO admission {c.replace('admission-', '')}</text>")
out.append("</svg>")
open("docs/img/goodput.svg", "w").write("\n".join(out) + "\n")
PY
echo "wrote docs/img/goodput.svg" >&2
