# Sourced by the benchmark scripts: the synthetic 110M Llama (dim 768, hidden 2048, 12
# layers, 12 heads, separate classifier) that every benchmark table uses, written once by
# make-model into BENCH_DIR (default /tmp/troupe-bench) with the same flags whichever
# script comes first, with the Llama 2 vocabulary when ../shared has it.
#   bench_model FILE [make-model args...]   prints the path, making the file if missing
BENCH_DIR=${BENCH_DIR:-/tmp/troupe-bench}
mkdir -p "$BENCH_DIR"
bench_vocab=()
[[ -f ../shared/models/llama2-tokenizer/tokenizer.bin ]] &&
  bench_vocab=(--vocab-from ../shared/models/llama2-tokenizer/tokenizer.bin)
bench_model() {
  local file=$BENCH_DIR/$1
  if [[ ! -f $file ]]; then
    local extra=("${@:2}")
    [[ $1 == *.gguf ]] && extra+=("${bench_vocab[@]}")
    build/tools/make-model "$file" --preset 110m --separate-classifier "${extra[@]}" >&2
  fi
  echo "$file"
}

# For a benchmark that starts clusters with troupe-launch: a scratch directory ($work),
# launch() with its state there, every topology under it taken down on exit, free_port()
# (a free loopback port when asked), and median() of the numbers on its input (of two,
# the lower).
bench_cluster_scratch() {
  work=$(mktemp -d)
  trap 'for t in "$work"/*.toml; do [[ -f $t ]] && launch down "$t" >/dev/null 2>&1; done; rm -rf "$work"' EXIT
}
launch() { build/tools/troupe-launch "$@" --state-dir "$work/state"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
# launch_http TOPOLOGY: starts its nodes (both client APIs on free ports) and prints the
# HTTP endpoint. ratio A B: A over B, as "N.Nx".
launch_http() { launch up "$1" --http 127.0.0.1:0 --capnp 127.0.0.1:0 --timeout 300 | sed -n 's|^endpoint: \(http://.*\)|\1|p'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1fx", a / b}'; }
# layout_toml colocated|disaggregated [DECODE_BLOCKS]: the [[node]] and [[replica]] tables
# of the machine's two cores either way: one replica on one process with both threads, or
# a prefill replica and a decode replica (as deploy/disagg.toml has them), one process and
# one thread each, the decode replica with DECODE_BLOCKS blocks when given.
layout_toml() {
  if [[ $1 == colocated ]]; then
    printf '[[node]]\nname = "n0"\nhost = "127.0.0.1"\nport = %s\nthreads = 2\n' "$(free_port)"
    printf '[[replica]]\nname = "r0"\nstages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]\n'
    return
  fi
  local n
  for n in n0 n1; do printf '[[node]]\nname = "%s"\nhost = "127.0.0.1"\nport = %s\nthreads = 1\n' "$n" "$(free_port)"; done
  printf '[[replica]]\nname = "p0"\nrole = "prefill"\nstages = [ { node = "n0", layers = "all", devices = ["cpu"] } ]\n'
  printf '[[replica]]\nname = "d0"\nrole = "decode"\n'
  [[ -n ${2:-} ]] && printf 'num_blocks = %s\n' "$2"
  printf 'stages = [ { node = "n1", layers = "all", devices = ["cpu"], kv_port = %s } ]\n' "$(free_port)"
}
