#include "kernels/cpu/paged_attention.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/softmax.hpp"

namespace troupe {

namespace {

float dot(const float* a, const float* b, int32_t n) {
  int32_t i = 0;
  float s = 0.0f;
  if (n >= simd::width) {
    simd::v16f acc = simd::zero();
    for (; i + simd::width <= n; i += simd::width)
      acc = simd::fma(simd::load(a + i), simd::load(b + i), acc);
    s = simd::reduce_add(acc);
  }
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void attend_one(const float* q, float* out, const attention_token& tok, int32_t kv_head,
                const paged_kv_layer& kv, float* scores) {
  const int32_t n = tok.position + 1;
  const int32_t hd = kv.head_dim;
  const float norm = std::sqrt(static_cast<float>(hd));
  for (int32_t p = 0; p < n; ++p) {
    const uint32_t block = tok.block_table[p / kv.block_size];
    const float* k = kv.k + kv.offset(block, kv_head, p % kv.block_size);
    scores[p] = dot(q, k, hd) / norm;
  }
  softmax(scores, n);
  std::memset(out, 0, sizeof(float) * hd);
  for (int32_t p = 0; p < n; ++p) {
    const uint32_t block = tok.block_table[p / kv.block_size];
    const float* v = kv.v + kv.offset(block, kv_head, p % kv.block_size);
    const float a = scores[p];
    for (int32_t d = 0; d < hd; ++d) out[d] += a * v[d];
  }
}

}  // namespace

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride,
                     const attention_token* tokens, int32_t num_tokens, int32_t num_heads,
                     const paged_kv_layer& kv, thread_pool& pool) {
  const int32_t group = num_heads / kv.num_kv_heads;
  const int64_t items = int64_t{num_tokens} * num_heads;
  pool.parallel_for(items, 1, [&](int64_t b, int64_t e, int) {
    thread_local std::vector<float> scores;
    for (int64_t it = b; it < e; ++it) {
      const auto t = static_cast<int32_t>(it / num_heads);
      const auto h = static_cast<int32_t>(it % num_heads);
      const attention_token& tok = tokens[t];
      if (static_cast<int64_t>(scores.size()) < tok.position + 1) scores.resize(tok.position + 1);
      attend_one(q + t * q_stride + h * kv.head_dim, out + t * out_stride + h * kv.head_dim, tok,
                 h / group, kv, scores.data());
    }
  });
}

void paged_kv_write(const paged_kv_layer& kv, const uint32_t* block_table, int32_t position,
                    const float* k, const float* v) {
  const uint32_t block = block_table[position / kv.block_size];
  const int32_t slot = position % kv.block_size;
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const int64_t off = kv.offset(block, h, slot);
    std::memcpy(kv.k + off, k + h * kv.head_dim, sizeof(float) * kv.head_dim);
    std::memcpy(kv.v + off, v + h * kv.head_dim, sizeof(float) * kv.head_dim);
  }
}

}  // namespace troupe
