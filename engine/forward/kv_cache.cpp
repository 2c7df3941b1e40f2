#include "engine/forward/kv_cache.hpp"

#include "kernels/common/assert.hpp"

namespace troupe {

kv_cache::kv_cache(const kv_cache_shape& s)
    : shape_(s), layer_values_(int64_t{s.num_blocks} * s.num_kv_heads * s.block_size * s.head_dim) {
  TROUPE_ASSERT(s.num_layers > 0 && s.num_blocks > 0 && s.block_size > 0 && s.head_dim > 0,
                s.num_layers, s.num_blocks, s.block_size, s.head_dim);
  TROUPE_ASSERT(s.type == dtype::f32 || s.type == dtype::f16 || s.type == dtype::q8_0,
                "a KV cache holds f32, f16 or q8_0");
  const auto n = static_cast<size_t>(2 * layer_values_ * s.num_layers);
  if (s.type == dtype::q8_0) {
    int8_.assign(n, 0);
    scales_.assign(n / s.head_dim, 0.0f);
  } else if (s.type == dtype::f16) {
    half_.assign(n, 0);
  } else {
    data_.assign(n, 0.0f);
  }
}

int64_t kv_cache::bytes() const {
  const int64_t values = 2 * layer_values_ * shape_.num_layers;
  switch (shape_.type) {
    case dtype::q8_0: return values + values / shape_.head_dim * int64_t{sizeof(float)};
    case dtype::f16: return values * 2;
    default: return values * int64_t{sizeof(float)};
  }
}

paged_kv_layer kv_cache::layer(int32_t idx) {
  TROUPE_ASSERT(idx >= 0 && idx < shape_.num_layers, idx, shape_.num_layers);
  paged_kv_layer l;
  if (shape_.type == dtype::q8_0) {
    l.k8 = int8_.data() + 2 * layer_values_ * idx;
    l.v8 = l.k8 + layer_values_;
    const int64_t layer_scales = layer_values_ / shape_.head_dim;
    l.k_scale = scales_.data() + 2 * layer_scales * idx;
    l.v_scale = l.k_scale + layer_scales;
  } else if (shape_.type == dtype::f16) {
    l.k16 = half_.data() + 2 * layer_values_ * idx;
    l.v16 = l.k16 + layer_values_;
  } else {
    l.k = data_.data() + 2 * layer_values_ * idx;
    l.v = l.k + layer_values_;
  }
  l.num_blocks = shape_.num_blocks;
  l.num_kv_heads = shape_.num_kv_heads;
  l.block_size = shape_.block_size;
  l.head_dim = shape_.head_dim;
  return l;
}

}  // namespace troupe
