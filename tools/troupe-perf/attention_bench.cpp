#include "tools/troupe-perf/attention_bench.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <vector>

#include "engine/forward/kv_cache.hpp"
#include "kernels/cpu/paged_attention.hpp"

namespace troupe::tools {

attention_rate measure_attention(const attention_shape& s, thread_pool& pool, int runs) {
  constexpr int32_t block = 16;
  const int32_t per_seq = (s.context + block - 1) / block;
  kv_cache_shape shape;
  shape.num_layers = s.layers;
  shape.num_blocks = s.sequences * per_seq;
  shape.num_kv_heads = s.kv_heads;
  shape.block_size = block;
  shape.head_dim = s.head_dim;
  shape.type = s.cache;
  kv_cache cache(shape);

  // Each layer's blocks handed out in a shuffled order; every position written.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<uint32_t>> tables(static_cast<size_t>(s.layers));
  std::vector<float> k(static_cast<size_t>(s.kv_heads) * s.head_dim), v(k.size());
  for (int32_t l = 0; l < s.layers; ++l) {
    auto& t = tables[static_cast<size_t>(l)];
    t.resize(static_cast<size_t>(shape.num_blocks));
    std::iota(t.begin(), t.end(), 0u);
    std::shuffle(t.begin(), t.end(), rng);
    const paged_kv_layer kv = cache.layer(l);
    for (int32_t q = 0; q < s.sequences; ++q)
      for (int32_t p = 0; p < s.context; ++p) {
        for (float& x : k) x = u(rng);
        for (float& x : v) x = u(rng);
        paged_kv_write(kv, t.data() + int64_t{q} * per_seq, p, k.data(), v.data());
      }
  }
  const int64_t q_width = int64_t{s.heads} * s.head_dim;
  std::vector<float> q(static_cast<size_t>(s.sequences * q_width)), out(q.size());
  for (float& x : q) x = u(rng);

  std::vector<double> ms;
  std::vector<attention_token> tokens(static_cast<size_t>(s.sequences));
  for (int r = 0; r < runs + 1; ++r) {  // the first warms up
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t l = 0; l < s.layers; ++l) {
      for (int32_t i = 0; i < s.sequences; ++i)
        tokens[static_cast<size_t>(i)] = {s.context - 1, tables[static_cast<size_t>(l)].data() + int64_t{i} * per_seq};
      paged_attention(q.data(), q_width, out.data(), q_width, tokens.data(), s.sequences, s.heads, cache.layer(l), pool);
    }
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const double step_ms = ms[ms.size() / 2];
  // What one step reads: each sequence's K and V over its context, in every layer.
  const double per_value = s.cache == dtype::f32 ? 4.0 : s.cache == dtype::f16 ? 2.0 : 1.0 + 4.0 / s.head_dim;
  const double bytes = 2.0 * s.sequences * s.context * s.layers * s.kv_heads * s.head_dim * per_value;
  return {step_ms, bytes / (step_ms * 1e-3) / 1e9, bytes / 1e6};
}

}  // namespace troupe::tools
