// The weight sources the checkpoint writers read: seeded random weights, a loaded model's,
// and the wrappers that widen an FFN or change the rotary layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/sample/rng.hpp"

namespace troupe {

weight_source random_weights(uint64_t seed, bool random_norms) {
  return [seed, random_norms](tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols) {
    rng r(seed ^ (uint64_t(static_cast<int>(role)) << 56) ^ (uint64_t(layer + 1) << 40) ^ uint64_t(row));
    if (role == tensor_role::attn_norm || role == tensor_role::ffn_norm || role == tensor_role::final_norm) {
      for (int32_t i = 0; i < cols; ++i) out[i] = random_norms ? 0.8f + 0.4f * r.uniform() : 1.0f;
      return;
    }
    const float a = (role == tensor_role::embedding ? 1.0f : 1.7f / std::sqrt(static_cast<float>(cols)));
    for (int32_t i = 0; i < cols; ++i) out[i] = (2.0f * r.uniform() - 1.0f) * a;
  };
}

weight_source with_ffn_padded(weight_source src, int32_t src_hidden) {
  return [src = std::move(src), src_hidden](tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols) {
    if ((role == tensor_role::w1 || role == tensor_role::w3) && row >= src_hidden) {
      std::fill(out, out + cols, 0.0f);
    } else if (role == tensor_role::w2 && cols > src_hidden) {
      src(role, layer, row, out, src_hidden);
      std::fill(out + src_hidden, out + cols, 0.0f);
    } else {
      src(role, layer, row, out, cols);
    }
  };
}

weight_source with_rope_layout(weight_source src, const model_config& c, rope_layout from, rope_layout to) {
  if (from == to) return src;
  const int32_t hd = c.head_dim, rot = c.rope_dim, half = c.rope_dim / 2;
  // The source index within a head of the element the target stores at index j.
  auto source_of = [=](int32_t j) {
    if (j >= rot) return j;
    if (to == rope_layout::pairs) return j % 2 == 0 ? j / 2 : j / 2 + half;  // from halves
    return j < half ? 2 * j : 2 * (j - half) + 1;                          // from pairs
  };
  return [src = std::move(src), hd, source_of](tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols) {
    if (role == tensor_role::wq || role == tensor_role::wk) {
      const int32_t head = row / hd;
      return src(role, layer, head * hd + source_of(row % hd), out, cols);
    }
    if (role == tensor_role::bq || role == tensor_role::bk) {
      std::vector<float> v(cols);
      src(role, layer, row, v.data(), cols);
      for (int32_t i = 0; i < cols; ++i) out[i] = v[i / hd * hd + source_of(i % hd)];
      return;
    }
    src(role, layer, row, out, cols);
  };
}

weight_source weights_of(const model& m) {
  return [&m](tensor_role role, int32_t layer, int32_t row, float* out, int32_t cols) {
    const auto& w = m.weights;
    auto from_vec = [&](const float* v) {
      if (v) std::memcpy(out, v, sizeof(float) * cols);
      else std::fill(out, out + cols, 0.0f);
    };
    auto from_mat = [&](const matrix_view& v) {
      for (int32_t c = 0; c < cols; ++c) out[c] = v.at(row, c);
    };
    switch (role) {
      case tensor_role::embedding: return from_mat(w.token_embedding);
      case tensor_role::classifier: return from_mat(w.classifier);
      case tensor_role::final_norm: return from_vec(w.final_norm);
      case tensor_role::attn_norm: return from_vec(w.layers[layer].attn_norm);
      case tensor_role::ffn_norm: return from_vec(w.layers[layer].ffn_norm);
      case tensor_role::wq: return from_mat(w.layers[layer].wq);
      case tensor_role::wk: return from_mat(w.layers[layer].wk);
      case tensor_role::wv: return from_mat(w.layers[layer].wv);
      case tensor_role::wo: return from_mat(w.layers[layer].wo);
      case tensor_role::w1: return from_mat(w.layers[layer].w1);
      case tensor_role::w2: return from_mat(w.layers[layer].w2);
      case tensor_role::w3: return from_mat(w.layers[layer].w3);
      case tensor_role::bq: return from_vec(w.layers[layer].bq);
      case tensor_role::bk: return from_vec(w.layers[layer].bk);
      case tensor_role::bv: return from_vec(w.layers[layer].bv);
    }
  };
}

}  // namespace troupe
