#!/usr/bin/env python3
"""The cross-feature matrix: serving layouts that combine troupe's levers, each checked
against troupe-run.

Factors (FACTORS below): the proposer, a chain or a token tree, the KV eviction policy,
the KV tier, prefill/decode roles, pipeline and tensor parallelism, and a failure. A
covering set of layouts is drawn from a seed: every pair of levels of any two factors (or,
with TROUPE_MATRIX=full, every triple) appears in some layout that can run. A layout
without a failure is served by one troupe-node process (its stages, replicas and draft
actor are actors there; prefill and decode replicas send KV over the KV channel); one
with a failure by node processes troupe-launch starts and restarts:

  - stage: the (decode) replica's last stage on a node of its own, SIGKILLed while a
    greedy stream of the story runs there (a whole replica on it, PP=1: its scheduler
    goes too, and the router sends the request again with the tokens it has);
  - gateway: two gateway nodes before the replicas' node; the one a troupe-client
    naming both streams from is SIGKILLed mid-stream, and the client goes on at the
    other.

The stream that met the failure must be troupe-run's text whole, each token once. Then
each case checks, over HTTP:

  - a greedy completion of the story and of a random prompt (drawn from the seed): the
    whole text, and as many tokens as max_tokens, equal to troupe-run's with the same KV
    eviction settings and nothing else (no speculation, one process, no tiers);
  - the story again, after a request for other words: served from what the prefix cache
    and the tiers kept of it, the same text;
  - llama2.c's greedy text of the shared reference (../shared/reference), under a KV budget
    above the sequence where the layout evicts (the request's own, the layout's policy);
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
import threading
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
    "failure": ["none", "stage", "gateway"],
}
NAMES = list(FACTORS)

BUDGET = 48          # KV budget of an evicting layout: below the story's prompt
MAX_TOKENS = 80
FAILURE_TOKENS = 400  # the stream a failure meets: long enough to be under way when it comes
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


def kv_ports(tp, stages, taken):
    """A base port per decode stage whose tp ports (base + shard) are all free and none of
    `taken`."""
    out = []
    while len(out) < stages:
        base = free_ports(1)[0]
        if base + tp > 65535 or any(p in taken for p in range(base, base + tp)):
            continue
        try:
            held = []
            for p in range(base, base + tp):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                held.append(s)
            out.append(base)
            taken = set(taken) | set(range(base, base + tp))
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
        # llama2.c's greedy continuations (PROVENANCE.md beside them): `steps` tokens after
        # BOS, the prompt's included.
        path = os.path.normpath(os.path.join(self.models, "..", "..", "reference", "stories260K_greedy.jsonl"))
        with open(path) as f:
            self.reference = [json.loads(line) for line in f if line.strip()]
        self.reference_prompt_tokens = None  # after BOS, as the first case's server counts them

    def topology(self, row, work):
        """The layout's topology file, and the nodes a failure strikes (name: role)."""
        model = os.path.join(self.models, "stories260K.bin")
        tok = os.path.join(self.models, "tok512.bin")
        failure = row["failure"]
        # Nodes: n0 alone without a failure; with a stage failure n1 holds the stage it
        # kills; with a gateway failure g1 and g2 are the gateways, n0 every replica.
        names = {"none": ["n0"], "stage": ["n0", "n1"], "gateway": ["g1", "g2", "n0"]}[failure]
        ports = free_ports(len(names) + 4)
        lines = ["[model]", f'path = "{model}"', f'tokenizer = "{tok}"']
        if failure == "gateway":
            lines += ["[gateway]", 'node = "g1"', f'capnp = "127.0.0.1:{ports[-4]}"', f'http = "127.0.0.1:{ports[-3]}"',
                      "[[gateway.also]]", 'node = "g2"', f'capnp = "127.0.0.1:{ports[-2]}"',
                      f'http = "127.0.0.1:{ports[-1]}"']
        elif failure == "stage":
            lines += ["[gateway]", 'node = "n0"', f'capnp = "127.0.0.1:{ports[-4]}"', f'http = "127.0.0.1:{ports[-3]}"']
        else:  # (the command line moves the endpoints to free ports)
            lines += ["[gateway]", 'node = "n0"', f'capnp = "127.0.0.1:{ports[-4]}"']
        if failure != "none":
            lines += ["[failure]", "heartbeat_ms = 300", "timeout_ms = 450", "recovery_timeout_s = 30",
                      'restart = "always"']
        for name, port in zip(names, ports):
            lines += ["[[node]]", f'name = "{name}"', 'host = "127.0.0.1"', f"port = {port}"]
        lines += ["[kv]", "num_blocks = 64"]
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

        def stages(victim=False, ports=None):
            # The replica a stage failure strikes has its last stage on n1 (PP=1: all of it).
            nodes = ["n0"] * len(ranges)
            if victim and failure == "stage":
                nodes[-1] = "n1"
            out = []
            for k, layers in enumerate(ranges):
                extra = f", kv_port = {ports[k]}" if ports else ""
                out.append(f'{{ node = "{nodes[k]}", layers = "{layers}", devices = {devices}{extra} }}')
            return "[ " + ", ".join(out) + " ]"

        if row["roles"] == "both":
            lines += ["[[replica]]", 'name = "r0"', f"stages = {stages(victim=True)}"]
        else:
            lines += ["[[replica]]", 'name = "p0"', 'role = "prefill"', f"stages = {stages()}"]
            lines += ["[[replica]]", 'name = "d0"', 'role = "decode"',
                      f"stages = {stages(victim=True, ports=kv_ports(row['tp'], len(ranges), ports))}"]
        path = os.path.join(work, "matrix.toml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self, topo, work, row):
        """The layout served: a troupe-node process, or (with a failure) the nodes
        troupe-launch starts; returns a Served once every replica is ready."""
        replicas = 2 if row["roles"] == "disagg" else 1
        if row["failure"] != "none":
            served = Launched(self.build, topo, work)
        else:
            served = Node(self.build, topo, work)
        deadline = time.time() + 60
        while time.time() < deadline:
            if metric(served.base, "troupe_replicas_ready") == replicas:
                return served
            time.sleep(0.05)
        served.stop()
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

    def stage_killed(self, row, served):
        """A greedy stream of the story, the node of the (decode) replica's last stage
        SIGKILLed once it is under way: troupe-run's text, whole, each token once. (The
        node is held back by SIGSTOP pulses until then: unhindered, the stream ends in
        less time than the client takes to see it begin.)"""
        victim = served.pid_of("n1")
        pulsing = Pulse(victim)
        body = {"model": "stories260K", "prompt": STORY, "max_tokens": FAILURE_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        req = urllib.request.Request(served.base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        text, chunks, usage, killed_at, done, line = "", 0, None, None, False, ""
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        done = True
                        break
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        usage = event["usage"]
                    for c in event.get("choices", []):
                        if c.get("text"):
                            text += c["text"]
                            chunks += 1
                    if chunks >= 3 and killed_at is None:
                        pulsing.kill()
                        killed_at = len(text)
        except (OSError, ValueError) as e:
            raise CaseFailed(f"the stream that met the stage's loss broke off: {e}\n    {served.logs()}")
        finally:
            pulsing.kill()
        if not done or usage is None or killed_at is None:
            raise CaseFailed(f"the stream that met the stage's loss ended without [DONE] or usage: {text!r}"
                             f"{' (its last event: ' + line[:300] + ')' if line else ''}\n    {served.logs()}")
        if killed_at == len(text):
            raise CaseFailed("the stream ended before the stage's node was killed")
        if usage["completion_tokens"] != FAILURE_TOKENS:
            raise CaseFailed(f"the stream that met the stage's loss: {usage['completion_tokens']} tokens")
        want = self.want(STORY, row["eviction"], usage["prompt_tokens"], FAILURE_TOKENS)
        if want is None or text.rstrip("\n") != want.rstrip("\n"):
            raise CaseFailed(f"the stream that met the stage's loss is not troupe-run's text:\n  got  {text!r}\n"
                             f"  want {want!r}\n    {served.logs()}")
        # Only n1 computes the last layers (of the decode replica): the tokens past the
        # first few were computed by the node troupe-launch started in its place.
        if served.pid_of("n1") == victim:
            raise CaseFailed("node n1 was never restarted")

    def gateway_killed(self, row, served):
        """troupe-client naming both gateways streams the story; the gateway it streams
        from is SIGKILLed once the stream is under way: troupe-run's text, each token once.
        (The replicas' node is held back by SIGSTOP pulses meanwhile, so that most of the
        stream is still to come when the gateway goes.)"""
        victim = served.pid_of("g1")
        n_prompt = complete(served.base, {"prompt": STORY, "max_tokens": 1})["usage"]["prompt_tokens"]
        pulsing = Pulse(served.pid_of("n0"), kill=False)
        cmd = [os.path.join(self.build, "tools", "troupe-client"), "--connect", ",".join(served.capnp),
               "-p", STORY, "-n", str(n_prompt - 1 + FAILURE_TOKENS), "-t", "0", "--ignore-eos"]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, killed = b"", False
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                byte = client.stdout.read(1)
                if not byte:
                    break
                out += byte
                if not killed and len(out) > len(STORY) + 8:
                    os.kill(victim, signal.SIGKILL)
                    killed = len(out)
                    pulsing.kill()
            client.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            pulsing.kill()
            if client.poll() is None:
                client.kill()
                client.wait()
        err = client.stderr.read().decode(errors="replace")
        if client.returncode != 0 or not killed or killed == len(out):
            raise CaseFailed(f"troupe-client across the gateway's loss: exit {client.returncode}, killed {killed}: "
                             f"{err[-500:]}\n    {served.logs()}")
        text = out.decode(errors="replace")
        want = self.want(STORY, row["eviction"], n_prompt, FAILURE_TOKENS)
        if want is None or text[len(STORY):].rstrip("\n") != want.rstrip("\n"):
            raise CaseFailed(f"troupe-client across the gateway's loss is not troupe-run's text:\n"
                             f"  got  {text[len(STORY):]!r}\n  want {want!r}")

    def run(self, index, row, random_prompt, sampled_prompt):
        work = tempfile.mkdtemp(prefix="troupe-matrix-")
        served = None
        try:
            for attempt in range(3):  # (a port drawn free may be taken before the node binds it)
                topo = self.topology(row, work)
                try:
                    served = self.start(topo, work, row)
                    break
                except CaseFailed as e:
                    if "in use" not in str(e) or attempt == 2:
                        raise
            base = served.base
            if row["failure"] == "stage":
                self.stage_killed(row, served)
            elif row["failure"] == "gateway":
                self.gateway_killed(row, served)
                base = served.others[0]  # (the gateway that lived; the other is restarting)
            if row["failure"] != "none":
                replicas = 2 if row["roles"] == "disagg" else 1
                deadline = time.time() + 60
                while metric(base, "troupe_replicas_ready") != replicas:
                    if time.time() > deadline:
                        raise CaseFailed(f"the replicas were not all ready again within 60 s:\n    {served.logs()}")
                    time.sleep(0.05)
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
            # The shared reference (llama2.c's greedy text, no code in common): under a KV
            # budget above the sequence (the request's own, with the layout's policy), the
            # same text.
            ref = self.reference[0]
            if self.reference_prompt_tokens is None:
                once = complete(base, {"prompt": ref["prompt"], "max_tokens": 1, "temperature": 0})
                self.reference_prompt_tokens = once["usage"]["prompt_tokens"] - 1
            body = {"prompt": ref["prompt"], "max_tokens": ref["steps"] - self.reference_prompt_tokens, "temperature": 0,
                    "ignore_eos": True}
            if row["eviction"] != "none":
                body["kv_eviction"] = {"policy": row["eviction"], "budget": 256}
            text = complete(base, body)["choices"][0]["text"]
            if text.rstrip("\n") != ref["text"][len(ref["prompt"]):].rstrip("\n"):
                raise CaseFailed(f"the reference, a budget above the sequence: not llama2.c's text:\n  got  {text!r}\n"
                                 f"  want {ref['text'][len(ref['prompt']):]!r}")
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
            if served:
                served.stop()
            shutil.rmtree(work, ignore_errors=True)


class CaseFailed(Exception):
    pass


class Pulse:
    """Holds a process back: SIGSTOP for 20 ms, SIGCONT for 2 ms, over and over (within
    any heartbeat timeout), until kill() SIGKILLs it (or, with kill=False, lets it go)."""

    def __init__(self, pid, kill=True):
        self.pid = pid
        self.lethal = kill
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.is_set():
            with self.lock:
                if self.done.is_set():
                    break
                os.kill(self.pid, signal.SIGSTOP)
            time.sleep(0.02)
            with self.lock:
                if self.done.is_set():
                    break
                os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.002)

    def kill(self):
        with self.lock:
            if self.done.is_set():
                return
            self.done.set()
            try:
                if self.lethal:
                    os.kill(self.pid, signal.SIGKILL)
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.thread.join()


class Node:
    """One troupe-node process serving a whole topology."""

    def __init__(self, build, topo, work):
        out = open(os.path.join(work, "node.out"), "w+")
        err = open(os.path.join(work, "node.err"), "w+")
        self.proc = subprocess.Popen([os.path.join(build, "tools", "troupe-node"), topo,
                                      "--capnp", "127.0.0.1:0", "--http", "127.0.0.1:0"],
                                     stdout=out, stderr=err, start_new_session=True)
        self.base = None
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            out.seek(0)
            for line in out.read().splitlines():
                if line.startswith("endpoint: http://"):
                    self.base = line.split(" ", 1)[1].strip()
            if self.base:
                return
            time.sleep(0.05)
        self.stop()
        err.seek(0)
        raise CaseFailed("the node did not start: " + err.read()[-1500:])

    def stop(self):
        stop(self.proc)


class Launched:
    """The nodes of a topology, started by troupe-launch up (whose supervisor restarts
    the ones that die) and stopped by troupe-launch down."""

    def __init__(self, build, topo, work):
        self.launch = os.path.join(build, "tools", "troupe-launch")
        self.topo = topo
        self.state = os.path.join(work, "state")
        got = subprocess.run([self.launch, "up", topo, "--state-dir", self.state, "--timeout", "60"],
                             capture_output=True, text=True, timeout=90)
        ends = [line.split(" ", 1)[1] for line in got.stdout.splitlines() if line.startswith("endpoint: ")]
        self.capnp = [e[len("capnp://"):] for e in ends if e.startswith("capnp://")]
        https = [e for e in ends if e.startswith("http://")]
        if got.returncode != 0 or not https or not self.capnp:
            self.stop()
            raise CaseFailed("troupe-launch up: " + (got.stderr + got.stdout)[-1500:])
        self.base = https[0]
        self.others = https[1:]  # the other gateways'

    def pid_of(self, node):
        got = subprocess.run([self.launch, "status", self.topo, "--state-dir", self.state],
                             capture_output=True, text=True, timeout=30)
        for line in got.stdout.splitlines():
            f = line.split()
            if len(f) >= 4 and f[0] == "node" and f[1] == node and f[2] == "pid":
                return int(f[3])
        raise CaseFailed(f"troupe-launch status names no process of node {node}: {got.stdout}{got.stderr}")

    def logs(self):
        tail = []
        for name in sorted(os.listdir(self.state)) if os.path.isdir(self.state) else []:
            if name.endswith(".log"):
                with open(os.path.join(self.state, name), errors="replace") as f:
                    lines = [x for x in f.read().splitlines() if " info request" not in x]
                tail.append(f"{name}: " + " | ".join(lines[-4:]))
        return "\n    ".join(tail)

    def stop(self):
        subprocess.run([self.launch, "down", self.topo, "--state-dir", self.state], capture_output=True, timeout=60)
        stem = os.path.splitext(os.path.basename(self.topo))[0]
        for name in (stem + ".supervisor", stem + ".procs"):
            try:
                with open(os.path.join(self.state, name)) as f:
                    for line in f:
                        for pid in line.split()[-1:]:
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except (ValueError, ProcessLookupError):
                                pass
            except OSError:
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
                                     'eviction=none tier=none roles=both pp=1 tp=1 failure=none"')
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
