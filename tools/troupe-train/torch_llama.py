"""A Llama-family forward pass in torch, from the published definitions (RMSNorm, rotary
embeddings in halves with the family's scaling, grouped-query attention with q/k/v biases
or a sliding window, SwiGLU), reading a Hugging Face directory as make-model writes it
(config.json, model.safetensors).

families_test.py compares troupe's logits with it; troupe-train runs the target with it
(generating text, then its features and distributions for every position).
"""
import json
import math
import struct
from pathlib import Path

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path, dtype=torch.float64):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        raw = bytearray(data[8 + n + lo:8 + n + hi])
        x = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]) if raw else torch.zeros(0, dtype=DTYPES[t["dtype"]])
        tensors[name] = x.to(dtype).reshape(t["shape"])
    return tensors


def write_safetensors(path, tensors):
    """F32 tensors, in name order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        blob = tensors[name].detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def inv_frequencies(cfg, head_dim):
    """The rotary frequencies of the head_dim / 2 pairs, and the factor on cos and sin."""
    base = cfg.get("rope_theta", 10000.0)
    f = [1.0 / (base ** (2 * i / head_dim)) for i in range(head_dim // 2)]
    rs = cfg.get("rope_scaling")
    if not rs:
        return f, 1.0
    kind, factor = rs.get("rope_type", rs.get("type")), rs["factor"]
    if kind == "linear":
        return [x / factor for x in f], 1.0
    if kind == "llama3":
        old = rs["original_max_position_embeddings"]
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        out = []
        for x in f:
            wavelen = 2 * math.pi / x
            if wavelen < old / high:
                out.append(x)
            elif wavelen > old / low:
                out.append(x / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * x / factor + smooth * x)
        return out, 1.0
    if kind == "yarn":
        old = rs.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        fast, slow = rs.get("beta_fast", 32.0), rs.get("beta_slow", 1.0)

        def correction(rotations):
            return head_dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(correction(fast)), 0)
        hi = min(math.ceil(correction(slow)), head_dim - 1)
        span = 0.001 if hi == lo else hi - lo
        out = []
        for i, x in enumerate(f):
            keep = 1 - min(max((i - lo) / span, 0.0), 1.0)
            out.append(x / factor * (1 - keep) + x * keep)
        att = rs.get("attention_factor") or (1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0)
        return out, att
    raise ValueError(f"rope scaling {kind!r}")


def rope_tables(cfg, head_dim, positions, dtype):
    """cos and sin [len(positions)][head_dim] for rotation in halves."""
    freqs, att = inv_frequencies(cfg, head_dim)
    angles = positions.to(torch.float64)[:, None] * torch.tensor(freqs, dtype=torch.float64)[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1) * att
    sin = torch.cat([angles.sin(), angles.sin()], -1) * att
    return cos.to(dtype), sin.to(dtype)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate(x, cos, sin):
    """x [..., T, heads, head_dim], cos and sin [T, head_dim]: rotation in halves."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Shape:
    """The attention and FFN shape of a config.json."""

    def __init__(self, cfg):
        self.dim, self.heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or self.dim // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None


def attend(q, k, v, shape, visible):
    """q [B, T, heads, hd], k and v [B, S, kv_heads, hd], visible [T, S] -> [B, T, heads * hd]."""
    B, T = q.shape[0], q.shape[1]
    group = shape.heads // shape.kv_heads
    # Query heads grouped by the key head they share: [B, kv_heads, group * T, hd].
    q = (q * (1.0 / math.sqrt(shape.head_dim))).reshape(B, T, shape.kv_heads, group, shape.head_dim)
    q = q.permute(0, 2, 3, 1, 4).reshape(B, shape.kv_heads, group * T, shape.head_dim)
    scores = q @ k.permute(0, 2, 3, 1)  # [B, kv_heads, group * T, S]
    bias = torch.zeros(visible.shape, dtype=scores.dtype).masked_fill(~visible, float("-inf")).repeat(group, 1)
    out = (scores + bias).softmax(-1) @ v.transpose(1, 2)  # [B, kv_heads, group * T, hd]
    out = out.reshape(B, shape.kv_heads, group, T, shape.head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(B, T, shape.heads * shape.head_dim)


def layer_forward(w, p, x, shape, cos, sin, visible, cache=None):
    """One decoder layer on x [B, T, dim] (weights w[p + name]); with cache (a list of
    [k, v] or empty), the new keys and values are appended and attention sees all."""
    B, T, _ = x.shape
    h = rms_norm(x, w[p + "input_layernorm.weight"], shape.eps)

    def proj(name):
        y = h @ w[p + f"self_attn.{name}.weight"].T
        bias = w.get(p + f"self_attn.{name}.bias")
        return y if bias is None else y + bias

    q = rotate(proj("q_proj").reshape(B, T, shape.heads, shape.head_dim), cos, sin)
    k = rotate(proj("k_proj").reshape(B, T, shape.kv_heads, shape.head_dim), cos, sin)
    v = proj("v_proj").reshape(B, T, shape.kv_heads, shape.head_dim)
    if cache is not None:
        if cache:
            k = torch.cat([cache[0], k], 1)
            v = torch.cat([cache[1], v], 1)
        cache[:] = [k, v]
    x = x + attend(q, k, v, shape, visible) @ w[p + "self_attn.o_proj.weight"].T
    h = rms_norm(x, w[p + "post_attention_layernorm.weight"], shape.eps)
    gate = h @ w[p + "mlp.gate_proj.weight"].T
    up = h @ w[p + "mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T


def causal_mask(T, S, window=None):
    """[T, S]: query t (at position S - T + t) sees keys up to its own position."""
    i = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    visible = j <= i
    if window:
        visible &= (i - j) < window
    return visible


class Llama:
    """A model of a make-model Hugging Face directory, frozen, in float32 (or dtype)."""

    def __init__(self, model_dir, dtype=torch.float32):
        self.dir = Path(model_dir)
        self.cfg = json.loads((self.dir / "config.json").read_text())
        self.w = read_safetensors(self.dir / "model.safetensors", dtype)
        self.shape = Shape(self.cfg)
        self.dtype = dtype
        self.layers = self.cfg["num_hidden_layers"]
        self.vocab = self.cfg["vocab_size"]
        self.context = self.cfg["max_position_embeddings"]
        self.embedding = self.w["model.embed_tokens.weight"]
        self.classifier = self.w.get("lm_head.weight", self.embedding)
        self.final_norm = self.w["model.norm.weight"]
        self.cos, self.sin = rope_tables(self.cfg, self.shape.head_dim, torch.arange(self.context), dtype)

    def head(self, features):
        """Logits of features (the last layer's output, before the final norm)."""
        return rms_norm(features, self.final_norm, self.shape.eps) @ self.classifier.T

    def forward(self, tokens):
        """tokens [B, T] from position 0 -> features [B, T, dim] (the last layer's output,
        before the final norm) and logits [B, T, vocab]."""
        T = tokens.shape[1]
        x = self.embedding[tokens]
        visible = causal_mask(T, T, self.shape.window)
        for layer in range(self.layers):
            x = layer_forward(self.w, f"model.layers.{layer}.", x, self.shape, self.cos[:T], self.sin[:T], visible)
        return x, self.head(x)

    def generate(self, first, length, temperature, generator, progress=None, greedy_from=None):
        """Continues first [B, 1] to [B, length] tokens, sampling at temperature (0: greedy);
        rows whose greedy_from [B] is set (>= 0) take the argmax from that position on."""
        out = [first]
        caches = [[] for _ in range(self.layers)]
        x_tokens = first
        for pos in range(length - 1):
            x = self.embedding[x_tokens]
            visible = causal_mask(1, pos + 1, self.shape.window)
            cos, sin = self.cos[pos:pos + 1], self.sin[pos:pos + 1]
            for layer in range(self.layers):
                x = layer_forward(self.w, f"model.layers.{layer}.", x, self.shape, cos, sin, visible, caches[layer])
            logits = self.head(x)[:, -1]
            if temperature == 0:
                x_tokens = logits.argmax(-1, keepdim=True)
            else:
                probs = (logits / temperature).softmax(-1)
                x_tokens = torch.multinomial(probs, 1, generator=generator)
                if greedy_from is not None:
                    greedy = (greedy_from >= 0) & (greedy_from <= pos + 1)
                    x_tokens = torch.where(greedy[:, None], logits.argmax(-1, keepdim=True), x_tokens)
            out.append(x_tokens)
            if progress:
                progress(pos + 2, length)
        return torch.cat(out, 1)
