// Drafts from a draft actor (engine/speculative/draft_exchange.hpp through actors/wire/
// draft_codec.hpp): the same drafts, distributions and output as a proposer in the
// scheduler's own process, step after step; a restarted server; the slots' positions
// under KV eviction; answers and orders that do not fit refused whole.
#include "actors/wire/draft_codec.hpp"

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/wire/frame.hpp"
#include "engine/forward/kv_cache_type.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/serve/step_choices.hpp"
#include "engine/speculative/model_proposer.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "schema/draft.capnp.h"
#include "tests/support/test_support.hpp"

namespace troupe::wire {

namespace {

constexpr int32_t exit_layer = 2;

scheduler_config config(const model& m, uint32_t num_blocks) {
  scheduler_config cfg;
  cfg.max_step_tokens = 64;
  cfg.max_running = 8;
  cfg.kv.num_blocks = num_blocks;
  cfg.kv.block_size = 16;
  cfg.context = m.config.max_seq_len;
  cfg.vocab = m.config.vocab_size;
  return cfg;
}

draft_limits limits_of(const scheduler_config& cfg) {
  draft_limits lim;
  lim.num_blocks = cfg.kv.num_blocks;
  lim.block_size = cfg.kv.block_size;
  lim.context = cfg.context;
  lim.vocab = cfg.vocab;
  return lim;
}

speculative_config spec() {
  speculative_config sc;
  sc.method = spec_method::early_exit;
  sc.k = 4;
  sc.exit_layer = exit_layer;
  sc.max_step_tokens = 64;  // drafts for every request
  return sc;
}

std::unique_ptr<model_proposer> early_exit(const model& m, const scheduler_config& cfg, thread_pool& pool) {
  return std::make_unique<model_proposer>(m, exit_layer, static_cast<int32_t>(cfg.kv.num_blocks), cfg.kv.block_size,
                                          kv_cache_type_for(m), pool);
}

// Requests of every kind of sampler: greedy, truncated (sparse draft rows), whole (dense
// rows), with penalties and biases.
std::vector<request_params> requests(int count) {
  std::vector<request_params> out;
  rng r(11);
  for (int i = 0; i < count; ++i) {
    request_params p;
    p.prompt.push_back(1);
    const int len = 4 + static_cast<int>(r.next() % 20);
    for (int t = 0; t < len; ++t) p.prompt.push_back(3 + static_cast<int32_t>(r.next() % 500));
    p.max_tokens = 40 + i * 4;
    p.ignore_eos = true;
    p.sampling.seed = 100 + i;
    switch (i % 5) {
      case 0: p.sampling.temperature = 0.0f; break;
      case 1: p.sampling = {0.8f, 20, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f, p.sampling.seed, -1, {}}; break;
      case 2: p.sampling.temperature = 1.0f; break;
      case 3: p.sampling = {0.0f, 0, 1.0f, 0.0f, 1.3f, 0.0f, 0.0f, 0, -1, {{7, 2.0f}}}; break;
      case 4: p.sampling = {0.9f, 0, 1.0f, 0.05f, 1.0f, 0.5f, 0.3f, p.sampling.seed, -1, {}}; break;
    }
    out.push_back(p);
  }
  return out;
}

// One exchange as the scheduler actor and the draft actor make it, bytes between them.
status exchange(draft_orders& orders, draft_server& server, step_plan& plan, scheduler& s, const draft_limits& lim,
                size_t* bytes = nullptr, std::span<const int32_t> tree = {}) {
  auto order = orders.make(plan, s, tree);
  if (!order) return ok();
  const auto sent = encode_draft_order(*order);
  auto got = decode_draft_order(sent, lim);
  if (!got) return got.err();
  const auto answer = encode_drafts(server.serve(*got), lim.vocab);
  if (bytes) *bytes += sent.size() + answer.size();
  auto a = decode_drafts(answer, lim);
  if (!a) return a.err();
  return orders.take(plan, s, *a, lim.vocab);
}

// Target logits for a step (the same rows for both schedulers): random, but each draft's
// row favours the drafted token with probability `agree`, so that some drafts are taken.
std::vector<float> target_rows(const step_plan& plan, int32_t vocab, uint64_t seed, float agree) {
  auto rows = test::random_floats(static_cast<size_t>(plan.num_logit_rows()) * vocab, seed, -4.0f, 4.0f);
  rng r(seed);
  size_t row = 0;
  for (const auto& c : plan.chunks) {
    if (!c.sample) continue;
    for (int32_t j = 0; j < c.num_draft; ++j, ++row)
      if (r.uniform() < agree) rows[row * vocab + c.draft[j]] += 12.0f;
    ++row;
  }
  return rows;
}

}  // namespace

namespace {

// With `tree` (widths), token trees of the proposer's candidates instead of chains.
void same_drafts_as_local(const std::vector<int32_t>& tree) {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const int32_t vocab = l.m.config.vocab_size;
  const scheduler_config cfg = config(l.m, 16);  // fewer blocks than the requests want: preemption
  thread_pool pool_a(1), pool_b(1);
  scheduler a(cfg, l.tok), b(cfg, l.tok);
  auto local = early_exit(l.m, cfg, pool_a);
  draft_server server(early_exit(l.m, cfg, pool_b));
  draft_orders orders;
  orders.restart(7);
  std::vector<draft_slot> slots;
  const auto reqs = requests(10);
  for (size_t i = 0; i < reqs.size(); ++i) {
    REQUIRE(a.add(request_id{i + 1}, reqs[i]).has_value());
    REQUIRE(b.add(request_id{i + 1}, reqs[i]).has_value());
  }
  speculative_config sc = spec();
  sc.tree = tree;
  const draft_limits lim = limits_of(cfg);
  spec_tally tally;
  int preempted = 0, with_q = 0, sparse_rows = 0, trees = 0;
  size_t bytes = 0;
  for (int step = 0; step < 400 && a.has_unfinished(); ++step) {
    CAPTURE(step);
    plan_drafts(a.running(), sc, cfg.context);
    plan_drafts(b.running(), sc, cfg.context);
    step_plan pa = a.schedule(), pb = b.schedule();
    REQUIRE(pa.preempted == pb.preempted);
    preempted += static_cast<int>(pa.preempted.size());
    for (request_id id : pa.preempted) local->forget(id);
    for (request_id id : pb.preempted) orders.forget(id);
    fill_drafts(pa, a, *local, slots, tree);
    const auto taken = exchange(orders, server, pb, b, lim, &bytes, tree);
    REQUIRE_MESSAGE(taken.has_value(), (taken ? "" : taken.err().message));
    REQUIRE(pa.chunks.size() == pb.chunks.size());
    CHECK(pa.num_tokens == pb.num_tokens);
    for (size_t c = 0; c < pa.chunks.size(); ++c) {
      const scheduled_chunk &x = pa.chunks[c], &y = pb.chunks[c];
      CHECK(x.id == y.id);
      CHECK(x.count == y.count);
      REQUIRE(x.num_draft == y.num_draft);
      CHECK(std::vector<int32_t>(x.draft.begin(), x.draft.end()) == std::vector<int32_t>(y.draft.begin(), y.draft.end()));
      CHECK(std::vector<int32_t>(x.draft_parents.begin(), x.draft_parents.end()) ==
            std::vector<int32_t>(y.draft_parents.begin(), y.draft_parents.end()));
      trees += !y.draft_parents.empty();
      if (x.num_draft == 0) continue;
      const auto& qa = a.find(x.id)->drafts.q;
      const auto& qb = b.find(y.id)->drafts.q;
      CHECK(qa == qb);  // the same distributions, bit for bit
      if (!qb.empty()) {
        ++with_q;
        for (int32_t j = 0; j < y.num_draft; ++j)
          sparse_rows += std::count(qb.begin() + j * vocab, qb.begin() + (j + 1) * vocab, 0.0f) * 2 > vocab;
      }
    }
    auto rows_a = target_rows(pa, vocab, 1000 + step, 0.7f), rows_b = rows_a;
    step_tokens ga = sample_rows(pa, a, rows_a.data(), vocab, sc);
    step_tokens gb = sample_rows(pb, b, rows_b.data(), vocab, sc);
    tally += gb.spec;
    const auto oa = a.update_from_output(pa, ga.samples, ga.emitted);
    const auto ob = b.update_from_output(pb, gb.samples, gb.emitted);
    REQUIRE(oa.size() == ob.size());
    for (size_t i = 0; i < oa.size(); ++i) {
      CHECK(oa[i].id == ob[i].id);
      CHECK(oa[i].new_tokens == ob[i].new_tokens);
      if (oa[i].finished) local->forget(oa[i].id);
      if (ob[i].finished) orders.forget(ob[i].id);
    }
  }
  CHECK_FALSE(a.has_unfinished());
  CHECK_FALSE(b.has_unfinished());
  CHECK(preempted > 0);
  CHECK(tally.verifies > 20);
  CHECK(tally.accepted > 0);
  if (tree.empty()) {
    CHECK(with_q > 0);       // sampled requests' drafts carried their distributions
    CHECK(sparse_rows > 0);  // and truncated ones went sparse
  } else {
    CHECK(trees > 20);  // (a tree's candidates are ranked: no distributions travel)
    CHECK(with_q == 0);
  }
  MESSAGE(tally.accepted << " of " << tally.proposed << " drafts accepted; " << bytes << " bytes exchanged");
}

}  // namespace

TEST_CASE("drafts from a draft server through the codec are a local proposer's, step for step, under preemption") {
  same_drafts_as_local({});
}

TEST_CASE("a draft server's token trees are a local proposer's, step for step, under preemption") {
  same_drafts_as_local({3, 2, 1});
}

TEST_CASE("a draft server that restarted answers 'unknown', and the next order sends the whole sequence") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const scheduler_config cfg = config(l.m, 64);
  thread_pool pool(1);
  scheduler s(cfg, l.tok);
  auto reqs = requests(2);
  REQUIRE(s.add(request_id{1}, reqs[0]).has_value());  // greedy
  REQUIRE(s.add(request_id{2}, reqs[1]).has_value());  // sampled
  draft_orders orders;
  orders.restart(1);
  auto server = std::make_unique<draft_server>(early_exit(l.m, cfg, pool));
  const speculative_config sc = spec();
  const draft_limits lim = limits_of(cfg);
  auto step = [&](int n) {
    plan_drafts(s.running(), sc, cfg.context);
    step_plan p = s.schedule();
    std::optional<draft_order> seen;
    if (auto o = orders.make(p, s)) {
      seen = o;
      auto got = decode_draft_order(encode_draft_order(*o), lim);
      REQUIRE(got.has_value());
      auto a = decode_drafts(encode_drafts(server->serve(*got), lim.vocab), lim);
      REQUIRE(a.has_value());
      REQUIRE(orders.take(p, s, *a, lim.vocab).has_value());
    }
    auto rows = target_rows(p, lim.vocab, 50 + n, 1.0f);
    step_tokens got = sample_rows(p, s, rows.data(), lim.vocab, sc);
    s.update_from_output(p, got.samples, got.emitted);
    return std::make_pair(p, seen);
  };
  step(0);  // the prompts
  auto [first, sent] = step(1);
  REQUIRE(sent.has_value());
  for (const auto& slot : sent->slots) {
    CHECK(slot.from == 0);  // new to the server: whole, with the sampler's settings
    CHECK(slot.sampling.has_value());
    CHECK(slot.uniforms.size() == (slot.sampling->temperature == 0.0f ? 0u : static_cast<size_t>(slot.max_tokens)));
  }
  for (const auto& c : first.chunks) CHECK(c.num_draft > 0);
  auto [second, delta] = step(2);
  REQUIRE(delta.has_value());
  for (const auto& slot : delta->slots) {
    CHECK(slot.from > 0);  // only what was added
    CHECK_FALSE(slot.sampling.has_value());
  }
  CHECK(server->num_requests() == 2);

  server = std::make_unique<draft_server>(early_exit(l.m, cfg, pool));  // it restarted
  auto [blind, asked] = step(3);
  REQUIRE(asked.has_value());
  for (const auto& c : blind.chunks) CHECK(c.num_draft == 0);  // nothing to draft from
  auto [again, whole] = step(4);
  REQUIRE(whole.has_value());
  for (const auto& slot : whole->slots) CHECK(slot.from == 0);
  for (const auto& c : again.chunks) CHECK(c.num_draft > 0);

  // A request that ended is forgotten with the next order; a new session forgets all.
  s.abort(request_id{2});
  orders.forget(request_id{2});
  auto [after, forgot] = step(5);
  REQUIRE(forgot.has_value());
  CHECK(forgot->forget == std::vector<request_id>{request_id{2}});
  CHECK(server->num_requests() == 1);
  orders.restart(2);
  auto [fresh, anew] = step(6);
  REQUIRE(anew.has_value());
  CHECK(anew->session == 2);
  CHECK(anew->slots.at(0).from == 0);
  CHECK(server->num_requests() == 1);
}

TEST_CASE("under KV eviction an order names its slots' positions after each compaction, and a server without "
          "them answers 'unknown'") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  scheduler_config cfg = config(l.m, 64);
  cfg.eviction = {kv_policy::h2o, 48, -1, -1, 16};
  thread_pool pool(1);
  scheduler s(cfg, l.tok);
  request_params p = requests(1)[0];
  p.max_tokens = 150;  // past its budget of 48 several times
  REQUIRE(s.add(request_id{1}, p).has_value());
  draft_orders orders;
  orders.restart(1);
  draft_server server(early_exit(l.m, cfg, pool));
  const speculative_config sc = spec();
  const draft_limits lim = limits_of(cfg);
  int32_t told = 0, named = 0, drafted = 0, moves = 0;
  for (int n = 0; n < 200 && s.has_unfinished(); ++n) {
    plan_drafts(s.running(), sc, cfg.context);
    step_plan p = s.schedule();
    for (const planned_compaction& c : p.compactions) orders.compacted(c);  // (as step_path passes them on)
    if (auto o = orders.make(p, s)) {
      const request& r = *s.find(request_id{1});
      const draft_order_slot& slot = o->slots.at(0);
      CHECK(slot.evicted == r.eviction.evicted);
      if (r.eviction.evicted != told) {  // compacted since the last order: its slots' positions
        CHECK(slot.positions == std::vector<int32_t>(r.eviction.kept.positions().begin(), r.eviction.kept.positions().end()));
        ++named;
      } else {
        CHECK(slot.positions.empty());
      }
      told = r.eviction.evicted;
      auto got = decode_draft_order(encode_draft_order(*o), lim);
      REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.err().message));
      CHECK(got->slots[0].positions == slot.positions);
      moves += static_cast<int32_t>(got->compactions.size());
      const draft_answer a = server.serve(*got);
      CHECK_FALSE(a.slots.at(0).unknown);
      drafted += static_cast<int32_t>(a.slots[0].tokens.size());
      REQUIRE(orders.take(p, s, a, lim.vocab).has_value());
    }
    auto rows = target_rows(p, lim.vocab, 50 + n, 1.0f);
    step_tokens got = sample_rows(p, s, rows.data(), lim.vocab, sc);
    s.update_from_output(p, got.samples, got.emitted);
  }
  CHECK(named >= 2);
  CHECK(moves >= named);  // each compaction reaches the server with an order
  CHECK(drafted > 0);
  // A server that has the request's tokens but not its slots' positions (an order lost
  // between them) drafts nothing, and says so.
  draft_server blind(early_exit(l.m, cfg, pool));
  draft_order_slot whole;
  whole.id = request_id{9};
  whole.max_tokens = 2;
  whole.tokens = {1, 20, 30, 40, 50};
  whole.prompt_tokens = 3;
  whole.sampling = sampling_params{};
  whole.blocks = test::block_ids({4});
  whole.evicted = 2;
  whole.positions = {0, 3};
  draft_order o;
  o.session = 1;
  o.slots = {whole};
  CHECK_FALSE(blind.serve(o).slots.at(0).unknown);
  o.slots[0].positions.clear();
  o.slots[0].from = 5;
  o.slots[0].tokens = {60};
  o.slots[0].evicted = 3;  // a compaction it was not told of
  CHECK(blind.serve(o).slots.at(0).unknown);
}

TEST_CASE("an answer that does not fit its order is refused whole, and the plan goes without drafts") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const int32_t vocab = l.m.config.vocab_size;
  const scheduler_config cfg = config(l.m, 64);
  thread_pool pool(1);
  draft_server server(early_exit(l.m, cfg, pool));
  const speculative_config sc = spec();
  auto reqs = requests(2);
  // Two fresh schedulers per case, each at its first decode step: the order, its good
  // answer, and the plan it fills.
  struct fixture {
    scheduler s;
    draft_orders orders;
    step_plan plan;
    draft_answer answer;
    fixture(const scheduler_config& c, const tokenizer& tok) : s(c, tok) {}
  };
  auto setup = [&](uint64_t session) {
    auto f = std::make_unique<fixture>(cfg, l.tok);
    REQUIRE(f->s.add(request_id{1}, reqs[0]).has_value());
    REQUIRE(f->s.add(request_id{2}, reqs[1]).has_value());
    step_plan prefill = f->s.schedule();
    std::vector<sample_result> firsts(2);
    f->s.update_from_output(prefill, firsts);
    plan_drafts(f->s.running(), sc, cfg.context);
    f->plan = f->s.schedule();
    f->orders.restart(session);
    auto o = f->orders.make(f->plan, f->s);
    REQUIRE(o.has_value());
    f->answer = server.serve(*o);
    return f;
  };
  struct broken {
    const char* what;
    std::function<void(draft_answer&)> edit;
  };
  const broken cases[] = {
      {"another session", [](draft_answer& a) { a.session += 1; }},
      {"a slot missing", [](draft_answer& a) { a.slots.pop_back(); }},
      {"slots swapped", [](draft_answer& a) { std::swap(a.slots[0], a.slots[1]); }},
      {"more drafts than slots", [](draft_answer& a) { a.slots[0].tokens.resize(5, 3); }},
      {"a token outside the vocabulary", [vocab](draft_answer& a) { a.slots[0].tokens[0] = vocab; }},
      {"a distribution of the wrong size", [](draft_answer& a) { a.slots[1].q.pop_back(); }},
      {"no mass on a drafted token",
       [vocab](draft_answer& a) {
         auto& d = a.slots[1];
         const float moved = d.q[d.tokens[0]];
         d.q[d.tokens[0]] = 0.0f;
         d.q[(d.tokens[0] + 1) % vocab] += moved;
       }},
      {"a distribution that is not one", [](draft_answer& a) { a.slots[1].q[0] += 0.5f; }},
      {"drafts for an unknown sequence", [](draft_answer& a) { a.slots[0].unknown = true; }},
  };
  for (const broken& c : cases) {
    CAPTURE(c.what);
    auto f = setup(9);
    REQUIRE(f->answer.slots.size() == 2);
    REQUIRE(f->answer.slots[1].q.size() == f->answer.slots[1].tokens.size() * static_cast<size_t>(vocab));
    const int32_t tokens = f->plan.num_tokens;
    c.edit(f->answer);
    CHECK_FALSE(f->orders.take(f->plan, f->s, f->answer, vocab).has_value());
    CHECK(f->plan.num_tokens == tokens);  // nothing taken
    draft_orders::give_up(f->plan);
    for (const auto& ch : f->plan.chunks) {
      CHECK(ch.num_draft == 0);
      CHECK(ch.count == 1);
    }
    CHECK(f->plan.num_tokens == 2);
  }
  // The good answer fits; a request that ended meanwhile simply gets none.
  auto f = setup(10);
  f->s.abort(request_id{1});
  REQUIRE(f->orders.take(f->plan, f->s, f->answer, vocab).has_value());
  CHECK(f->plan.chunks[0].num_draft == 0);
  CHECK(f->plan.chunks[1].num_draft == 4);
}

TEST_CASE("draft orders outside the replica's limits are refused with the reason") {
  draft_limits lim;
  lim.num_blocks = 32;
  lim.block_size = 16;
  lim.context = 256;
  lim.vocab = 512;
  draft_order_slot good;
  good.id = request_id{5};
  good.max_tokens = 3;
  good.tokens = {1, 20, 30, 40};
  good.blocks = test::block_ids({4});
  good.sampling = sampling_params{};
  good.sampling->temperature = 0.7f;
  good.prompt_tokens = 3;
  good.uniforms = {0.1f, 0.5f, 0.9f};
  auto order_with = [&](const std::function<void(draft_order&)>& edit) {
    draft_order o;
    o.session = 3;
    o.slots = {good};
    edit(o);
    return decode_draft_order(encode_draft_order(o), lim);
  };
  auto ok_order = order_with([](draft_order&) {});
  REQUIRE(ok_order.has_value());
  CHECK(ok_order->slots[0].tokens == good.tokens);
  CHECK(ok_order->slots[0].sampling->temperature == 0.7f);

  struct broken {
    std::function<void(draft_order&)> edit;
    const char* says;
  };
  const broken cases[] = {
      {[](draft_order& o) { o.slots[0].tokens[1] = 512; }, "token 512 is outside the vocabulary"},
      {[](draft_order& o) { o.slots[0].tokens[1] = -1; }, "outside the vocabulary"},
      {[](draft_order& o) { o.slots[0].blocks = test::block_ids({32}); }, "block 32 is outside the pool"},
      {[](draft_order& o) { o.slots[0].max_tokens = 16, o.slots[0].uniforms.assign(16, 0.5f); }, "a table of 1 blocks"},
      {[](draft_order& o) { o.slots[0].max_tokens = 0, o.slots[0].uniforms.clear(); }, "0 drafts"},
      {[](draft_order& o) { o.slots[0].max_tokens = 17; }, "17 drafts"},
      {[](draft_order& o) { o.slots[0].uniforms.pop_back(); }, "2 uniforms for 3 drafts"},
      {[](draft_order& o) { o.slots[0].uniforms[1] = 1.0f; }, "a uniform outside [0, 1)"},
      {[](draft_order& o) { o.slots[0].sampling.reset(); }, "without its sampler settings"},
      {[](draft_order& o) { o.slots[0].prompt_tokens = 0; }, "a prompt of 0 tokens"},
      {[](draft_order& o) { o.slots[0].prompt_tokens = 5; }, "a prompt of 5 tokens"},
      {[](draft_order& o) { o.slots[0].sampling->temperature = -1.0f; }, "temperature"},
      {[](draft_order& o) { o.slots[0].sampling->logit_bias = {{600, 1.0f}}; }, "outside the vocabulary"},
      {[](draft_order& o) { o.slots[0].sampling->temperature = 0.0f; }, "greedy ones none"},
      {[](draft_order& o) { o.slots.push_back(o.slots[0]); }, "comes twice"},
      {[](draft_order& o) { o.slots[0].from = 250; }, "does not fit the context"},
      {[](draft_order& o) { o.slots[0].from = -3; }, "does not fit the context"},
      // KV eviction: fewer slots than computed tokens, one at least; their positions ascend.
      {[](draft_order& o) { o.slots[0].evicted = 3; }, "3 tokens evicted of 3 computed"},
      {[](draft_order& o) { o.slots[0].evicted = -1; }, "-1 tokens evicted"},
      {[](draft_order& o) { o.slots[0].positions = {0, 2}; }, "slot positions without evicted tokens"},
      {[](draft_order& o) { o.slots[0].evicted = 1, o.slots[0].positions = {2, 1}; }, "slot positions must ascend"},
      {[](draft_order& o) { o.slots[0].evicted = 1, o.slots[0].positions = {0, 3}; }, "slot positions must ascend"},
      {[](draft_order& o) { o.slots[0].evicted = 1, o.slots[0].positions = {0, 1, 2}; }, "positions for 3 slots; it holds 2"},
      // Compactions: slot kept[i] to slot i, ascending within the old table; tables in the pool.
      {[](draft_order& o) { o.compactions = {{request_id{5}, {0, 16}, false, test::block_ids({4}), {}}}; },
       "kept slots must ascend within its table of 16 slots"},
      {[](draft_order& o) { o.compactions = {{request_id{5}, {3, 2}, false, test::block_ids({4}), {}}}; }, "kept slots must ascend"},
      {[](draft_order& o) { o.compactions = {{request_id{5}, {0, 1}, false, test::block_ids({40}), {}}}; },
       "block 40 is outside the pool"},
      {[](draft_order& o) { o.compactions = {{request_id{5}, {0, 1}, false, test::block_ids({4}), test::block_ids({33})}}; },
       "block 33 is outside the pool"},
      // Token trees: widths 1..16, up to 16 deep, a position per depth, no uniforms.
      {[](draft_order& o) { o.tree = {3, 0}; }, "widths must be in 1..16"},
      {[](draft_order& o) { o.tree = {17}; }, "widths must be in 1..16"},
      {[](draft_order& o) { o.tree.assign(17, 1); }, "a tree of depth 17"},
      {[](draft_order& o) { o.tree = {2, 2}, o.slots[0].uniforms.clear(); }, "3 positions in a tree of depth 2"},
      {[](draft_order& o) { o.tree = {2, 2, 1}; }, "a tree's candidates take no uniforms"},
  };
  for (const broken& c : cases) {
    CAPTURE(c.says);
    auto got = order_with(c.edit);
    REQUIRE_FALSE(got.has_value());
    CHECK(got.err().message.find(c.says) != std::string::npos);
  }
  auto evicting = order_with([](draft_order& o) {
    o.slots[0].evicted = 1, o.slots[0].positions = {0, 2}, o.slots[0].rope_in_cache = true;
  });
  REQUIRE_MESSAGE(evicting.has_value(), (evicting ? "" : evicting.err().message));
  CHECK(evicting->slots[0].evicted == 1);
  CHECK(evicting->slots[0].positions == std::vector<int32_t>{0, 2});
  CHECK(evicting->slots[0].rope_in_cache);
  auto moved = order_with([](draft_order& o) {
    o.compactions = {{request_id{5}, {0, 2, 3}, true, test::block_ids({4, 6}), test::block_ids({7})}};
  });
  REQUIRE_MESSAGE(moved.has_value(), (moved ? "" : moved.err().message));
  REQUIRE(moved->compactions.size() == 1);
  CHECK(moved->compactions[0].kept == std::vector<int32_t>{0, 2, 3});
  CHECK(moved->compactions[0].rotate);
  CHECK(moved->compactions[0].block_table == test::block_ids({4, 6}));
  CHECK(moved->compactions[0].new_table == test::block_ids({7}));
  auto tree_order = order_with([](draft_order& o) { o.tree = {2, 2, 1}, o.slots[0].uniforms.clear(); });
  REQUIRE_MESSAGE(tree_order.has_value(), (tree_order ? "" : tree_order.err().message));
  CHECK(tree_order->tree == std::vector<int32_t>{2, 2, 1});
  // A tree's candidates come back per position; one wider than a tree may be is refused.
  draft_answer a;
  a.session = 3;
  a.slots.push_back({request_id{5}, {7, 8}, {}, false, {{7, 9}, {8}}});
  auto back = decode_drafts(encode_drafts(a, lim.vocab), lim);
  REQUIRE(back.has_value());
  CHECK(back->slots[0].levels == a.slots[0].levels);
  a.slots[0].levels[0].assign(17, 3);
  CHECK_FALSE(decode_drafts(encode_drafts(a, lim.vocab), lim).has_value());
  a.slots[0].levels.assign(3, {7});  // candidates for three positions, two drafted
  CHECK_FALSE(decode_drafts(encode_drafts(a, lim.vocab), lim).has_value());
  // Bytes that are no order at all.
  std::vector<uint8_t> junk(64, 0xff);
  CHECK_FALSE(decode_draft_order(junk, lim).has_value());
  CHECK_FALSE(decode_drafts(junk, lim).has_value());
  // A refusal reads as an error, with the draft actor's reason.
  auto refused = decode_drafts(encode_draft_refusal("block 99 is outside the pool"), lim);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message == "draft actor: block 99 is outside the pool");
}

}  // namespace troupe::wire
