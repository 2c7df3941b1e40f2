#include "engine/forward/kv_cache.hpp"

#include <cstring>

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

// Per layer: K then V of the block (its KV heads' values are contiguous), then with int8
// storage K's and V's scales.
template <class F>
void kv_cache::for_each_piece(uint32_t block, F&& f) const {
  TROUPE_ASSERT(block < static_cast<uint32_t>(shape_.num_blocks), block, shape_.num_blocks);
  const int64_t values = int64_t{shape_.num_kv_heads} * shape_.block_size * shape_.head_dim;
  const int64_t at = int64_t{block} * values;
  const int64_t layer_scales = layer_values_ / shape_.head_dim;
  const int64_t scales = int64_t{shape_.num_kv_heads} * shape_.block_size;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const int64_t base = (2 * int64_t{l} + kv) * layer_values_ + at;
      switch (shape_.type) {
        case dtype::q8_0: f(reinterpret_cast<const std::byte*>(int8_.data() + base), values); break;
        case dtype::f16: f(reinterpret_cast<const std::byte*>(half_.data() + base), values * 2); break;
        default: f(reinterpret_cast<const std::byte*>(data_.data() + base), values * 4); break;
      }
    }
    if (shape_.type == dtype::q8_0)
      for (int kv = 0; kv < 2; ++kv)
        f(reinterpret_cast<const std::byte*>(scales_.data() + (2 * int64_t{l} + kv) * layer_scales + int64_t{block} * scales),
          scales * 4);
  }
}

int64_t kv_cache::block_bytes(const kv_cache_shape& s) {
  const int64_t values = 2 * int64_t{s.num_layers} * s.num_kv_heads * s.block_size * s.head_dim;
  switch (s.type) {
    case dtype::q8_0: return values + values / s.head_dim * int64_t{sizeof(float)};
    case dtype::f16: return values * 2;
    default: return values * int64_t{sizeof(float)};
  }
}

void kv_cache::read_block(uint32_t block, std::span<std::byte> out) const {
  size_t at = 0;
  for_each_piece(block, [&](const std::byte* p, int64_t len) {
    TROUPE_ASSERT(at + len <= out.size(), at, len, out.size());
    std::memcpy(out.data() + at, p, static_cast<size_t>(len));
    at += static_cast<size_t>(len);
  });
  TROUPE_ASSERT(at == out.size(), at, out.size());
}

void kv_cache::write_block(uint32_t block, std::span<const std::byte> in) {
  size_t at = 0;
  for_each_piece(block, [&](const std::byte* p, int64_t len) {
    TROUPE_ASSERT(at + len <= in.size(), at, len, in.size());
    // (The pieces are this cache's own memory.)
    std::memcpy(const_cast<std::byte*>(p), in.data() + at, static_cast<size_t>(len));
    at += static_cast<size_t>(len);
  });
  TROUPE_ASSERT(at == in.size(), at, in.size());
}

}  // namespace troupe
