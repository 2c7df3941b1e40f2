// make-model's command line: the checkpoint to write (its shape, family, format and weight
// type, or a model to convert), and the flags that set it.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/model/config.hpp"

namespace troupe::tools {

struct make_options {
  std::string out, format, type_name = "f32", preset_name, vocab_from, from, from_tokenizer, heads_from;
  std::string family = "llama2", scaling;
  model_config c = default_shape();
  uint64_t seed = 42;
  int32_t group_size = 64;
  bool separate = false;
  float rope_theta = 0, rope_factor = 0;
  int32_t window = -1, original_context = 0;
  int32_t pad_ffn = 0, damp_from = -1, keep_layers = 0;
  float damp = 0.05f;

  static model_config default_shape() {
    model_config c;
    c.dim = 64;
    c.hidden_dim = 172;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 0;
    c.vocab_size = 512;
    c.max_seq_len = 256;
    return c;
  }
};

// Adds every flag of `o` to `app`.
void add_make_options(CLI::App& app, make_options& o);

// --heads-from: trained speculative heads packed as a head file for the --from model.
// The exit status, with the reason on stderr.
int pack_heads(const make_options& o);

// The checkpoint: its shape settled from a preset, the family and the flags `app` was
// given, then weights generated or converted and written, with progress on a terminal.
// The exit status, with the reason on stderr.
int make_checkpoint(make_options& o, const CLI::App& app);

}  // namespace troupe::tools
