#!/usr/bin/env bash
# Goodput under SLO against offered load, for BENCHMARKS.md: the synthetic 110M Q8_0 model
# on the machine's two cores, Poisson arrivals at each of RATES requests/s (troupe-bench
# --sweep-rate --fresh-prompts: each level its own prompts, so the prefix cache, which
# disaggregation needs, serves no level from the one before), prompts of 150 words and
# OUTPUT output tokens, every request in a class with TTFT_MS and TPOT_MS targets, steps of
# 64 tokens. Four configurations: colocated (one replica, one process with two threads) and
# disaggregated (a prefill and a decode replica, one process and one thread each), each
# with SLO admission on (a request that cannot be served in time is refused at once) and
# off (the class orders the queue, nothing is refused). Goodput: requests per second that
# met both targets. Prints a Markdown table, and writes docs/img/goodput.svg (goodput and
# TTFT and TPOT p99 against load).
# RESULTS=DIR keeps each configuration's troupe-bench JSON there.
#   tools/bench-slo.sh            CONFIGS="colocated-on colocated-off" tools/bench-slo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=${RATES:-"0.25 0.5 1 1.5 2 3"}
TTFT_MS=${TTFT_MS:-3000}
TPOT_MS=${TPOT_MS:-100}
OUTPUT=${OUTPUT:-64}
REQUESTS=${REQUESTS:-30}
read -r -a configs <<<"${CONFIGS:-colocated-on colocated-off disaggregated-on disaggregated-off}"
tools/setup.sh build >&2
source tools/bench-models.sh
model=$(bench_model syn110m.q8_0.gguf --type q8_0)
bench_cluster_scratch
topology() {  # NAME (LAYOUT-ADMISSION)
  local admission=${1##*-}
  [[ $admission == on ]] && admission=true || admission=false
  cat >"$work/$1.toml" <<TOML
[model]
path = "$model"
name = "s110m"
[gateway]
node = "n0"
capnp = "127.0.0.1:$(free_port)"
[scheduler]
max_running = 16
max_step_tokens = 64  # prompt chunks small enough to leave decoding a chance at its TPOT
default_class = "chat"
slo_admission = $admission
[[class]]
name = "chat"
ttft_ms = $TTFT_MS
tpot_ms = $TPOT_MS
$(layout_toml "${1%-*}")
TOML
}
for cfg in "${configs[@]}"; do
  topology "$cfg"
  url=$(launch_http "$work/$cfg.toml")
  # A few requests first, so that no level pays for a cold start (and the estimates have
  # steps); their prompts (seed 999) are none of the sweep's.
  build/tools/troupe-bench --endpoint "$url" --requests 4 --concurrency 1 --prompt-words 150 --output-tokens "$OUTPUT" \
    --seed 999 >/dev/null
  # shellcheck disable=SC2086
  build/tools/troupe-bench --endpoint "$url" --sweep-rate $RATES --fresh-prompts --requests "$REQUESTS" --prompt-words 150 \
    --output-tokens "$OUTPUT" --slo-ttft-ms "$TTFT_MS" --slo-tpot-ms "$TPOT_MS" --json "$work/$cfg.json" >&2 || true  # refusals count as errors
  [[ -s $work/$cfg.json ]] || { echo "troupe-bench wrote no results for $cfg" >&2; exit 1; }
  launch down "$work/$cfg.toml" >/dev/null
  if [[ -n ${RESULTS:-} ]]; then mkdir -p "$RESULTS" && cp "$work/$cfg.json" "$RESULTS/"; fi
done
python3 - "$work" "$TTFT_MS" "$TPOT_MS" "${configs[@]}" <<'PY'
import json, sys
work, ttft, tpot, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
runs = {c: json.load(open(f"{work}/{c}.json")) for c in configs}
runs = {c: r if isinstance(r, list) else [r] for c, r in runs.items()}  # one level: one object
print("| layout | SLO admission | offered (req/s) | served (req/s) | refused | goodput (req/s) | met | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in configs:
    layout, admission = c.rsplit("-", 1)
    for l in runs[c]:
        n = l["completed"] + l["errors"]
        met = l["goodput_requests_per_s"] * l["duration_s"]
        print("| %s | %s | %g | %.2f | %d | %.2f | %.0f%% | %.0f / %.0f | %.0f / %.0f |" % (
            layout, admission, l["rate"], l["requests_per_s"], l["errors"], l["goodput_requests_per_s"],
            100 * met / n if n else 0, l["ttft_ms"]["p50"], l["ttft_ms"]["p99"], l["tpot_ms"]["p50"], l["tpot_ms"]["p99"]))
# The chart: three panels against offered load (goodput, TTFT p99, TPOT p99); a colour per
# layout, solid with SLO admission, dashed without.
import math
def nice(v):  # the axis top: 1, 2, 2.5 or 5 times a power of ten, at or above v
    if v <= 0: return 1
    e = 10 ** math.floor(math.log10(v))
    return next(m * e for m in (1, 2, 2.5, 5, 10) if m * e >= v)
PW, H, L, R, T, B = 360, 420, 64, 16, 60, 60
panels = [("goodput (requests/s within SLO)", lambda l: l["goodput_requests_per_s"], 0),
          ("TTFT p99 (ms)", lambda l: l["ttft_ms"]["p99"], float(ttft)),
          ("TPOT p99 (ms)", lambda l: l["tpot_ms"]["p99"], float(tpot))]
W = len(panels) * PW
xs = sorted({l["rate"] for c in configs for l in runs[c]})
xmax = max(xs)
colors = {"colocated": "#1f77b4", "disaggregated": "#2ca02c"}
out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' font-family='sans-serif' font-size='12'>",
       "<rect width='100%' height='100%' fill='white'/>",
       f"<text x='{W/2}' y='18' text-anchor='middle' font-size='14'>Under SLO (TTFT {ttft} ms, TPOT {tpot} ms; targets dotted): synthetic 110M Q8_0 on two cores</text>"]
for i, c in enumerate(configs):
    layout, admission = c.rsplit("-", 1)
    x0 = 40 + i * 250
    dash = "" if admission == "on" else " stroke-dasharray='6,4'"
    out.append(f"<line x1='{x0}' y1='36' x2='{x0+24}' y2='36' stroke='{colors[layout]}' stroke-width='2'{dash}/>")
    out.append(f"<text x='{x0+30}' y='40'>{layout}, admission {admission}</text>")
for k, (label, value, target) in enumerate(panels):
    ox = k * PW
    vmax = nice(max(max(value(l) for l in runs[c]) for c in configs) * 1.05)
    X = lambda x: ox + L + (PW - L - R) * x / xmax
    Y = lambda v: H - B - (H - T - B) * v / vmax
    out += [f"<line x1='{ox+L}' y1='{H-B}' x2='{ox+PW-R}' y2='{H-B}' stroke='black'/>",
            f"<line x1='{ox+L}' y1='{T}' x2='{ox+L}' y2='{H-B}' stroke='black'/>",
            f"<text x='{ox+(PW+L)/2}' y='{H-20}' text-anchor='middle'>offered load (requests/s, Poisson)</text>",
            f"<text x='{ox+14}' y='{H/2}' transform='rotate(-90 {ox+14} {H/2})' text-anchor='middle'>{label}</text>"]
    for t in range(5):
        y = T + (H - T - B) * t / 4
        out.append(f"<line x1='{ox+L}' y1='{y}' x2='{ox+PW-R}' y2='{y}' stroke='#ddd'/>")
        out.append(f"<text x='{ox+L-5}' y='{y+4}' text-anchor='end'>{vmax*(4-t)/4:g}</text>")
    if 0 < target <= vmax:
        out.append(f"<line x1='{ox+L}' y1='{Y(target)}' x2='{ox+PW-R}' y2='{Y(target)}' stroke='#888' stroke-dasharray='2,3'/>")
    for x in xs:
        out.append(f"<text x='{X(x)}' y='{H-B+16}' text-anchor='middle'>{x:g}</text>")
    for c in configs:
        layout, admission = c.rsplit("-", 1)
        dash = "" if admission == "on" else " stroke-dasharray='6,4'"
        pts = " ".join(f"{X(l['rate'])},{Y(value(l))}" for l in runs[c])
        out.append(f"<polyline fill='none' stroke='{colors[layout]}' stroke-width='2'{dash} points='{pts}'/>")
        for l in runs[c]:
            out.append(f"<circle cx='{X(l['rate'])}' cy='{Y(value(l))}' r='3' fill='{colors[layout]}'/>")
out.append("</svg>")
open("docs/img/goodput.svg", "w").write("\n".join(out) + "\n")
PY
echo "wrote docs/img/goodput.svg" >&2
