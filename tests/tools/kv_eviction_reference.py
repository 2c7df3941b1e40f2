#!/usr/bin/env python3
"""KV eviction against an independent reference.

A served greedy completion under a KV policy (its JSON, with `logprobs`) is recomputed
here from scratch: a llama2.c checkpoint read by this script, a plain float64 forward
pass over a cache of exactly the tokens the policy keeps, at their positions, and the
policy written from its published definition:

  streaming     StreamingLLM: the first `sinks` tokens and the most recent ones; a key's
                rotary position is its place in the cache, the query's its own place;
  h2o           H2O: the most recent `window` tokens, and among the rest those that
                received the most attention in total;
  scissorhands  Scissorhands: the most recent `window` tokens, and among the rest those
                that, over the last `history` steps, fell below an even share of the
                attention the fewest times.

with troupe's documented schedule (docs/architecture.md, KV eviction): nothing is
dropped while the cache and a step's new tokens fit the budget; then the cache is cut
to max(budget / 2, budget - new - slack) tokens, slack = max(1, min(block, budget),
budget / 8), and a prompt goes in chunks that end at the budget; the attention a token
receives is summed over every head of every layer, from the last 32 query tokens of a
step, and an even share is the step's rows (queries times heads times layers) over the
tokens they saw; ties go to the later token.

Every output token's top logprobs and its own must equal the served ones within float32
tolerance, and the text must be the reference's own greedy text, whole.

    kv_eviction_reference.py CHECKPOINT TOKENIZER RESPONSE_JSON PROMPT_IDS POLICY BUDGET
        [--sinks N] [--window N] [--history N] [--block N]

It shares no code with troupe.
"""
import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

# Largest difference allowed between a served logprob (float32 throughout) and the
# reference's (float64): the models' logits span about 20, and float32 carries 7 digits
# through five layers and a cache.
TOLERANCE = 2e-4
MASS_QUERIES = 32  # the query tokens of a step whose attention a policy sees


class Model:
    """A llama2.c checkpoint: seven int32 (dim, hidden, layers, heads, kv heads, vocab,
    context; a negative vocab means a classifier of its own), then float32 tensors."""

    def __init__(self, path):
        blob = Path(path).read_bytes()
        dim, hidden, layers, heads, kv_heads, vocab, context = struct.unpack_from("<7i", blob, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        self.dim, self.layers, self.heads, self.kv_heads, self.vocab, self.context = dim, layers, heads, kv_heads, vocab, context
        self.hd = dim // heads
        values = np.frombuffer(blob, dtype="<f4", offset=28).astype(np.float64)
        at = 0

        def take(*shape):
            nonlocal at
            n = math.prod(shape)
            out = values[at:at + n].reshape(shape)
            at += n
            return out

        kv_dim = kv_heads * self.hd
        self.embed = take(vocab, dim)
        self.att_norm = take(layers, dim)
        self.wq = take(layers, dim, dim)
        self.wk = take(layers, kv_dim, dim)
        self.wv = take(layers, kv_dim, dim)
        self.wo = take(layers, dim, dim)
        self.ffn_norm = take(layers, dim)
        self.w1 = take(layers, hidden, dim)
        self.w2 = take(layers, dim, hidden)
        self.w3 = take(layers, hidden, dim)
        self.final_norm = take(dim)
        take(context, self.hd // 2)  # rotary tables, unused
        take(context, self.hd // 2)
        self.classifier = self.embed if shared else take(vocab, dim)
        # Rotary embedding on adjacent pairs (2i, 2i + 1), frequency 10000^(-2i / head_dim).
        self.freq = 10000.0 ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)

    def rotate(self, x, position):
        """x [n_heads, head_dim] turned to `position`."""
        angle = position * self.freq
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2] = even * cos - odd * sin
        out[:, 1::2] = even * sin + odd * cos
        return out


def rms_norm(x, weight):
    return x / np.sqrt(np.mean(x * x) + 1e-5) * weight


class Sequence:
    """One request's cache: for each kept token its position in the sequence, its key
    before rotation and its value per layer, and what the policy knows of it."""

    def __init__(self, model, policy):
        self.m, self.policy = model, policy
        self.position = []
        self.keys = [[] for _ in range(model.layers)]    # [kv_heads, hd], unrotated
        self.values = [[] for _ in range(model.layers)]
        self.total = []  # h2o: attention received
        self.below = []  # scissorhands: steps below an even share, most recent last

    def size(self):
        return len(self.position)

    def rope_position(self, slot):
        return slot if self.policy.name == "streaming" else self.position[slot]

    def step(self, tokens, first_position, queries_seen):
        """Runs `tokens` (the next ones of the sequence, from `first_position`); returns the
        last token's logits, and the attention each kept token received from the step's
        last `queries_seen` tokens (summed over heads and layers) and the rows of it."""
        m = self.m
        start = self.size()
        for i in range(len(tokens)):
            self.position.append(first_position + i)
            self.total.append(0.0)
            self.below.append([])
        n = self.size()
        received = np.zeros(n)
        x = m.embed[np.array(tokens)]
        group = m.heads // m.kv_heads
        for layer in range(m.layers):
            h = np.array([rms_norm(row, m.att_norm[layer]) for row in x])
            q = h @ m.wq[layer].T
            k = h @ m.wk[layer].T
            v = h @ m.wv[layer].T
            for i in range(len(tokens)):
                self.keys[layer].append(k[i].reshape(m.kv_heads, m.hd))
                self.values[layer].append(v[i].reshape(m.kv_heads, m.hd))
            keys = np.stack([m.rotate(self.keys[layer][s], self.rope_position(s)) for s in range(n)])  # [n, kvh, hd]
            values = np.stack(self.values[layer])
            out = np.zeros((len(tokens), m.dim))
            for i in range(len(tokens)):
                slot = start + i
                qi = m.rotate(q[i].reshape(m.heads, m.hd), self.rope_position(slot))
                for head in range(m.heads):
                    kvh = head // group
                    scores = keys[:slot + 1, kvh] @ qi[head] / math.sqrt(m.hd)
                    weights = np.exp(scores - scores.max())
                    weights /= weights.sum()
                    out[i, head * m.hd:(head + 1) * m.hd] = weights @ values[:slot + 1, kvh]
                    if i >= len(tokens) - queries_seen:
                        received[:slot + 1] += weights
            x = x + out @ m.wo[layer].T
            for i in range(len(tokens)):
                hf = rms_norm(x[i], m.ffn_norm[layer])
                gate = m.w1[layer] @ hf
                x[i] = x[i] + m.w2[layer] @ (gate / (1 + np.exp(-gate)) * (m.w3[layer] @ hf))
        logits = m.classifier @ rms_norm(x[-1], m.final_norm)
        return logits, received, queries_seen * m.heads * m.layers

    def observe(self, received, rows):
        even = rows / len(received)
        for s in range(len(received)):
            self.total[s] += received[s]
            self.below[s].append(received[s] < even)

    def keep(self, count):
        """Drops all but `count` tokens, the policy's choice."""
        p, n = self.policy, self.size()
        if p.name == "streaming":
            chosen = list(range(min(p.sinks, count))) + list(range(n - (count - min(p.sinks, count)), n))
        else:
            recent = min(p.window, count)
            older = range(n - recent)
            if p.name == "h2o":
                rank = sorted(older, key=lambda s: (self.total[s], s), reverse=True)
            else:
                low = {s: sum(self.below[s][-p.history:]) for s in older}
                rank = sorted(older, key=lambda s: (-low[s], s), reverse=True)
            chosen = sorted(rank[:count - recent]) + list(range(n - recent, n))
        for seq in (self.position, self.total, self.below, *self.keys, *self.values):
            seq[:] = [seq[s] for s in chosen]


def make_room(seq, policy, wanted, block):
    """Drops tokens before a step that wants `wanted` new ones, where the cache would pass
    the budget; returns how many the step may take (a claim never passes the budget)."""
    slots = seq.size()
    if slots + wanted <= policy.budget:
        return wanted
    slack = max(1, min(block, policy.budget), policy.budget // 8)
    keep = min(slots, max(policy.budget // 2, policy.budget - wanted - slack))
    if keep < slots:
        seq.keep(keep)
    return min(wanted, policy.budget - keep)


def log_softmax(logits):
    top = logits.max()
    return logits - (top + math.log(np.exp(logits - top).sum()))


def pieces(path, vocab):
    """A llama2.c tokenizer: an int32 (longest piece), then per token a float32 score, an
    int32 length and the piece's bytes."""
    blob = Path(path).read_bytes()
    at = 4
    out = []
    for _ in range(vocab):
        _, n = struct.unpack_from("<fi", blob, at)
        at += 8
        out.append(blob[at:at + n])
        at += n
    return out


def decode(vocab, token, previous):
    """A piece's text as a completion shows it: BOS and EOS (1 and 2) none, a piece after
    BOS without its leading space, a byte piece (<0xNN>) that byte."""
    if token in (1, 2):
        return b""
    piece = vocab[token]
    if previous == 1 and piece.startswith(b" "):
        return piece[1:]
    if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
        return bytes([int(piece[3:5], 16)])
    return piece


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("tokenizer")
    ap.add_argument("response")
    ap.add_argument("prompt", help="the prompt's token ids, comma-separated")
    ap.add_argument("name", choices=["streaming", "h2o", "scissorhands"])
    ap.add_argument("budget", type=int)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=-1)
    ap.add_argument("--history", type=int, default=16)
    ap.add_argument("--block", type=int, default=16)
    policy = ap.parse_args()
    if policy.window < 0:
        policy.window = policy.budget - policy.sinks if policy.name == "streaming" else policy.budget // 2

    body = json.loads(Path(policy.response).read_text())
    choice = body["choices"][0]
    served = choice["logprobs"]
    steps = len(served["token_logprobs"])
    if steps == 0 or steps != body["usage"]["completion_tokens"]:
        sys.exit(f"FAIL: {steps} logprobs for {body['usage']['completion_tokens']} tokens")

    model = Model(policy.checkpoint)
    vocab = pieces(policy.tokenizer, model.vocab)
    seq = Sequence(model, policy)
    prompt = [int(t) for t in policy.prompt.split(",")]
    pending, position, text, worst, evicted = prompt, 0, b"", 0.0, 0
    produced = 0
    while produced < steps:
        before = seq.size()
        take = make_room(seq, policy, len(pending), policy.block)
        evicted += before - seq.size()
        tokens, pending = pending[:take], pending[take:]
        logits, received, rows = seq.step(tokens, position, min(len(tokens), MASS_QUERIES))
        seq.observe(received, rows)
        position += len(tokens)
        if pending:  # a chunk of the prompt: no token yet
            continue
        lp = log_softmax(logits)
        chosen = int(np.argmax(lp))
        want_top = sorted(lp, reverse=True)[:len(served["top_logprobs"][produced])]
        got_top = sorted(served["top_logprobs"][produced].values(), reverse=True)
        diffs = [abs(a - b) for a, b in zip(want_top, got_top)] + [abs(served["token_logprobs"][produced] - lp[chosen])]
        worst = max(worst, *diffs)
        if max(diffs) > TOLERANCE:
            sys.exit(f"FAIL: {policy.name}: token {produced} (position {position}, {seq.size()} tokens cached): logprobs "
                     f"{got_top} served, {want_top} by the reference")
        text += decode(vocab, chosen, tokens[-1])
        pending = [chosen]
        produced += 1
    served_text = choice["text"].encode()
    if served_text != text:
        sys.exit(f"FAIL: {policy.name}: the served text is not the reference's:\n  {served_text!r}\n  {text!r}")
    if evicted == 0:
        sys.exit(f"FAIL: {policy.name}: the budget of {policy.budget} never dropped a token in {steps} steps")
    print(f"{policy.name} budget {policy.budget}: {len(prompt)} prompt tokens, {steps} out, {evicted} tokens dropped, "
          f"largest logprob difference {worst:.2e}")


if __name__ == "__main__":
    main()
