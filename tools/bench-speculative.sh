#!/usr/bin/env bash
# Speculative decoding benchmarks for BENCHMARKS.md: batch-1 decode with and without each
# proposer, one sitting, on synthetic Q8_0 targets whose drafts agree at chosen rates.
#
#   tools/bench-speculative.sh            1B target (dim 2048, 22 layers), k = 3
#   PRESET=110m K=4 tools/bench-speculative.sh
#
# make-model writes each target (with a classifier of its own, not the embedding) with
# its layers from the second on damped by DAMP (their writes to the residual stream
# scaled), so the first layer decides the output the more, the smaller DAMP is:
# early exit after layer 1, and a draft cut to the target's first layer (make-model
# --keep-layers 1), agree with the target as often as the damping allows. Each damping
# gives one point of the curve of speedup against accepted length; the plain decode of
# the same target, measured just before, is its anchor. Then the n-gram proposer on the
# target's own repetitive output, and 16 concurrent sequences with adaptive speculation
# against none. Prints Markdown tables and writes the curve as an SVG chart (CHART,
# default docs/img/speculative-speedup.svg).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
PRESET=${PRESET:-1b}
K=${K:-3}
TOKENS=${TOKENS:-64}
DAMPS=${DAMPS:-"0.005 0.02 0.05 0.1 0.2"}
CHART=${CHART:-docs/img/speculative-speedup.svg}
BENCH_DIR=${BENCH_DIR:-/tmp/troupe-bench}
mkdir -p "$BENCH_DIR" "$(dirname "$CHART")"
tools/setup.sh build >&2
perf=build/tools/troupe-perf
mm=build/tools/make-model

rate() { awk '{for (i = 1; i <= NF; ++i) if ($i == "tok/s") {print $(i-1); exit}}'; }
per_verify() { sed -n 's/.*, \([0-9.]*\) tokens per verify.*/\1/p'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

echo "### Batch-1 decode, $PRESET Q8_0 target, k = $K, $TOKENS tokens, median of $RUNS runs"
echo
echo "| damping | plain tok/s | early exit tok/s | accepted length | speedup | draft model tok/s | accepted length | speedup |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
points=()
for damp in $DAMPS; do
  target=$BENCH_DIR/spec-$PRESET-damp$damp.gguf
  draft=$BENCH_DIR/spec-$PRESET-damp$damp-draft1.gguf
  [[ -f $target ]] || "$mm" "$target" --preset "$PRESET" --type q8_0 --separate-classifier --damp-layers 1 --damp "$damp" >&2
  [[ -f $draft ]] || "$mm" "$draft" --from "$target" --keep-layers 1 --type q8_0 >&2
  plain=$("$perf" decode "$target" -n "$TOKENS" -r "$RUNS" 2>/dev/null | rate)
  ee_line=$("$perf" decode "$target" -n "$TOKENS" -r "$RUNS" --speculative early-exit --exit-layer 1 -k "$K" 2>/dev/null)
  dm_line=$("$perf" decode "$target" -n "$TOKENS" -r "$RUNS" --speculative draft --draft "$draft" -k "$K" 2>/dev/null)
  ee=$(rate <<<"$ee_line"); ee_len=$(per_verify <<<"$ee_line")
  dm=$(rate <<<"$dm_line"); dm_len=$(per_verify <<<"$dm_line")
  # (Accepted length: drafted tokens kept per verify, the bonus token not counted.)
  ee_acc=$(awk -v x="${ee_len:-1}" 'BEGIN {printf "%.2f", x - 1}')
  dm_acc=$(awk -v x="${dm_len:-1}" 'BEGIN {printf "%.2f", x - 1}')
  echo "| $damp | $plain | $ee | $ee_acc | $(ratio "$ee" "$plain")x | $dm | $dm_acc | $(ratio "$dm" "$plain")x |"
  points+=("$ee_acc $(ratio "$ee" "$plain") $dm_acc $(ratio "$dm" "$plain")")
done

echo
echo "### The n-gram proposer and 16 sequences, same target (damping ${DAMPS%% *})"
echo
target=$BENCH_DIR/spec-$PRESET-damp${DAMPS%% *}.gguf
plain=$("$perf" decode "$target" -n "$TOKENS" -r "$RUNS" 2>/dev/null | rate)
ng_line=$("$perf" decode "$target" -n "$TOKENS" -r "$RUNS" --speculative ngram -k "$K" 2>/dev/null)
echo "| measurement | tok/s | against plain | drafts |"
echo "| --- | ---: | ---: | --- |"
echo "| batch 1, plain | $plain | 1.00x | |"
echo "| batch 1, n-gram | $(rate <<<"$ng_line") | $(ratio "$(rate <<<"$ng_line")" "$plain")x | $(sed -n 's/.*tok\/s *//p' <<<"$ng_line") |"
b16=$("$perf" batch "$target" -b 16 -n "$TOKENS" -r "$RUNS" 2>/dev/null | rate)
b16s=$("$perf" batch "$target" -b 16 -n "$TOKENS" -r "$RUNS" --speculative early-exit --exit-layer 1 -k "$K" 2>/dev/null | rate)
echo "| 16 sequences, plain | $b16 | 1.00x | |"
echo "| 16 sequences, early exit, adaptive | $b16s | $(ratio "$b16s" "$b16")x | none handed out: 16 decode tokens fill the step |"

# The curve, as an SVG line chart: speedup against accepted length, both proposers.
printf '%s\n' "${points[@]}" | awk -v k="$K" -v preset="$PRESET" '
  BEGIN { W = 560; H = 340; L = 60; R = 20; T = 40; B = 50 }
  { ea[NR] = $1; es[NR] = $2; da[NR] = $3; ds[NR] = $4; n = NR }
  function px(a) { return L + a / k * (W - L - R) }
  function py(s) { return H - B - s / 3.0 * (H - T - B) }
  END {
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    printf "<text x=\"%d\" y=\"20\" font-size=\"14\">Batch-1 decode speedup against accepted length (%s Q8_0, k = %d)</text>\n", L, preset, k
    for (s = 0; s <= 3; s += 0.5) {
      printf "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, W - R, py(s), py(s)
      printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1fx</text>\n", L - 6, py(s) + 4, s
    }
    for (a = 0; a <= k; ++a) printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", px(a), H - B + 18, a
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">drafted tokens accepted per verify</text>\n", (L + W - R) / 2, H - 12
    printf "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n", L, W - R, py(1), py(1)
    split("ea es #1f77b4 early-exit,da ds #d62728 draft-model", series, ",")
    for (j = 1; j <= 2; ++j) {
      split(series[j], f, " ")
      pts = ""
      for (i = 1; i <= n; ++i) {
        a = (f[1] == "ea") ? ea[i] : da[i]; s = (f[2] == "es") ? es[i] : ds[i]
        pts = pts sprintf("%.1f,%.1f ", px(a), py(s))
        printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px(a), py(s), f[3]
      }
      printf "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", pts, f[3]
      printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", L + 12, T + 8 + 16 * j, f[3], f[4]
    }
    print "</svg>"
  }' > "$CHART"
echo
echo "Chart: $CHART"
