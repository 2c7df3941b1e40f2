// TP=2 shards of one model, summed through the collective, against TP=1.
#include <cmath>
#include <cstring>
#include <atomic>
#include <chrono>
#include <thread>

#include <doctest/doctest.h>

#include "engine/forward/transformer_shard.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "kernels/cpu/argmax.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// Runs prompt-then-greedy steps on `tp` shards (threads of this process); returns the
// logits of every step and the tokens chosen.
struct tp_run {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

tp_run run_tp(const model& m, int32_t tp, std::vector<int32_t> prompt, int32_t steps) {
  const int32_t bs = 16;
  const int32_t len = static_cast<int32_t>(prompt.size()) + steps;
  std::vector<uint32_t> blocks;
  for (int32_t b = 0; b < (len + bs - 1) / bs; ++b) blocks.push_back(static_cast<uint32_t>(b));
  local_collective_group group(tp);
  std::vector<std::unique_ptr<kv_cache>> caches;
  std::vector<std::unique_ptr<thread_pool>> pools;
  std::vector<std::unique_ptr<transformer_shard>> shards;
  for (int32_t r = 0; r < tp; ++r) {
    shard_spec spec;
    spec.tp = {r, tp};
    caches.push_back(std::make_unique<kv_cache>(transformer_shard::cache_shape(m.config, spec, static_cast<int32_t>(blocks.size()), bs)));
    pools.push_back(std::make_unique<thread_pool>(1));
    shards.push_back(std::make_unique<transformer_shard>(m, spec, *caches[r], *pools[r], group.member(r)));
  }
  tp_run out;
  std::vector<int32_t> tokens = prompt;
  int32_t computed = 0;
  for (int32_t s = 0; s < steps; ++s) {
    step_batch batch;
    batch.add(std::span(tokens).subspan(computed), computed, blocks, true);
    std::vector<std::vector<float>> hidden(tp, std::vector<float>(size_t(batch.num_tokens()) * m.config.dim));
    std::vector<float> logits(m.config.vocab_size);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < tp; ++r)
      threads.emplace_back([&, r] { shards[r]->forward(batch, hidden[r].data(), r == 0 ? logits.data() : nullptr); });
    for (auto& t : threads) t.join();
    computed = static_cast<int32_t>(tokens.size());
    out.logits.push_back(logits);
    tokens.push_back(argmax(logits.data(), m.config.vocab_size));
    out.tokens.push_back(tokens.back());
  }
  return out;
}

void check_close(const tp_run& a, const tp_run& b) {
  REQUIRE(a.logits.size() == b.logits.size());
  for (size_t s = 0; s < a.logits.size(); ++s) {
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < a.logits[s].size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(double(a.logits[s][i])));
      max_diff = std::max(max_diff, std::fabs(double(a.logits[s][i]) - b.logits[s][i]));
    }
    CAPTURE(s);
    CHECK(max_diff <= 1e-5 * max_abs);
  }
}

}  // namespace

TEST_CASE("TP=2 logits stay within 1e-5 of TP=1 on a random synthetic model (f32 and q8_0)") {
  test::temp_dir dir;
  model_config c;
  c.dim = 128;
  c.hidden_dim = 320;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.vocab_size = 300;
  c.max_seq_len = 64;
  for (dtype type : {dtype::f32, dtype::q8_0}) {
    CAPTURE(dtype_name(type));
    const std::string path = dir.file(std::string("tp_") + std::string(dtype_name(type)) + ".gguf");
    REQUIRE(write_gguf(path, {c, type, 32, false}, synthetic_vocabulary(c.vocab_size), random_weights(11)).has_value());
    auto m = load_model(path);
    REQUIRE(m.has_value());
    REQUIRE_FALSE(check_tp_split(m->config, 2, type == dtype::q8_0 ? 32 : 0).has_value());
    const std::vector<int32_t> prompt{1, 17, 200, 45, 99, 3, 250};
    const tp_run one = run_tp(*m, 1, prompt, 6);
    const tp_run two = run_tp(*m, 2, prompt, 6);
    check_close(one, two);
    CHECK(one.tokens == two.tokens);
  }
}

TEST_CASE("TP=2 gives the reference greedy tokens for stories260K") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  REQUIRE_FALSE(check_tp_split(l.m.config, 2, 0).has_value());
  for (const auto& c : test::read_reference(test::shared_path("reference/stories260K_greedy.jsonl"))) {
    CAPTURE(c.prompt);
    const auto prompt = l.tok.encode(c.prompt, true);
    const int32_t steps = c.steps - static_cast<int32_t>(prompt.size() - 1);
    const tp_run one = run_tp(l.m, 1, prompt, steps);
    const tp_run two = run_tp(l.m, 2, prompt, steps);
    check_close(one, two);
    std::vector<int32_t> ids(prompt.begin() + 1, prompt.end());
    for (int32_t t : two.tokens) {
      if (t == 1) break;  // the reference stops where the model emits BOS
      ids.push_back(t);
    }
    CHECK(ids == c.ids_after_bos);
  }
}

TEST_CASE("a model that cannot be split says why") {
  model_config c;
  c.num_heads = 6;
  c.num_kv_heads = 3;
  c.hidden_dim = 100;
  c.head_dim = 8;
  CHECK(check_tp_split(c, 2, 0).has_value());
  CHECK(check_tp_split(c, 3, 0).has_value() == true);  // 100 FFN columns
  c.hidden_dim = 96;
  CHECK_FALSE(check_tp_split(c, 3, 0).has_value());
  CHECK(check_tp_split(c, 3, 32).has_value());  // 16 columns per shard cut 32-groups
}

}  // namespace troupe

namespace troupe {

TEST_CASE("two pipeline stages (layers 0-1 and 2-4) hand over activations and match one stage") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model& m = l.m;
  const std::vector<int32_t> tokens{1, 403, 407, 261, 378, 432, 383, 286};
  const std::vector<uint32_t> blocks{0};
  step_batch batch;
  batch.add(tokens, 0, blocks, true);
  thread_pool pool(1);
  no_collective solo;

  auto run = [&](std::vector<shard_spec> stages) {
    std::vector<float> hidden(tokens.size() * m.config.dim), logits(m.config.vocab_size, NAN);
    for (const shard_spec& spec : stages) {
      kv_cache cache(transformer_shard::cache_shape(m.config, spec, 1, 16));
      transformer_shard shard(m, spec, cache, pool, solo);
      shard.forward(batch, hidden.data(), shard.is_last_stage() ? logits.data() : nullptr);
    }
    return logits;
  };
  shard_spec whole;
  shard_spec first{0, 2, {}}, second{2, 5, {}};
  const auto a = run({whole});
  const auto b = run({first, second});
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("an aborted collective releases a rank waiting for a peer that died, and stays aborted") {
  local_collective_group group(3);
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  std::atomic<int> thrown{0};
  auto rank = [&](int32_t r, std::vector<float>& data) {
    try {
      group.member(r).all_reduce_sum(data.data(), 8);
    } catch (const collective_aborted&) {
      ++thrown;
    }
  };
  std::thread t0(rank, 0, std::ref(a)), t1(rank, 1, std::ref(b));  // rank 2 never comes
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  group.abort();
  t0.join();
  t1.join();
  CHECK(thrown == 2);
  CHECK_THROWS_AS(group.member(2).all_reduce_sum(a.data(), 8), collective_aborted);
}

}  // namespace troupe
