#include "actors/wire/step_codec.hpp"

#include <cmath>
#include <limits>
#include <tuple>

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/wire/activations_codec.hpp"
#include "actors/wire/frame.hpp"
#include "engine/sample/rng.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/speculative/speculative.hpp"
#include "schema/step.capnp.h"
#include "tests/actors/wire/step_codec_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe::wire {


TEST_CASE("plans of a scheduler run, preemptions included, arrive at the stage as the engine built them") {
  scheduler s(small_scheduler(), test::tok512());
  rng r(3);
  for (uint64_t id = 0; id < 10; ++id) {
    request_params p;
    for (int i = 0; i < 3 + static_cast<int>(r.next() % 9); ++i) p.prompt.push_back(3 + static_cast<int32_t>(r.next() % 500));
    p.max_tokens = 4 + static_cast<int32_t>(r.next() % 12);
    p.ignore_eos = true;
    REQUIRE(s.add(request_id{id}, p).has_value());
  }
  step_encoder enc;
  step_decoder dec(limits());
  std::vector<request_id> released;
  int preemptions = 0;
  for (int step = 0; s.has_unfinished() && step < 500; ++step) {
    const step_plan plan = s.schedule();
    preemptions += static_cast<int>(plan.preempted.size());
    const auto bytes = enc.encode(plan, released);
    released.clear();
    auto d = dec.decode(bytes);
    REQUIRE_MESSAGE(d.has_value(), (d ? "" : d.err().message));
    REQUIRE(d->batch.sequences.size() == plan.chunks.size());
    size_t tok = 0;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const auto& c = plan.chunks[i];
      const auto& q = d->batch.sequences[i];
      CHECK(d->ids[i] == c.id);
      CHECK(q.start_pos == c.first);
      CHECK(q.num_tokens == c.count);
      CHECK(q.logit_rows == (c.sample ? 1 : 0));
      CHECK(test::block_values(q.block_table) == test::block_values(c.block_table));
      for (int32_t t : c.tokens) CHECK(d->batch.tokens[tok++] == t);
    }
    std::vector<sample_result> samples(plan.num_samples());
    for (auto& x : samples) x.token = 3 + static_cast<int32_t>(r.next() % 500);
    for (const auto& o : s.update_from_output(plan, samples))
      if (o.finished) released.push_back(o.id);
  }
  CHECK_FALSE(s.has_unfinished());
  CHECK(preemptions > 0);
  enc.encode(step_plan{}, released);
  CHECK(dec.decode(enc.encode(step_plan{}, {})).has_value());
}

TEST_CASE("out-of-range ids, tokens and positions are rejected, and leave the decoder as it was") {
  step_decoder dec(limits());
  REQUIRE(dec.decode(one_chunk(1, 7, 0, {5, 6, 7}, {0}, true)).has_value());
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::string& part) {
    auto d = dec.decode(bytes);
    REQUIRE_FALSE(d.has_value());
    CAPTURE(d.err().message);
    CHECK(d.err().message.find(part) != std::string::npos);
  };
  expect(one_chunk(2, 7, 3, {600}, {}, false), "outside the vocabulary");
  expect(one_chunk(2, 7, 3, {-1}, {}, false), "outside the vocabulary");
  expect(one_chunk(2, 7, 3, {5}, {12}, false), "outside the pool");
  expect(one_chunk(2, 8, 0, {5}, {}, false), "unknown request");
  expect(one_chunk(2, 7, 4, {5}, {}, false), "does not cover");
  expect(one_chunk(2, 7, 511, {5, 6}, {1}, false), "outside the context");
  expect(one_chunk(2, 7, -3, {5}, {}, false), "outside the context");
  expect(one_chunk(2, 7, 3, {}, {}, false), "no tokens");
  {
    auto bytes = one_chunk(2, 7, 3, {5}, {}, false);
    capnp::MallocMessageBuilder msg;
    auto frame = frame_reader::parse(bytes, frame_limits::flat(1 << 16));
    REQUIRE(frame.has_value());
    msg.setRoot((*frame)->root<schema::StepPlan>());
    msg.getRoot<schema::StepPlan>().getChunks()[0].setEvicted(4);
    expect(to_bytes(msg), "4 tokens evicted before position 3");
  }
  expect(one_chunk(2, 7, 3, std::vector<int32_t>(65, 5), std::vector<uint32_t>(11, 1), false), "exceeds");
  expect(one_chunk(1, 7, 3, {5}, {}, false), "does not follow");
  // None of that changed the table: request 7 still has one block and continues.
  auto ok = dec.decode(one_chunk(2, 7, 3, {5}, {}, false));
  REQUIRE(ok.has_value());
  CHECK(ok->batch.sequences[0].block_table.size() == 1);
  CHECK(dec.num_known_requests() == 1);
}

TEST_CASE("truncated, oversized and corrupted frames are errors, never crashes") {
  const auto good = one_chunk(1, 7, 0, {5, 6, 7}, {0}, true);
  for (size_t n = 0; n < good.size(); ++n) {
    step_decoder dec(limits());
    CHECK_FALSE(dec.decode(std::span(good).first(n)).has_value());
  }
  // A segment count of 0xFFFFFFFF (Cap'n Proto 0.9.2 overflows on it).
  auto huge = good;
  huge[0] = huge[1] = huge[2] = huge[3] = 0xff;
  {
    step_decoder dec(limits());
    auto d = dec.decode(huge);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.err().message.find("segments") != std::string::npos);
  }
  // Random corruption: whatever the bytes say, decode returns (an error or a checked plan).
  rng r(11);
  int rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    auto bad = good;
    const int flips = 1 + static_cast<int>(r.next() % 4);
    for (int f = 0; f < flips; ++f) bad[r.next() % bad.size()] ^= static_cast<uint8_t>(1u << (r.next() % 8));
    step_decoder dec(limits());
    auto d = dec.decode(bad);
    if (!d) {
      ++rejected;
      continue;
    }
    for (const auto& q : d->batch.sequences) {
      CHECK(q.start_pos >= 0);
      for (block_id b : q.block_table) CHECK(b.value < 12u);
    }
    for (int32_t t : d->batch.tokens) CHECK((t >= 0 && t < 512));
  }
  CHECK(rejected > 0);
}

TEST_CASE("a plan that resets every table starts a session, and plans of an older session are refused") {
  step_decoder d(limits());
  REQUIRE(d.decode(one_chunk(0, 7, 0, {1, 2, 3}, {0}, true, 100, true)).has_value());
  REQUIRE(d.decode(one_chunk(1, 7, 3, {4}, {1}, false, 100)).has_value());
  CHECK(d.num_known_requests() == 1);
  // A recovering scheduler: new session, step ids from 0 again, every table forgotten.
  REQUIRE(d.decode(one_chunk(0, 9, 0, {5, 6}, {2}, true, 101, true)).has_value());
  CHECK(d.num_known_requests() == 1);
  auto stale = d.decode(one_chunk(2, 7, 4, {8}, {}, false, 100));
  REQUIRE_FALSE(stale.has_value());
  CHECK(stale.err().message.find("stale") != std::string::npos);
  // A reset plan must send each table whole.
  auto partial = d.decode(one_chunk(1, 9, 2, {7}, {}, false, 102, true));
  CHECK_FALSE(partial.has_value());
  CHECK(d.decode(one_chunk(1, 9, 2, {7}, {}, false, 101)).has_value());
}

TEST_CASE("the encoder's restart makes its next plan reset the stages under the new session") {
  scheduler_config cfg;
  cfg.kv.num_blocks = 12;
  cfg.kv.block_size = 4;
  cfg.context = 512;
  cfg.vocab = 512;
  scheduler s(cfg, test::tok512());
  request_params p;
  p.prompt = {1, 5, 6, 7, 8};
  p.max_tokens = 8;
  REQUIRE(s.add(request_id{1}, p).has_value());
  step_encoder enc;
  step_decoder d(limits());
  enc.restart(42);
  const step_plan first = s.schedule();
  REQUIRE(d.decode(enc.encode(first, {})).has_value());
  std::vector<sample_result> one(1);
  one[0].token = 9;
  (void)s.update_from_output(first, one);
  // Lost a stage: the scheduler forgets its KV, the encoder restarts; the plan resends the table.
  s.reset_kv();
  enc.restart(43);
  const step_plan again = s.schedule();
  REQUIRE(again.chunks.size() == 1);
  CHECK(again.chunks[0].first == 0);
  step_decoder fresh(limits());  // a restarted stage knows nothing
  auto out = fresh.decode(enc.encode(again, {}));
  REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.err().message));
  CHECK(out->batch.num_tokens() == 6);
  // A stage that missed the reset (still in session 42) refuses the session's later plans.
  CHECK_FALSE(d.decode(enc.encode(again, {})).has_value());
}

TEST_CASE("choices travel with their sampled chunks, and a plan where one sampled chunk has none returns logits") {
  scheduler s(small_scheduler(), test::tok512());
  for (uint64_t id = 0; id < 3; ++id) {
    request_params p;
    p.prompt = {1, 5, 9, static_cast<int32_t>(20 + id)};
    p.max_tokens = 4;
    REQUIRE(s.add(request_id{id}, p).has_value());
  }
  const step_plan plan = s.schedule();
  REQUIRE(plan.num_samples() == 3);
  std::vector<std::optional<token_choice>> choices(plan.chunks.size());
  for (size_t i = 0; i < choices.size(); ++i)
    choices[i] = token_choice{{0.5f + static_cast<float>(i), static_cast<int32_t>(i), 0.9f, 0.01f}, 0.25f * static_cast<float>(i)};
  step_encoder enc;
  {
    step_decoder dec(limits());
    auto d = dec.decode(enc.encode(plan, {}, choices));
    REQUIRE(d.has_value());
    REQUIRE(d->choices.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(d->chosen_ids[i] == plan.chunks[i].id);
      CHECK(d->choices[i].how.temperature == choices[i]->how.temperature);
      CHECK(d->choices[i].how.top_k == choices[i]->how.top_k);
      CHECK(d->choices[i].how.top_p == choices[i]->how.top_p);
      CHECK(d->choices[i].how.min_p == choices[i]->how.min_p);
      CHECK(d->choices[i].u == choices[i]->u);
    }
  }
  choices[1].reset();
  enc.restart(1);
  step_decoder dec(limits());
  auto d = dec.decode(enc.encode(plan, {}, choices));
  REQUIRE(d.has_value());
  CHECK(d->choices.empty());
}

TEST_CASE("a choice out of range is refused, as is a choice for a chunk that samples nothing") {
  auto with = [](auto set, bool sample = true) {
    capnp::MallocMessageBuilder msg;
    auto root = msg.initRoot<schema::StepPlan>();
    root.setStepId(1);
    auto c = root.initChunks(1)[0];
    c.setRequestId(7);
    c.initTokens(1).set(0, 5);
    c.initNewBlocks(1).set(0, 0);
    c.setResetTable(true);
    c.setSample(sample);
    c.setChoose(true);
    c.setTopP(1.0f);
    set(c);
    return to_bytes(msg);
  };
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::string& part) {
    step_decoder dec(limits());
    auto d = dec.decode(bytes);
    REQUIRE_FALSE(d.has_value());
    CAPTURE(d.err().message);
    CHECK(d.err().message.find(part) != std::string::npos);
  };
  expect(with([](auto c) { c.setTemperature(-1.0f); }), "temperature");
  expect(with([](auto c) { c.setTemperature(std::numeric_limits<float>::infinity()); }), "temperature");
  expect(with([](auto c) { c.setTemperature(std::nanf("")); }), "temperature");
  expect(with([](auto c) { c.setTopK(-2); }), "top_k");
  expect(with([](auto c) { c.setTopP(0.0f); }), "top_p");
  expect(with([](auto c) { c.setTopP(1.5f); }), "top_p");
  expect(with([](auto c) { c.setMinP(-0.1f); }), "min_p");
  expect(with([](auto c) { c.setU(1.0f); }), "u must be");
  expect(with([](auto c) { c.setU(std::nanf("")); }), "u must be");
  expect(with([](auto) {}, false), "samples nothing");
  step_decoder dec(limits());
  CHECK(dec.decode(with([](auto c) {
                    c.setTemperature(0.7f);
                    c.setU(0.5f);
                  })).has_value());
}

TEST_CASE("drafts travel as a chunk's last tokens, each with a row of logits, chosen on the shard only greedily") {
  scheduler s(small_scheduler(), test::tok512());
  request_params p;
  p.prompt = {1, 5, 9, 20};
  p.max_tokens = 8;
  REQUIRE(s.add(request_id{4}, p).has_value());
  step_plan prefill = s.schedule();
  step_encoder enc;
  step_decoder dec(limits());
  auto learned = dec.decode(enc.encode(prefill, {}));  // the stage learns the request's table
  REQUIRE_MESSAGE(learned.has_value(), (learned ? "" : learned.err().message));
  std::vector<sample_result> first(1);
  first[0].token = 33;
  s.update_from_output(prefill, first);
  speculative_config sc;
  sc.method = spec_method::ngram;
  plan_drafts(s.running(), sc, 512);
  step_plan plan = s.schedule();
  REQUIRE(plan.chunks.size() == 1);
  REQUIRE(plan.chunks[0].num_draft == 3);
  const std::vector<int32_t> drafts{40, 41, 42};
  plan.chunks[0].draft = drafts;
  auto d = dec.decode(enc.encode(plan, {}, std::vector<std::optional<token_choice>>{token_choice::greedy()}));
  REQUIRE_MESSAGE(d.has_value(), (d ? "" : d.err().message));
  CHECK(d->batch.tokens == std::vector<int32_t>{33, 40, 41, 42});
  REQUIRE(d->batch.sequences.size() == 1);
  CHECK(d->batch.sequences[0].logit_rows == 4);
  CHECK(d->batch.num_logits() == 4);
  REQUIRE(d->choices.size() == 4);  // one per row, all the chunk's
  for (const auto& id : d->chosen_ids) CHECK(id == request_id{4});

  // Made by hand: drafts that do not fit are refused.
  auto with = [](int32_t drafts, int32_t tokens, bool sample, float temperature, bool choose) {
    capnp::MallocMessageBuilder msg;
    auto root = msg.initRoot<schema::StepPlan>();
    root.setStepId(1);
    auto c = root.initChunks(1)[0];
    c.setRequestId(7);
    auto t = c.initTokens(static_cast<unsigned>(tokens));
    for (int32_t i = 0; i < tokens; ++i) t.set(static_cast<unsigned>(i), 5);
    c.initNewBlocks(5).set(0, 0);
    c.setResetTable(true);
    c.setSample(sample);
    c.setDrafts(drafts);
    c.setChoose(choose);
    c.setTemperature(temperature);
    c.setTopP(1.0f);
    return to_bytes(msg);
  };
  auto expect = [](const std::vector<uint8_t>& bytes, const std::string& part) {
    step_decoder dec(limits());
    auto d = dec.decode(bytes);
    REQUIRE_FALSE(d.has_value());
    CAPTURE(d.err().message);
    CHECK(d.err().message.find(part) != std::string::npos);
  };
  expect(with(3, 3, true, 0.0f, false), "no known token");
  expect(with(-1, 3, true, 0.0f, false), "drafts;");
  expect(with(17, 18, true, 0.0f, false), "drafts;");
  expect(with(2, 3, false, 0.0f, false), "samples nothing");
  expect(with(2, 3, true, 0.7f, true), "only greedily");
  step_decoder ok(limits());
  auto drawn = ok.decode(with(2, 3, true, 0.7f, false));  // a draw: the logits come back
  REQUIRE(drawn.has_value());
  CHECK(drawn->batch.num_logits() == 3);
  CHECK(drawn->choices.empty());
}

TEST_CASE("a table that shrank between plans reaches the stage whole, as the scheduler holds it") {
  step_encoder enc;
  step_decoder dec(limits());
  enc.restart(1);
  std::vector<int32_t> toks{5, 6, 7, 8, 9, 10};
  auto plan_with = [&](int32_t first, int32_t count, const std::vector<block_id>& table) {
    step_plan p;
    scheduled_chunk c;
    c.id = request_id{7};
    c.first = first;
    c.count = count;
    c.tokens = std::span<const int32_t>(toks).subspan(static_cast<size_t>(first), static_cast<size_t>(count));
    c.block_table = table;
    c.sample = true;
    p.chunks.push_back(c);
    p.num_tokens = count;
    return p;
  };
  const auto wide = test::block_ids({3, 9, 4});   // held for drafts past position 8
  const auto narrow = test::block_ids({3, 9});    // the third handed back
  const auto regrown = test::block_ids({3, 9, 6});
  for (const auto& [first, count, table] : {std::tuple{0, 5, wide}, std::tuple{5, 1, narrow}, std::tuple{5, 1, regrown}}) {
    auto got = dec.decode(enc.encode(plan_with(first, count, table), {}));
    REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
    CHECK(test::block_values(got->batch.sequences[0].block_table) == test::block_values(table));
  }
}

TEST_CASE("chosen tokens round-trip, and out-of-vocabulary tokens, too many rows and broken frames are errors") {
  const std::vector<chosen_token> toks{{request_id{3}, 7}, {request_id{9}, 511}, {request_id{4}, 0}};
  const auto bytes = encode_step_result(12, toks);
  auto d = decode_step_result(bytes, 512, 8);
  REQUIRE(d.has_value());
  REQUIRE(d->tokens.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(d->tokens[i].id == toks[i].id);
    CHECK(d->tokens[i].token == toks[i].token);
  }
  CHECK_FALSE(decode_step_result(bytes, 511, 8).has_value());  // 511 is outside a vocabulary of 511
  CHECK_FALSE(decode_step_result(bytes, 512, 2).has_value());
  for (size_t n = 0; n < bytes.size(); ++n) CHECK_FALSE(decode_step_result(std::span(bytes).first(n), 512, 8).has_value());
  rng r(5);
  for (int i = 0; i < 2000; ++i) {
    auto bad = bytes;
    bad[r.next() % bad.size()] ^= static_cast<uint8_t>(1u << (r.next() % 8));
    auto x = decode_step_result(bad, 512, 8);
    if (x)
      for (const auto& t : x->tokens) CHECK((t.token >= 0 && t.token < 512));
  }
}

TEST_CASE("activations sent over a device link travel as their step and size alone, and a frame with data is refused") {
  const auto bytes = encode_linked_activations(41, 5, 16);
  auto d = decode_linked_activations(bytes, 16, 8);
  REQUIRE(d.has_value());
  CHECK(d->step_id == 41);
  CHECK(d->num_tokens == 5);
  CHECK(d->data.empty());
  CHECK_FALSE(decode_linked_activations(bytes, 32, 8).has_value());  // another width
  CHECK_FALSE(decode_linked_activations(bytes, 16, 4).has_value());  // more tokens than a step holds
  // Activations with their data are not linked ones, nor the other way round.
  const std::vector<float> data(5 * 16, 0.5f);
  const auto full = encode_activations(41, 5, 16, data.data());
  auto refused = decode_linked_activations(full, 16, 8);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("over a device link carry 320 bytes") != std::string::npos);
  CHECK_FALSE(decode_activations(bytes, 16, 8).has_value());
  for (size_t n = 0; n < bytes.size(); ++n) CHECK_FALSE(decode_linked_activations(std::span(bytes).first(n), 16, 8).has_value());
}

}  // namespace troupe::wire
