// The one rule of who chooses a step's tokens (engine/serve/step_choices.hpp).
#include "engine/serve/step_choices.hpp"

#include <algorithm>

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
  const auto samples = replay_chosen(plan, s, chosen, {}).samples;
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
  const auto samples = sample_rows(plan, s, logits.data(), 512, {}).samples;
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
  const auto samples = replay_chosen(plan, s, chosen, {}).samples;
  REQUIRE(samples.size() == 2);
  CHECK(samples[1].token == 6);
  std::vector<float> logits(2 * 512, 0.0f);
  CHECK(sample_rows(plan, s, logits.data(), 512, {}).samples.size() == 2);
}

namespace {

// Proposes the same tokens for every request.
class fixed_proposer final : public proposer {
 public:
  explicit fixed_proposer(std::vector<int32_t> t) : tokens_(std::move(t)) {}
  void propose(std::span<draft_slot> slots) override {
    for (draft_slot& s : slots) s.tokens.assign(tokens_.begin(), tokens_.begin() + std::min<size_t>(s.max_tokens, tokens_.size()));
  }

 private:
  std::vector<int32_t> tokens_;
};

// A scheduler whose requests have had their prompts computed and decode next, with draft
// slots planned (k 3) and filled by `p`.
step_plan decoding_plan(scheduler& s, proposer& p, std::vector<draft_slot>& slots) {
  step_plan prefill = s.schedule();
  std::vector<sample_result> first(static_cast<size_t>(prefill.num_samples()));
  for (auto& f : first) f.token = 40;
  s.update_from_output(prefill, first);
  speculative_config sc;
  sc.method = spec_method::ngram;
  plan_drafts(s.running(), sc, 512);
  step_plan plan = s.schedule();
  fill_drafts(plan, s, p, slots);
  return plan;
}

}  // namespace

TEST_CASE("step choices: greedy drafts are chosen on the shard, a row each, and verified from the ids") {
  scheduler s(config(), test::tok512());
  REQUIRE(s.add(request_id{1}, params(0.0f, 0)).has_value());
  REQUIRE(s.add(request_id{2}, params(0.0f, 0)).has_value());
  fixed_proposer p({50, 51, 52});
  std::vector<draft_slot> slots;
  const step_plan plan = decoding_plan(s, p, slots);
  REQUIRE(plan.chunks.size() == 2);
  for (const auto& c : plan.chunks) {
    REQUIRE(c.num_draft == 3);
    CHECK(std::vector<int32_t>(c.draft.begin(), c.draft.end()) == std::vector<int32_t>{50, 51, 52});
  }
  REQUIRE(plan.num_logit_rows() == 8);
  const auto choices = shard_choices(plan, s);
  REQUIRE(choices.size() == 8);
  for (const auto& c : choices) CHECK(c.how.temperature == 0.0f);
  // Request 1: the argmax agrees with the first draft only; request 2: with all three.
  const std::vector<int32_t> chosen{50, 7, 8, 9, 50, 51, 52, 60};
  const step_tokens got = replay_chosen(plan, s, chosen, {});
  CHECK(got.emitted == std::vector<int32_t>{2, 4});
  std::vector<int32_t> tokens;
  for (const auto& x : got.samples) tokens.push_back(x.token);
  CHECK(tokens == std::vector<int32_t>{50, 7, 50, 51, 52, 60});
  CHECK(got.spec.verifies == 2);
  CHECK(got.spec.proposed == 6);
  CHECK(got.spec.accepted == 4);
  CHECK(got.spec.by_accepted[1] == 1);
  CHECK(got.spec.by_accepted[3] == 1);
}

TEST_CASE("step choices: a sampled request's drafts bring the logits back, and the sampler verifies its rows") {
  scheduler s(config(), test::tok512());
  REQUIRE(s.add(request_id{1}, params(0.0f, 0)).has_value());
  REQUIRE(s.add(request_id{2}, params(0.7f, 5)).has_value());
  fixed_proposer p({50, 51});
  std::vector<draft_slot> slots;
  const step_plan plan = decoding_plan(s, p, slots);
  REQUIRE(plan.num_logit_rows() == 6);
  CHECK(shard_choices(plan, s).empty());
  for (const auto& c : shard_choices_by_chunk(plan, s)) CHECK_FALSE(c.has_value());
  // Each row puts all its mass on one token: request 1's rows say 50, 51, 9 (both drafts
  // kept, then 9); request 2's say 50, 30, 31 (50 kept; 51 has no mass: rejected, and the
  // residual is all on 30).
  std::vector<float> logits(6 * 512, -1e4f);
  const int32_t peaks[] = {50, 51, 9, 50, 30, 31};
  for (int32_t r = 0; r < 6; ++r) logits[static_cast<size_t>(r) * 512 + peaks[r]] = 10.0f;
  const step_tokens got = sample_rows(plan, s, logits.data(), 512, {});
  CHECK(got.emitted == std::vector<int32_t>{3, 2});
  std::vector<int32_t> tokens;
  for (const auto& x : got.samples) tokens.push_back(x.token);
  CHECK(tokens == std::vector<int32_t>{50, 51, 9, 50, 30});
  CHECK(got.spec.verifies == 2);
  CHECK(got.spec.proposed == 4);
  CHECK(got.spec.accepted == 3);
}

}  // namespace troupe
