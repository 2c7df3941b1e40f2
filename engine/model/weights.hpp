// model_weights: views of every tensor of a loaded checkpoint, in place in the mapped
// file (never converted), plus the few small tensors a loader had to materialise as float
// (norm weights stored in 16-bit types).
//
// Matrices follow y = W x: wq [num_heads*head_dim][dim], wk/wv [kv_dim][dim],
// wo [dim][num_heads*head_dim], w1 (gate) and w3 (up) [hidden][dim], w2 (down)
// [dim][hidden], token_embedding and classifier [vocab][dim].
#pragma once

#include <memory>
#include <vector>

#include "engine/util/mapped_file.hpp"
#include "kernels/common/matrix_view.hpp"

namespace troupe {

struct layer_weights {
  const float* attn_norm = nullptr;  // [dim]
  matrix_view wq, wk, wv, wo;
  const float* bq = nullptr;  // [num_heads*head_dim], when the model has q/k/v biases (Qwen2)
  const float* bk = nullptr;  // [kv_dim]
  const float* bv = nullptr;  // [kv_dim]
  const float* ffn_norm = nullptr;  // [dim]
  matrix_view w1, w2, w3;
};

struct model_weights {
  matrix_view token_embedding;
  std::vector<layer_weights> layers;
  const float* final_norm = nullptr;  // [dim]
  matrix_view classifier;

  mapped_file file;                              // the mapping the views point into
  std::vector<mapped_file> files;                // more of them, for weights in several files
  std::vector<std::unique_ptr<float[]>> owned;   // materialised float norms, if any

  // Bytes of weights one decode step streams (all matrices but the embedding table).
  int64_t streamed_bytes() const;

  // n floats of a dense (F32, F16 or BF16) vector in the file: in place when F32, else
  // converted into a buffer these weights own.
  const float* dense_vector(dtype type, const void* data, int64_t n);
};

}  // namespace troupe
