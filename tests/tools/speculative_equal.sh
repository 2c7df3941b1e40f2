#!/bin/sh
# speculative_equal.sh TROUPE_RUN MODEL ARG...: greedy ids from troupe-run with the
# speculative options ARG... against plain decoding; prints "identical" when they match.
run=$1
model=$2
shift 2
plain=$("$run" "$model" -p 'Once upon a time' -t 0 -n 300 --ids -q) || exit 1
spec=$("$run" "$model" -p 'Once upon a time' -t 0 -n 300 --ids -q "$@") || exit 1
[ -n "$plain" ] || { echo "plain decoding printed nothing"; exit 1; }
if [ "$plain" = "$spec" ]; then
  echo identical
else
  echo "plain:       $plain"
  echo "speculative: $spec"
  exit 1
fi
