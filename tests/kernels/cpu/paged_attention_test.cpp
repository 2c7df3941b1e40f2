#include "kernels/cpu/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <vector>

#include <doctest/doctest.h>

#include "engine/sample/rng.hpp"
#include "kernels/common/dtype.hpp"
#include "tests/support/random_data.hpp"
#include "tests/support/tolerance.hpp"

namespace troupe {

namespace {

// Dense causal GQA attention in double precision: out[t][h][i] for queries at `positions`
// over keys and vals laid out [position][kv_head][head_dim].
std::vector<double> dense_attention(const std::vector<float>& q, const std::vector<float>& keys,
                                    const std::vector<float>& vals, const std::vector<int32_t>& positions,
                                    int32_t heads, int32_t kv_heads, int32_t head_dim) {
  std::vector<double> out(positions.size() * heads * head_dim);
  for (size_t t = 0; t < positions.size(); ++t)
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t kh = h / (heads / kv_heads);
      const float* qh = q.data() + (t * heads + h) * head_dim;
      std::vector<double> s(positions[t] + 1);
      double mx = -1e300;
      for (int32_t p = 0; p <= positions[t]; ++p) {
        double d = 0;
        for (int32_t i = 0; i < head_dim; ++i) d += double(qh[i]) * keys[(size_t(p) * kv_heads + kh) * head_dim + i];
        s[p] = d / std::sqrt(double(head_dim));
        mx = std::max(mx, s[p]);
      }
      double z = 0;
      for (double& e : s) z += (e = std::exp(e - mx));
      for (int32_t i = 0; i < head_dim; ++i) {
        double o = 0;
        for (int32_t p = 0; p <= positions[t]; ++p) o += s[p] / z * vals[(size_t(p) * kv_heads + kh) * head_dim + i];
        out[(t * heads + h) * head_dim + i] = o;
      }
    }
  return out;
}

// Block ids 0..blocks-1 in an order scrambled by `seed`: the table, not the layout, decides.
std::vector<uint32_t> shuffled_table(int32_t blocks, uint64_t seed) {
  std::vector<uint32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0u);
  rng r(seed);
  for (size_t i = table.size() - 1; i > 0; --i) std::swap(table[i], table[r.next() % (i + 1)]);
  return table;
}

enum class cache_type { f32, f16, i8 };

// One layer's cache of the given type, owning its storage (zeroed; scales NaN).
struct test_cache {
  std::vector<float> k, v, k_scale, v_scale;
  std::vector<uint16_t> k16, v16;
  std::vector<int8_t> k8, v8;
  paged_kv_layer layer;

  test_cache(cache_type type, int32_t blocks, int32_t kv_heads, int32_t block, int32_t head_dim)
      : layer{nullptr, nullptr, blocks, kv_heads, block, head_dim} {
    const size_t n = size_t(blocks) * kv_heads * block * head_dim;
    if (type == cache_type::f32) {
      k.assign(n, 0.0f);
      v.assign(n, 0.0f);
      layer.k = k.data();
      layer.v = v.data();
    } else if (type == cache_type::f16) {
      k16.assign(n, 0);
      v16.assign(n, 0);
      layer.k16 = k16.data();
      layer.v16 = v16.data();
    } else {
      k8.assign(n, 0);
      v8.assign(n, 0);
      k_scale.assign(n / head_dim, NAN);
      v_scale.assign(n / head_dim, NAN);
      layer.k8 = k8.data();
      layer.v8 = v8.data();
      layer.k_scale = k_scale.data();
      layer.v_scale = v_scale.data();
    }
  }
};

// A cache of 16-slot blocks holding `len` positions of random keys and values, written
// through `table`.
struct written_cache {
  int32_t kv_heads, head_dim;
  test_cache cache;
  std::vector<float> keys, vals;

  written_cache(cache_type type, int32_t blocks, int32_t kv_heads_, int32_t head_dim_, int32_t len,
                const std::vector<uint32_t>& table, uint64_t seed)
      : kv_heads(kv_heads_), head_dim(head_dim_), cache(type, blocks, kv_heads_, 16, head_dim_),
        keys(test::random_floats(size_t(len) * kv_heads_ * head_dim_, seed)),
        vals(test::random_floats(keys.size(), seed + 1)) {
    const size_t stride = size_t(kv_heads) * head_dim;
    for (int32_t p = 0; p < len; ++p)
      paged_kv_write(cache.layer, table.data(), p, keys.data() + p * stride, vals.data() + p * stride);
  }
};

// The batch's attention, and for each token in `check` that token's alone, the same bits;
// over an F32 cache, the rows of the tokens that read `written` (the table the cache was
// written through) within 1e-5 of dense attention.
void check_alone_as_in_batch(const written_cache& c, cache_type type, const std::vector<attention_token>& toks,
                             const std::vector<int32_t>& check, int32_t heads, const uint32_t* written,
                             uint64_t q_seed) {
  const auto batch = static_cast<int32_t>(toks.size());
  const int32_t row = heads * c.head_dim;
  const auto q = test::random_floats(size_t(batch) * row, q_seed);
  thread_pool pool(2);
  std::vector<float> together(q.size(), NAN);
  paged_attention(q.data(), row, together.data(), row, toks.data(), batch, heads, c.cache.layer, pool);
  for (int32_t t : check) {
    CAPTURE(t);
    std::vector<float> alone(row, NAN);
    paged_attention(q.data() + t * row, row, alone.data(), row, &toks[t], 1, heads, c.cache.layer, pool);
    CHECK(test::same_finite_bits(alone, std::span(together).subspan(size_t(t) * row, row)));
  }
  if (type != cache_type::f32) return;
  std::vector<int32_t> rows, positions;
  std::vector<float> qs;
  for (int32_t t = 0; t < batch; ++t)
    if (toks[t].block_table == written) {
      rows.push_back(t);
      positions.push_back(toks[t].position);
      qs.insert(qs.end(), q.begin() + t * row, q.begin() + (t + 1) * row);
    }
  const auto want = dense_attention(qs, c.keys, c.vals, positions, heads, c.kv_heads, c.head_dim);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int32_t i = 0; i < row; ++i)
      CHECK(together[rows[r] * row + i] == doctest::Approx(want[r * row + i]).epsilon(1e-5).scale(1.0));
}

}  // namespace

TEST_CASE("paged attention over shuffled blocks equals dense causal GQA attention") {
  struct shape {
    int32_t block, heads, kv_heads;
  };
  // Small blocks; then 16-slot blocks with 1, 2, 3 and 4 query heads per KV head (the
  // sixteen-slot kernels for 1, 2 and 4 and a head size of 16).
  for (shape sh : {shape{4, 6, 2}, shape{16, 4, 4}, shape{16, 8, 4}, shape{16, 6, 2}, shape{16, 8, 2}})
  for (int32_t head_dim : {8, 16, 20}) {
    CAPTURE(head_dim);
    CAPTURE(sh.block);
    CAPTURE(sh.heads);
    const int32_t heads = sh.heads, kv_heads = sh.kv_heads, block = sh.block, blocks = 16, len = sh.block == 4 ? 23 : 71;
    std::vector<float> k(size_t(blocks) * kv_heads * block * head_dim, NAN), v(k.size(), NAN);
    paged_kv_layer kv{k.data(), v.data(), blocks, kv_heads, block, head_dim};
    const std::vector<uint32_t> table = shuffled_table(blocks, 3);
    const auto keys = test::random_floats(size_t(len) * kv_heads * head_dim, 1);
    const auto vals = test::random_floats(keys.size(), 2);
    for (int32_t p = 0; p < len; ++p)
      paged_kv_write(kv, table.data(), p, keys.data() + size_t(p) * kv_heads * head_dim,
                     vals.data() + size_t(p) * kv_heads * head_dim);
    // Queries at three positions, as a step might hold them.
    const std::vector<int32_t> positions{0, 11, len - 1};
    const auto q = test::random_floats(positions.size() * heads * head_dim, 4);
    std::vector<attention_token> toks;
    for (int32_t p : positions) toks.push_back({p, table.data()});
    std::vector<float> out(q.size(), NAN);
    thread_pool pool(2);
    paged_attention(q.data(), heads * head_dim, out.data(), heads * head_dim, toks.data(),
                    static_cast<int32_t>(toks.size()), heads, kv, pool);
    const auto want = dense_attention(q, keys, vals, positions, heads, kv_heads, head_dim);
    for (size_t j = 0; j < want.size(); ++j) CHECK(out[j] == doctest::Approx(want[j]).epsilon(1e-5).scale(1.0));
  }
}

}  // namespace troupe

namespace troupe {

TEST_CASE("an F16 cache gives exactly what an F32 cache holding the same rounded values gives") {
  for (int32_t head_dim : {16, 20, 64}) {  // the vector paths and the scalar one
    CAPTURE(head_dim);
    const int32_t heads = 4, kv_heads = 2, block = 16, blocks = 4, len = 37;
    const size_t n = size_t(blocks) * kv_heads * block * head_dim;
    std::vector<float> k(n, 0.0f), v(n, 0.0f);
    std::vector<uint16_t> k16(n, 0), v16(n, 0);
    paged_kv_layer f32{k.data(), v.data(), blocks, kv_heads, block, head_dim};
    paged_kv_layer f16{nullptr, nullptr, blocks, kv_heads, block, head_dim, k16.data(), v16.data()};
    const std::vector<uint32_t> table{2, 0, 3, 1};
    auto keys = test::random_floats(size_t(len) * kv_heads * head_dim, 5);
    auto vals = test::random_floats(keys.size(), 6);
    for (int32_t p = 0; p < len; ++p) {
      const size_t at = size_t(p) * kv_heads * head_dim;
      paged_kv_write(f16, table.data(), p, keys.data() + at, vals.data() + at);
    }
    // The F32 cache gets the values rounded to F16, as the F16 cache stored them.
    for (auto* x : {&keys, &vals})
      for (float& f : *x) f = f16_to_f32(f32_to_f16(f));
    for (int32_t p = 0; p < len; ++p) {
      const size_t at = size_t(p) * kv_heads * head_dim;
      paged_kv_write(f32, table.data(), p, keys.data() + at, vals.data() + at);
    }
    const std::vector<int32_t> positions{0, 15, 16, len - 1};
    const auto q = test::random_floats(positions.size() * heads * head_dim, 7);
    std::vector<attention_token> toks;
    for (int32_t p : positions) toks.push_back({p, table.data()});
    std::vector<float> a(q.size(), NAN), b(q.size(), NAN);
    thread_pool pool(2);
    paged_attention(q.data(), heads * head_dim, a.data(), heads * head_dim, toks.data(), 4, heads, f32, pool);
    paged_attention(q.data(), heads * head_dim, b.data(), heads * head_dim, toks.data(), 4, heads, f16, pool);
    CHECK(test::same_finite_bits(a, b));
  }
}

TEST_CASE("an int8 cache stores each row as max |x| / 127 times rounded integers, and attends over them") {
  // 16-slot blocks take the sixteen-slot kernels (1, 2 and 4 query heads per KV head, and
  // 3 through the one-block loop); 4- and 32-slot blocks the general ones; head_dim 20
  // the scalar weighted sum.
  struct shape {
    int32_t block, heads, kv_heads, head_dim;
  };
  for (shape sh : {shape{16, 4, 4, 64}, shape{16, 8, 4, 16}, shape{16, 8, 2, 32}, shape{16, 6, 2, 16},
                   shape{4, 6, 2, 16}, shape{32, 4, 2, 20}}) {
    CAPTURE(sh.block);
    CAPTURE(sh.heads);
    CAPTURE(sh.head_dim);
    const int32_t heads = sh.heads, kv_heads = sh.kv_heads, block = sh.block, hd = sh.head_dim, blocks = 8;
    const int32_t len = std::min(71, blocks * block);
    test_cache cache(cache_type::i8, blocks, kv_heads, block, hd);
    const paged_kv_layer& i8 = cache.layer;
    const auto &k8 = cache.k8, &v8 = cache.v8;
    const auto &ks = cache.k_scale, &vs = cache.v_scale;
    std::vector<uint32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0u);
    std::reverse(table.begin(), table.end());
    const auto keys = test::random_floats(size_t(len) * kv_heads * hd, 11);
    const auto vals = test::random_floats(keys.size(), 12);
    for (int32_t p = 0; p < len; ++p)
      paged_kv_write(i8, table.data(), p, keys.data() + size_t(p) * kv_heads * hd, vals.data() + size_t(p) * kv_heads * hd);
    // What was stored: per position and KV head, the scale and the rounded quotients.
    std::vector<float> kq(keys.size()), vq(vals.size());  // dequantized
    for (int32_t p = 0; p < len; ++p)
      for (int32_t h = 0; h < kv_heads; ++h) {
        const uint32_t b = table[p / block];
        const int32_t slot = p % block;
        for (auto [src, q8, scales, deq, transposed] :
             {std::tuple{&keys, &k8, &ks, &kq, true}, std::tuple{&vals, &v8, &vs, &vq, false}}) {
          const float* x = src->data() + (size_t(p) * kv_heads + h) * hd;
          float amax = 0.0f;
          for (int32_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
          const float scale = (*scales)[i8.scale_offset(b, h) + slot];
          REQUIRE(scale == amax / 127.0f);
          for (int32_t d = 0; d < hd; ++d) {
            const int8_t q = (*q8)[i8.offset(b, h) + (transposed ? d * block + slot : slot * hd + d)];
            CHECK(q == static_cast<int8_t>(std::nearbyint(x[d] / scale)));
            (*deq)[(size_t(p) * kv_heads + h) * hd + d] = q * scale;
          }
        }
      }
    // Attention over the stored values equals dense attention over the dequantized ones
    // (the scale is applied after the sum, so up to rounding).
    const std::vector<int32_t> positions{0, 15, 16, len - 1};
    const auto q = test::random_floats(positions.size() * heads * hd, 13);
    std::vector<attention_token> toks;
    for (int32_t p : positions) toks.push_back({p, table.data()});
    std::vector<float> out(q.size(), NAN);
    thread_pool pool(2);
    paged_attention(q.data(), heads * hd, out.data(), heads * hd, toks.data(), static_cast<int32_t>(toks.size()),
                    heads, i8, pool);
    const auto want = dense_attention(q, kq, vq, positions, heads, kv_heads, hd);
    for (size_t j = 0; j < want.size(); ++j) CHECK(out[j] == doctest::Approx(want[j]).epsilon(1e-5).scale(1.0));
  }
}

TEST_CASE("a token's attention is the same bits alone and in a batch, however heads are grouped into items") {
  // Alone, a token's heads are items of their own; in a batch of 24 tokens two or four
  // KV heads share an item (1, 2, 4, 8 and 3 query heads per KV head, and 16 in two
  // passes of 8; 2, 3, 4 and 6 KV heads), in each of the cache's types.
  struct shape {
    int32_t heads, kv_heads, head_dim;
  };
  for (shape sh : {shape{4, 4, 64}, shape{6, 6, 32}, shape{3, 3, 16}, shape{8, 4, 64}, shape{8, 2, 128},
                   shape{16, 2, 16}, shape{32, 2, 16}, shape{6, 2, 48}})
    for (cache_type type : {cache_type::f32, cache_type::f16, cache_type::i8}) {
      CAPTURE(sh.heads);
      CAPTURE(sh.kv_heads);
      CAPTURE(sh.head_dim);
      CAPTURE(static_cast<int>(type));
      const int32_t len = 100;
      const std::vector<uint32_t> table = shuffled_table(8, 5);
      const written_cache c(type, 8, sh.kv_heads, sh.head_dim, len, table, 21);
      std::vector<attention_token> toks;
      for (int32_t t = 0; t < 24; ++t) toks.push_back({(t * 37 + 5) % len, table.data()});
      check_alone_as_in_batch(c, type, toks, {0, 7, 23}, sh.heads, table.data(), 23);
    }
}

TEST_CASE("a prefill chunk's tokens, read a block at a time for several of them, are the same bits as each alone") {
  // Consecutive positions of one sequence form runs (up to eight query heads in all), one
  // KV head an item; the chunk starts inside a block and ends inside another, and a lone
  // token of another sequence sits between two runs of this one. 1, 2 and 4 query heads
  // per KV head take runs; 3 and 8 do not (each token alone).
  struct shape {
    int32_t heads, kv_heads, head_dim;
  };
  for (shape sh : {shape{4, 4, 64}, shape{6, 3, 32}, shape{8, 2, 16}, shape{6, 2, 48}, shape{8, 1, 32}})
    for (cache_type type : {cache_type::f32, cache_type::f16, cache_type::i8}) {
      CAPTURE(sh.heads);
      CAPTURE(sh.kv_heads);
      CAPTURE(sh.head_dim);
      CAPTURE(static_cast<int>(type));
      const std::vector<uint32_t> table = shuffled_table(12, 9);
      const written_cache c(type, 12, sh.kv_heads, sh.head_dim, 90, table, 31);
      // Positions 5..41, then 42 of another sequence (the next position, but another
      // table: the written blocks in another order, so that it too reads written slots),
      // then 43..88.
      std::vector<uint32_t> other = table;
      std::rotate(other.begin(), other.begin() + 1, other.begin() + 6);
      std::vector<attention_token> toks;
      for (int32_t p = 5; p < 42; ++p) toks.push_back({p, table.data()});
      toks.push_back({42, other.data()});
      for (int32_t p = 43; p < 89; ++p) toks.push_back({p, table.data()});
      std::vector<int32_t> every(toks.size());
      std::iota(every.begin(), every.end(), 0);
      check_alone_as_in_batch(c, type, toks, every, sh.heads, table.data(), 33);
    }
}

TEST_CASE("an int8 cache row of zeros stays zeros, and a non-finite row reads as NaN") {
  const int32_t block = 16, hd = 16, kv_heads = 1, blocks = 1;
  std::vector<int8_t> k8(block * hd, 5), v8(block * hd, 5);
  std::vector<float> ks(block, 1.0f), vs(block, 1.0f);
  paged_kv_layer i8{nullptr, nullptr, blocks, kv_heads, block, hd};
  i8.k8 = k8.data();
  i8.v8 = v8.data();
  i8.k_scale = ks.data();
  i8.v_scale = vs.data();
  const uint32_t table[] = {0};
  std::vector<float> zeros(hd, 0.0f), row(hd, 1.0f);
  paged_kv_write(i8, table, 0, zeros.data(), zeros.data());
  CHECK(ks[0] == 0.0f);
  CHECK(vs[0] == 0.0f);
  for (int32_t d = 0; d < hd; ++d) CHECK(k8[d * block] == 0);
  std::vector<float> q(hd, 1.0f), out(hd, NAN);
  const attention_token tok{0, table};
  thread_pool pool(1);
  paged_attention(q.data(), hd, out.data(), hd, &tok, 1, 1, i8, pool);
  for (float o : out) CHECK(o == 0.0f);
  row[3] = INFINITY;
  paged_kv_write(i8, table, 1, row.data(), row.data());
  CHECK(std::isnan(ks[1]));
  const attention_token next{1, table};
  paged_attention(q.data(), hd, out.data(), hd, &next, 1, 1, i8, pool);
  for (float o : out) CHECK(std::isnan(o));
}

}  // namespace troupe

namespace troupe {

TEST_CASE("attention weights, where a token asks for them, are dense attention's, and change nothing else") {
  for (cache_type type : {cache_type::f32, cache_type::i8})
    for (int32_t group : {1, 2, 4, 8})
      for (int32_t head_dim : {16, 20, 64}) {
        CAPTURE(static_cast<int>(type));
        CAPTURE(group);
        CAPTURE(head_dim);
        const int32_t kv_heads = 2, heads = kv_heads * group, len = 40, blocks = 4;
        const auto table = shuffled_table(blocks, 3);
        const written_cache c(type, blocks, kv_heads, head_dim, len, table, 9);
        // A prefill run of five tokens, a lone one and a windowed one.
        std::vector<attention_token> toks;
        for (int32_t p = 20; p < 25; ++p) toks.push_back({p, table.data()});
        toks.push_back({len - 1, table.data()});
        toks.push_back({33, table.data(), 10});
        const auto q = test::random_floats(toks.size() * heads * head_dim, 12);
        thread_pool pool(2);
        std::vector<float> plain(q.size(), NAN), with(q.size(), NAN);
        paged_attention(q.data(), heads * head_dim, plain.data(), heads * head_dim, toks.data(),
                        static_cast<int32_t>(toks.size()), heads, c.cache.layer, pool);
        const int64_t stride = len;
        std::vector<float> weights(toks.size() * heads * stride, -1.0f);
        for (size_t t = 0; t < toks.size(); ++t) {
          toks[t].weights = weights.data() + t * heads * stride;
          toks[t].weights_stride = stride;
        }
        paged_attention(q.data(), heads * head_dim, with.data(), heads * head_dim, toks.data(),
                        static_cast<int32_t>(toks.size()), heads, c.cache.layer, pool);
        CHECK(std::equal(plain.begin(), plain.end(), with.begin()));
        for (size_t t = 0; t < toks.size(); ++t)
          for (int32_t h = 0; h < heads; ++h) {
            const float* w = weights.data() + (t * heads + h) * stride;
            // Dense scores over the cache as written (the scale of an int8 cache aside, the
            // order of the weights is the test: each row sums to one and peaks where dense
            // attention does).
            const int32_t kh = h / group, pos = toks[t].position;
            const float* qh = q.data() + (t * heads + h) * head_dim;
            std::vector<double> s(pos + 1, 0.0);
            double mx = -1e300, z = 0.0, sum = 0.0;
            for (int32_t p = toks[t].first; p <= pos; ++p) {
              double d = 0;
              for (int32_t i = 0; i < head_dim; ++i) d += double(qh[i]) * c.keys[(size_t(p) * kv_heads + kh) * head_dim + i];
              s[p] = d / std::sqrt(double(head_dim));
              mx = std::max(mx, s[p]);
            }
            for (int32_t p = toks[t].first; p <= pos; ++p) z += std::exp(s[p] - mx);
            for (int32_t p = 0; p <= pos; ++p) {
              const double want = p < toks[t].first ? 0.0 : std::exp(s[p] - mx) / z;
              if (p < toks[t].first) CHECK(w[p] == 0.0f);
              CHECK(w[p] == doctest::Approx(want).epsilon(type == cache_type::f32 ? 1e-4 : 0.05).scale(type == cache_type::f32 ? 1e-6 : 1e-2));
              sum += w[p];
            }
            CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
            for (int32_t p = pos + 1; p < stride; ++p) CHECK(w[p] == -1.0f);  // nothing past its position
          }
      }
}

}  // namespace troupe

namespace troupe {

TEST_CASE("a token tree's nodes see the cache before the tree, their ancestors and themselves") {
  // 40 positions of context, then a tree of 8 nodes at positions 40..47: the root (the
  // sequence's last known token), two children, and their descendants.
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 1, 2, 3, 5};
  const int32_t context = 40, nodes = static_cast<int32_t>(parent.size()), len = context + nodes;
  for (cache_type type : {cache_type::f32, cache_type::f16})
  for (int32_t heads : {4, 8}) {
    CAPTURE(heads);
    const int32_t kv_heads = 4, head_dim = 16, row = heads * head_dim;
    const std::vector<uint32_t> table = shuffled_table(8, 5);
    const written_cache c(type, 8, kv_heads, head_dim, len, table, 21);
    std::vector<attention_token> toks;
    for (int32_t i = 0; i < nodes; ++i) {
      attention_token t{context + i, table.data()};
      t.tree_first = context;
      for (int32_t a = i; a >= 0; a = parent[a]) t.tree_mask |= uint64_t{1} << a;
      toks.push_back(t);
    }
    const auto q = test::random_floats(size_t(nodes) * row, 9);
    thread_pool pool(2);
    std::vector<float> together(q.size(), NAN);
    paged_attention(q.data(), row, together.data(), row, toks.data(), nodes, heads, c.cache.layer, pool);
    for (int32_t i = 0; i < nodes; ++i) {
      CAPTURE(i);
      // Alone, the same bits (a run of the tree's tokens is read a block at a time).
      std::vector<float> alone(row, NAN);
      paged_attention(q.data() + i * row, row, alone.data(), row, &toks[i], 1, heads, c.cache.layer, pool);
      CHECK(test::same_finite_bits(alone, std::span(together).subspan(size_t(i) * row, row)));
      if (type != cache_type::f32) continue;
      // Dense attention over the context and the node's path, as one sequence.
      std::vector<int32_t> path;
      for (int32_t a = i; a >= 0; a = parent[a]) path.insert(path.begin(), a);
      const size_t stride = size_t(kv_heads) * head_dim;
      std::vector<float> keys(c.keys.begin(), c.keys.begin() + context * stride);
      std::vector<float> vals(c.vals.begin(), c.vals.begin() + context * stride);
      for (int32_t a : path) {
        keys.insert(keys.end(), c.keys.begin() + (context + a) * stride, c.keys.begin() + (context + a + 1) * stride);
        vals.insert(vals.end(), c.vals.begin() + (context + a) * stride, c.vals.begin() + (context + a + 1) * stride);
      }
      const std::vector<float> qi(q.begin() + i * row, q.begin() + (i + 1) * row);
      const int32_t at = context + static_cast<int32_t>(path.size()) - 1;
      const auto want = dense_attention(qi, keys, vals, {at}, heads, kv_heads, head_dim);
      for (int32_t j = 0; j < row; ++j) CHECK(together[i * row + j] == doctest::Approx(want[j]).epsilon(1e-5).scale(1.0));
    }
  }
}

}  // namespace troupe
