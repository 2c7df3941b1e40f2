#!/usr/bin/env python3
"""The model families against an independent reference.

For each family (llama2, llama3, qwen2, mistral), make-model writes one synthetic model
as a Hugging Face directory (F32 and BF16) and as GGUF (F32 and Q8_0); this script
implements each family's forward pass in torch from the published definitions (RMSNorm,
rotary embeddings in halves with the family's scaling, grouped-query attention with
q/k/v biases or a sliding window, SwiGLU), reading the safetensors file itself, and
compares its logits with troupe's (model_logits: a prefill step, then one token a step).

    families_test.py BUILD_DIR
"""
import json
import math
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
except ImportError:
    print(f"FAIL: {sys.executable} has no torch: Debian's python3-torch provides it (tools/install-packages.sh installs it)")
    sys.exit(1)

torch.set_grad_enabled(False)
BUILD = Path(sys.argv[1])
MAKE_MODEL = BUILD / "tools" / "make-model"
MODEL_LOGITS = BUILD / "tests" / "model_logits"

# Bounds on the largest logit difference. Where the reference reads the very weights
# troupe runs (F32 anywhere, BF16 in a Hugging Face directory) troupe's float32 against
# the reference's float64: absolute. Q8_0 (GGUF) against the reference on the F32
# weights, 8 bits per weight with a scale per 32 carried through every layer: a fraction
# of the span of the logits.
ABSOLUTE = 1e-4
Q8_RELATIVE = 0.02


# Everything below is this test's own, from the formats' and the families' published
# definitions; it shares no code with troupe (nor with troupe-train's torch model).

SAFETENSORS_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    """Every tensor of a safetensors file, as float64: an 8-byte little-endian header
    length, the JSON header (name -> dtype, shape, data_offsets), then the data."""
    blob = Path(path).read_bytes()
    header_len = struct.unpack_from("<Q", blob, 0)[0]
    header = json.loads(blob[8:8 + header_len])
    start = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        kind = SAFETENSORS_TYPES[info["dtype"]]
        if hi == lo:
            out[name] = torch.zeros(info["shape"], dtype=torch.float64)
            continue
        values = torch.frombuffer(bytearray(blob[start + lo:start + hi]), dtype=kind)
        out[name] = values.to(torch.float64).reshape(info["shape"])
    return out


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rotate(x, cos, sin):
    """Rotary embedding in halves (the Hugging Face layout): x [T, heads, head_dim], pair
    (i, i + head_dim / 2) turned by angle i; cos and sin [T, head_dim]."""
    first, second = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat([-second, first], dim=-1) * sin[:, None]


def inv_frequencies(cfg, head_dim):
    """The rotary frequency of each pair with the config's rope_scaling (none, linear,
    llama3, yarn), and yarn's factor on cos and sin."""
    theta = cfg.get("rope_theta", 10000.0)
    plain = [theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)]
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if not kind:
        return plain, 1.0
    factor = scaling["factor"]
    if kind == "linear":  # positions divided by the factor
        return [f / factor for f in plain], 1.0
    if kind == "llama3":  # long wavelengths slowed by the factor, short ones kept, blended between
        original = scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        scaled = []
        for f in plain:
            wavelength = 2 * math.pi / f
            if wavelength > original / low:
                scaled.append(f / factor)
            elif wavelength < original / high:
                scaled.append(f)
            else:
                t = (original / wavelength - low) / (high - low)
                scaled.append(t * f + (1 - t) * f / factor)
        return scaled, 1.0
    if kind == "yarn":  # pairs that turn fewer than beta_slow times kept, more than beta_fast scaled, ramp between
        original = scaling.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        beta_fast, beta_slow = scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)

        def pair_turning(turns):  # the (fractional) pair index that turns `turns` times over the original context
            return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

        lo = max(math.floor(pair_turning(beta_fast)), 0)
        hi = min(math.ceil(pair_turning(beta_slow)), head_dim - 1)
        width = hi - lo if hi != lo else 0.001
        scaled = []
        for i, f in enumerate(plain):
            ramp = min(max((i - lo) / width, 0.0), 1.0)  # 0: keep, 1: scale
            scaled.append(f * (1 - ramp) + f / factor * ramp)
        mscale = scaling.get("attention_factor") or (1.0 if factor <= 1 else 1.0 + 0.1 * math.log(factor))
        return scaled, mscale
    raise ValueError(f"rope_scaling {kind!r} is not one this test knows")


def reference_logits(model_dir, tokens):
    cfg = json.loads((model_dir / "config.json").read_text())
    w = read_safetensors(model_dir / "model.safetensors")
    dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or dim // heads
    eps = cfg["rms_norm_eps"]
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    T = len(tokens)
    freqs, att_factor = inv_frequencies(cfg, hd)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * torch.tensor(freqs, dtype=torch.float64)[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1) * att_factor
    sin = torch.cat([angles.sin(), angles.sin()], -1) * att_factor
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    visible = j <= i
    if window:
        visible &= (i - j) < window
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name):
            y = h @ w[p + f"self_attn.{name}.weight"].T
            bias = w.get(p + f"self_attn.{name}.bias")
            return y if bias is None else y + bias

        q = rotate(proj("q_proj").reshape(T, heads, hd), cos, sin)
        k = rotate(proj("k_proj").reshape(T, kv_heads, hd), cos, sin)
        v = proj("v_proj").reshape(T, kv_heads, hd)
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, heads * hd)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def troupe_logits(model, tokens, prefill, vocab):
    with tempfile.NamedTemporaryFile(suffix=".f32") as out:
        subprocess.run([str(MODEL_LOGITS), str(model), out.name, str(prefill)] + [str(t) for t in tokens], check=True)
        raw = bytearray(Path(out.name).read_bytes())
    return torch.frombuffer(raw, dtype=torch.float32).reshape(-1, vocab).to(torch.float64)


FAMILIES = {
    # family: make-model flags (shapes small enough for a test, with the family's features:
    # GQA everywhere, a window shorter than the prefill for Mistral, head_dim 32 so that
    # the scaled frequencies differ pair by pair)
    "llama2": ["--dim", "128", "--hidden", "256", "--layers", "3", "--heads", "4", "--kv-heads", "2"],
    "llama3": ["--dim", "128", "--hidden", "256", "--layers", "3", "--heads", "4", "--kv-heads", "2",
               "--original-context", "16"],
    "qwen2": ["--dim", "128", "--hidden", "256", "--layers", "3", "--heads", "4", "--kv-heads", "2"],
    "mistral": ["--dim", "128", "--hidden", "256", "--layers", "3", "--heads", "4", "--kv-heads", "2",
                "--sliding-window", "7", "--separate-classifier"],
}
EXTRA = {
    "llama3 yarn": ("llama3", ["--rope-scaling", "yarn", "--rope-factor", "4"]),
    "llama2 linear": ("llama2", ["--rope-scaling", "linear", "--rope-factor", "2"]),
}


def make(out, family, flags, fmt, typ):
    subprocess.run([str(MAKE_MODEL), str(out), "--family", family, "--format", fmt, "--type", typ, "--vocab", "320",
                    "--context", "64", "--seed", "7"] + flags, check=True, stderr=subprocess.DEVNULL)


def main():
    tokens = [1] + [(37 * i * i + 11 * i + 5) % 317 + 3 for i in range(39)]
    prefill = 20
    failures = 0
    cases = [(name, name, flags) for name, flags in FAMILIES.items()]
    cases += [(name, fam, FAMILIES[fam] + more) for name, (fam, more) in EXTRA.items()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, family, flags in cases:
            slug = name.replace(" ", "-")
            hf = tmp / f"{slug}-f32-hf"
            make(hf, family, flags, "hf", "f32")
            f32_want = reference_logits(hf, tokens)[prefill - 1:]
            for fmt, typ in [("hf", "f32"), ("hf", "bf16"), ("gguf", "f32"), ("gguf", "q8_0")]:
                path = tmp / f"{slug}-{typ}-{fmt}"
                make(path, family, flags, fmt, typ)
                want = reference_logits(path, tokens)[prefill - 1:] if fmt == "hf" else f32_want
                got = troupe_logits(path, tokens, prefill, want.shape[1])
                label = f"{fmt} {typ}"
                if got.shape != want.shape:
                    print(f"FAIL {name}, {label}: {tuple(got.shape)} logits, {tuple(want.shape)} expected")
                    failures += 1
                    continue
                diff = (got - want).abs().max().item()
                span = (want.max() - want.min()).item()
                bound = Q8_RELATIVE * span if typ == "q8_0" else ABSOLUTE
                ok = bool(torch.isfinite(got).all()) and diff <= bound
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:14} {label:10} max |logit difference| {diff:.2e}"
                      f" = {diff / span:.1e} of the span {span:.1f} (bound {bound:.1e})")
    if failures:
        print(f"{failures} case(s) outside their bound")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
