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
enum class tensor_role { embedding, attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, final_norm, classifier };

// Fills out[0..cols) with row `row` of the tensor (norm vectors have one row).
using weight_source = std::function<void(tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols)>;

// Seeded random weights: matrices uniform in +-1/sqrt(fan_in) * 1.7 (unit variance of the
// products), norms 1.0; different tensors and rows get independent streams.
weight_source random_weights(uint64_t seed);

// The weights of a loaded model, dequantized to float.
weight_source weights_of(const model& m);

// `src`, a model whose FFN is `src_hidden` wide, widened to any wider FFN by zero weights:
// rows of w1 and w3 past src_hidden, and the columns of w2 past it. The model computes
// the same function (each added unit's gate and input are 0, silu(0) * 0 = 0, and w2
// gives it no weight), so a Q8_0 group size that does not divide the FFN width fits:
// stories260K's 172 becomes 192, groups of 32.
weight_source with_ffn_padded(weight_source src, int32_t src_hidden);

struct checkpoint_spec {
  model_config config;
  dtype type = dtype::f32;        // f32 or q8_0 for llama2.c; f32, f16, bf16, q8_0 for GGUF
  int32_t group_size = 64;        // llama2.c version 2 (Q8_0) only
  bool shared_classifier = true;  // the classifier is the embedding
};

// llama2.c: type f32 writes the legacy (v0) format, q8_0 the version-2 format.
status write_llama2c(const std::string& path, const checkpoint_spec& spec, const weight_source& src,
                     const std::function<void(double)>& progress = {});

// GGUF v3, llama architecture, with the vocabulary as tokenizer metadata. Norms are F32;
// the embedding, matrices and classifier are of spec.type.
// chat_template, when not empty, is written as tokenizer.chat_template.
status write_gguf(const std::string& path, const checkpoint_spec& spec, const vocabulary& vocab,
                  const weight_source& src, const std::function<void(double)>& progress = {},
                  const std::string& chat_template = "");

// A stand-in vocabulary of n tokens for synthetic models: <unk>, <s>, </s>, the 256 byte
// tokens, then single characters and short pieces.
vocabulary synthetic_vocabulary(int32_t n);

// Writes a llama2.c tokenizer.bin for a vocabulary.
status write_llama2c_vocabulary(const std::string& path, const vocabulary& v);

}  // namespace troupe
