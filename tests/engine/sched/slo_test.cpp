// SLO classes: the step-time fit and its predictions, the queue's order by priority and
// deadline, early refusal of what cannot meet its class's targets, and how a finished
// request is judged.
#include "engine/sched/slo.hpp"

#include <doctest/doctest.h>

#include "engine/sched/scheduler.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

scheduler_config with_classes(int32_t max_running = 1) {
  scheduler_config c;
  c.max_step_tokens = 64;
  c.kv.num_blocks = 256;
  c.kv.block_size = 4;
  c.max_running = max_running;
  c.context = 512;
  c.vocab = 512;
  c.classes = {{"chat", 500, 50, 0}, {"batch", 60000, 0, 1}, {"bulk", 0, 200, 1}};
  return c;
}

request_params prompt_of(int32_t n, const std::string& cls, double arrival_ms = 0) {
  request_params p;
  for (int32_t i = 0; i < n; ++i) p.prompt.push_back(300 + i % 100);
  p.sampling.temperature = 0.0f;
  p.max_tokens = 8;
  p.slo_class = cls;
  p.arrival_ms = arrival_ms;
  return p;
}

// Feeds `steps` steps of step_ms = base + per_token * tokens, at a few sizes.
void teach(slo_estimator& e, double base, double per_token, int steps = 20) {
  for (int i = 0; i < steps; ++i) {
    const int32_t tokens = 1 + (i % 4) * 20;
    e.observe(tokens, base + per_token * tokens);
  }
}

}  // namespace

TEST_CASE("slo estimator: predicts nothing until it has seen steps, then fits base and per-token times") {
  slo_estimator e;
  CHECK_FALSE(e.line());
  CHECK_FALSE(e.ttft_ms(100, 64));
  teach(e, 2.0, 0.5, slo_estimator::min_steps - 1);
  CHECK_FALSE(e.line());
  teach(e, 2.0, 0.5, 30);
  auto f = e.line();
  REQUIRE(f);
  CHECK(f->base_ms == doctest::Approx(2.0).epsilon(0.01));
  CHECK(f->per_token_ms == doctest::Approx(0.5).epsilon(0.01));
  // 200 tokens at 64 a step: 4 full steps of 2 + 32 ms.
  CHECK(*e.ttft_ms(200, 64) == doctest::Approx(4 * 34.0).epsilon(0.01));
  // With 16 requests decoding, 48 a step: 5 full steps; 10 tokens: one step of 26 rows.
  CHECK(*e.ttft_ms(200, 64, 16) == doctest::Approx(5 * 34.0).epsilon(0.01));
  CHECK(*e.ttft_ms(10, 64, 16) == doctest::Approx(2.0 + 13).epsilon(0.01));
  // The latest steps carried prompt chunks (up to 61 tokens, 32.5 ms): a token now takes
  // about their mean, more than 8 decoding rows alone would cost.
  CHECK(e.recent_ms() > 10);
  CHECK(*e.tpot_ms(8) == doctest::Approx(e.recent_ms()));
  // Decoding alone lately (steps of 1 and 8 rows, 4.25 ms on average): the line's time for
  // 8 rows. The mean forgets the chunks over about a request's decoding, not in a few steps.
  auto decode_only = [&e](int steps) {
    for (int i = 0; i < steps; ++i) e.observe(1 + (i % 2) * 7, 2.0 + 0.5 * (1 + (i % 2) * 7));
  };
  decode_only(4);
  CHECK(e.recent_ms() > 10);
  decode_only(150);
  CHECK(e.recent_ms() == doctest::Approx(4.25).epsilon(0.05));
  CHECK(*e.tpot_ms(8) == doctest::Approx(2.0 + 4).epsilon(0.05));
  // Steps of one size: all of their time is taken as the tokens'.
  slo_estimator same;
  for (int i = 0; i < 10; ++i) same.observe(10, 5.0);
  REQUIRE(same.line());
  CHECK(same.line()->base_ms == 0);
  CHECK(same.line()->per_token_ms == doctest::Approx(0.5));
  // Nonsense is ignored.
  same.observe(0, 1.0);
  same.observe(5, -1.0);
  CHECK(same.steps() == 10);
  // Recent steps weigh more: the replica got slower.
  teach(e, 2.0, 2.0, 200);
  CHECK(e.line()->per_token_ms == doctest::Approx(2.0).epsilon(0.05));
}

TEST_CASE("slo classes: the queue runs by priority, then deadline, then arrival") {
  scheduler s(with_classes(), test::tok512());
  // batch (priority 1) first, then chat at 100 ms (due 600), chat at 0 ms (due 500).
  REQUIRE(s.add(request_id{1}, prompt_of(4, "batch", 0)).has_value());
  REQUIRE(s.add(request_id{2}, prompt_of(4, "chat", 100)).has_value());
  REQUIRE(s.add(request_id{3}, prompt_of(4, "chat", 0)).has_value());
  std::vector<uint64_t> order;
  for (int i = 0; i < 3; ++i) {
    const step_plan p = s.schedule();
    REQUIRE(p.chunks.size() == 1);
    order.push_back(p.chunks[0].id.value);
    s.abort(p.chunks[0].id);
  }
  CHECK(order == std::vector<uint64_t>{3, 2, 1});
}

TEST_CASE("slo classes: a class that does not exist, or classes where none are declared, are refused by name") {
  scheduler s(with_classes(), test::tok512());
  auto bad = s.add(request_id{1}, prompt_of(4, "gold"));
  REQUIRE_FALSE(bad);
  CHECK(bad.err().message.find("class 'gold' does not exist (the classes: chat, batch and bulk)") != std::string::npos);
  auto cfg = with_classes();
  cfg.classes.clear();
  scheduler none(cfg, test::tok512());
  auto no = none.add(request_id{1}, prompt_of(4, "chat"));
  REQUIRE_FALSE(no);
  CHECK(no.err().message.find("no SLO classes") != std::string::npos);
  CHECK(none.add(request_id{2}, prompt_of(4, "")).has_value());
}

TEST_CASE("slo admission: refuses early what its class cannot meet here, names why, and admits the rest") {
  auto cfg = with_classes(8);
  cfg.slo_admission = true;
  scheduler s(cfg, test::tok512());
  // Nothing measured yet: nothing is refused.
  CHECK_FALSE(s.slo_refusal(prompt_of(400, "chat")));
  for (int i = 0; i < 20; ++i) s.observe_step(1 + (i % 4) * 20, 2.0 + 0.5 * (1 + (i % 4) * 20));
  // 100 tokens: 2 steps of 2 ms + 50 ms, within chat's 500 ms.
  CHECK_FALSE(s.slo_refusal(prompt_of(100, "chat")));
  // Queue 1,200 prompt tokens of chat: the next chat prompt would wait past its target...
  for (uint64_t id = 1; id <= 3; ++id) REQUIRE(s.add(request_id{id}, prompt_of(400, "chat")).has_value());
  auto why = s.slo_refusal(prompt_of(100, "chat"));
  REQUIRE(why);
  CHECK(why->find("class 'chat'") != std::string::npos);
  CHECK(why->find("1300 prompt tokens") != std::string::npos);
  CHECK(why->find("past its target of 500 ms") != std::string::npos);
  // ... while batch, behind all of chat anyway, has a minute; and a class without a TTFT
  // target is judged by its tokens' time only.
  CHECK_FALSE(s.slo_refusal(prompt_of(100, "batch")));
  CHECK_FALSE(s.slo_refusal(prompt_of(100, "bulk")));
  // Decoding with 8 requests: 2 + 0.5 * 8 = 6 ms a token; a 5 ms target cannot be met.
  auto tight = cfg;
  tight.classes[2].tpot_ms = 5;
  scheduler t(tight, test::tok512());
  for (int i = 0; i < 20; ++i) t.observe_step(1 + (i % 4) * 20, 2.0 + 0.5 * (1 + (i % 4) * 20));
  for (int i = 0; i < 150; ++i) t.observe_step(8, 2.0 + 0.5 * 8);  // decoding alone lately
  for (uint64_t id = 1; id <= 7; ++id) REQUIRE(t.add(request_id{id}, prompt_of(4, "")).has_value());
  (void)t.schedule();
  auto slow = t.slo_refusal(prompt_of(4, "bulk"));
  REQUIRE(slow);
  CHECK(slow->find("with 8 requests decoding, a token would take about 6 ms, past its target of 5 ms") != std::string::npos);
  // Prefilled here and decoded on another replica: this replica's decoding pace is not its.
  auto prefill_only = prompt_of(4, "bulk");
  prefill_only.kv_to = "d0";
  CHECK_FALSE(t.slo_refusal(prefill_only));
  // A request moved off a lost replica, with output delivered, is not turned away.
  auto moved = prompt_of(100, "chat");
  moved.delivered = {5, 6};
  CHECK(s.slo_refusal(prompt_of(100, "chat")));
  CHECK_FALSE(s.slo_refusal(moved));
  // Admission off: nothing is refused.
  auto off = cfg;
  off.slo_admission = false;
  scheduler o(off, test::tok512());
  for (int i = 0; i < 20; ++i) o.observe_step(10, 1000.0);
  CHECK_FALSE(o.slo_refusal(prompt_of(100, "chat")));
}

TEST_CASE("slo classes: a request that names none takes the default class") {
  auto cfg = with_classes(8);
  cfg.default_class = 0;
  cfg.slo_admission = true;
  scheduler s(cfg, test::tok512());
  for (int i = 0; i < 20; ++i) s.observe_step(10, 100.0);  // 10 ms a token
  CHECK(s.slo_refusal(prompt_of(100, "")));                 // 1 s for 100 tokens: past chat's 500 ms
  CHECK_FALSE(s.slo_refusal(prompt_of(100, "batch")));
  REQUIRE(s.add(request_id{1}, prompt_of(4, "", 0)).has_value());
  CHECK(s.find(request_id{1})->slo.cls == 0);
  CHECK(s.find(request_id{1})->slo.deadline_ms == 500);
}

TEST_CASE("slo judge: met within both targets, missed past either, a one-token answer has no TPOT") {
  const slo_class c{"chat", 500, 50, 0};
  CHECK(slo_judge(c, 400, 400 + 9 * 50, 10) == slo_outcome::met);
  CHECK(slo_judge(c, 501, 600, 3) == slo_outcome::missed);
  CHECK(slo_judge(c, 100, 100 + 9 * 51, 10) == slo_outcome::missed);
  CHECK(slo_judge(c, 100, 5000, 1) == slo_outcome::met);
  CHECK(slo_judge(c, -1, 10, 0) == slo_outcome::missed);  // no token at all
  CHECK(slo_judge(slo_class{"any", 0, 0, 0}, 9999, 99999, 5) == slo_outcome::met);
  CHECK(std::string(slo_outcome_name(slo_outcome::refused)) == "refused");
}

}  // namespace troupe
