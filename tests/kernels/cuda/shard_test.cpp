// The GPU shard end to end on stories260K: the FP32 path gives the reference greedy ids,
// the BF16 path's logits stay close to the CPU's. Runs only where a CUDA device exists.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <doctest/doctest.h>

#include "engine/forward/forward_shard.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "kernels/cpu/argmax.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// Prompt in one step, then one token a step; stops at BOS/EOS or when `steps` positions
// are used (the reference's rule). Returns the generated ids.
std::vector<int32_t> greedy(forward_shard& shard, const test::loaded& l, const std::vector<int32_t>& prompt, int32_t steps) {
  const model_config& c = l.m.config;
  std::vector<uint32_t> table((c.max_seq_len + 15) / 16);
  std::iota(table.begin(), table.end(), 0u);
  std::vector<float> hidden, logits(c.vocab_size);
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  int32_t pos = 0;
  while (pos + static_cast<int32_t>(feed.size()) < steps) {
    step_batch b;
    b.add(feed, pos, table, true);
    hidden.assign(size_t(b.num_tokens()) * c.dim, 0.0f);
    shard.forward(b, hidden.data(), logits.data());
    pos += static_cast<int32_t>(feed.size());
    const int32_t next = argmax(logits.data(), c.vocab_size);
    if (next == l.tok.bos_id() || next == l.tok.eos_id()) break;
    out.push_back(next);
    feed = {next};
  }
  return out;
}

}  // namespace

TEST_CASE("GPU FP32 path: stories260K greedy ids equal the reference") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  cuda_shard_options o;
  o.weights = dtype::f32;
  o.num_blocks = (l.m.config.max_seq_len + 15) / 16;
  auto shard = make_cuda_shard(l.m, shard_spec{0, 0, {}}, o);
  REQUIRE_MESSAGE(shard.has_value(), (shard ? "" : shard.err().message));
  for (const auto& c : test::read_reference(test::shared_path("reference/stories260K_greedy.jsonl"))) {
    CAPTURE(c.prompt);
    const auto prompt = l.tok.encode(c.prompt, true);
    std::vector<int32_t> ids(prompt.begin() + 1, prompt.end());
    const auto gen = greedy(**shard, l, prompt, c.steps);
    ids.insert(ids.end(), gen.begin(), gen.end());
    CHECK(ids == c.ids_after_bos);
  }
}

TEST_CASE("GPU BF16 path: prompt logits within 5% of the logit range of the CPU's") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model_config& c = l.m.config;
  const auto prompt = l.tok.encode("Once upon a time, there was a little girl named Lily", true);
  std::vector<uint32_t> table((c.max_seq_len + 15) / 16);
  std::iota(table.begin(), table.end(), 0u);
  step_batch b;
  b.add(prompt, 0, table, true);
  // CPU.
  kv_cache cache(transformer_shard::cache_shape(c, shard_spec{}, static_cast<int32_t>(table.size()), 16));
  thread_pool pool(1);
  no_collective solo;
  transformer_shard cpu(l.m, shard_spec{}, cache, pool, solo);
  std::vector<float> hidden(size_t(b.num_tokens()) * c.dim), want(c.vocab_size), got(c.vocab_size);
  cpu.forward(b, hidden.data(), want.data());
  // GPU, BF16 weights.
  cuda_shard_options o;
  o.weights = dtype::bf16;
  o.num_blocks = static_cast<int32_t>(table.size());
  auto gpu = make_cuda_shard(l.m, shard_spec{}, o);
  REQUIRE_MESSAGE(gpu.has_value(), (gpu ? "" : gpu.err().message));
  std::fill(hidden.begin(), hidden.end(), 0.0f);
  (*gpu)->forward(b, hidden.data(), got.data());
  const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
  const float range = *hi - *lo;
  float worst = 0.0f;
  for (int32_t i = 0; i < c.vocab_size; ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  MESSAGE("BF16 worst logit error ", worst, " of a range of ", range);
  CHECK(worst <= 0.05f * range);
}

}  // namespace troupe
