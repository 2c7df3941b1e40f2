// speculative_heads: trained proposer heads for one target model, read from a GGUF file
// (troupe-train trains them; make-model --heads-from packs them for their target).
//
//   Medusa (general.architecture "troupe.medusa"): k heads on the target's last hidden
//     state h after its final norm; head i is a chain of residual blocks
//     x <- x + SiLU(W x + b) (tensors medusa.{i}.{j}.weight [dim][dim], .bias [dim]) read
//     by its own classifier (medusa.{i}.output.weight [vocab][dim]) or, without one, the
//     target's, and guesses the token i + 2 positions after h's.
//   EAGLE ("troupe.eagle"): one Llama decoder layer over features. From the target's
//     feature f_j (its last layer's output, before the final norm) and the embedding of
//     token j + 1, fc (eagle.fc.weight [dim][2 dim], eagle.fc.bias) makes the layer's
//     input at position j; the layer (eagle.attn_norm, attn_q, attn_k, attn_v,
//     attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down; the target's heads, rotary
//     embeddings in halves) predicts f_{j+1}, which the target's final norm and classifier
//     read. Drafting feeds each prediction back with its drafted token.
//
// Every file names its target: troupe.target.dim, .vocab_size, .layers and .vocabulary
// (a fingerprint of the token texts). Loading checks them, and every tensor's shape, so
// heads trained for another model, or a file that is not a head file, are refused with a
// reason; so is a tensor the file should not hold.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model.hpp"
#include "engine/model/safetensors_file.hpp"
#include "engine/tokenizer/vocabulary.hpp"
#include "engine/util/expected.hpp"
#include "engine/util/mapped_file.hpp"
#include "kernels/common/matrix_view.hpp"

namespace troupe {

enum class heads_kind : uint8_t { medusa, eagle };

struct medusa_block {
  matrix_view w;  // [dim][dim]
  const float* bias = nullptr;
};

struct medusa_head {
  std::vector<medusa_block> blocks;
  std::optional<matrix_view> classifier;  // [vocab][dim]; none: the target's
};

struct eagle_layer {
  matrix_view fc;  // [dim][2 dim]: the feature's columns, then the embedding's
  const float* fc_bias = nullptr;
  const float* attn_norm = nullptr;
  matrix_view wq, wk, wv, wo;
  const float* ffn_norm = nullptr;
  matrix_view gate, up, down;
};

struct speculative_heads {
  std::string path;
  heads_kind kind = heads_kind::medusa;
  std::vector<medusa_head> medusa;
  eagle_layer eagle;
  mapped_file file;  // the mapping the views point into

  // How far ahead the heads can draft: Medusa's head count; EAGLE runs on (16).
  int32_t depth() const;
  std::string describe() const;  // "4 Medusa heads", "an EAGLE layer (hidden 172)"
};

// A fingerprint of a vocabulary's token texts (FNV-1a over each piece and a separator),
// as hex: what a head file records of its target's vocabulary.
std::string vocabulary_fingerprint(const vocabulary& v);

// The heads in `path`, checked against the target (its vocabulary, where one is at hand).
expected<std::unique_ptr<speculative_heads>> load_heads(const std::string& path, const model& target,
                                                        const vocabulary* target_vocab);

// The heads in `file` (a GGUF file's bytes), as load_heads reads them.
expected<std::unique_ptr<speculative_heads>> load_heads(mapped_file file, const model& target,
                                                        const vocabulary* target_vocab);

struct head_tensor {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  const float* data = nullptr;
};

// Writes `tensors` (named as above; the kind from their names) as a head file for
// `target`, recording its shape and vocabulary's fingerprint, and reads it back: a file
// that would be refused is not left behind.
status write_heads(const std::string& path, std::span<const head_tensor> tensors, const model& target,
                   const vocabulary& target_vocab);
// The same from a safetensors file (troupe-train's; F32 tensors).
status write_heads(const std::string& path, const safetensors_file& src, const model& target,
                   const vocabulary& target_vocab);

}  // namespace troupe
