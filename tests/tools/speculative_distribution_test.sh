#!/usr/bin/env bash
# Sampled output served with speculative decoding through a PP=2 cluster (two
# troupe-node processes, troupe-launch) is distributed as the same cluster's output with
# speculation off: for each proposer (a draft model whose actor runs on the other node,
# early exit, Medusa heads, an EAGLE head, n-gram lookup), chains and token trees, 1,600
# seeded draws of a completion's first tokens each way, over the OpenAI HTTP API (8
# choices a request, each with its own seed, two requests at a time, [speculative]
# max_step_tokens 128 so that each step drafts for them all; the drafts must have been
# verified and some accepted), compared by a chi-square test of homogeneity
# on the joint distribution of the first two, three and four tokens (cells of expectation
# under 5 merged; the 1e-4 critical value). Draft probabilities cross the actors here (the
# draft actor's answers, the scheduler's verification), which the engine-loop test
# (tests/engine/speculative/speculative_distribution_test.cpp) does not see.
# Bounded in time; every node is stopped.
# Usage: speculative_distribution_test.sh BUILD_DIR SOURCE_DIR MODELS_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=$1 src=$2 models=$3
launch_scratch
trained=$(cd "$src" && pwd)/tests/data/stories260K

# VARIANT: its [speculative] table, its sampler settings.
variants=(
  "draft-chain-on-n1|method = \"draft\"|draft = \"$trained-draft.gguf\"|k = 3|1.0|1.0"
  "draft-tree|method = \"draft\"|draft = \"$trained-draft.gguf\"|tree = \"2,2,1\"|0.7|0.9"
  "early-exit|method = \"early-exit\"|exit_layer = 4|k = 2|1.0|1.0"
  "medusa-tree|method = \"medusa\"|heads = \"$trained-medusa.gguf\"|tree = [2, 2, 1]|1.0|1.0"
  "eagle|method = \"eagle\"|heads = \"$trained-eagle.gguf\"|k = 3|0.7|0.9"
  "ngram|method = \"ngram\"|k = 3||1.0|1.0"
)
for v in "${variants[@]}"; do
  IFS='|' read -r name a b c temperature top_p <<<"$v"
  replica_extra=
  [[ $name == *-on-n1 ]] && replica_extra='draft  = "n1"'
  # A step's budget that drafts for all of a request's choices at once (8 by default
  # would draft for none of 16 sequences decoding).
  speculative_topology "$name" "$a" "$b" "$c" "max_step_tokens = 128"
  launch_http "$work/$name.toml" "$name"
  python3 - "$base" "$name" "$temperature" "$top_p" >"$work/$name.out" 2>&1 <<'PY' || fail "$name: $(cat "$work/$name.out")"
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
base, name, temperature, top_p = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
PROMPT = "Lily saw a cat. Lily saw a cat. Lily saw a"  # a repeated phrase: n-gram lookup drafts too
# Six tokens a draw (a tree drafts only where the request has room for its depth and the
# target's own token after it), the first four compared.
REQUESTS, CHOICES, TOKENS = 200, 8, 6

def draws(first_seed, speculative):
    def one(i):
        body = {"model": "stories260K", "prompt": PROMPT, "max_tokens": TOKENS, "ignore_eos": True, "n": CHOICES,
                "temperature": temperature, "top_p": top_p, "seed": first_seed + CHOICES * i, "logprobs": 1}
        if not speculative:
            body["speculative"] = False
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.load(r)
        got = []
        for c in out["choices"]:
            tokens = c["logprobs"]["tokens"]
            assert len(tokens) == TOKENS, f"{len(tokens)} tokens"
            got.append(tuple(tokens))
        return got
    with ThreadPoolExecutor(2) as pool:
        return [t for batch in pool.map(one, range(REQUESTS)) for t in batch]

def critical(dof):  # the 1e-4 upper quantile (Wilson-Hilferty)
    z, k = 3.719, max(dof, 1)
    t = 1 - 2 / (9 * k) + z * (2 / (9 * k)) ** 0.5
    return k * t ** 3

def homogeneity(a, b):
    """Two samples' counts by cell: (chi, dof); cells of expectation under 5 merged."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    chi, cells, rest_a, rest_b = 0.0, 0, 0, 0
    def add(oa, ob):
        ea, eb = na * (oa + ob) / n, nb * (oa + ob) / n
        return (oa - ea) ** 2 / ea + (ob - eb) ** 2 / eb
    for key in set(a) | set(b):
        oa, ob = a.get(key, 0), b.get(key, 0)
        if min(na, nb) * (oa + ob) / n < 5:
            rest_a, rest_b = rest_a + oa, rest_b + ob
            continue
        chi += add(oa, ob)
        cells += 1
    if rest_a + rest_b:
        chi += add(rest_a, rest_b)
        cells += 1
    return chi, cells - 1

spec = draws(1000, True)
plain = draws(10_000_000, False)
failed = False
for length in (2, 3, 4):
    a, b = {}, {}
    for t in spec:
        a[t[:length]] = a.get(t[:length], 0) + 1
    for t in plain:
        b[t[:length]] = b.get(t[:length], 0) + 1
    chi, dof = homogeneity(a, b)
    ok = dof >= 3 and chi < critical(dof)
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: the first {length} tokens, {len(spec)} draws each way: "
          f"chi-square {chi:.1f} on {dof} degrees of freedom (critical {critical(dof):.1f})")
sys.exit(1 if failed else 0)
PY
  cat "$work/$name.out"
  # The drafts were verified, and some accepted.
  metrics=$(curl -s "$base/metrics")
  method=$(sed -n 's/^method = "\(.*\)"$/\1/p' <<<"$a")
  for _ in $(seq 1 50); do
    accepted=$(sed -n "s/^troupe_speculative_accepted_tokens_total{method=\"$method\"} //p" <<<"$metrics")
    [[ -n $accepted && ${accepted%.*} -gt 0 ]] && break
    sleep 0.2
    metrics=$(curl -s "$base/metrics")
  done
  [[ -n $accepted && ${accepted%.*} -gt 0 ]] || fail "$name: no drafted token was accepted ($accepted)"
  launch down "$work/$name.toml" >/dev/null
done
echo "PASS"
