// The model the model_files target reads head files for (selector 4), and its seeds are
// written for: the shape of the seed checkpoints (dim 32, one layer, vocabulary 300).
#pragma once

#include "engine/model/checkpoint_writer.hpp"
#include "engine/model/model.hpp"

namespace troupe::fuzz {

inline model heads_target() {
  model m;
  model_config& c = m.config;
  c.dim = 32;
  c.hidden_dim = 32;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 2;
  c.vocab_size = 300;
  c.max_seq_len = 64;
  c.head_dim = 16;
  c.rope_dim = 16;
  return m;
}

inline const vocabulary& heads_vocabulary() {
  static const vocabulary v = synthetic_vocabulary(300);
  return v;
}

}  // namespace troupe::fuzz
