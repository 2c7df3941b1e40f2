#include "tests/support/tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <thread>

#include "kernels/cpu/argmax.hpp"
#include "tests/support/test_support.hpp"
#include "tests/support/tolerance.hpp"

namespace troupe::test {

model_config splittable_config() {
  model_config c;
  c.dim = 128;
  c.hidden_dim = 320;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.vocab_size = 300;
  c.max_seq_len = 64;
  return c;
}

std::vector<block_id> blocks_for(int32_t tokens) { return block_range((tokens + 15) / 16); }

tp_run run_steps(const std::vector<forward_shard*>& shards, const model_config& c, std::vector<int32_t> prompt,
                 int32_t steps, const std::vector<block_id>& blocks) {
  const auto tp = static_cast<int32_t>(shards.size());
  tp_run out;
  std::vector<int32_t> tokens = std::move(prompt);
  int32_t computed = 0;
  for (int32_t s = 0; s < steps; ++s) {
    step_batch batch;
    batch.add(std::span(tokens).subspan(computed), computed, blocks, true);
    std::vector<std::vector<float>> hidden(tp, std::vector<float>(size_t(batch.num_tokens()) * c.dim));
    std::vector<float> logits(c.vocab_size);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < tp; ++r)
      threads.emplace_back([&, r] { shards[r]->forward(batch, hidden[r].data(), r == 0 ? logits.data() : nullptr); });
    for (auto& t : threads) t.join();
    computed = static_cast<int32_t>(tokens.size());
    tokens.push_back(argmax(logits.data(), c.vocab_size));
    out.tokens.push_back(tokens.back());
    out.logits.push_back(std::move(logits));
  }
  return out;
}

double worst_relative_difference(const tp_run& a, const tp_run& b) {
  if (a.logits.empty() || a.logits.size() != b.logits.size()) return INFINITY;
  double worst = 0;
  for (size_t s = 0; s < a.logits.size(); ++s) worst = std::max(worst, max_relative_difference(b.logits[s], a.logits[s]));
  return worst;
}

}  // namespace troupe::test
