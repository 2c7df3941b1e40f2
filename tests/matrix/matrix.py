#!/usr/bin/env python3
"""The cross-feature matrix: serving layouts that combine troupe's levers, each checked
against troupe-run.

Factors (FACTORS below): the proposer, a chain or a token tree, the KV eviction policy,
the KV tier, prefill/decode roles, pipeline and tensor parallelism. A covering set of
layouts is drawn from a seed: every pair of levels of any two factors (or, with
TROUPE_MATRIX=full, every triple) appears in some layout that can run. Each layout is
served by one troupe-node process (its stages, replicas and draft actor are actors there;
prefill and decode replicas send KV over the KV channel), and each case checks, over HTTP:

  - a greedy completion of the story and of a random prompt (drawn from the seed): the
    whole text, and as many tokens as max_tokens, equal to troupe-run's with the same KV
    eviction settings and nothing else (no speculation, one process, no tiers);
  - the story again, after a request for other words: served from what the prefix cache
    and the tiers kept of it, the same text;
  - a sampled completion with a seed: troupe-run's with the same seed, proposer, shape
    and eviction (speculation and eviction are part of how a seed is spent; the layout
    is not), but for the layouts sampled_apart() names, the same text as the first
    layout of the set with the same proposer, shape and eviction.

The set is printed before it runs (`--list` prints it only); `--case N` runs one case of
it again. Bounded: each case's node is stopped after it, and every wait has a limit.

Usage: matrix.py --build BUILD_DIR --models MODELS_DIR --data TESTS_DATA_DIR
                 [--seed N] [--case N] [--layout "proposer=... tp=..."] [--list]
"""
import argparse
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

FACTORS = {
    "proposer": ["none", "ngram", "draft", "early-exit", "medusa", "eagle"],
    "shape": ["chain", "tree"],
    "eviction": ["none", "streaming", "h2o", "scissorhands"],
    "tier": ["none", "host", "disk"],
    "roles": ["both", "disagg"],
    "pp": [1, 2],
    "tp": [1, 2],
}
NAMES = list(FACTORS)

BUDGET = 48          # KV budget of an evicting layout: below the story's prompt
MAX_TOKENS = 80
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
         "with her friends. One day, she saw a big red ball and wanted to play with it. Her mom said")
WORDS = ("the cat dog sun big little happy sad ran jumped saw played tree park ball girl boy mom "
         "dad friend red blue toy bird fish water day night").split()


def allowed(row):
    """Whether a (partial) layout can run: a tree needs a proposer, and token trees do not
    run with KV eviction (refused with the reason: tests/tools/kv_eviction_serve_test.sh)."""
    if row.get("proposer") == "none" and row.get("shape") == "tree":
        return False
    if row.get("shape") == "tree" and row.get("eviction") not in (None, "none"):
        return False
    return True


def covering_set(strength, seed):
    """A covering set of `strength` (every `strength` factors' levels together in some
    allowed layout), built greedily: each new layout the best of many drawn, each drawn
    one starting from a tuple still uncovered and taking, factor by factor, the level that
    covers the most tuples still uncovered."""
    rng = random.Random(seed)
    combos = list(itertools.combinations(range(len(NAMES)), strength))

    def tuples_of(row):
        for c in combos:
            yield tuple((i, row[NAMES[i]]) for i in c)

    uncovered = set()
    for c in combos:
        for values in itertools.product(*(FACTORS[NAMES[i]] for i in c)):
            t = tuple(zip(c, values))
            if allowed({NAMES[i]: v for i, v in t}):
                uncovered.add(t)
    rows = []
    while uncovered:
        best, best_gain = None, -1
        for _ in range(30):
            start = rng.choice(sorted(uncovered))
            row = {NAMES[i]: v for i, v in start}
            order = [n for n in NAMES if n not in row]
            rng.shuffle(order)
            for n in order:
                scored = []
                for v in FACTORS[n]:
                    trial = dict(row, **{n: v})
                    if not allowed(trial):
                        continue
                    gain = sum(1 for t in tuples_of_partial(trial, combos) if t in uncovered)
                    scored.append((gain, rng.random(), v))
                row[n] = max(scored)[2]
            gain = sum(1 for t in tuples_of(row) if t in uncovered)
            if gain > best_gain:
                best, best_gain = row, gain
        rows.append(best)
        uncovered -= set(tuples_of(best))
    return rows


def tuples_of_partial(row, combos):
    for c in combos:
        if all(NAMES[i] in row for i in c):
            yield tuple((i, row[NAMES[i]]) for i in c)


def sampled_apart(row):
    """Why a layout's sampled text is not troupe-run's with the same seed, or None. Greedy
    text is troupe-run's in every layout; these spend a seed's draws otherwise."""
    if row["proposer"] == "early-exit" and row["eviction"] != "none":
        return ("troupe-run's early exit drafts over the target's cache, whose kept keys are the target's own; a "
                "cluster's draft actor keeps a cache of its own, which computes a prompt's kept tokens after the "
                "compactions the prompt's chunks made")
    if row["proposer"] == "eagle" and row["roles"] == "disagg":
        return ("EAGLE drafts from the features of every position, and a decode replica computes none of the "
                "prompt's (its KV comes from the prefill replica, its features do not)")
    return None


def label(row):
    return " ".join(f"{n}={row[n]}" for n in NAMES)


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def kv_ports(tp, stages):
    """A base port per decode stage whose tp ports (base + shard) are all free."""
    out = []
    while len(out) < stages:
        base = free_ports(1)[0]
        if base + tp > 65535:
            continue
        try:
            held = []
            for p in range(base, base + tp):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                held.append(s)
            out.append(base)
        except OSError:
            pass
        finally:
            for s in held:
                s.close()
    return out


class Matrix:
    def __init__(self, args):
        self.build = os.path.abspath(args.build)
        self.models = os.path.abspath(args.models)
        self.data = os.path.abspath(args.data)
        self.expected = {}   # troupe-run's text, by its settings
        self.sampled = {}    # where sampled_apart: the first sampled text, by proposer, shape and eviction
        self.apart = set()   # the reasons sampled_apart gave

    def topology(self, row, work):
        model = os.path.join(self.models, "stories260K.bin")
        tok = os.path.join(self.models, "tok512.bin")
        node_port, capnp_port = free_ports(2)  # (the command line moves the gateway's to a free one)
        lines = [
            "[model]", f'path = "{model}"', f'tokenizer = "{tok}"',
            "[gateway]", 'node = "n0"', f'capnp = "127.0.0.1:{capnp_port}"',
            "[[node]]", 'name = "n0"', 'host = "127.0.0.1"', f"port = {node_port}",
            "[kv]", "num_blocks = 64",
        ]
        if row["eviction"] != "none":
            lines += [f'policy = "{row["eviction"]}"', f"budget = {BUDGET}"]
        if row["tier"] == "host":
            lines += ["[[tier]]", 'kind = "host"']
        elif row["tier"] == "disk":
            lines += ["[[tier]]", 'kind = "disk"', f'path = "{os.path.join(work, "tier")}"']
        if row["proposer"] != "none":
            lines += ["[speculative]", f'method = "{row["proposer"]}"', "max_step_tokens = 32"]
            if row["proposer"] == "draft":
                lines.append(f'draft = "{os.path.join(self.data, "stories260K-draft.gguf")}"')
            if row["proposer"] == "early-exit":
                lines.append("exit_layer = 4")
            if row["proposer"] in ("medusa", "eagle"):
                lines.append(f'heads = "{os.path.join(self.data, "stories260K-" + row["proposer"] + ".gguf")}"')
            if row["shape"] == "tree":
                lines.append('tree = "2,2"')
        devices = "[" + ", ".join(['"cpu"'] * row["tp"]) + "]"
        ranges = ["all"] if row["pp"] == 1 else ["0-2", "3-4"]

        def stages(ports=None):
            out = []
            for k, layers in enumerate(ranges):
                extra = f", kv_port = {ports[k]}" if ports else ""
                out.append(f'{{ node = "n0", layers = "{layers}", devices = {devices}{extra} }}')
            return "[ " + ", ".join(out) + " ]"

        if row["roles"] == "both":
            lines += ["[[replica]]", 'name = "r0"', f"stages = {stages()}"]
        else:
            lines += ["[[replica]]", 'name = "p0"', 'role = "prefill"', f"stages = {stages()}"]
            lines += ["[[replica]]", 'name = "d0"', 'role = "decode"',
                      f"stages = {stages(kv_ports(row['tp'], len(ranges)))}"]
        path = os.path.join(work, "matrix.toml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self, topo, work, replicas):
        out = open(os.path.join(work, "node.out"), "w+")
        err = open(os.path.join(work, "node.err"), "w+")
        node = subprocess.Popen([os.path.join(self.build, "tools", "troupe-node"), topo,
                                 "--capnp", "127.0.0.1:0", "--http", "127.0.0.1:0"],
                                stdout=out, stderr=err, start_new_session=True)
        base = None
        deadline = time.time() + 60
        while time.time() < deadline and node.poll() is None:
            out.seek(0)
            for line in out.read().splitlines():
                if line.startswith("endpoint: http://"):
                    base = line.split(" ", 1)[1].strip()
            if base:
                break
            time.sleep(0.05)
        if not base:
            stop(node)
            err.seek(0)
            raise CaseFailed("the node did not start: " + err.read()[-1500:])
        # Every replica ready (a prefill replica not ready would leave the prompt to the
        # decode replica).
        while time.time() < deadline:
            if metric(base, "troupe_replicas_ready") == replicas:
                return node, base
            time.sleep(0.05)
        stop(node)
        raise CaseFailed(f"not every one of {replicas} replicas was ready within 60 s")

    def speculation_flags(self, row):
        if row["proposer"] == "none":
            return []
        flags = ["--speculative", row["proposer"]]
        if row["proposer"] == "draft":
            flags += ["--draft", os.path.join(self.data, "stories260K-draft.gguf")]
        if row["proposer"] == "early-exit":
            flags += ["--exit-layer", "4"]
        if row["proposer"] in ("medusa", "eagle"):
            flags += ["--heads", os.path.join(self.data, "stories260K-" + row["proposer"] + ".gguf")]
        if row["shape"] == "tree":
            flags += ["--tree", "2,2"]
        return flags

    def want(self, prompt, eviction, n_prompt, tokens=MAX_TOKENS, extra=()):
        """troupe-run's continuation of prompt (greedy, unless extra says otherwise)."""
        key = (prompt, eviction, tokens, tuple(extra))
        if key not in self.expected:
            cmd = [os.path.join(self.build, "tools", "troupe-run"), os.path.join(self.models, "stories260K.bin"),
                   "-z", os.path.join(self.models, "tok512.bin"), "-p", prompt, "-q", "--ignore-eos",
                   "-n", str(n_prompt - 1 + tokens), *(extra or ["-t", "0"])]  # (-n: the prompt after BOS too)
            if eviction != "none":
                cmd += ["--kv-policy", eviction, "--kv-budget", str(BUDGET)]
            got = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if got.returncode != 0:
                raise CaseFailed("troupe-run: " + got.stderr[-500:])
            self.expected[key] = got.stdout[len(prompt):] if got.stdout.startswith(prompt) else None
        return self.expected[key]

    def run(self, index, row, random_prompt, sampled_prompt):
        work = tempfile.mkdtemp(prefix="troupe-matrix-")
        node = None
        try:
            for attempt in range(3):  # (a port drawn free may be taken before the node binds it)
                topo = self.topology(row, work)
                try:
                    node, base = self.start(topo, work, 2 if row["roles"] == "disagg" else 1)
                    break
                except CaseFailed as e:
                    if "in use" not in str(e) or attempt == 2:
                        raise
            for what, prompt in (("story", STORY), ("random prompt", random_prompt), ("other words", "The dog ran"),
                                 ("story again", STORY)):
                d = complete(base, {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                    "ignore_eos": True})
                if what == "other words":
                    continue
                c = d["choices"][0]
                u = d["usage"]
                if u["completion_tokens"] != MAX_TOKENS or c["finish_reason"] != "length":
                    raise CaseFailed(f"{what}: {u['completion_tokens']} tokens, finish {c['finish_reason']}")
                want = self.want(prompt, row["eviction"], u["prompt_tokens"])
                # (troupe-run ends its output with a line; a text that ends with newlines
                # compares without them on both sides)
                if want is None or c["text"].rstrip("\n") != want.rstrip("\n"):
                    raise CaseFailed(f"{what}: the text is not troupe-run's:\n  got  {c['text']!r}\n  want {want!r}")
            # Sampled with a seed: troupe-run's text with the same seed, proposer and
            # eviction (a draft's draws come from the request's own stream wherever it runs),
            # or where a cluster spends the seed apart from troupe-run's engine loop
            # (sampled_apart), the text of the first layout of the same proposer, shape and
            # eviction.
            # (A prompt no earlier request of the case shares: EAGLE drafts from the features
            # of every position, which a prefix hit does not compute.)
            d = complete(base, {"prompt": sampled_prompt, "max_tokens": 40, "temperature": 0.8, "seed": 53,
                                "ignore_eos": True})
            text = d["choices"][0]["text"].rstrip("\n")
            apart = sampled_apart(row)
            if apart:
                key = (row["proposer"], row["shape"], row["eviction"])
                first = self.sampled.setdefault(key, (index, text))
                if first[1] != text:
                    raise CaseFailed(f"sampled with a seed: case {first[0]} of the same proposer, shape and eviction "
                                     f"wrote {first[1]!r}; this one {text!r}")
                self.apart.add(apart)
            else:
                want = self.want(sampled_prompt, row["eviction"], d["usage"]["prompt_tokens"], 40,
                                 ["-t", "0.8", "--top-p", "1", "--seed", "53", *self.speculation_flags(row)])
                if want is None or text != want.rstrip("\n"):
                    raise CaseFailed(f"sampled with a seed: the text is not troupe-run's:\n  got  {text!r}\n  want {want!r}")
        finally:
            if node:
                stop(node)
            shutil.rmtree(work, ignore_errors=True)


class CaseFailed(Exception):
    pass


def complete(base, body):
    body = dict(body, model="stories260K")
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise CaseFailed(f"status {e.code}: {e.read()[:300]!r}")


def metric(base, name):
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
    except OSError:
        pass
    return None


def stop(node):
    try:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="the build directory (tools/troupe-node, tools/troupe-run)")
    ap.add_argument("--models", required=True, help="the directory of stories260K.bin and tok512.bin")
    ap.add_argument("--data", required=True, help="tests/data (the draft model and head files)")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("TROUPE_MATRIX_SEED", "53")),
                    help="draws the covering set and the random prompt (default 53, or TROUPE_MATRIX_SEED)")
    ap.add_argument("--case", type=int, help="run this case of the set only")
    ap.add_argument("--list", action="store_true", help="print the set and stop")
    ap.add_argument("--layout", help='run this layout alone, as the set prints one: "proposer=eagle shape=chain '
                                     'eviction=none tier=none roles=both pp=1 tp=1"')
    args = ap.parse_args()
    full = os.environ.get("TROUPE_MATRIX") == "full"
    if args.layout:
        row = dict(kv.split("=", 1) for kv in args.layout.split())
        if sorted(row) != sorted(NAMES) or any(str(v) not in map(str, FACTORS[n]) for n, v in row.items()):
            ap.error(f"--layout: name every factor once, each with one of its levels: {FACTORS}")
        row["pp"], row["tp"] = int(row["pp"]), int(row["tp"])
        if not allowed(row):
            ap.error("--layout: that layout does not run (a tree needs a proposer, and no KV eviction)")
        rows = [row]
    else:
        rows = covering_set(3 if full else 2, args.seed)
    rng = random.Random(args.seed)
    random_prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))).capitalize()
    sampled_prompt = "Once " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 50)))
    print(f"matrix: {len(rows)} layouts covering every {'triple' if full else 'pair'} of levels "
          f"(seed {args.seed}; another: --seed N or TROUPE_MATRIX_SEED; every triple: TROUPE_MATRIX=full)")
    print(f"random prompt: {random_prompt!r}; sampled: {sampled_prompt!r}")
    for i, row in enumerate(rows):
        print(f"  case {i}: {label(row)}")
    if args.list:
        return 0
    m = Matrix(args)
    failed = []
    started = time.time()
    for i, row in enumerate(rows):
        if args.case is not None and i != args.case:
            continue
        t0 = time.time()
        try:
            m.run(i, row, random_prompt, sampled_prompt)
            print(f"ok   case {i} ({time.time() - t0:.1f} s): {label(row)}", flush=True)
        except CaseFailed as e:
            failed.append(i)
            print(f"FAIL case {i}: {label(row)}\n  {e}\n  again: {sys.argv[0]} ... --seed {args.seed} --case {i}",
                  flush=True)
    for why in sorted(m.apart):
        print(f"sampled text compared between layouts, not with troupe-run's: {why}")
    print(f"matrix: {len(rows) - len(failed) if args.case is None else 1 - len(failed)} passed, "
          f"{len(failed)} failed in {time.time() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
