// KV eviction on the device: the attention each slot receives against the CPU's softmax
// weights summed the same way, and a compaction (moves into a table whose shared block
// was replaced by a copy, keys turned back or not) against the CPU's reads and writes.
#include <numeric>

#include "kernels/cpu/paged_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cuda/kv_eviction.hpp"

#include "tests/kernels/cuda/gpu_test_support.hpp"

namespace troupe {

using namespace gpu_test;

TEST_CASE("attention sums on the device: each slot's softmax weights over a sequence's last queries and every head") {
  const int32_t heads = 6, kv_heads = 2, head_dim = 64, block = 16, blocks = 64, table_stride = 20;
  const std::vector<int32_t> lengths{37, 300};
  std::vector<uint32_t> tables(lengths.size() * table_stride, 0);
  std::vector<uint32_t> order(blocks);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  size_t next = 0;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int32_t b = 0; b < (lengths[s] + block - 1) / block; ++b) tables[s * table_stride + b] = order[next++];
  const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
  std::vector<float> k = randoms(cache, 21), v = randoms(cache, 22);
  paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
  // The step: sequence 0's decode token (position 36), and a 40-token chunk of sequence 1
  // (positions 260..299), whose last 32 queries count.
  std::vector<int32_t> pos{36}, seq{0};
  for (int32_t p = 260; p < 300; ++p) {
    pos.push_back(p);
    seq.push_back(1);
  }
  const int32_t n = static_cast<int32_t>(pos.size()), q_stride = heads * head_dim + 3;
  const auto q = randoms(size_t(n) * q_stride, 23);
  // The CPU: each counted query's weights, summed token by token, head by head.
  std::vector<float> want(37 + 300, 0.5f);  // (the sums add to what is there)
  thread_pool cpu(1);
  std::vector<float> out(size_t(n) * heads * head_dim);
  for (int32_t t = 0; t < n; ++t) {
    const bool counted = t == 0 || t >= n - 32;
    if (!counted) continue;
    std::vector<float> w(size_t(heads) * (pos[t] + 1));
    attention_token tok{pos[t], tables.data() + size_t(seq[t]) * table_stride};
    tok.weights = w.data();
    tok.weights_stride = pos[t] + 1;
    paged_attention(q.data() + size_t(t) * q_stride, q_stride, out.data(), heads * head_dim, &tok, 1, heads, host, cpu);
    float* mass = want.data() + (seq[t] == 0 ? 0 : 37);
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t p = 0; p <= pos[t]; ++p) mass[p] += w[size_t(h) * (pos[t] + 1) + p];
  }
  auto dk = on_device(k), dv = on_device(v), dq = on_device(q);
  auto dtables = on_device(tables);
  auto dpos = on_device(pos), dseq = on_device(seq);
  const cuda::token_batch b{dpos.get(), dseq.get(), dtables.get(), table_stride, n};
  const std::vector<cuda::mass_sequence> seqs{{0, 1, 37, 0}, {n - 32, 32, 300, 37}};
  auto dseqs = on_device(seqs);
  cuda::buffer<float> ws(cuda::attention_mass_workspace(2, heads));
  ws.fill_bytes(0xFF);
  auto mass = on_device(std::vector<float>(want.size(), 0.5f));
  paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
  cuda::attention_mass(dq.get(), q_stride, b, heads, dev, dseqs.get(), 2, 300, ws.get(), mass.get(), nullptr);
  sync();
  const auto got = mass.download();
  for (size_t i = 0; i < want.size(); ++i) close(got[i], want[i], 1e-4f);
}

TEST_CASE("a compaction on the device moves the kept slots as the CPU does, into copies of shared blocks, keys turned back") {
  const int32_t kv_heads = 2, head_dim = 16, rot = 12, block = 8, blocks = 16;
  const size_t cache = size_t(blocks) * kv_heads * block * head_dim;
  const std::vector<uint32_t> src{5, 9, 2, 14, 7}, dst{5, 11, 2, 14, 7};  // block 9 shared: copied into 11
  const std::vector<int32_t> kept{0, 1, 2, 7, 9, 17, 20, 21, 30, 33, 39};
  std::vector<float> freqs(rot / 2);
  for (int32_t i = 0; i < rot / 2; ++i) freqs[i] = std::pow(10000.0f, -2.0f * i / rot);
  for (bool rotate : {false, true}) {
    CAPTURE(rotate);
    std::vector<float> k = randoms(cache, 31), v = randoms(cache, 32);
    paged_kv_layer host{k.data(), v.data(), blocks, kv_heads, block, head_dim};
    // The moves the shard makes: every kept slot whose place changes.
    std::vector<cuda::slot_move> moves;
    for (size_t i = 0; i < kept.size(); ++i)
      if (kept[i] != static_cast<int32_t>(i) || dst[i / block] != src[kept[i] / block]) moves.push_back({kept[i], int32_t(i)});
    auto dk = on_device(k), dv = on_device(v);
    auto dsrc = on_device(src), ddst = on_device(dst);
    auto dmoves = on_device(moves);
    auto dfreqs = on_device(freqs);
    cuda::buffer<float> ws(cuda::kv_compact_workspace(static_cast<int32_t>(moves.size()), kv_heads, head_dim));
    paged_kv_layer dev{dk.get(), dv.get(), blocks, kv_heads, block, head_dim};
    cuda::kv_compact(dev, dsrc.get(), ddst.get(), dmoves.get(), static_cast<int32_t>(moves.size()),
                     rotate ? dfreqs.get() : nullptr, rot, rope_layout::pairs, ws.get(), nullptr);
    sync();
    // The CPU: every move read first, turned back, then written.
    const int32_t row = kv_heads * head_dim;
    std::vector<float> rk(moves.size() * row), rv(moves.size() * row);
    for (size_t i = 0; i < moves.size(); ++i) {
      paged_kv_read(host, src.data(), moves[i].from, rk.data() + i * row, rv.data() + i * row);
      if (!rotate) continue;
      std::vector<float> cs(rot / 2), sn(rot / 2);
      for (int32_t j = 0; j < rot / 2; ++j) {
        cs[j] = std::cos(float(moves[i].to - moves[i].from) * freqs[j]);
        sn[j] = std::sin(float(moves[i].to - moves[i].from) * freqs[j]);
      }
      rope(rk.data() + i * row, kv_heads, head_dim, rot, cs.data(), sn.data(), rope_layout::pairs);
    }
    const std::vector<float> shared_k = k, shared_v = v;  // the block the copy replaced: as it was
    for (size_t i = 0; i < moves.size(); ++i) paged_kv_write(host, dst.data(), moves[i].to, rk.data() + i * row, rv.data() + i * row);
    const auto gk = dk.download(), gv = dv.download();
    for (size_t i = 0; i < cache; ++i) {
      close(gk[i], k[i], 1e-5f);
      close(gv[i], v[i], 1e-6f);
    }
    const size_t per_block = size_t(kv_heads) * block * head_dim;
    for (size_t i = 9 * per_block; i < 10 * per_block; ++i) CHECK((gk[i] == shared_k[i] && gv[i] == shared_v[i]));
  }
}

}  // namespace troupe
