// The step path (engine/serve/step_path.hpp) on its own, as the scheduler actor drives it
// with drafts elsewhere: orders for the requests that decode, none without a proposer at
// hand, a failed exchange dropping the drafts; a proposer here told whom to forget; the
// feature rows a last stage returns put in their batch rows. (The engine
// loop and the actors run it end to end: llm_engine_test, speculative_test,
// scheduler_actor_test.)
#include "engine/serve/step_path.hpp"

#include <algorithm>
#include <memory>

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

scheduler_config path_config() {
  scheduler_config c;
  c.kv.num_blocks = 64;
  c.kv.block_size = 4;
  c.context = 512;
  c.vocab = 512;
  return c;
}

model_config path_dims() {
  model_config m;
  m.dim = 2;
  m.vocab_size = 512;
  m.num_layers = 1;
  m.num_heads = 1;
  return m;
}

step_path::drafts drafts_elsewhere() {
  step_path::drafts d;
  d.spec.method = spec_method::draft;
  d.spec.k = 3;
  d.elsewhere = true;
  return d;
}

request_params greedy_params(int32_t max_tokens) {
  request_params p;
  p.prompt = {1, 300, 301};
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

// One step through the path with the shard choosing `token` for every row.
std::vector<step_output> path_step(step_path& path, scheduler& s, int32_t token, bool drafts_at_hand = true) {
  path.plan_drafts(drafts_at_hand);
  step_plan plan = s.schedule();
  if (auto order = path.draft(plan, drafts_at_hand)) path.give_up(plan, path.session() + 1);
  (void)path.ready(plan);
  const std::vector<int32_t> chosen(static_cast<size_t>(plan.num_logit_rows()), token);
  step_tokens got = path.tokens_chosen(plan, chosen);
  return path.finish(plan, got, {}, {});
}

}  // namespace

TEST_CASE("step path: decoding requests are ordered drafts elsewhere, and none go without a proposer at hand") {
  const model_config m = path_dims();
  scheduler s(path_config(), test::tok512());
  step_path path(s, m, drafts_elsewhere());
  REQUIRE(s.add(request_id{1}, greedy_params(10)).has_value());
  path_step(path, s, 7);  // the prompt, and a first token

  // Decoding: its draft slots go out as an order, its tokens whole the first time.
  path.plan_drafts(true);
  step_plan plan = s.schedule();
  auto order = path.draft(plan, true);
  REQUIRE(order.has_value());
  REQUIRE(order->slots.size() == 1);
  CHECK(order->slots[0].id == request_id{1});
  CHECK(order->slots[0].from == 0);
  CHECK(order->slots[0].tokens == std::vector<int32_t>{1, 300, 301, 7});
  CHECK(plan.chunks[0].num_draft > 0);  // (claimed; filled when the answer comes)
  // The exchange failed: the plan goes without drafts, in a new session.
  const uint64_t session = path.session();
  path.give_up(plan, session + 1);
  CHECK(plan.chunks[0].num_draft == 0);
  CHECK(path.session() == session + 1);
  step_tokens got = path.tokens_chosen(plan, std::vector<int32_t>(static_cast<size_t>(plan.num_logit_rows()), 8));
  (void)path.finish(plan, got, {}, {});

  // Without the proposer at hand, no slots are planned and nothing is ordered.
  path.plan_drafts(false);
  step_plan bare = s.schedule();
  CHECK_FALSE(path.draft(bare, false).has_value());
  CHECK(bare.chunks.at(0).num_draft == 0);
}

// A proposer here that drafts nothing and remembers whom it was told to forget.
struct forgetful_proposer final : proposer {
  std::vector<request_id> forgotten;
  int resets = 0;
  void propose(std::span<draft_slot>) override {}
  void forget(request_id id) override { forgotten.push_back(id); }
  void forget_all() override { ++resets; }
};

TEST_CASE("step path: the proposer forgets a request that finished, a request aborted, and all of them on a reset") {
  const model_config m = path_dims();
  scheduler s(path_config(), test::tok512());
  step_path::drafts d;
  d.spec.method = spec_method::ngram;
  auto here = std::make_unique<forgetful_proposer>();
  forgetful_proposer& p = *here;
  d.here = std::move(here);
  step_path path(s, m, std::move(d));
  REQUIRE(s.add(request_id{1}, greedy_params(2)).has_value());
  REQUIRE(s.add(request_id{2}, greedy_params(10)).has_value());
  path_step(path, s, 7);
  CHECK(p.forgotten.empty());
  bool finished = false;
  for (const step_output& o : path_step(path, s, 9)) finished |= o.id == request_id{1} && o.finished;
  REQUIRE(finished);
  CHECK(p.forgotten == std::vector<request_id>{request_id{1}});
  path.forget(request_id{2});  // (aborted by its caller)
  CHECK(p.forgotten.back() == request_id{2});
  path.reset();
  CHECK(p.resets == 1);
}

TEST_CASE("step path: the feature rows a last stage returns land in their chunks' last batch rows") {
  const model_config m = path_dims();
  scheduler s(path_config(), test::tok512());
  step_path path(s, m, drafts_elsewhere());
  step_plan plan;
  plan.chunks.resize(2);
  plan.chunks[0].count = 3;
  plan.chunks[1].count = 2;
  plan.num_tokens = 5;
  const std::vector<int32_t> wanted = {1, 2};
  const std::vector<float> features = {10, 11, 20, 21, 30, 31};  // three rows of dim 2
  const auto rows = path.spread_features(plan, wanted, features);
  REQUIRE(rows.size() == 10);
  // Chunk 0's last row is batch row 2; chunk 1's two rows are 3 and 4.
  CHECK(rows[4] == 10);
  CHECK(rows[5] == 11);
  CHECK(rows[6] == 20);
  CHECK(rows[7] == 21);
  CHECK(rows[8] == 30);
  CHECK(rows[9] == 31);
  CHECK(path.spread_features(plan, {}, features).empty());
}

}  // namespace troupe
