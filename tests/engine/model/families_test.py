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
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
except ImportError:
    print(f"FAIL: {sys.executable} has no torch: Debian's python3-torch provides it (tools/install-packages.sh installs it)")
    sys.exit(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "troupe-train"))
from torch_llama import inv_frequencies, read_safetensors, rms_norm, rotate  # noqa: E402

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
