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
#include "engine/spec/speculative.hpp"
#include "schema/step.capnp.h"
#include "tests/support/test_support.hpp"

namespace troupe::wire {

namespace {

step_limits limits() {
  step_limits l;
  l.vocab = 512;
  l.context = 512;
  l.num_blocks = 12;
  l.block_size = 4;
  l.max_step_tokens = 64;
  l.max_chunks = 16;
  return l;
}

// A plan message built by hand, one chunk.
std::vector<uint8_t> one_chunk(uint64_t step, uint64_t id, int32_t first, std::vector<int32_t> toks,
                               std::vector<uint32_t> blocks, bool reset, uint64_t session = 0, bool reset_all = false) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::StepPlan>();
  root.setStepId(step);
  root.setSession(session);
  root.setResetAll(reset_all);
  auto c = root.initChunks(1)[0];
  c.setRequestId(id);
  c.setFirst(first);
  auto t = c.initTokens(static_cast<unsigned>(toks.size()));
  for (size_t i = 0; i < toks.size(); ++i) t.set(static_cast<unsigned>(i), toks[i]);
  auto b = c.initNewBlocks(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) b.set(static_cast<unsigned>(i), blocks[i]);
  c.setResetTable(reset);
  c.setSample(true);
  return to_bytes(msg);
}

// An engine scheduler within limits(), running up to four requests.
scheduler_config small_scheduler() {
  scheduler_config cfg;
  cfg.max_step_tokens = 64;
  cfg.kv.num_blocks = 12;
  cfg.kv.block_size = 4;
  cfg.max_running = 4;
  cfg.context = 512;
  cfg.vocab = 512;
  return cfg;
}

}  // namespace

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

TEST_CASE("KV eviction reaches the stage: each chunk's slots and RoPE positions, and the compactions before them") {
  for (kv_policy policy : {kv_policy::streaming, kv_policy::h2o}) {
    CAPTURE(kv_policy_name(policy));
    scheduler_config cfg = small_scheduler();
    cfg.context = 48;  // (streaming runs past it)
    cfg.eviction = {policy, 12, 2, -1, 16};
    scheduler s(cfg, test::tok512());
    for (uint64_t id = 1; id <= 3; ++id) {
      request_params p;
      for (int32_t i = 0; i < 4 + static_cast<int32_t>(id); ++i) p.prompt.push_back(100 + i);
      p.max_tokens = 60;
      p.ignore_eos = true;
      p.sampling.temperature = 0.0f;
      REQUIRE(s.add(request_id{id}, p).has_value());
    }
    step_limits lim = limits();
    lim.context = cfg.context;
    step_encoder enc;
    step_decoder dec(lim);
    enc.restart(1);
    int compactions = 0, past = 0;
    for (int step = 0; step < 300 && s.has_unfinished(); ++step) {
      step_plan plan = s.schedule();
      auto got = dec.decode(enc.encode(plan, {}));
      REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
      REQUIRE(got->batch.compactions.size() == plan.compactions.size());
      for (size_t i = 0; i < plan.compactions.size(); ++i) {
        const kv_compaction& c = got->batch.compactions[i];
        CHECK(std::vector<int32_t>(c.kept.begin(), c.kept.end()) == plan.compactions[i].kept);
        CHECK(test::block_values(c.block_table) == test::block_values(plan.compactions[i].block_table));
        CHECK(c.rotate == (policy == kv_policy::streaming));
        ++compactions;
      }
      REQUIRE(got->batch.sequences.size() == plan.chunks.size());
      for (size_t i = 0; i < plan.chunks.size(); ++i) {
        const scheduled_chunk& c = plan.chunks[i];
        CHECK(got->batch.sequences[i].start_pos == c.first_slot());
        CHECK(got->batch.sequences[i].rope_pos == c.first_rope_position());
        CHECK(test::block_values(got->batch.sequences[i].block_table) == test::block_values(c.block_table));
        // Streaming ranks by position alone: no attention figures asked for.
        CHECK(c.attention == (policy == kv_policy::h2o));
        CHECK((got->batch.sequences[i].attention_mass != nullptr) == c.attention);
        past += c.first >= cfg.context;
      }
      std::vector<sample_result> samples(static_cast<size_t>(plan.num_samples()));
      for (auto& x : samples) x.token = 105;
      s.update_from_output(plan, samples);
    }
    CHECK_FALSE(s.has_unfinished());
    CHECK(compactions > 5);
    CHECK((past > 0) == (policy == kv_policy::streaming));
  }
}

TEST_CASE("a compaction of an unknown request, or of slots out of order or past its table, is refused") {
  step_decoder dec(limits());
  REQUIRE(dec.decode(one_chunk(0, 4, 0, {1, 2, 3, 4, 5}, {2, 3}, true, 1, true)).has_value());
  auto with = [&](uint64_t step, uint64_t id, std::vector<int32_t> kept) {
    capnp::MallocMessageBuilder msg;
    auto root = msg.initRoot<schema::StepPlan>();
    root.setStepId(step);
    root.setSession(1);
    auto c = root.initCompactions(1)[0];
    c.setRequestId(id);
    auto k = c.initKept(static_cast<unsigned>(kept.size()));
    for (size_t i = 0; i < kept.size(); ++i) k.set(static_cast<unsigned>(i), kept[i]);
    return dec.decode(to_bytes(msg));
  };
  auto why = [](const auto& got) { return got ? std::string() : got.err().message; };
  CHECK(why(with(1, 9, {0, 1})).find("unknown request") != std::string::npos);
  CHECK(why(with(2, 4, {0, 3, 2})).find("must ascend") != std::string::npos);
  CHECK(why(with(3, 4, {0, 8})).find("must ascend within its table of 2 blocks") != std::string::npos);
  CHECK(why(with(4, 4, {1, 0})).find("must ascend") != std::string::npos);
  auto fine = with(5, 4, {0, 2, 4});
  REQUIRE(fine.has_value());
  REQUIRE(fine->batch.compactions.size() == 1);
  CHECK(test::block_values(fine->batch.compactions[0].block_table) == std::vector<uint32_t>{2, 3});
}

TEST_CASE("a table whose blocks were replaced by copies goes whole, and its compaction moves into the new blocks") {
  step_decoder dec(limits());
  step_encoder enc;
  enc.restart(1);
  // Request 4 holds blocks 2, 3, 5 (12 slots); the next plan compacts it to slots {0, 5, 9}
  // and its table became 7, 3 (block 2 was shared: copied into 7; 5 emptied).
  std::vector<block_id> before{block_id{2}, block_id{3}, block_id{5}}, after{block_id{7}, block_id{3}};
  std::vector<int32_t> toks(12, 1), one{1};
  step_plan p1;
  scheduled_chunk c;
  c.id = request_id{4};
  c.count = 12;
  c.tokens = toks;
  c.block_table = before;
  p1.chunks = {c};
  REQUIRE(dec.decode(enc.encode(p1, {})).has_value());
  step_plan p2;
  p2.compactions.push_back({request_id{4}, before, {0, 5, 9}, false, after});
  c.first = 12;
  c.evicted = 9;
  c.count = 1;
  c.tokens = one;
  c.block_table = after;
  p2.chunks = {c};
  auto got = dec.decode(enc.encode(p2, {}));
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
  REQUIRE(got->batch.compactions.size() == 1);
  const kv_compaction& k = got->batch.compactions[0];
  CHECK(test::block_values(k.block_table) == std::vector<uint32_t>{2, 3, 5});
  CHECK(test::block_values(k.new_table) == std::vector<uint32_t>{7, 3});
  CHECK(test::block_values(got->batch.sequences[0].block_table) == std::vector<uint32_t>{7, 3});
  // The same length with a block replaced is a change too: sent whole.
  std::vector<block_id> swapped{block_id{8}, block_id{3}};
  p2.compactions.clear();
  c.first = 13;
  c.block_table = swapped;
  p2.chunks = {c};
  got = dec.decode(enc.encode(p2, {}));
  REQUIRE(got.has_value());
  CHECK(test::block_values(got->batch.sequences[0].block_table) == std::vector<uint32_t>{8, 3});
  CHECK(got->batch.compactions.empty());

  // A compaction whose request's table after the plan cannot hold what it keeps is refused.
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::StepPlan>();
  root.setStepId(got->step_id + 1);
  root.setSession(1);
  auto cp = root.initCompactions(1)[0];
  cp.setRequestId(4);
  auto kept = cp.initKept(5);
  for (unsigned i = 0; i < 5; ++i) kept.set(i, static_cast<int32_t>(i));
  auto ch = root.initChunks(1)[0];
  ch.setRequestId(4);
  ch.setFirst(13);
  ch.setEvicted(12);  // (at odds with the compaction, which keeps 5)
  ch.initTokens(1).set(0, 1);
  ch.setResetTable(true);
  ch.initNewBlocks(1).set(0, 9);
  auto refused = dec.decode(to_bytes(msg));
  REQUIRE_FALSE(refused.has_value());
  CAPTURE(refused.err().message);
  CHECK(refused.err().message.find("5 kept slots do not fit the 1 blocks its table has after the plan") != std::string::npos);
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

TEST_CASE("attention sums: zero where the plan asks, carried by activations and step results, refused in the wrong number") {
  step_decoder dec(limits());
  step_encoder enc;
  enc.restart(1);
  // Two requests, the first asking for its attention (4 slots it had, 3 tokens now), the
  // second not.
  std::vector<block_id> t1{block_id{1}, block_id{3}}, t2{block_id{2}};
  std::vector<int32_t> toks1{5, 6, 7}, toks2{8};
  step_plan plan;
  scheduled_chunk a;
  a.id = request_id{1};
  a.first = 6;
  a.evicted = 2;
  a.count = 3;
  a.tokens = toks1;
  a.block_table = t1;
  a.attention = true;
  scheduled_chunk b;
  b.id = request_id{2};
  b.count = 1;
  b.tokens = toks2;
  b.block_table = t2;
  b.sample = true;
  plan.chunks = {a, b};
  auto got = dec.decode(enc.encode(plan, {}));
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
  REQUIRE(got->attention.size() == 7);  // 4 + 3 slots
  CHECK(got->batch.sequences[0].attention_mass == got->attention.data());
  CHECK(got->batch.sequences[1].attention_mass == nullptr);
  for (float x : got->attention) CHECK(x == 0.0f);

  std::vector<float> sums{0.5f, 1.0f, 2.0f, 0.25f, 3.0f, 0.0f, 7.5f};
  const std::vector<float> hidden(2 * 16, 0.125f);
  const auto act = encode_activations(3, 2, 16, hidden.data(), sums);
  auto back = decode_activations(act, 16, 8, 7);
  REQUIRE(back.has_value());
  CHECK(back->attention == sums);
  CHECK(back->data == hidden);
  auto short_of = decode_activations(act, 16, 8, 6);
  REQUIRE_FALSE(short_of.has_value());
  CHECK(short_of.err().message == "activations carry 7 attention sums where 6 are expected");
  CHECK_FALSE(decode_activations(act, 16, 8).has_value());  // none asked for
  CHECK_FALSE(decode_activations(encode_activations(3, 2, 16, hidden.data()), 16, 8, 7).has_value());

  const std::vector<chosen_token> toks{{request_id{2}, 9}};
  const auto res = encode_step_result(3, toks, sums);
  auto r = decode_step_result(res, 512, 8, 7);
  REQUIRE(r.has_value());
  CHECK(r->attention == sums);
  REQUIRE(r->tokens.size() == 1);
  CHECK(r->tokens[0].token == 9);
  auto wrong = decode_step_result(res, 512, 8, 8);
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.err().message == "step result carries 7 attention sums where 8 are expected");
  for (size_t n = 0; n < res.size(); ++n) CHECK_FALSE(decode_step_result(std::span(res).first(n), 512, 8, 7).has_value());
}

TEST_CASE("KV tier loads and saves reach the stage with their keys, and only blocks of the plan's tables") {
  step_decoder dec(limits());
  step_encoder enc;
  enc.restart(1);
  std::vector<block_id> t1{block_id{4}, block_id{7}, block_id{9}};
  std::vector<int32_t> toks{5, 6};
  step_plan plan;
  scheduled_chunk a;
  a.id = request_id{1};
  a.first = 8;
  a.count = 2;
  a.tokens = toks;
  a.block_table = t1;
  a.sample = true;
  plan.chunks = {a};
  const tier_key k0{0x1122334455667788ull, 0x99aabbccddeeff00ull}, k1{3, 4};
  plan.tier_loads = {{request_id{1}, block_id{4}, k0}, {request_id{1}, block_id{7}, k1}};
  plan.tier_saves = {{request_id{1}, block_id{9}, tier_key{5, 6}}};
  plan.tier_prefetch = {tier_key{7, 8}, k0};
  auto got = dec.decode(enc.encode(plan, {}));
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
  REQUIRE(got->tier_loads.size() == 2);
  CHECK(got->tier_loads[0].id == request_id{1});
  CHECK(got->tier_loads[0].block == block_id{4});
  CHECK(got->tier_loads[0].key == k0);
  CHECK(got->tier_loads[1].key == k1);
  REQUIRE(got->tier_saves.size() == 1);
  CHECK(got->tier_saves[0].key == tier_key{5, 6});
  CHECK(got->tier_prefetch == std::vector<tier_key>{tier_key{7, 8}, k0});

  // A block outside the plan's tables, a request without a chunk, a block twice: refused,
  // the decoder unchanged.
  auto refused = [&](std::vector<tier_move> loads, const std::string& part) {
    step_plan p = plan;
    p.tier_loads = std::move(loads);
    p.tier_saves.clear();
    step_encoder e2;
    e2.restart(2);
    step_decoder d2(limits());
    auto r = d2.decode(e2.encode(p, {}));
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.err().message.find(part) != std::string::npos, r.err().message);
    CHECK(d2.num_known_requests() == 0);
  };
  refused({{request_id{1}, block_id{5}, k0}}, "block 5 is not in a table of this plan");
  refused({{request_id{2}, block_id{4}, k0}}, "is not in a table of this plan");
  refused({{request_id{1}, block_id{4}, k0}, {request_id{1}, block_id{4}, k1}}, "block 4 twice");

  // The next plan's loads may name blocks the stage knows from before.
  step_plan next = plan;
  next.chunks[0].first = 10;
  next.chunks[0].count = 1;
  std::vector<int32_t> one{7};
  next.chunks[0].tokens = one;
  next.tier_loads = {{request_id{1}, block_id{9}, k0}};
  next.tier_saves.clear();
  auto later = dec.decode(enc.encode(next, {}));
  REQUIRE_MESSAGE(later.has_value(), (later ? "" : later.err().message));
  CHECK(later->tier_loads.size() == 1);
}

TEST_CASE("failed tier loads travel back with activations and step results, bounded and without repeats") {
  const std::vector<float> hidden(2 * 16, 0.5f);
  const std::vector<request_id> failed{request_id{7}, request_id{3}};
  auto back = decode_activations(encode_activations(3, 2, 16, hidden.data(), {}, failed), 16, 8);
  REQUIRE(back.has_value());
  CHECK(back->failed_loads == failed);
  CHECK(decode_activations(encode_activations(3, 2, 16, hidden.data()), 16, 8)->failed_loads.empty());
  const std::vector<request_id> twice{request_id{7}, request_id{7}};
  auto dup = decode_activations(encode_activations(3, 2, 16, hidden.data(), {}, twice), 16, 8);
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.err().message.find("named twice") != std::string::npos);
  std::vector<request_id> many;
  for (uint64_t i = 0; i < 9; ++i) many.push_back(request_id{i});
  CHECK_FALSE(decode_activations(encode_activations(3, 2, 16, hidden.data(), {}, many), 16, 8).has_value());

  const std::vector<chosen_token> toks{{request_id{2}, 9}};
  auto r = decode_step_result(encode_step_result(3, toks, {}, failed), 512, 8);
  REQUIRE(r.has_value());
  CHECK(r->failed_loads == failed);
  CHECK_FALSE(decode_step_result(encode_step_result(3, toks, {}, many), 512, 8).has_value());
}

}  // namespace troupe::wire
