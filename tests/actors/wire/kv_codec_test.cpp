#include "actors/wire/kv_codec.hpp"

#include <functional>
#include <numeric>
#include <tuple>
#include <utility>

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/wire/frame.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/speculative/speculative.hpp"
#include "schema/kv.capnp.h"
#include "tests/support/test_support.hpp"

namespace troupe::wire {

namespace {

kv_limits limits() {
  kv_limits l;
  l.num_blocks = 16;
  l.block_size = 4;
  l.context = 64;
  l.max_claims = 8;
  return l;
}

// One exchange as the kv manager serves it: decode, (reset,) grant, encode.
std::vector<uint8_t> serve(kv_claim_receiver& rx, kv_block_manager& kv, std::span<const uint8_t> msg) {
  auto step = rx.decode(msg);
  if (!step) return encode_kv_error(rx.session(), step.err().message);
  if (step->reset) kv = kv_block_manager(16, 4, true);
  auto g = kv.grant(step->request);
  if (!g) return encode_kv_error(step->session, g.err().message);
  return encode_kv_grants(step->session, *g);
}

// A KvStep built by hand with one claim.
std::vector<uint8_t> one_claim(uint64_t session, bool reset, uint64_t id, bool admit, int32_t computed, int32_t from,
                               std::vector<int32_t> toks,
                               const std::function<void(schema::Claim::Builder)>& more = {}) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<schema::KvStep>();
  root.setSession(session);
  root.setReset(reset);
  root.setBudget(64);
  auto c = root.initClaims(1)[0];
  c.setRequestId(id);
  c.setAdmit(admit);
  c.setComputed(computed);
  c.setTokensFrom(from);
  auto t = c.initTokens(static_cast<unsigned>(toks.size()));
  for (size_t i = 0; i < toks.size(); ++i) t.set(static_cast<unsigned>(i), toks[i]);
  if (more) more(c);
  return to_bytes(msg);
}

// Two schedulers over the same requests: one keeps its blocks itself, the other claims
// them through the kv codec from a kv manager. Each step they must plan alike.
struct twin_schedulers {
  scheduler local, remote;
  kv_claim_sender tx{limits()};
  kv_claim_receiver rx{limits()};
  kv_block_manager kv{16, 4, true};
  size_t bytes_sent = 0, rounds = 0;
  int dropped = 0;  // blocks the kv manager's grants took off tables

  static scheduler_config config(int32_t max_step_tokens, bool remote_kv, const kv_eviction_config& eviction = {},
                                 size_t tier_blocks = 0) {
    scheduler_config cfg;
    cfg.tier_blocks = tier_blocks;
    cfg.eviction = eviction;
    cfg.max_step_tokens = max_step_tokens;
    cfg.kv.num_blocks = 16;
    cfg.kv.block_size = 4;
    cfg.max_running = 4;
    cfg.context = 64;
    cfg.vocab = 512;
    cfg.remote_kv = remote_kv;
    return cfg;
  }
  explicit twin_schedulers(int32_t max_step_tokens, const kv_eviction_config& eviction = {}, size_t tier_blocks = 0)
      : local(config(max_step_tokens, false, eviction, tier_blocks), test::tok512()),
        remote(config(max_step_tokens, true, eviction, tier_blocks), test::tok512()) {
    tx.restart(42);
  }

  void add(uint64_t id, const request_params& p) {
    REQUIRE(local.add(request_id{id}, p).has_value());
    REQUIRE(remote.add(request_id{id}, p).has_value());
  }

  // The next step of each; checks that they agree.
  std::pair<step_plan, step_plan> plan() {
    step_plan a = local.schedule();
    step_draft d = remote.begin_step();
    while (auto q = remote.next_claims(d)) {
      const auto msg = tx.encode(*q);
      bytes_sent += msg.size();
      ++rounds;
      auto g = tx.decode(serve(rx, kv, msg));
      REQUIRE_MESSAGE(g.has_value(), (g ? "" : g.err().message));
      for (const auto& x : g->grants) dropped += x.dropped;
      remote.apply(d, std::move(g).value());
    }
    step_plan b = remote.end_step(d);
    REQUIRE(a.chunks.size() == b.chunks.size());
    CHECK(a.preempted == b.preempted);
    REQUIRE(a.compactions.size() == b.compactions.size());
    for (size_t i = 0; i < a.compactions.size(); ++i) {
      CHECK(a.compactions[i].id == b.compactions[i].id);
      CHECK(a.compactions[i].kept == b.compactions[i].kept);
      CHECK(test::block_values(a.compactions[i].block_table) == test::block_values(b.compactions[i].block_table));
    }
    auto same_moves = [](const std::vector<tier_move>& x, const std::vector<tier_move>& y) {
      REQUIRE(x.size() == y.size());
      for (size_t i = 0; i < x.size(); ++i) {
        CHECK(x[i].id == y[i].id);
        CHECK(x[i].block == y[i].block);
        CHECK(x[i].key == y[i].key);
      }
    };
    same_moves(a.tier_loads, b.tier_loads);
    same_moves(a.tier_saves, b.tier_saves);
    for (size_t i = 0; i < a.chunks.size(); ++i) {
      CHECK(a.chunks[i].id == b.chunks[i].id);
      CHECK(a.chunks[i].first == b.chunks[i].first);
      CHECK(a.chunks[i].count == b.chunks[i].count);
      CHECK(a.chunks[i].num_draft == b.chunks[i].num_draft);
      CHECK(test::block_values(a.chunks[i].block_table) == test::block_values(b.chunks[i].block_table));
    }
    return {std::move(a), std::move(b)};
  }

  // Both steps give each sampled chunk emitted[k] tokens (empty: one each).
  void finish(const step_plan& a, const step_plan& b, const std::vector<int32_t>& emitted) {
    int32_t rows = a.num_samples();
    if (!emitted.empty()) rows = std::accumulate(emitted.begin(), emitted.end(), 0);
    std::vector<sample_result> sa(static_cast<size_t>(rows)), sb(static_cast<size_t>(rows));
    for (auto& x : sa) x.token = 105;
    for (auto& x : sb) x.token = 105;
    local.update_from_output(a, sa, emitted);
    remote.update_from_output(b, sb, emitted);
  }

  // Hands back what the remote scheduler released; the kv manager's blocks in use after.
  uint32_t release_all() {
    kv_step_request rest;
    rest.releases = remote.take_releases();
    auto g = tx.decode(serve(rx, kv, tx.encode(rest)));
    REQUIRE(g.has_value());
    return g->usage.used;
  }
};

}  // namespace

TEST_CASE("a scheduler's claims through the kv codec plan the steps the in-process block manager plans") {
  twin_schedulers twins(16);
  for (uint64_t id = 1; id <= 6; ++id) {
    request_params p;
    for (int32_t i = 0; i < 3 + static_cast<int32_t>(id) * 2; ++i) p.prompt.push_back(100 + (i + (id % 2)) % 7);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 12;
    twins.add(id, p);
  }
  for (int step = 0; step < 200 && twins.local.has_unfinished(); ++step) {
    const auto [a, b] = twins.plan();
    twins.finish(a, b, {});
  }
  CHECK_FALSE(twins.remote.has_unfinished());
  CHECK(twins.release_all() == 0);
  CHECK(twins.rx.num_known_requests() == 0);
  CHECK(twins.rounds > 0);
  MESSAGE(twins.rounds << " exchanges, " << twins.bytes_sent << " bytes of claims");
}

TEST_CASE("KV tiers cross the kv codec: tier prefixes claimed, loads granted, landings heard, as in process") {
  twin_schedulers twins(64, {}, 100);
  auto prompt = [](int32_t first, int32_t n) {
    request_params p;
    for (int32_t i = 0; i < n; ++i) p.prompt.push_back(first + i);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 6;
    return p;
  };
  auto drain = [&] {
    for (int step = 0; step < 100 && twins.local.has_unfinished(); ++step) {
      const auto [a, b] = twins.plan();
      twins.local.settle_tier_loads(a, {});
      twins.remote.settle_tier_loads(b, {});
      twins.finish(a, b, {});
    }
    REQUIRE_FALSE(twins.remote.has_unfinished());
  };
  twins.add(1, prompt(10, 21));
  drain();
  // Other prompts push it out of the 16-block pool; then it comes back from the tiers.
  for (uint64_t id = 2; id <= 4; ++id) twins.add(id, prompt(100 + 30 * static_cast<int32_t>(id), 40));
  drain();
  twins.add(5, prompt(10, 21));
  const auto [a, b] = twins.plan();
  CHECK(a.tier_loads.size() == 5);  // 20 of its 21 tokens in whole blocks
  twins.local.settle_tier_loads(a, {});
  twins.remote.settle_tier_loads(b, {});
  twins.finish(a, b, {});
  drain();
  // (The churn's preempted requests came back from the tiers too.)
  CHECK(twins.local.tiers_now().loaded_tokens >= 20);
  CHECK(twins.remote.tiers_now().loaded_tokens == twins.local.tiers_now().loaded_tokens);
  CHECK(twins.release_all() == 0);
  // Its blocks joined the kv manager's prefix cache once the landing was heard: the same
  // prompt now hits the pool.
  twins.add(6, prompt(10, 21));
  const auto [c, d] = twins.plan();
  CHECK(c.tier_loads.empty());
  REQUIRE(d.chunks.size() == 1);
  CHECK(d.chunks[0].first == 20);
}

TEST_CASE("draft positions cross the kv codec: claimed, granted, and their blocks dropped as in process") {
  twin_schedulers twins(24);
  for (uint64_t id = 1; id <= 3; ++id) {
    request_params p;
    for (int32_t i = 0; i < 2 + static_cast<int32_t>(id) * 3; ++i) p.prompt.push_back(100 + (i * 5 + static_cast<int32_t>(id)) % 11);
    p.max_tokens = 20;
    p.ignore_eos = true;
    twins.add(id, p);
  }
  speculative_config sc;
  sc.method = spec_method::ngram;
  sc.k = 5;
  sc.max_step_tokens = 24;  // room for every request's drafts
  int drafted = 0;
  for (int step = 0; step < 200 && twins.local.has_unfinished(); ++step) {
    plan_drafts(twins.local.running(), sc, 64);
    plan_drafts(twins.remote.running(), sc, 64);
    const auto [a, b] = twins.plan();
    // The same verdicts for both: every draft accepted twice, then none. Draft lengths
    // adapt alike, so runs grow, then collapse, leaving blocks the next step drops.
    std::vector<int32_t> emitted;
    for (const scheduled_chunk& c : a.chunks) {
      drafted += c.num_draft;
      if (!c.sample) continue;
      emitted.push_back(step % 3 == 2 ? 1 : c.num_draft + 1);
      if (c.num_draft == 0) continue;
      after_verify(*twins.local.find(c.id), c.num_draft, emitted.back() - 1, sc);
      after_verify(*twins.remote.find(c.id), c.num_draft, emitted.back() - 1, sc);
    }
    twins.finish(a, b, emitted);
  }
  CHECK_FALSE(twins.remote.has_unfinished());
  CHECK(drafted > 20);
  CHECK(twins.dropped > 0);  // rejected drafts gave blocks back
  CHECK(twins.release_all() == 0);
}

TEST_CASE("KV eviction crosses the kv codec: budgets and evictions claimed, grants within them, as in process") {
  // Streaming within 12 slots (3 blocks of 4) while every request runs to 40 tokens, past
  // the context of 64 for some: the pool of 16 blocks holds every request at once.
  const kv_eviction_config e{kv_policy::streaming, 12, 2, -1, 16};
  twin_schedulers twins(16, e);
  for (uint64_t id = 1; id <= 5; ++id) {
    request_params p;
    for (int32_t i = 0; i < 5 + static_cast<int32_t>(id); ++i) p.prompt.push_back(100 + (i * 3 + static_cast<int32_t>(id)) % 9);
    p.sampling.temperature = 0.0f;
    p.max_tokens = 40 + static_cast<int32_t>(id) * 6;
    p.ignore_eos = true;
    twins.add(id, p);
  }
  int compactions = 0;
  uint32_t most = 0;
  for (int step = 0; step < 400 && twins.local.has_unfinished(); ++step) {
    const auto [a, b] = twins.plan();
    compactions += static_cast<int>(a.compactions.size());
    twins.finish(a, b, {});
    most = std::max(most, twins.local.usage().used);
  }
  CHECK_FALSE(twins.remote.has_unfinished());
  CHECK(compactions > 20);
  CHECK(most <= 15);  // 5 requests x 3 blocks
  CHECK(twins.release_all() == 0);
}

TEST_CASE("a claim's eviction figures are refused where they contradict it") {
  kv_claim_receiver rx(limits());
  auto claim_with = [&](int32_t evicted, int32_t budget, bool admit, int32_t computed, int32_t tokens) {
    return rx.decode(one_claim(1, true, 3, admit, computed, 0, std::vector<int32_t>(static_cast<size_t>(tokens), 5),
                               [&](schema::Claim::Builder c) {
                                 c.setEvicted(evicted);
                                 c.setKvBudget(budget);
                               }));
  };
  CHECK(claim_with(0, 12, true, 0, 20).has_value());
  CHECK(claim_with(0, 12, true, 0, 100).has_value());  // past the context of 64, within a budget
  auto why = [&](auto got) { return got ? std::string() : got.err().message; };
  CHECK(why(claim_with(0, 0, true, 0, 100)).find("the context holds 64") != std::string::npos);
  CHECK(why(claim_with(2, 12, true, 0, 20)).find("2 tokens evicted") != std::string::npos);
  CHECK(why(claim_with(9, 12, false, 8, 20)).find("9 tokens evicted of 8 computed") != std::string::npos);
  CHECK(why(claim_with(3, 0, false, 8, 20)).find("without a KV budget") != std::string::npos);
  CHECK(why(claim_with(0, 65, true, 0, 20)).find("a KV budget of 65") != std::string::npos);
  CHECK(why(claim_with(-1, 12, false, 8, 20)).find("evicted") != std::string::npos);
  // A compaction's first slot written: within the slots the request keeps, with a budget.
  auto rewriting = [&](int32_t from, int32_t budget, bool admit) {
    return rx.decode(one_claim(1, true, 3, admit, 8, 0, std::vector<int32_t>(20, 5), [&](schema::Claim::Builder c) {
      c.setEvicted(admit ? 0 : 3);
      c.setKvBudget(budget);
      c.setRewriteFrom(from);
    }));
  };
  auto fine = rewriting(5, 12, false);
  REQUIRE_MESSAGE(fine.has_value(), why(fine));
  CHECK(fine->request.claims[0].rewrite_from == 5);
  CHECK(rewriting(-1, 12, false).has_value());
  CHECK(why(rewriting(6, 12, false)).find("a compaction from slot 6 of 5 cached") != std::string::npos);
  CHECK(why(rewriting(2, 0, false)).find("without a KV budget") != std::string::npos);
  CHECK(why(rewriting(0, 12, true)).find("a compaction from slot 0") != std::string::npos);
  CHECK(why(rewriting(-2, 12, false)).find("a compaction from slot -2") != std::string::npos);
  // The chunk limit and hit margin: non-negative, the margin within the context, and both
  // only with a budget.
  auto chunking = [&](int32_t limit, int32_t margin, int32_t budget) {
    return rx.decode(one_claim(1, true, 3, true, 0, 0, std::vector<int32_t>(20, 5), [&](schema::Claim::Builder c) {
      c.setKvBudget(budget);
      c.setChunkLimit(limit);
      c.setHitMargin(margin);
    }));
  };
  auto chunked = chunking(64, 32, 12);
  REQUIRE_MESSAGE(chunked.has_value(), why(chunked));
  CHECK(chunked->request.claims[0].chunk_limit == 64);
  CHECK(chunked->request.claims[0].hit_margin == 32);
  CHECK(chunking(0, 0, 0).has_value());
  CHECK(why(chunking(-1, 1, 12)).find("a chunk limit of -1") != std::string::npos);
  CHECK(why(chunking(8, -3, 12)).find("a hit margin of -3") != std::string::npos);
  CHECK(why(chunking(8, 65, 12)).find("a hit margin of 65") != std::string::npos);
  CHECK(why(chunking(8, 1, 0)).find("without a KV budget") != std::string::npos);
}

TEST_CASE("a claim's draft positions are refused out of range, and on an admission") {
  auto with_drafts = [](bool admit, int32_t drafts) {
    capnp::MallocMessageBuilder msg;
    auto root = msg.initRoot<schema::KvStep>();
    root.setSession(3);
    root.setReset(true);
    root.setBudget(64);
    auto c = root.initClaims(1)[0];
    c.setRequestId(9);
    c.setAdmit(admit);
    auto t = c.initTokens(2);
    t.set(0, 1);
    t.set(1, 2);
    c.setSpeculative(drafts);
    return to_bytes(msg);
  };
  for (const auto& [admit, drafts, why] : std::vector<std::tuple<bool, int32_t, std::string>>{
           {false, -1, "draft positions"}, {false, 64, "draft positions"}, {true, 2, "draft positions"},
           {false, 16, ""}, {false, 62, ""}}) {  // (up to a token tree's 63 nodes, in a context of 64)
    kv_claim_receiver fresh(limits());
    auto step = fresh.decode(with_drafts(admit, drafts));
    const int32_t draft_count = drafts;  // (a variable: clang 14 captures no binding)
    CAPTURE(draft_count);
    if (why.empty()) {
      CHECK(step.has_value());
    } else {
      REQUIRE_FALSE(step.has_value());
      CHECK(step.err().message.find(why) != std::string::npos);
    }
  }
}

TEST_CASE("the kv receiver keeps each request's tokens: whole on admission, the rest as deltas") {
  kv_claim_receiver rx(limits());
  auto s = rx.decode(one_claim(7, true, 1, true, 0, 0, {1, 2, 3}));
  REQUIRE(s.has_value());
  CHECK(s->reset);
  REQUIRE(s->request.claims.size() == 1);
  CHECK(std::vector<int32_t>(s->request.claims[0].tokens.begin(), s->request.claims[0].tokens.end()) ==
        std::vector<int32_t>{1, 2, 3});
  s = rx.decode(one_claim(7, false, 1, false, 3, 3, {4}));
  REQUIRE(s.has_value());
  CHECK(std::vector<int32_t>(s->request.claims[0].tokens.begin(), s->request.claims[0].tokens.end()) ==
        std::vector<int32_t>{1, 2, 3, 4});
  // A delta that does not start where the kv manager stands is refused, and changes nothing.
  CHECK_FALSE(rx.decode(one_claim(7, false, 1, false, 3, 2, {5})).has_value());
  CHECK_FALSE(rx.decode(one_claim(7, false, 2, false, 0, 3, {5})).has_value());  // unknown request
  CHECK_FALSE(rx.decode(one_claim(7, false, 1, false, 9, 4, {5})).has_value());  // computed past its tokens
  CHECK_FALSE(rx.decode(one_claim(7, false, 3, true, 0, 0, std::vector<int32_t>(65, 1))).has_value());  // over context
  CHECK_FALSE(rx.decode(one_claim(7, false, 3, true, 0, 0, {})).has_value());  // no tokens
  s = rx.decode(one_claim(7, false, 1, false, 4, 4, {5}));
  REQUIRE(s.has_value());
  CHECK(s->request.claims[0].tokens.size() == 5);
}

TEST_CASE("sessions: a restarted kv manager refuses claims until reset, and other sessions are refused") {
  kv_claim_receiver fresh(limits());
  auto s = fresh.decode(one_claim(7, false, 1, true, 0, 0, {1, 2}));
  REQUIRE_FALSE(s.has_value());
  CHECK(s.err().message.find("never reset") != std::string::npos);
  REQUIRE(fresh.decode(one_claim(7, true, 1, true, 0, 0, {1, 2})).has_value());
  s = fresh.decode(one_claim(8, false, 2, true, 0, 0, {1, 2}));
  REQUIRE_FALSE(s.has_value());
  CHECK(s.err().message.find("serves session 7") != std::string::npos);
  // A reset of another session takes over, and forgets the old one's tokens.
  REQUIRE(fresh.decode(one_claim(8, true, 2, true, 0, 0, {1, 2})).has_value());
  CHECK(fresh.num_known_requests() == 1);

  // The sender side: an error answer, another session's grants, and grants that do not fit
  // the claims are errors.
  kv_claim_sender tx(limits());
  tx.restart(5);
  kv_step_request q;
  q.budget = 8;
  const std::vector<int32_t> toks{1, 2, 3, 4, 5};
  q.claims = {{request_id{1}, true, 0, 0, 0, toks}};
  (void)tx.encode(q);
  CHECK_FALSE(tx.decode(encode_kv_error(5, "broken")).has_value());
  // A restarted kv manager's refusal names its reason, not only the other session.
  const auto refused = tx.decode(encode_kv_error(0, "never reset"));
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("never reset") != std::string::npos);
  kv_step_grants g;
  g.grants.push_back({request_id{1}, 0, 5, test::block_ids({0, 1})});
  CHECK(tx.decode(encode_kv_grants(5, g)).has_value());
  CHECK_FALSE(tx.decode(encode_kv_grants(6, g)).has_value());
  g.grants[0].added = test::block_ids({0, 16});  // outside the pool
  CHECK_FALSE(tx.decode(encode_kv_grants(5, g)).has_value());
  g.grants[0].added = test::block_ids({0});  // too short for 5 tokens
  CHECK_FALSE(tx.decode(encode_kv_grants(5, g)).has_value());
  g.grants[0] = {request_id{2}, 0, 5, test::block_ids({0, 1})};  // not the claimed request
  CHECK_FALSE(tx.decode(encode_kv_grants(5, g)).has_value());
  g.grants[0] = {request_id{1}, 0, 6, test::block_ids({0, 1})};  // more tokens than it has
  CHECK_FALSE(tx.decode(encode_kv_grants(5, g)).has_value());
  g.grants = {{request_id{1}, 0, 5, test::block_ids({0, 1})}, {request_id{1}, 0, 5, test::block_ids({0, 1})}};  // more grants than claims
  CHECK_FALSE(tx.decode(encode_kv_grants(5, g)).has_value());
}

TEST_CASE("truncated and corrupted kv frames are errors, never crashes") {
  kv_claim_receiver rx(limits());
  const auto good = one_claim(7, true, 1, true, 0, 0, {1, 2, 3, 4, 5, 6});
  for (size_t n = 0; n < good.size(); n += 3)
    CHECK_FALSE(rx.decode(std::span<const uint8_t>(good.data(), n)).has_value());
  for (size_t i = 8; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0xA5;
    (void)rx.decode(bad);  // any answer, as long as it is one
  }
  kv_claim_sender tx(limits());
  for (size_t n = 0; n < good.size(); n += 5) CHECK_FALSE(tx.decode(std::span<const uint8_t>(good.data(), n)).has_value());
}

}  // namespace troupe::wire
