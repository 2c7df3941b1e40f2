// The one rule of who chooses a step's tokens (engine/serve/step_choices.hpp).
#include "engine/serve/step_choices.hpp"

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

scheduler_config config() {
  scheduler_config c;
  c.kv.num_blocks = 64;
  c.kv.block_size = 4;
  c.context = 512;
  c.vocab = 512;
  return c;
}

request_params params(float temperature, uint64_t seed, int32_t logprobs = -1) {
  request_params p;
  p.prompt = {1, 300, 301};
  p.sampling.temperature = temperature;
  p.sampling.seed = seed;
  p.sampling.logprobs = logprobs;
  p.max_tokens = 10;
  return p;
}

}  // namespace

TEST_CASE("step choices: the shard chooses when every row needs only its logits, with the uniform each sampler would draw") {
  scheduler s(config(), test::tok512());
  REQUIRE(s.add(request_id{1}, params(0.0f, 0)).has_value());
  REQUIRE(s.add(request_id{2}, params(0.8f, 42)).has_value());
  const step_plan plan = s.schedule();
  REQUIRE(plan.num_samples() == 2);
  const auto choices = shard_choices(plan, s);
  REQUIRE(choices.size() == 2);
  CHECK(choices[0].how.temperature == 0.0f);
  CHECK(choices[1].how.temperature == 0.8f);
  // The uniform is the next of the request's own stream: a sampler seeded alike draws it.
  rng same(42);
  CHECK(choices[1].u == same.uniform());
  const auto by_chunk = shard_choices_by_chunk(plan, s);
  REQUIRE(by_chunk.size() == plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) CHECK(by_chunk[i].has_value() == plan.chunks[i].sample);
  // Replayed, each sampler has drawn that uniform: the next choice takes the one after.
  const std::vector<int32_t> chosen{7, 9};
  const auto samples = replay_chosen(plan, s, chosen);
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].token == 7);
  CHECK(samples[1].token == 9);
  CHECK(s.find(request_id{2})->smp.next_choice().u == same.uniform());
}

TEST_CASE("step choices: one row that needs the sampler's own state brings every row's logits back") {
  scheduler s(config(), test::tok512());
  REQUIRE(s.add(request_id{1}, params(0.0f, 0)).has_value());
  REQUIRE(s.add(request_id{2}, params(0.0f, 0, 0)).has_value());  // log-probabilities: computed here
  const step_plan plan = s.schedule();
  REQUIRE(plan.num_samples() == 2);
  CHECK(shard_choices(plan, s).empty());
  for (const auto& c : shard_choices_by_chunk(plan, s)) CHECK_FALSE(c.has_value());
  // Chosen here instead, from the rows: greedy picks each row's largest logit.
  std::vector<float> logits(2 * 512, 0.0f);
  logits[5] = 3.0f;
  logits[512 + 11] = 2.0f;
  const auto samples = sample_rows(plan, s, logits.data(), 512);
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].token == 5);
  CHECK(samples[1].token == 11);
  CHECK(samples[1].logprob < 0.0f);  // the row asked for it
}

TEST_CASE("step choices: a request cancelled while its step ran keeps its row, and nothing records it") {
  scheduler s(config(), test::tok512());
  REQUIRE(s.add(request_id{1}, params(0.0f, 0)).has_value());
  REQUIRE(s.add(request_id{2}, params(0.0f, 0)).has_value());
  const step_plan plan = s.schedule();
  REQUIRE(s.abort(request_id{2}).has_value());
  const std::vector<int32_t> chosen{4, 6};
  const auto samples = replay_chosen(plan, s, chosen);
  REQUIRE(samples.size() == 2);
  CHECK(samples[1].token == 6);
  std::vector<float> logits(2 * 512, 0.0f);
  CHECK(sample_rows(plan, s, logits.data(), 512).size() == 2);
}

}  // namespace troupe
