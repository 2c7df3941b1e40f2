#include "kernels/cpu/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common/dtype.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/cpu/softmax.hpp"

namespace troupe {

namespace {

constexpr int max_group = 8;  // query heads per KV head handled in one pass

// Cache storage: F32 as is, F16 widened (exactly) as it is read, int8 converted (exactly)
// and scaled per slot: scores after the sum over the head dimension, values through the
// softmax weight.
inline simd::v16f load16(const float* p) { return simd::load(p); }
inline simd::v16f load16(const uint16_t* p) { return simd::load_f16(p); }
inline simd::v16f load16(const int8_t* p) { return simd::load_i8(p); }
inline float value(float x) { return x; }
inline float value(uint16_t h) { return f16_to_f32(h); }
inline float value(int8_t q) { return static_cast<float>(q); }
inline const float* keys(const paged_kv_layer& kv, float) { return kv.k; }
inline const uint16_t* keys(const paged_kv_layer& kv, uint16_t) { return kv.k16; }
inline const int8_t* keys(const paged_kv_layer& kv, int8_t) { return kv.k8; }
inline const float* values(const paged_kv_layer& kv, float) { return kv.v; }
inline const uint16_t* values(const paged_kv_layer& kv, uint16_t) { return kv.v16; }
inline const int8_t* values(const paged_kv_layer& kv, int8_t) { return kv.v8; }
template <class T>
constexpr bool scaled = std::is_same_v<T, int8_t>;

// Sixteen-slot blocks, NB blocks at a time for G query heads: NB * G independent sums (one
// alone waits on each FMA's latency), each still a sequential sum over the head
// dimension, so the scores are those of the one-block loop below.
//
// A decode step's attention reads each running sequence's cache once, in pieces of
// 16 * head_dim elements scattered over the pool, which the hardware prefetcher finds
// only after missing on them. So while it scores NB blocks the loop asks for the keys of
// the next NB and the values of these (read after the softmax), a line or so per
// head-dimension step, spread out so that the requests never queue up behind each other.
template <class T, int NB, int G>
void scores_blocks(const float* const* q, const attention_token& tok, int32_t kv_head, const paged_kv_layer& kv,
                   int32_t n, float* const* scores) {
  const int32_t hd = kv.head_dim;
  const simd::v16f vnorm = simd::splat(std::sqrt(static_cast<float>(hd)));
  const int32_t blocks = (n + simd::width - 1) / simd::width;
  // A piece's row d (keys) or its d-th 16-element stretch (values) begins at d * row.
  constexpr int row = simd::width * sizeof(T);
  constexpr int rows_per_line = row >= 64 ? 1 : 64 / row;
  for (int32_t b0 = 0; b0 < blocks; b0 += NB) {
    const int nb = std::min<int32_t>(NB, blocks - b0);
    const char* ahead[2 * NB];
    int n_ahead = 0;
    for (int32_t b = b0 + NB; b < std::min(b0 + 2 * NB, blocks); ++b)
      ahead[n_ahead++] = reinterpret_cast<const char*>(keys(kv, T{}) + kv.offset(tok.block_table[b], kv_head));
    for (int32_t b = b0; b < b0 + nb; ++b)
      ahead[n_ahead++] = reinterpret_cast<const char*>(values(kv, T{}) + kv.offset(tok.block_table[b], kv_head));
    if constexpr (scaled<T>) {
      for (int32_t b = b0 + NB; b < std::min(b0 + 2 * NB, blocks); ++b)
        __builtin_prefetch(kv.k_scale + kv.scale_offset(tok.block_table[b], kv_head));
      for (int32_t b = b0; b < b0 + nb; ++b) __builtin_prefetch(kv.v_scale + kv.scale_offset(tok.block_table[b], kv_head));
    }
    const T* kt[NB];
    for (int j = 0; j < NB; ++j) kt[j] = keys(kv, T{}) + kv.offset(tok.block_table[b0 + std::min(j, nb - 1)], kv_head);
    simd::v16f acc[NB][G];
    for (int j = 0; j < NB; ++j)
      for (int h = 0; h < G; ++h) acc[j][h] = simd::zero();
    for (int32_t d = 0; d < hd; ++d) {
      if (d % rows_per_line == 0)
        for (int i = 0; i < n_ahead; ++i) __builtin_prefetch(ahead[i] + d * row);
      for (int j = 0; j < NB; ++j) {
        const simd::v16f col = load16(kt[j] + d * simd::width);
        for (int h = 0; h < G; ++h) acc[j][h] = simd::fma(simd::splat(q[h][d]), col, acc[j][h]);
      }
    }
    for (int j = 0; j < nb; ++j) {
      const int32_t p0 = (b0 + j) * simd::width;
      const int32_t take = std::min(simd::width, n - p0);
      simd::v16f ks = simd::splat(1.0f);
      if constexpr (scaled<T>) ks = simd::load(kv.k_scale + kv.scale_offset(tok.block_table[b0 + j], kv_head));
      for (int h = 0; h < G; ++h) {
        alignas(64) float tmp[simd::width];
        if constexpr (scaled<T>)
          simd::store(tmp, acc[j][h] * ks / vnorm);
        else
          simd::store(tmp, acc[j][h] / vnorm);
        std::memcpy(scores[h] + p0, tmp, sizeof(float) * take);
      }
    }
  }
}

// scores[h][p] = q_h . k_p / sqrt(head_dim) for p < n, for the `group` query heads that
// share one KV head. Each score is a sequential sum over the head dimension, whichever
// path computes it.
template <class T>
void scores_for(const float* const* q, int group, const attention_token& tok, int32_t kv_head,
                const paged_kv_layer& kv, int32_t n, float* const* scores) {
  const int32_t bs = kv.block_size, hd = kv.head_dim;
  if (bs == simd::width) {
    switch (group) {
      case 1: return scores_blocks<T, 4, 1>(q, tok, kv_head, kv, n, scores);
      case 2: return scores_blocks<T, 4, 2>(q, tok, kv_head, kv, n, scores);
      case 4: return scores_blocks<T, 2, 4>(q, tok, kv_head, kv, n, scores);
      default: break;
    }
  }
  const float norm = std::sqrt(static_cast<float>(hd));
  const simd::v16f vnorm = simd::splat(norm);
  for (int32_t p0 = 0; p0 < n; p0 += bs) {
    const T* kt = keys(kv, T{}) + kv.offset(tok.block_table[p0 / bs], kv_head);  // [hd][bs]
    const float* ks = scaled<T> ? kv.k_scale + kv.scale_offset(tok.block_table[p0 / bs], kv_head) : nullptr;
    const int32_t count = std::min(bs, n - p0);
    if (bs % simd::width == 0) {
      // Whole vectors of slots; lanes past `count` are computed and dropped.
      for (int32_t c = 0; c < count; c += simd::width) {
        simd::v16f acc[max_group];
        for (int h = 0; h < group; ++h) acc[h] = simd::zero();
        for (int32_t d = 0; d < hd; ++d) {
          const simd::v16f col = load16(kt + d * bs + c);
          for (int h = 0; h < group; ++h) acc[h] = simd::fma(simd::splat(q[h][d]), col, acc[h]);
        }
        const int32_t take = std::min(simd::width, count - c);
        for (int h = 0; h < group; ++h) {
          alignas(64) float tmp[simd::width];
          if constexpr (scaled<T>)
            simd::store(tmp, acc[h] * simd::load(ks + c) / vnorm);
          else
            simd::store(tmp, acc[h] / vnorm);
          std::memcpy(scores[h] + p0 + c, tmp, sizeof(float) * take);
        }
      }
    } else {
      for (int32_t s = 0; s < count; ++s)
        for (int h = 0; h < group; ++h) {
          float acc = 0.0f;
          for (int32_t d = 0; d < hd; ++d) acc = std::fma(q[h][d], value(kt[d * bs + s]), acc);
          if constexpr (scaled<T>) acc *= ks[s];
          scores[h][p0 + s] = acc / norm;
        }
    }
  }
}

// out = sum_p weights[p] * v_p, accumulated over positions in order. Head sizes that are
// multiples of 16 (up to 256) keep the sum in registers.
template <int Chunks, class T>
void weighted_values_simd(const float* weights, int32_t n, const attention_token& tok, int32_t kv_head,
                          const paged_kv_layer& kv, float* out) {
  simd::v16f acc[Chunks];
  for (int c = 0; c < Chunks; ++c) acc[c] = simd::zero();
  const int32_t bs = kv.block_size;
  for (int32_t p0 = 0; p0 < n; p0 += bs) {
    const T* vb = values(kv, T{}) + kv.offset(tok.block_table[p0 / bs], kv_head);
    const float* vs = scaled<T> ? kv.v_scale + kv.scale_offset(tok.block_table[p0 / bs], kv_head) : nullptr;
    const int32_t count = std::min(bs, n - p0);
    for (int32_t s = 0; s < count; ++s) {
      const simd::v16f a = simd::splat(scaled<T> ? weights[p0 + s] * vs[s] : weights[p0 + s]);
      for (int c = 0; c < Chunks; ++c) acc[c] = simd::fma(a, load16(vb + s * Chunks * simd::width + c * simd::width), acc[c]);
    }
  }
  for (int c = 0; c < Chunks; ++c) simd::store(out + c * simd::width, acc[c]);
}

template <class T>
void weighted_values(const float* weights, int32_t n, const attention_token& tok, int32_t kv_head,
                     const paged_kv_layer& kv, float* out) {
  switch (kv.head_dim) {
    case 16: return weighted_values_simd<1, T>(weights, n, tok, kv_head, kv, out);
    case 32: return weighted_values_simd<2, T>(weights, n, tok, kv_head, kv, out);
    case 64: return weighted_values_simd<4, T>(weights, n, tok, kv_head, kv, out);
    case 128: return weighted_values_simd<8, T>(weights, n, tok, kv_head, kv, out);
    case 256: return weighted_values_simd<16, T>(weights, n, tok, kv_head, kv, out);
    default: break;
  }
  const int32_t hd = kv.head_dim, bs = kv.block_size;
  std::memset(out, 0, sizeof(float) * hd);
  for (int32_t p = 0; p < n; ++p) {
    const T* v = values(kv, T{}) + kv.offset(tok.block_table[p / bs], kv_head) + (p % bs) * hd;
    const float a = scaled<T> ? weights[p] * kv.v_scale[kv.scale_offset(tok.block_table[p / bs], kv_head) + p % bs] : weights[p];
    for (int32_t d = 0; d < hd; ++d) out[d] += a * value(v[d]);
  }
}

template <class T>
void attend_group(const float* const* q, float* const* out, int group, const attention_token& tok,
                  int32_t kv_head, const paged_kv_layer& kv, std::vector<float>& scratch) {
  const int32_t n = tok.position + 1;
  const int32_t bs = kv.block_size;
  const int32_t padded = (n + bs - 1) / bs * bs + simd::width;
  if (static_cast<int32_t>(scratch.size()) < group * padded) scratch.resize(group * padded);
  float* scores[max_group] = {};
  for (int h = 0; h < group; ++h) scores[h] = scratch.data() + h * padded;
  scores_for<T>(q, group, tok, kv_head, kv, n, scores);
  for (int h = 0; h < group; ++h) {
    softmax(scores[h], n);
    weighted_values<T>(scores[h], n, tok, kv_head, kv, out[h]);
  }
}

}  // namespace

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride,
                     const attention_token* tokens, int32_t num_tokens, int32_t num_heads,
                     const paged_kv_layer& kv, thread_pool& pool) {
  const int32_t group = num_heads / kv.num_kv_heads;
  // Query heads of one KV head in passes of at most max_group.
  const int32_t passes = (group + max_group - 1) / max_group;
  const int64_t items = int64_t{num_tokens} * kv.num_kv_heads * passes;
  // Items differ in cost (a prefill chunk's tokens see more positions than a new
  // sequence's), so threads take them as they become free.
  pool.parallel_for_dynamic(items, [&](int64_t it, int) {
    thread_local std::vector<float> scratch;
    {
      const auto t = static_cast<int32_t>(it / (int64_t{kv.num_kv_heads} * passes));
      const auto rest = static_cast<int32_t>(it % (int64_t{kv.num_kv_heads} * passes));
      const int32_t g = rest / passes, pass = rest % passes;
      const int32_t h0 = g * group + pass * max_group;
      const int count = std::min(max_group, group - pass * max_group);
      const float* qs[max_group];
      float* outs[max_group];
      for (int h = 0; h < count; ++h) {
        qs[h] = q + t * q_stride + (h0 + h) * kv.head_dim;
        outs[h] = out + t * out_stride + (h0 + h) * kv.head_dim;
      }
      if (kv.k8)
        attend_group<int8_t>(qs, outs, count, tokens[t], g, kv, scratch);
      else if (kv.k16)
        attend_group<uint16_t>(qs, outs, count, tokens[t], g, kv, scratch);
      else
        attend_group<float>(qs, outs, count, tokens[t], g, kv, scratch);
    }
  });
}

namespace {

// x[0..n) to int8 at q[0], q[stride], ...: scale = max |x| / 127, q = x / scale rounded to
// nearest even. An all-zero vector keeps scale 0; a non-finite one stores zeros under a
// NaN scale, so that what reads it sees NaN, as it would have in F32.
float quantize_i8(const float* x, int32_t n, int8_t* q, int32_t stride) {
  float amax = 0.0f;
  bool finite = true;
  for (int32_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float scale = amax / 127.0f;
  const bool usable = finite && scale > 0.0f;
  for (int32_t i = 0; i < n; ++i)
    q[i * stride] = usable ? static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / scale), -127.0f, 127.0f)) : 0;
  return finite ? scale : std::numeric_limits<float>::quiet_NaN();
}

}  // namespace

void paged_kv_write(const paged_kv_layer& kv, const uint32_t* block_table, int32_t position,
                    const float* k, const float* v) {
  const uint32_t block = block_table[position / kv.block_size];
  const int32_t slot = position % kv.block_size;
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const int64_t at = kv.offset(block, h);
    const float* kh = k + h * kv.head_dim;
    const float* vh = v + h * kv.head_dim;
    if (kv.k8) {
      const int64_t so = kv.scale_offset(block, h) + slot;
      kv.k_scale[so] = quantize_i8(kh, kv.head_dim, kv.k8 + at + slot, kv.block_size);
      kv.v_scale[so] = quantize_i8(vh, kv.head_dim, kv.v8 + at + slot * kv.head_dim, 1);
    } else if (kv.k16) {
      for (int32_t d = 0; d < kv.head_dim; ++d) kv.k16[at + d * kv.block_size + slot] = f32_to_f16(kh[d]);
      for (int32_t d = 0; d < kv.head_dim; ++d) kv.v16[at + slot * kv.head_dim + d] = f32_to_f16(vh[d]);
    } else {
      for (int32_t d = 0; d < kv.head_dim; ++d) kv.k[at + d * kv.block_size + slot] = kh[d];
      std::memcpy(kv.v + at + slot * kv.head_dim, vh, sizeof(float) * kv.head_dim);
    }
  }
}

}  // namespace troupe
