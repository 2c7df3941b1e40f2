#!/usr/bin/env bash
# Engine benchmarks for BENCHMARKS.md: troupe beside llama.cpp and llama2.c's run.c (each
# built outside this repository), on the same models, the same machine, in one sitting.
#
#   tools/bench-engine.sh                       troupe only
#   LLAMA_CPP=~/llama.cpp/build/bin LLAMA2C=~/llama2.c tools/bench-engine.sh
#
# Models are written by make-model into BENCH_DIR (default /tmp/troupe-bench): the
# synthetic 110M Llama (dim 768, hidden 2048, 12 layers, 12 heads, vocab 32000, separate
# classifier) in F32 and Q8_0, as GGUF for both engines and as llama2.c .bin for run.c.
# Prints Markdown tables; every figure is a median (troupe-perf: of RUNS runs; llama-bench:
# its own -r RUNS). SITTINGS=N (default 1) measures everything N times in a row, prints
# each sitting's tables, then one table of per-row medians with every sitting's ratio:
# on a shared machine whose speed moves within minutes, that says more than one sitting.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
shared=../shared/models
tools/setup.sh build >&2
source tools/bench-models.sh
perf=build/tools/troupe-perf
bench_model syn110m.f32.gguf --type f32 >/dev/null
bench_model syn110m.q8_0.gguf --type q8_0 >/dev/null
bench_model syn110m.f32.bin --type f32 >/dev/null
stories=$shared/stories260K

value() { awk '{for (i = 1; i <= NF; ++i) if ($i == "tok/s" || $i == "GB/s") {print $(i-1); exit}}'; }
troupe() { "$perf" "$@" -r "$RUNS" 2>/dev/null | value; }
llama_tg() {  # model threads -> tokens/s
  "$LLAMA_CPP/llama-bench" -m "$1" -t "$2" -p 0 -n 128 -r "$RUNS" -o csv 2>/dev/null | tail -1 | awk -F, '{gsub(/"/, "", $(NF-1)); print $(NF-1)}'
}
llama_pp() {
  "$LLAMA_CPP/llama-bench" -m "$1" -t "$2" -p 128 -n 0 -r "$RUNS" -o csv 2>/dev/null | tail -1 | awk -F, '{gsub(/"/, "", $(NF-1)); print $(NF-1)}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

sitting() {
  echo "## Machine"
  echo
  echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "- troupe: $(git rev-parse --short HEAD), TROUPE_ISA=native; $("$perf" decode "$BENCH_DIR/syn110m.q8_0.gguf" -n 2 -r 1 2>&1 >/dev/null |
    grep -o "q8_0 weights with [^,;]*" | head -1)"
  echo "- CPU flags: $(grep -o -w 'avx512_vnni\|amx_tile\|amx_int8' /proc/cpuinfo | sort -u | xargs)"
  if [[ -n ${LLAMA_CPP:-} ]]; then
    echo "- llama.cpp: build $("$LLAMA_CPP/llama-bench" -m "$stories/stories260K.gguf" -p 0 -n 1 -r 1 -o csv 2>/dev/null |
      tail -1 | awk -F, '{gsub(/"/, ""); print $1 " (" $2 ")"}'), default settings (llama-bench reports means)"
  fi
  for t in 1 2; do
    echo "- memory bandwidth, $t thread(s): triad $("$perf" bandwidth -j $t -r 3 2>/dev/null | head -1 | value) GB/s, read $("$perf" bandwidth -j $t -r 3 2>/dev/null | tail -1 | value) GB/s"
  done
  echo
  echo "## Single-stream decode (tokens/s)"
  echo
  echo "| model | threads | troupe | weights streamed | llama.cpp | troupe / llama.cpp |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for m in f32 q8_0; do
    for t in 1 2; do
      line=$("$perf" decode "$BENCH_DIR/syn110m.$m.gguf" -j $t -n 128 -r "$RUNS" 2>/dev/null)
      ours=$(echo "$line" | value)
      gbs=$(echo "$line" | awk '{for (i = 1; i <= NF; ++i) if ($i == "GB/s") print $(i-1)}')
      theirs=$([[ -n ${LLAMA_CPP:-} ]] && llama_tg "$BENCH_DIR/syn110m.$m.gguf" $t || echo 0)
      echo "| syn110m $m | $t | $ours | $gbs GB/s | $theirs | $(ratio "$ours" "$theirs") |"
    done
  done
  for t in 1 2; do
    ours=$(troupe decode "$stories/stories260K.gguf" -j $t -n 256)
    theirs=$([[ -n ${LLAMA_CPP:-} ]] && llama_tg "$stories/stories260K.gguf" $t || echo 0)
    echo "| stories260K f32 | $t | $ours | | $theirs | $(ratio "$ours" "$theirs") |"
  done
  if [[ -n ${LLAMA2C:-} ]]; then
    echo
    echo "llama2.c run.c (-Ofast, 1 thread), same models:"
    for m in "$stories/stories260K.bin -z $stories/tok512.bin" "$BENCH_DIR/syn110m.f32.bin -z $shared/llama2-tokenizer/tokenizer.bin"; do
      # shellcheck disable=SC2086
      r=$("$LLAMA2C/run" $m -t 0 -n 256 -i "Once upon a time" 2>&1 | awk -F': ' '/achieved/ {print $2}')
      echo "- $(basename "${m%% *}"): $r tok/s"
    done
  fi
  echo
  echo "## Prefill, 128-token prompt (tokens/s)"
  echo
  echo "| model | threads | troupe | llama.cpp | troupe / llama.cpp |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  for m in f32 q8_0; do
    ours=$(troupe prefill "$BENCH_DIR/syn110m.$m.gguf" -j 2 -p 128)
    theirs=$([[ -n ${LLAMA_CPP:-} ]] && llama_pp "$BENCH_DIR/syn110m.$m.gguf" 2 || echo 0)
    echo "| syn110m $m | 2 | $ours | $theirs | $(ratio "$ours" "$theirs") |"
  done
  echo
  echo "## Batched decode, syn110m q8_0, 2 threads (tokens/s, all sequences together)"
  echo
  echo "| sequences | troupe | llama.cpp (llama-batched-bench) | troupe / llama.cpp |"
  echo "| ---: | ---: | ---: | ---: |"
  for b in 1 4 16 32; do
    ours=$("$perf" batch "$BENCH_DIR/syn110m.q8_0.gguf" -j 2 -b $b -n 64 -r "$RUNS" 2>/dev/null | value)
    theirs=0
    if [[ -n ${LLAMA_CPP:-} ]]; then
      theirs=$("$LLAMA_CPP/llama-batched-bench" -m "$BENCH_DIR/syn110m.q8_0.gguf" -t 2 -c 8192 -npp 3 -ntg 64 -npl $b 2>/dev/null |
        awk -F'|' '/^\|/ && $2 ~ /[0-9]/ {gsub(/ /, "", $9); print $9}' | tail -1)
    fi
    echo "| $b | $ours | $theirs | $(ratio "$ours" "$theirs") |"
  done
}

SITTINGS=${SITTINGS:-1}
if ((SITTINGS <= 1)); then
  sitting
  exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= SITTINGS; ++i)); do
  echo "bench-engine: sitting $i of $SITTINGS" >&2
  echo "# Sitting $i of $SITTINGS"
  echo
  sitting | tee "$out/$i.md"
  echo
done
files=()
for ((i = 1; i <= SITTINGS; ++i)); do files+=("$out/$i.md"); done
echo "# Medians of $SITTINGS sittings"
echo
# Rows are matched by section and label; each sitting's troupe / llama.cpp ratio is
# listed in order.
awk -v n="$SITTINGS" '
  function median(list,    v, k, i, j, t) {
    k = split(list, v, " ")
    for (i = 2; i <= k; ++i) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  FNR == 1 { section = "" }
  /^## / { section = substr($0, 4); sub(/ \(.*/, "", section) }
  /^\| / && !/^\| ---/ && !/^\| (model|sequences) / {
    m = split($0, c, "|")
    for (i = 2; i < m; ++i) gsub(/^ +| +$/, "", c[i])
    if (section ~ /^Single/) { key = c[2] ", " c[3] " thread(s)"; ours = c[4]; theirs = c[6] }
    else if (section ~ /^Prefill/) { key = c[2] ", " c[3] " thread(s)"; ours = c[4]; theirs = c[5] }
    else { key = c[2] " sequences"; ours = c[3]; theirs = c[4] }
    key = section ": " key
    if (!(key in seen)) { seen[key] = 1; order[++rows] = key }
    o[key] = o[key] " " ours; t[key] = t[key] " " theirs
    r[key] = r[key] " " (theirs + 0 > 0 ? sprintf("%.2f", ours / theirs) : "-")
  }
  END {
    print "| measurement | troupe | llama.cpp | troupe / llama.cpp | the sittings |"
    print "| --- | ---: | ---: | ---: | --- |"
    for (i = 1; i <= rows; ++i) {
      k = order[i]
      ratio = r[k] ~ /-/ ? "-" : sprintf("%.2fx", median(r[k]))
      printf "| %s | %.1f | %.1f | %s | %s |\n", k, median(o[k]), median(t[k]), ratio, substr(r[k], 2)
    }
  }' "${files[@]}"
