// kv_cache: the key/value tensors one shard keeps for its layers and KV heads, in
// fixed-size blocks. Which block belongs to which sequence is decided elsewhere (block
// tables handed in with each step); this object only owns the memory.
//
//   per layer: k, v [num_blocks][num_kv_heads][block_size][head_dim], F32, F16, or int8
//   with a float scale per slot and KV head (q8_0 here; kernels/cpu/paged_attention.hpp
//   has the layouts)
//
// Owned by one shard; touched only by the thread that runs that shard's forward pass.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <span>

#include "kernels/common/aligned.hpp"
#include "kernels/common/dtype.hpp"
#include "kernels/cpu/paged_attention.hpp"

namespace troupe {

struct kv_cache_shape {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;  // this shard's share
  int32_t block_size = 16;
  int32_t head_dim = 0;
  dtype type = dtype::f32;  // f32, f16 or q8_0 (int8, a scale per slot and KV head)
};

class kv_cache {
 public:
  explicit kv_cache(const kv_cache_shape& s);

  paged_kv_layer layer(int32_t idx);
  const kv_cache_shape& shape() const { return shape_; }
  int64_t bytes() const;

  // One block's K and V, every layer (and scales), as bytes: what the KV tiers keep.
  int64_t block_bytes() const { return block_bytes(shape_); }
  static int64_t block_bytes(const kv_cache_shape& s);
  void read_block(uint32_t block, std::span<std::byte> out) const;
  void write_block(uint32_t block, std::span<const std::byte> in);

 private:
  kv_cache_shape shape_;
  int64_t layer_values_;
  // Zeroed, so a read of an unwritten slot is repeatable; one of the two is used.
  aligned_vector<float> data_;
  aligned_vector<uint16_t> half_;
  aligned_vector<int8_t> int8_;
  aligned_vector<float> scales_;  // q8_0: per layer k_scale then v_scale

  // The block's pieces, in order: (offset in bytes into the array, length), each array's
  // base. f(base, offset, length) for each.
  template <class F>
  void for_each_piece(uint32_t block, F&& f) const;
};

}  // namespace troupe
