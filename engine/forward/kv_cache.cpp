#include "engine/forward/kv_cache.hpp"

#include "kernels/common/assert.hpp"

namespace troupe {

kv_cache::kv_cache(const kv_cache_shape& s)
    : shape_(s),
      layer_floats_(int64_t{s.num_blocks} * s.num_kv_heads * s.block_size * s.head_dim),
      data_(static_cast<size_t>(2 * layer_floats_ * s.num_layers), 0.0f) {
  TROUPE_ASSERT(s.num_layers > 0 && s.num_blocks > 0 && s.block_size > 0 && s.head_dim > 0,
                s.num_layers, s.num_blocks, s.block_size, s.head_dim);
}

paged_kv_layer kv_cache::layer(int32_t idx) {
  TROUPE_ASSERT(idx >= 0 && idx < shape_.num_layers, idx, shape_.num_layers);
  paged_kv_layer l;
  l.k = data_.data() + 2 * layer_floats_ * idx;
  l.v = l.k + layer_floats_;
  l.num_blocks = shape_.num_blocks;
  l.num_kv_heads = shape_.num_kv_heads;
  l.block_size = shape_.block_size;
  l.head_dim = shape_.head_dim;
  return l;
}

}  // namespace troupe
