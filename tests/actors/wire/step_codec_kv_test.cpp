// The step codec's KV cache fields: KV eviction's compactions, slots and attention sums,
// and KV tiers' loads, saves, prefetches and failed loads (step_codec_test.cpp has the rest).
#include <doctest/doctest.h>

#include "actors/wire/activations_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "tests/actors/wire/step_codec_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe::wire {

namespace {

// A plan of one chunk: request 1's tokens 5 and 6 at position 8, its table blocks 4, 7
// and 9 (the plan's spans point into this object, which therefore stays put).
struct chunk_plan {
  std::vector<block_id> table{block_id{4}, block_id{7}, block_id{9}};
  std::vector<int32_t> tokens{5, 6};
  step_plan plan;
  chunk_plan() {
    scheduled_chunk a;
    a.id = request_id{1};
    a.first = 8;
    a.count = 2;
    a.tokens = tokens;
    a.block_table = table;
    a.sample = true;
    plan.chunks = {a};
  }
  chunk_plan(const chunk_plan&) = delete;
  chunk_plan& operator=(const chunk_plan&) = delete;
};

}  // namespace

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

TEST_CASE("a sliding-window model's window starts reach the stage, token by token, and bad ones are refused") {
  step_decoder dec(limits());
  step_encoder enc;
  enc.restart(1);
  std::vector<block_id> table{block_id{1}, block_id{3}};
  std::vector<int32_t> toks{5, 6, 7}, starts{1, 1, 3};
  step_plan plan;
  scheduled_chunk a;
  a.id = request_id{1};
  a.first = 9;
  a.evicted = 4;  // slots 5, 6 and 7
  a.count = 3;
  a.tokens = toks;
  a.block_table = table;
  a.window_first = starts;
  plan.chunks = {a};
  auto got = dec.decode(enc.encode(plan, {}));
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
  REQUIRE(got->batch.sequences.size() == 1);
  REQUIRE(got->batch.sequences[0].window_first != nullptr);
  CHECK(std::vector<int32_t>(got->batch.sequences[0].window_first, got->batch.sequences[0].window_first + 3) == starts);
  // Without them, none.
  a.window_first = {};
  plan.chunks = {a};
  auto plain = dec.decode(enc.encode(plan, {}));
  REQUIRE(plain.has_value());
  CHECK(plain->batch.sequences[0].window_first == nullptr);
  // Descending, past a token's own slot, or below slot 0: refused.
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{3, 1, 3}, std::vector<int32_t>{1, 7, 7}, std::vector<int32_t>{-1, 0, 0}}) {
    CAPTURE(bad);
    step_encoder e;
    e.restart(2);
    step_decoder d(limits());
    scheduled_chunk c = a;
    c.window_first = bad;
    step_plan p;
    p.chunks = {c};
    auto r = d.decode(e.encode(p, {}));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().message.find("window starts must ascend") != std::string::npos);
  }
}

TEST_CASE("KV tier loads and saves reach the stage with their keys, and only blocks of the plan's tables") {
  step_decoder dec(limits());
  step_encoder enc;
  enc.restart(1);
  const chunk_plan c;
  step_plan plan = c.plan;
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

TEST_CASE("KV pushes reach the stage with their replicas: a block once to each, always to one") {
  const chunk_plan c;
  auto decode = [&](std::vector<tier_move> pushes) {
    step_plan p = c.plan;
    p.kv_pushes = std::move(pushes);
    step_encoder e;
    e.restart(1);
    step_decoder d(limits());
    return d.decode(e.encode(p, {}));
  };
  auto got = decode({{request_id{1}, block_id{4}, tier_key{1, 2}, "d0"}, {request_id{1}, block_id{4}, tier_key{1, 2}, "d1"},
                     {request_id{1}, block_id{7}, tier_key{3, 4}, "d0"}});
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
  REQUIRE(got->kv_pushes.size() == 3);
  CHECK(got->kv_pushes[1].block == block_id{4});
  CHECK(got->kv_pushes[1].to == "d1");
  CHECK(got->kv_pushes[2].key == tier_key{3, 4});
  auto twice = decode({{request_id{1}, block_id{4}, tier_key{1, 2}, "d0"}, {request_id{1}, block_id{4}, tier_key{1, 2}, "d0"}});
  REQUIRE_FALSE(twice.has_value());
  CHECK(twice.err().message.find("block 4 twice") != std::string::npos);
  auto nowhere = decode({{request_id{1}, block_id{4}, tier_key{1, 2}, ""}});
  REQUIRE_FALSE(nowhere.has_value());
  CHECK(nowhere.err().message.find("no replica to send it to") != std::string::npos);
  auto outside = decode({{request_id{1}, block_id{5}, tier_key{1, 2}, "d0"}});
  REQUIRE_FALSE(outside.has_value());
  CHECK(outside.err().message.find("not in a table of this plan") != std::string::npos);
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
