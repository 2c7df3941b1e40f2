// checkpoint_writer: writes Llama checkpoints in the formats troupe reads, from any source
// of weights: seeded random values for synthetic models of any size (benchmarks, tests at
// sizes that cannot be shipped) or another loaded model (format conversion).
//
// Tensors are produced one row at a time, so a model far larger than memory can be written.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/model/config.hpp"
#include "engine/model/model.hpp"
#include "engine/tokenizer/vocabulary.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

// Which tensor a row belongs to. layer is -1 for the embedding, final norm and classifier.
// Biases (Qwen2's q, k and v) are vectors, like norms.
enum class tensor_role { embedding, attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, final_norm, classifier, bq, bk, bv };

// Fills out[0..cols) with row `row` of the tensor (norm vectors have one row).
using weight_source = std::function<void(tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols)>;

// Seeded random weights: matrices uniform in +-1/sqrt(fan_in) * 1.7 (unit variance of the
// products), biases likewise, norms 1.0 (or, with random_norms, uniform in 0.8..1.2, so
// that a norm read in the wrong place shows); different tensors and rows get independent
// streams.
weight_source random_weights(uint64_t seed, bool random_norms = false);

// The weights of a loaded model, dequantized to float.
weight_source weights_of(const model& m);

// `src`, a model whose FFN is `src_hidden` wide, widened to any wider FFN by zero weights:
// rows of w1 and w3 past src_hidden, and the columns of w2 past it. The model computes
// the same function (each added unit's gate and input are 0, silu(0) * 0 = 0, and w2
// gives it no weight), so a Q8_0 group size that does not divide the FFN width fits:
// stories260K's 172 becomes 192, groups of 32.
weight_source with_ffn_padded(weight_source src, int32_t src_hidden);

// `src` with the rows of wq and wk (and the elements of bq and bk) rearranged from one
// rotary layout to the other, so that a model stored with Q and K rotating in pairs
// (llama2.c, GGUF llama) computes what the same model stored in halves (Hugging Face,
// GGUF qwen2) computes.
weight_source with_rope_layout(weight_source src, const model_config& c, rope_layout from, rope_layout to);

// The writers take the source's rows in config.rope's layout and store them in their
// format's own (pairs for llama2.c and GGUF llama and mistral, halves for GGUF qwen2 and
// Hugging Face directories).
struct checkpoint_spec {
  model_config config;
  dtype type = dtype::f32;        // f32 or q8_0 for llama2.c; f32, f16, bf16, q8_0 for GGUF
  int32_t group_size = 64;        // llama2.c version 2 (Q8_0) only
  bool shared_classifier = true;  // the classifier is the embedding
};

// llama2.c: type f32 writes the legacy (v0) format, q8_0 the version-2 format.
status write_llama2c(const std::string& path, const checkpoint_spec& spec, const weight_source& src,
                     const std::function<void(double)>& progress = {});

// GGUF v3, with llama.cpp's architecture and keys for the family (llama for Llama and
// Mistral, qwen2), the vocabulary as tokenizer metadata. Norms and biases are F32; the
// embedding, matrices and classifier are of spec.type. Rope scaling: linear and yarn as
// {arch}.rope.scaling.* keys, llama3 as the rope_freqs.weight tensor of per-pair divisors.
// chat_template, when not empty, is written as tokenizer.chat_template.
status write_gguf(const std::string& path, const checkpoint_spec& spec, const vocabulary& vocab,
                  const weight_source& src, const std::function<void(double)>& progress = {},
                  const std::string& chat_template = "");

// A Hugging Face model directory (created if missing): config.json and model.safetensors,
// its tensors of spec.type (f32, f16 or bf16; norms and biases f32); with
// max_shard_bytes, shards of at most that size (a tensor larger than it alone in one)
// named model-0000N-of-0000M.safetensors, and model.safetensors.index.json.
status write_hf_dir(const std::string& dir, const checkpoint_spec& spec, const weight_source& src,
                    const std::function<void(double)>& progress = {}, uint64_t max_shard_bytes = 0);

// A stand-in vocabulary of n tokens for synthetic models: <unk>, <s>, </s>, the 256 byte
// tokens, then single characters and short pieces.
vocabulary synthetic_vocabulary(int32_t n);

// Writes a llama2.c tokenizer.bin for a vocabulary.
status write_llama2c_vocabulary(const std::string& path, const vocabulary& v);

}  // namespace troupe
