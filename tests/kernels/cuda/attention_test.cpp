// Paged KV writes and attention on the device (split over the sequence, tiled prefill,
// RoPE fused with the KV write) against the CPU's paged attention.
#include <numeric>

#include "kernels/cpu/paged_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cuda/paged_attention.hpp"
#include "kernels/cuda/prefill_attention.hpp"

#include "tests/kernels/cuda/gpu_test_support.hpp"

namespace troupe {

using namespace gpu_test;

namespace {

void check_attention(int32_t head_dim) {
  const int32_t heads = 6, kv_heads = 2, block = 16, blocks = 64;
  const std::vector<int32_t> lengths{1, 37, 300};
  // Each sequence's blocks, scrambled across the pool.
  std::vector<uint32_t> pool_order(blocks);
  std::iota(pool_order.begin(), pool_order.end(), 0u);
  std::shuffle(pool_order.begin(), pool_order.end(), std::mt19937(11));
  const int32_t table_stride = 20;
  std::vector<uint32_t> tables(lengths.size() * table_stride, 0);
  size_t next = 0;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int32_t b = 0; b < (lengths[s] + block - 1) / block; ++b) tables[s * table_stride + b] = pool_order[next++];
  // Every position's K and V, written by the CPU into its cache and by the GPU into its own.
  const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
  std::vector<float> k(cache, 0.0f), v(cache, 0.0f);
  paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
  std::vector<int32_t> all_pos, all_seq;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int32_t p = 0; p < lengths[s]; ++p) {
      all_pos.push_back(p);
      all_seq.push_back(static_cast<int32_t>(s));
    }
  const int32_t row = kv_heads * head_dim;
  const auto keys = randoms(all_pos.size() * row, 12), vals = randoms(all_pos.size() * row, 13);
  for (size_t i = 0; i < all_pos.size(); ++i)
    paged_kv_write(host, tables.data() + size_t(all_seq[i]) * table_stride, all_pos[i], keys.data() + i * row,
                   vals.data() + i * row);
  auto dk = on_device(std::vector<float>(cache, 0.0f)), dv = on_device(std::vector<float>(cache, 0.0f));
  auto dkeys = on_device(keys), dvals = on_device(vals);
  auto dtables = on_device(tables);
  auto dall_pos = on_device(all_pos), dall_seq = on_device(all_seq);
  paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
  cuda::token_batch wb{dall_pos.get(), dall_seq.get(), dtables.get(), table_stride, static_cast<int32_t>(all_pos.size())};
  cuda::paged_kv_write(dev, dkeys.get(), dvals.get(), row, wb, nullptr);
  sync();
  CHECK(dk.download() == k);
  CHECK(dv.download() == v);

  // A step: the three sequences' last tokens (decode) and ten tokens of a prefill chunk.
  std::vector<int32_t> pos{0, 36, 299}, seq{0, 1, 2};
  for (int32_t p = 120; p < 130; ++p) {
    pos.push_back(p);
    seq.push_back(2);
  }
  const int32_t n = static_cast<int32_t>(pos.size()), q_stride = heads * head_dim + 5;
  const auto q = randoms(size_t(n) * q_stride, 14);
  std::vector<attention_token> toks;
  for (int32_t t = 0; t < n; ++t) toks.push_back({pos[t], tables.data() + size_t(seq[t]) * table_stride});
  std::vector<float> want(size_t(n) * heads * head_dim, NAN);
  thread_pool cpu(1);
  paged_attention(q.data(), q_stride, want.data(), heads * head_dim, toks.data(), n, heads, host, cpu);
  auto dq = on_device(q);
  auto dpos = on_device(pos), dseq = on_device(seq);
  const cuda::token_batch b{dpos.get(), dseq.get(), dtables.get(), table_stride, n};
  for (int32_t split : {32, 256, 512}) {  // many partials to merge, two, and one (no merge)
    CAPTURE(split);
    cuda::buffer<float> ws(cuda::paged_attention_workspace(n, heads, head_dim, 299, split));
    ws.fill_bytes(0xFF);
    auto out = poisoned<float>(want.size());
    cuda::paged_attention(dq.get(), q_stride, out.get(), heads * head_dim, b, heads, 299, dev, ws.get(), split, nullptr);
    sync();
    const auto got = out.download();
    for (size_t i = 0; i < want.size(); ++i) close(got[i], want[i], 1e-5f);
  }
  // The tiled prefill kernel on the same step: three one-row tiles (the decode tokens) and
  // one of the ten-token chunk.
  const std::vector<cuda::query_tile> tiles{{0, 1}, {1, 1}, {2, 1}, {3, 10}};
  auto dtiles = on_device(tiles);
  auto out = poisoned<float>(want.size());
  cuda::prefill_attention(dq.get(), q_stride, out.get(), heads * head_dim, b, dtiles.get(), 4, heads, dev, nullptr);
  sync();
  auto got = out.download();
  for (size_t i = 0; i < want.size(); ++i) close(got[i], want[i], 1e-5f);
  // A 40-token chunk at positions 200..239 of the third sequence: tiles of 16, 16 and 8
  // rows, the first starting mid-block.
  std::vector<int32_t> chunk_pos, chunk_seq;
  for (int32_t p = 200; p < 240; ++p) {
    chunk_pos.push_back(p);
    chunk_seq.push_back(2);
  }
  const int32_t m = static_cast<int32_t>(chunk_pos.size());
  const auto cq = randoms(size_t(m) * q_stride, 15);
  std::vector<attention_token> ctoks;
  for (int32_t t = 0; t < m; ++t) ctoks.push_back({chunk_pos[t], tables.data() + size_t(2) * table_stride});
  std::vector<float> cwant(size_t(m) * heads * head_dim, NAN);
  paged_attention(cq.data(), q_stride, cwant.data(), heads * head_dim, ctoks.data(), m, heads, host, cpu);
  auto dcq = on_device(cq);
  auto dcpos = on_device(chunk_pos), dcseq = on_device(chunk_seq);
  const cuda::token_batch cb{dcpos.get(), dcseq.get(), dtables.get(), table_stride, m};
  const std::vector<cuda::query_tile> ctiles{{0, 16}, {16, 16}, {32, 8}};
  auto dctiles = on_device(ctiles);
  auto chunk_out = poisoned<float>(cwant.size());
  cuda::prefill_attention(dcq.get(), q_stride, chunk_out.get(), heads * head_dim, cb, dctiles.get(), 3, heads, dev, nullptr);
  sync();
  got = chunk_out.download();
  for (size_t i = 0; i < cwant.size(); ++i) close(got[i], cwant[i], 1e-5f);
}

}  // namespace

TEST_CASE("paged KV write, split attention and tiled prefill attention (GQA, scrambled blocks, decode and prefill tokens) match the CPU") {
  for (int32_t head_dim : {16, 64, 128}) {  // 64 and 128 have unrolled kernels of their own
    CAPTURE(head_dim);
    check_attention(head_dim);
  }
}


TEST_CASE("split attention over a token tree matches the CPU's: each node sees its ancestors only") {
  // 40 positions of context, then a tree of 8 nodes at 40..47 (as the CPU test's), in
  // splits of 32 positions (the second holds context and the tree) and of 64 (one).
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 1, 2, 3, 5};
  const int32_t context = 40, nodes = static_cast<int32_t>(parent.size()), len = context + nodes;
  const int32_t heads = 4, kv_heads = 2, head_dim = 64, block = 16, blocks = 8, table_stride = 4;
  std::vector<uint32_t> tables = {5, 1, 7, 2};
  const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
  std::vector<float> k(cache, 0.0f), v(cache, 0.0f);
  paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
  const int32_t row = kv_heads * head_dim;
  const auto keys = randoms(size_t(len) * row, 21), vals = randoms(size_t(len) * row, 22);
  for (int32_t p = 0; p < len; ++p) paged_kv_write(host, tables.data(), p, keys.data() + p * row, vals.data() + p * row);
  std::vector<attention_token> toks;
  std::vector<int32_t> pos, seq, first;
  std::vector<uint64_t> mask;
  for (int32_t i = 0; i < nodes; ++i) {
    attention_token t{context + i, tables.data()};
    t.tree_first = context;
    for (int32_t a = i; a >= 0; a = parent[a]) t.tree_mask |= uint64_t{1} << a;
    toks.push_back(t);
    pos.push_back(t.position);
    seq.push_back(0);
    first.push_back(t.tree_first);
    mask.push_back(t.tree_mask);
  }
  const int32_t q_stride = heads * head_dim;
  const auto q = randoms(size_t(nodes) * q_stride, 23);
  std::vector<float> want(size_t(nodes) * q_stride, NAN);
  thread_pool cpu(1);
  paged_attention(q.data(), q_stride, want.data(), q_stride, toks.data(), nodes, heads, host, cpu);
  auto dk = on_device(k), dv = on_device(v), dq = on_device(q);
  auto dtables = on_device(tables);
  auto dpos = on_device(pos), dseq = on_device(seq), dfirst = on_device(first);
  auto dmask = on_device(mask);
  paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
  cuda::token_batch b{dpos.get(), dseq.get(), dtables.get(), table_stride, nodes};
  b.tree_first = dfirst.get();
  b.tree_mask = dmask.get();
  for (int32_t split : {32, 64}) {  // partials to merge, and one
    CAPTURE(split);
    cuda::buffer<float> ws(cuda::paged_attention_workspace(nodes, heads, head_dim, len - 1, split));
    auto out = poisoned<float>(want.size());
    cuda::paged_attention(dq.get(), q_stride, out.get(), q_stride, b, heads, len - 1, dev, ws.get(), split, nullptr);
    sync();
    const auto got = out.download();
    for (size_t i = 0; i < want.size(); ++i) close(got[i], want[i], 1e-5f);
  }
}

TEST_CASE("rope and KV write in one launch equal rope, then paged_kv_write") {
  const int32_t heads = 4, kv_heads = 2, head_dim = 12, rot = 8, block = 16, blocks = 8, positions_n = 100;
  const int32_t stride = (heads + 2 * kv_heads) * head_dim + 3, tokens = 5;
  std::vector<float> cos(size_t(positions_n) * rot / 2), sin(cos.size());
  rope_table(cos.data(), sin.data(), positions_n, rot, 10000.0f);
  const std::vector<int32_t> pos{0, 17, 18, 63, 99}, seq{0, 0, 0, 1, 1};
  const int32_t table_stride = 7;
  std::vector<uint32_t> tables(2 * table_stride, 0);
  for (int32_t b = 0; b < table_stride; ++b) {
    tables[b] = static_cast<uint32_t>((b * 3) % blocks);
    tables[table_stride + b] = static_cast<uint32_t>(blocks - 1 - b);
  }
  for (rope_layout layout : {rope_layout::pairs, rope_layout::halves}) {
    auto qkv = randoms(size_t(tokens) * stride, 61);
    const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
    std::vector<float> k(cache, 0.0f), v(cache, 0.0f);
    paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
    auto dqkv = on_device(qkv);
    for (int32_t t = 0; t < tokens; ++t) {
      float* row = qkv.data() + size_t(t) * stride;
      const size_t at = size_t(pos[t]) * rot / 2;
      rope(row, heads + kv_heads, head_dim, rot, cos.data() + at, sin.data() + at, layout);
      paged_kv_write(host, tables.data() + size_t(seq[t]) * table_stride, pos[t], row + heads * head_dim,
                     row + (heads + kv_heads) * head_dim);
    }
    auto dk = on_device(std::vector<float>(cache, 0.0f)), dv = on_device(std::vector<float>(cache, 0.0f));
    auto dcos = on_device(cos), dsin = on_device(sin);
    auto dpos = on_device(pos), dseq = on_device(seq);
    auto dtables = on_device(tables);
    const paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
    const cuda::token_batch b{dpos.get(), dseq.get(), dtables.get(), table_stride, tokens};
    cuda::rope_kv_write(dev, dqkv.get(), stride, heads, rot, dcos.get(), dsin.get(), layout, b, nullptr);
    sync();
    const auto got = dqkv.download();
    for (size_t i = 0; i < got.size(); ++i) close(got[i], qkv[i], 1e-5f);
    const auto gk = dk.download(), gv = dv.download();
    for (size_t i = 0; i < cache; ++i) {
      close(gk[i], k[i], 1e-5f);
      close(gv[i], v[i], 1e-5f);
    }
  }
}

}  // namespace troupe
