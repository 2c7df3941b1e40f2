#include "kernels/cpu/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common/assert.hpp"
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

// Sixteen-slot blocks, NB at a time, for H KV heads side by side (whose parts of a block
// lie next to each other in memory) and G query heads each: NB * H * G independent sums
// (one alone waits on each FMA's latency), each a sequential sum over the head
// dimension, so the scores are those of the one-block loop below. q[h * G + j] is query
// head j of KV head kv_head0 + h.
//
// A decode step's attention reads each running sequence's cache once, in blocks
// scattered over the pool, which the hardware prefetcher finds only after missing on
// them. So while it scores NB blocks the loop asks for the keys of the next NB and the
// values of these (read after the softmax), a line or so per head-dimension step, spread
// out so that the requests never queue up behind each other.
template <class T, int NB, int H, int G>
void scores_heads(const float* const* q, const attention_token& tok, int32_t kv_head0, const paged_kv_layer& kv,
                  int32_t n, float* const* scores) {
  const int32_t hd = kv.head_dim;
  const simd::v16f vnorm = simd::splat(std::sqrt(static_cast<float>(hd)));
  const int32_t blocks = (n + simd::width - 1) / simd::width;
  const int64_t piece = int64_t{simd::width} * hd;  // one KV head's part of a block
  // The H parts' bytes per head-dimension step (keys) or 16-element stretch (values).
  constexpr int64_t step_bytes = int64_t{H} * simd::width * sizeof(T);
  for (int32_t b0 = 0; b0 < blocks; b0 += NB) {
    const int nb = std::min<int32_t>(NB, blocks - b0);
    const char* ahead[2 * NB];
    int n_ahead = 0;
    for (int32_t b = b0 + NB; b < std::min(b0 + 2 * NB, blocks); ++b)
      ahead[n_ahead++] = reinterpret_cast<const char*>(keys(kv, T{}) + kv.offset(tok.block_table[b], kv_head0));
    for (int32_t b = b0; b < b0 + nb; ++b)
      ahead[n_ahead++] = reinterpret_cast<const char*>(values(kv, T{}) + kv.offset(tok.block_table[b], kv_head0));
    if constexpr (scaled<T>) {
      for (int32_t b = b0 + NB; b < std::min(b0 + 2 * NB, blocks); ++b)
        __builtin_prefetch(kv.k_scale + kv.scale_offset(tok.block_table[b], kv_head0));
      for (int32_t b = b0; b < b0 + nb; ++b) __builtin_prefetch(kv.v_scale + kv.scale_offset(tok.block_table[b], kv_head0));
    }
    const T* kb[NB];
    for (int i = 0; i < NB; ++i) kb[i] = keys(kv, T{}) + kv.offset(tok.block_table[b0 + std::min(i, nb - 1)], kv_head0);
    simd::v16f acc[NB][H][G];
    for (int i = 0; i < NB; ++i)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < G; ++j) acc[i][h][j] = simd::zero();
    for (int32_t d = 0; d < hd; ++d) {
      for (int64_t off = (d * step_bytes + 63) / 64 * 64; off < (d + 1) * step_bytes; off += 64)
        for (int i = 0; i < n_ahead; ++i) __builtin_prefetch(ahead[i] + off);
      for (int i = 0; i < NB; ++i)
        for (int h = 0; h < H; ++h) {
          const simd::v16f col = load16(kb[i] + h * piece + d * simd::width);
          for (int j = 0; j < G; ++j) acc[i][h][j] = simd::fma(simd::splat(q[h * G + j][d]), col, acc[i][h][j]);
        }
    }
    for (int i = 0; i < nb; ++i) {
      const int32_t p0 = (b0 + i) * simd::width;
      const int32_t take = std::min(simd::width, n - p0);
      for (int h = 0; h < H; ++h) {
        simd::v16f ks = simd::splat(1.0f);
        if constexpr (scaled<T>) ks = simd::load(kv.k_scale + kv.scale_offset(tok.block_table[b0 + i], kv_head0 + h));
        for (int j = 0; j < G; ++j) {
          alignas(64) float tmp[simd::width];
          if constexpr (scaled<T>)
            simd::store(tmp, acc[i][h][j] * ks / vnorm);
          else
            simd::store(tmp, acc[i][h][j] / vnorm);
          std::memcpy(scores[h * G + j] + p0, tmp, sizeof(float) * take);
        }
      }
    }
  }
}

// out[h * G + j] = sum_p weights[h * G + j][p] * v_p of KV head kv_head0 + h, over
// sixteen-slot blocks in memory order, each sum accumulated over positions in order (the
// order of weighted_values below), C sixteen-element stretches of the head for K query
// heads at a time (K * C independent sums: fewer would wait on FMA latency). The sums
// wait in out between blocks.
template <class T, int H, int G, int C>
void values_heads(const float* const* weights, int32_t n, const attention_token& tok, int32_t kv_head0,
                  const paged_kv_layer& kv, float* const* out) {
  constexpr int HG = H * G;
  constexpr int K = HG < 16 / C ? HG : 16 / C;
  static_assert(HG % K == 0);
  const int32_t hd = kv.head_dim;
  const int64_t piece = int64_t{simd::width} * hd;
  for (int i = 0; i < HG; ++i) std::memset(out[i], 0, sizeof(float) * hd);
  for (int32_t p0 = 0; p0 < n; p0 += simd::width) {
    const uint32_t block = tok.block_table[p0 / simd::width];
    const T* vb = values(kv, T{}) + kv.offset(block, kv_head0);
    const int32_t count = std::min(simd::width, n - p0);
    for (int k0 = 0; k0 < HG; k0 += K) {
      const T* v[K];
      const float* w[K];
      const float* vs[K];
      for (int i = 0; i < K; ++i) {
        const int h = (k0 + i) / G;
        v[i] = vb + h * piece;
        w[i] = weights[k0 + i] + p0;
        vs[i] = scaled<T> ? kv.v_scale + kv.scale_offset(block, kv_head0 + h) : nullptr;
      }
      for (int32_t c0 = 0; c0 < hd; c0 += C * simd::width) {
        simd::v16f acc[K][C];
        for (int i = 0; i < K; ++i)
          for (int c = 0; c < C; ++c) acc[i][c] = simd::load(out[k0 + i] + c0 + c * simd::width);
        for (int32_t s = 0; s < count; ++s)
          for (int i = 0; i < K; ++i) {
            const simd::v16f a = simd::splat(scaled<T> ? w[i][s] * vs[i][s] : w[i][s]);
            for (int c = 0; c < C; ++c)
              acc[i][c] = simd::fma(a, load16(v[i] + s * hd + c0 + c * simd::width), acc[i][c]);
          }
        for (int i = 0; i < K; ++i)
          for (int c = 0; c < C; ++c) simd::store(out[k0 + i] + c0 + c * simd::width, acc[i][c]);
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

// A sliding window: the positions before `first` get no weight (a score of minus
// infinity, which the softmax turns into exactly zero).
inline void mask_before(float* scores, int32_t first) {
  for (int32_t p = 0; p < first; ++p) scores[p] = -INFINITY;
}

// Those too, and a token tree's nodes the token does not descend from.
inline void mask_token(float* scores, const attention_token& tok) {
  mask_before(scores, tok.first);
  if (tok.tree_first < 0) return;
  for (int32_t p = tok.tree_first; p <= tok.position; ++p)
    if (!((tok.tree_mask >> (p - tok.tree_first)) & 1u)) scores[p] = -INFINITY;
}

// The softmax weights of rows that asked for them (wouts[i] set), positions 0..n_i.
inline void keep_weights(float* const* wouts, const float* const* weights, int rows, const int32_t* ns) {
  for (int i = 0; i < rows; ++i)
    if (wouts[i]) std::memcpy(wouts[i], weights[i], sizeof(float) * ns[i]);
}

template <class T>
void attend_group(const float* const* q, float* const* out, float* const* wouts, int group, const attention_token& tok,
                  int32_t kv_head, const paged_kv_layer& kv, std::vector<float>& scratch) {
  const int32_t n = tok.position + 1;
  const int32_t bs = kv.block_size;
  const int32_t padded = (n + bs - 1) / bs * bs + simd::width;
  if (static_cast<int32_t>(scratch.size()) < group * padded) scratch.resize(group * padded);
  float* scores[max_group] = {};
  for (int h = 0; h < group; ++h) scores[h] = scratch.data() + h * padded;
  scores_for<T>(q, group, tok, kv_head, kv, n, scores);
  for (int h = 0; h < group; ++h) {
    mask_token(scores[h], tok);
    softmax(scores[h], n);
    if (wouts[h]) std::memcpy(wouts[h], scores[h], sizeof(float) * n);
    weighted_values<T>(scores[h], n, tok, kv_head, kv, out[h]);
  }
}

template <class T, int H, int G>
void attend_heads(const float* const* q, float* const* out, float* const* wouts, const attention_token& tok,
                  int32_t kv_head0, const paged_kv_layer& kv, std::vector<float>& scratch) {
  const int32_t n = tok.position + 1;
  const int32_t padded = (n + simd::width - 1) / simd::width * simd::width + simd::width;
  if (static_cast<int32_t>(scratch.size()) < H * G * padded) scratch.resize(H * G * padded);
  float* scores[H * G];
  for (int i = 0; i < H * G; ++i) scores[i] = scratch.data() + i * padded;
  // Eight sums or more at a time: with fewer, the loop waits on FMA latency, and with
  // more blocks at a time it also asks for more of the cache ahead.
  scores_heads<T, (H * G >= 8 ? 1 : 8 / (H * G)), H, G>(q, tok, kv_head0, kv, n, scores);
  for (int i = 0; i < H * G; ++i) {
    mask_token(scores[i], tok);
    softmax(scores[i], n);
    if (wouts[i]) std::memcpy(wouts[i], scores[i], sizeof(float) * n);
  }
  const int32_t stretches = kv.head_dim / simd::width;
  if (stretches % 4 == 0)
    values_heads<T, H, G, 4>(scores, n, tok, kv_head0, kv, out);
  else if (stretches % 2 == 0)
    values_heads<T, H, G, 2>(scores, n, tok, kv_head0, kv, out);
  else
    values_heads<T, H, G, 1>(scores, n, tok, kv_head0, kv, out);
}

// A run of R consecutive tokens of one sequence (a prefill chunk's), G query heads each,
// against one KV head: R * G rows, row r * G + j being query head j of token r. Each
// block of the cache is read (and widened) once for every row, where one token at a time
// reads it once per token; each row's result is the same bits as attend_heads gives that
// token alone (the same sums in the same order: scores over the head dimension, values
// over its own positions).
//
// out[row] = sum_p weights[row][p] * v_p over p < ns[row], positions in order, C
// sixteen-element stretches of the head at a time, each value stretch loaded once for
// every row that reaches it.
template <class T, int Rows, int C>
void values_rows(const float* const* weights, const int32_t* ns, const attention_token& tok, int32_t kv_head,
                 const paged_kv_layer& kv, float* const* out) {
  const int32_t hd = kv.head_dim;
  int32_t n = 0;
  for (int i = 0; i < Rows; ++i) n = std::max(n, ns[i]);
  for (int i = 0; i < Rows; ++i) std::memset(out[i], 0, sizeof(float) * hd);
  for (int32_t p0 = 0; p0 < n; p0 += simd::width) {
    const uint32_t block = tok.block_table[p0 / simd::width];
    const T* vb = values(kv, T{}) + kv.offset(block, kv_head);
    const float* vs = scaled<T> ? kv.v_scale + kv.scale_offset(block, kv_head) : nullptr;
    int32_t count[Rows], most = 0;
    for (int i = 0; i < Rows; ++i) {
      count[i] = std::clamp(ns[i] - p0, 0, simd::width);
      most = std::max(most, count[i]);
    }
    const bool full = count[0] == simd::width;  // (rows see more positions as i grows)
    for (int32_t c0 = 0; c0 < hd; c0 += C * simd::width) {
      simd::v16f acc[Rows][C];
      for (int i = 0; i < Rows; ++i)
        for (int c = 0; c < C; ++c) acc[i][c] = simd::load(out[i] + c0 + c * simd::width);
      for (int32_t s = 0; s < most; ++s) {
        simd::v16f v[C];
        for (int c = 0; c < C; ++c) v[c] = load16(vb + s * hd + c0 + c * simd::width);
        for (int i = 0; i < Rows; ++i) {
          if (!full && s >= count[i]) continue;
          const simd::v16f a = simd::splat(scaled<T> ? weights[i][p0 + s] * vs[s] : weights[i][p0 + s]);
          for (int c = 0; c < C; ++c) acc[i][c] = simd::fma(a, v[c], acc[i][c]);
        }
      }
      for (int i = 0; i < Rows; ++i)
        for (int c = 0; c < C; ++c) simd::store(out[i] + c0 + c * simd::width, acc[i][c]);
    }
  }
}

template <class T, int G, int R>
void attend_run(const float* const* q, float* const* out, float* const* wouts, const attention_token* toks,
                int32_t kv_head, const paged_kv_layer& kv, std::vector<float>& scratch) {
  constexpr int Rows = R * G;
  const int32_t n = toks[R - 1].position + 1;  // the last token sees the most
  const int32_t padded = (n + simd::width - 1) / simd::width * simd::width + simd::width;
  if (static_cast<int32_t>(scratch.size()) < Rows * padded) scratch.resize(Rows * padded);
  float* scores[Rows];
  int32_t ns[Rows];
  for (int i = 0; i < Rows; ++i) {
    scores[i] = scratch.data() + i * padded;
    ns[i] = toks[i / G].position + 1;
  }
  // Every row scored over the last token's positions (the extra ones are not used).
  scores_heads<T, (Rows >= 8 ? 2 : 16 / Rows), 1, Rows>(q, toks[R - 1], kv_head, kv, n, scores);
  for (int i = 0; i < Rows; ++i) {
    mask_token(scores[i], toks[i / G]);
    softmax(scores[i], ns[i]);
  }
  keep_weights(wouts, scores, Rows, ns);
  constexpr int C = Rows >= 8 ? 2 : 4;
  if ((kv.head_dim / simd::width) % C == 0)
    values_rows<T, Rows, C>(scores, ns, toks[R - 1], kv_head, kv, out);
  else
    values_rows<T, Rows, 1>(scores, ns, toks[R - 1], kv_head, kv, out);
}

// One item: the sixteen-slot kernels where `blocked`, the general loops otherwise.
template <class T>
void attend(bool blocked, int kv_heads_per_item, int group, const float* const* q, float* const* out,
            float* const* wouts, const attention_token& tok, int32_t kv_head0, const paged_kv_layer& kv,
            std::vector<float>& scratch) {
  switch (blocked ? kv_heads_per_item * 16 + group : 0) {
    case 4 * 16 + 1: return attend_heads<T, 4, 1>(q, out, wouts, tok, kv_head0, kv, scratch);
    case 2 * 16 + 1: return attend_heads<T, 2, 1>(q, out, wouts, tok, kv_head0, kv, scratch);
    case 1 * 16 + 1: return attend_heads<T, 1, 1>(q, out, wouts, tok, kv_head0, kv, scratch);
    case 2 * 16 + 2: return attend_heads<T, 2, 2>(q, out, wouts, tok, kv_head0, kv, scratch);
    case 1 * 16 + 2: return attend_heads<T, 1, 2>(q, out, wouts, tok, kv_head0, kv, scratch);
    case 1 * 16 + 4: return attend_heads<T, 1, 4>(q, out, wouts, tok, kv_head0, kv, scratch);
    case 1 * 16 + 8: return attend_heads<T, 1, 8>(q, out, wouts, tok, kv_head0, kv, scratch);
    default: return attend_group<T>(q, out, wouts, group, tok, kv_head0, kv, scratch);
  }
}

// A run of `len` tokens (2 to 8 / group) for one KV head.
template <class T>
void attend_run_of(int group, int len, const float* const* q, float* const* out, float* const* wouts,
                   const attention_token* toks, int32_t kv_head, const paged_kv_layer& kv, std::vector<float>& scratch) {
  switch (group * 16 + len) {
#define TROUPE_RUN(G, R) \
  case (G) * 16 + (R): return attend_run<T, G, R>(q, out, wouts, toks, kv_head, kv, scratch);
    TROUPE_RUN(1, 2) TROUPE_RUN(1, 3) TROUPE_RUN(1, 4) TROUPE_RUN(1, 5) TROUPE_RUN(1, 6) TROUPE_RUN(1, 7)
    TROUPE_RUN(1, 8) TROUPE_RUN(2, 2) TROUPE_RUN(2, 3) TROUPE_RUN(2, 4) TROUPE_RUN(4, 2)
#undef TROUPE_RUN
    default: TROUPE_ASSERT(false, group, len);
  }
}

// How a step's work is cut into items: query heads of one KV head in passes of `group`
// (at most max_group), and, where the sixteen-slot kernels apply, `kv_heads` KV heads
// side by side (up to four query heads in all), so that an item reads their neighbouring
// parts of each block in one run; fewer where that would leave too few items to keep
// every thread busy.
struct item_shape {
  bool blocked = false;
  int kv_heads = 1, group = 1, passes = 1;
};

item_shape shape_for(const paged_kv_layer& kv, int32_t group, int32_t num_tokens, int threads) {
  item_shape s;
  s.blocked = kv.block_size == simd::width && kv.head_dim % simd::width == 0 &&
              (group == 1 || group == 2 || group == 4 || group % max_group == 0);
  s.group = std::min(group, max_group);
  s.passes = (group + max_group - 1) / max_group;
  if (s.blocked)
    for (int h = std::max(1, 4 / s.group); h > 1; h /= 2)
      if (kv.num_kv_heads % h == 0 && int64_t{num_tokens} * (kv.num_kv_heads / h) * s.passes >= 4 * threads) {
        s.kv_heads = h;
        break;
      }
  return s;
}

}  // namespace

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride,
                     const attention_token* tokens, int32_t num_tokens, int32_t num_heads,
                     const paged_kv_layer& kv, thread_pool& pool) {
  const int32_t group = num_heads / kv.num_kv_heads;
  const item_shape shape = shape_for(kv, group, num_tokens, pool.num_threads());
  const int32_t chunks = kv.num_kv_heads / shape.kv_heads;
  // Items: a lone token's query heads of `shape.kv_heads` KV heads (one pass of at most
  // max_group per KV head), or a run of a prefill chunk's consecutive tokens (up to eight
  // query heads in all) for one KV head, which reads each block of the cache once for all
  // of them.
  struct item {
    int32_t t, len, kv_head0, pass;
  };
  const int run_max = shape.blocked && (group == 1 || group == 2 || group == 4) ? 8 / group : 1;
  thread_local std::vector<item> items;
  items.clear();
  for (int32_t t = 0; t < num_tokens;) {
    int32_t len = 1;
    while (len < run_max && t + len < num_tokens && tokens[t + len].block_table == tokens[t].block_table &&
           tokens[t + len].position == tokens[t].position + len)
      ++len;
    if (len > 1) {
      for (int32_t h = 0; h < kv.num_kv_heads; ++h) items.push_back({t, len, h, 0});
    } else {
      for (int32_t c = 0; c < chunks; ++c)
        for (int32_t pass = 0; pass < shape.passes; ++pass) items.push_back({t, 1, c * shape.kv_heads, pass});
    }
    t += len;
  }
  // Items differ in cost (a prefill chunk's tokens see more positions than a new
  // sequence's), so threads take them as they become free.
  pool.parallel_for_dynamic(static_cast<int64_t>(items.size()), [&, its = items.data()](int64_t at, int) {
    thread_local std::vector<float> scratch;
    const item& it = its[at];
    // Rows in the kernels' order: token r of the item, then KV head h, then query head j
    // of this pass (a run: one KV head, every query head; a lone token: one pass).
    const int32_t heads = it.len > 1 ? 1 : shape.kv_heads;
    const int count = it.len > 1 ? group : std::min(shape.group, group - it.pass * shape.group);
    const float* qs[4 * max_group];
    float* outs[4 * max_group];
    float* wouts[4 * max_group];
    for (int32_t r = 0; r < it.len; ++r)
      for (int32_t h = 0; h < heads; ++h)
        for (int32_t j = 0; j < count; ++j) {
          const int32_t head = (it.kv_head0 + h) * group + it.pass * shape.group + j;
          qs[(r * heads + h) * count + j] = q + (it.t + r) * q_stride + head * kv.head_dim;
          outs[(r * heads + h) * count + j] = out + (it.t + r) * out_stride + head * kv.head_dim;
          const attention_token& tok = tokens[it.t + r];
          wouts[(r * heads + h) * count + j] = tok.weights ? tok.weights + int64_t{head} * tok.weights_stride : nullptr;
        }
    const auto run = [&](auto element) {
      using T = decltype(element);
      if (it.len > 1)
        attend_run_of<T>(group, it.len, qs, outs, wouts, tokens + it.t, it.kv_head0, kv, scratch);
      else
        attend<T>(shape.blocked, shape.kv_heads, count, qs, outs, wouts, tokens[it.t], it.kv_head0, kv, scratch);
    };
    if (kv.k8)
      run(int8_t{});
    else if (kv.k16)
      run(uint16_t{});
    else
      run(float{});
  });
}

namespace {

typedef int8_t v16c __attribute__((vector_size(16)));

// x[0..n) to int8 at q[0], q[stride], ...: scale = max |x| / 127, q = x / scale rounded to
// nearest even. An all-zero vector keeps scale 0; a non-finite one stores zeros under a
// NaN scale, so that what reads it sees NaN, as it would have in F32.
float quantize_i8(const float* x, int32_t n, int8_t* q, int32_t stride) {
  // Sixteen at a time where n allows: the same maximum, the same correctly rounded
  // quotients, and the same clamp (before rounding, which gives the same integers),
  // rounded to nearest even by adding and taking away 1.5 * 2^23.
  if (n % simd::width == 0) {
    simd::v16f m = simd::zero();
    simd::v16i special{};  // lanes whose exponent is all ones: NaN or infinity
    const simd::v16i exponent = simd::v16i{} + 0x7F800000;
    for (int32_t i = 0; i < n; i += simd::width) {
      simd::v16i bits;
      std::memcpy(&bits, x + i, sizeof bits);
      special |= (bits & exponent) == exponent;
      simd::v16f a;
      const simd::v16i abs_bits = bits & 0x7FFFFFFF;
      std::memcpy(&a, &abs_bits, sizeof a);
      m = a > m ? a : m;
    }
    bool finite = true;
    for (int i = 0; i < simd::width; ++i) finite = finite && special[i] == 0;
    const float scale = simd::reduce_max(m) / 127.0f;
    const bool usable = finite && scale > 0.0f;
    const simd::v16f sv = simd::splat(scale), hi = simd::splat(127.0f), lo = simd::splat(-127.0f),
                     magic = simd::splat(12582912.0f);
    for (int32_t i = 0; i < n; i += simd::width) {
      v16c qv{};
      if (usable) {
        simd::v16f v = simd::load(x + i) / sv;
        v = v > hi ? hi : v;
        v = v < lo ? lo : v;
        qv = __builtin_convertvector(__builtin_convertvector((v + magic) - magic, simd::v16i), v16c);
      }
      for (int j = 0; j < simd::width; ++j) q[(i + j) * stride] = qv[j];
    }
    return finite ? scale : std::numeric_limits<float>::quiet_NaN();
  }
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
      int32_t d = 0;
      for (; d + simd::width <= kv.head_dim; d += simd::width) {
        uint16_t kr[simd::width];
        simd::store_f16(kr, simd::load(kh + d));
        for (int i = 0; i < simd::width; ++i) kv.k16[at + (d + i) * kv.block_size + slot] = kr[i];
        simd::store_f16(kv.v16 + at + slot * kv.head_dim + d, simd::load(vh + d));
      }
      for (; d < kv.head_dim; ++d) {
        kv.k16[at + d * kv.block_size + slot] = f32_to_f16(kh[d]);
        kv.v16[at + slot * kv.head_dim + d] = f32_to_f16(vh[d]);
      }
    } else {
      for (int32_t d = 0; d < kv.head_dim; ++d) kv.k[at + d * kv.block_size + slot] = kh[d];
      std::memcpy(kv.v + at + slot * kv.head_dim, vh, sizeof(float) * kv.head_dim);
    }
  }
}

void paged_kv_read(const paged_kv_layer& kv, const uint32_t* block_table, int32_t position, float* k, float* v) {
  const uint32_t block = block_table[position / kv.block_size];
  const int32_t slot = position % kv.block_size;
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const int64_t at = kv.offset(block, h);
    float* kh = k + h * kv.head_dim;
    float* vh = v + h * kv.head_dim;
    const float ks = kv.k8 ? kv.k_scale[kv.scale_offset(block, h) + slot] : 1.0f;
    const float vs = kv.k8 ? kv.v_scale[kv.scale_offset(block, h) + slot] : 1.0f;
    for (int32_t d = 0; d < kv.head_dim; ++d) {
      const int64_t kat = at + d * kv.block_size + slot, vat = at + slot * kv.head_dim + d;
      if (kv.k8) {
        kh[d] = static_cast<float>(kv.k8[kat]) * ks;
        vh[d] = static_cast<float>(kv.v8[vat]) * vs;
      } else if (kv.k16) {
        kh[d] = f16_to_f32(kv.k16[kat]);
        vh[d] = f16_to_f32(kv.v16[vat]);
      } else {
        kh[d] = kv.k[kat];
        vh[d] = kv.v[vat];
      }
    }
  }
}

void paged_kv_copy(const paged_kv_layer& kv, const uint32_t* from_table, int32_t from, const uint32_t* to_table,
                   int32_t to) {
  const uint32_t fb = from_table[from / kv.block_size], tb = to_table[to / kv.block_size];
  const int32_t fs = from % kv.block_size, ts = to % kv.block_size;
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const int64_t fa = kv.offset(fb, h), ta = kv.offset(tb, h);
    auto move = [&](auto* k, auto* v) {
      for (int32_t d = 0; d < kv.head_dim; ++d) k[ta + d * kv.block_size + ts] = k[fa + d * kv.block_size + fs];
      std::memmove(v + ta + ts * kv.head_dim, v + fa + fs * kv.head_dim, sizeof(*v) * kv.head_dim);
    };
    if (kv.k8) {
      move(kv.k8, kv.v8);
      kv.k_scale[kv.scale_offset(tb, h) + ts] = kv.k_scale[kv.scale_offset(fb, h) + fs];
      kv.v_scale[kv.scale_offset(tb, h) + ts] = kv.v_scale[kv.scale_offset(fb, h) + fs];
    } else if (kv.k16) {
      move(kv.k16, kv.v16);
    } else {
      move(kv.k, kv.v);
    }
  }
}

}  // namespace troupe
