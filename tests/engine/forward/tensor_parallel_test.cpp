// TP=2 shards of one model, summed through the collective, against TP=1.
#include <cmath>
#include <atomic>
#include <thread>

#include <doctest/doctest.h>

#include "engine/forward/transformer_shard.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "kernels/cpu/argmax.hpp"
#include "tests/support/tensor_parallel.hpp"
#include "tests/support/test_support.hpp"
#include "tests/support/tolerance.hpp"

namespace troupe {

namespace {

using test::tp_run;

// Prompt-then-greedy steps on `tp` CPU shards (threads of this process).
tp_run run_tp(const model& m, int32_t tp, std::vector<int32_t> prompt, int32_t steps) {
  const std::vector<block_id> blocks = test::blocks_for(static_cast<int32_t>(prompt.size()) + steps);
  local_collective_group group(tp);
  std::vector<std::unique_ptr<kv_cache>> caches;
  std::vector<std::unique_ptr<thread_pool>> pools;
  std::vector<std::unique_ptr<transformer_shard>> shards;
  std::vector<forward_shard*> ranks;
  for (int32_t r = 0; r < tp; ++r) {
    shard_spec spec;
    spec.tp = {r, tp};
    caches.push_back(std::make_unique<kv_cache>(transformer_shard::cache_shape(m.config, spec, static_cast<int32_t>(blocks.size()), 16)));
    pools.push_back(std::make_unique<thread_pool>(1));
    shards.push_back(std::make_unique<transformer_shard>(m, spec, *caches[r], *pools[r], group.member(r)));
    ranks.push_back(shards.back().get());
  }
  return test::run_steps(ranks, m.config, std::move(prompt), steps, blocks);
}

void check_close(const tp_run& a, const tp_run& b) {
  const double worst = test::worst_relative_difference(a, b);
  CAPTURE(worst);
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("TP=2 logits stay within 1e-5 of TP=1 on a random synthetic model (f32 and q8_0)") {
  test::temp_dir dir;
  const model_config c = test::splittable_config();
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

TEST_CASE("TP=2 logits stay within 1e-5 of TP=1 for every family: biases, windows and scaled rope split too") {
  test::temp_dir dir;
  for (model_family f : {model_family::llama, model_family::qwen2, model_family::mistral}) {
    CAPTURE(family_name(f));
    model_config c = test::splittable_config();
    c.family = f;
    c.rope = rope_layout::halves;
    c.qkv_bias = f == model_family::qwen2;
    c.sliding_window = f == model_family::mistral ? 5 : 0;
    if (f == model_family::llama) c.rope_scale = {rope_scaling_type::llama3, 8.0f, 1.0f, 4.0f, 16};
    const std::string path = dir.file(family_name(f));
    REQUIRE(write_hf_dir(path, {c, dtype::f32, 32, false}, random_weights(11, true)).has_value());
    auto m = load_model(path);
    REQUIRE_MESSAGE(m.has_value(), (m ? "" : m.err().message));
    const std::vector<int32_t> prompt{1, 17, 200, 45, 99, 3, 250, 8, 31};
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
  const std::vector<block_id> blocks = test::block_ids({0});
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
  CHECK(test::same_finite_bits(a, b));
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
  while (group.num_waiting() < 2) std::this_thread::yield();      // both wait for it
  group.abort();
  t0.join();
  t1.join();
  CHECK(thrown == 2);
  CHECK_THROWS_AS(group.member(2).all_reduce_sum(a.data(), 8), collective_aborted);
}

}  // namespace troupe
