// KV eviction in the engine loop: a budget never reached changes nothing; with one, every
// request stays within it and long requests that would preempt each other all fit;
// streaming decodes past the model's context; a compaction moves each kept slot down
// exactly, turning keys back by the distance moved where positions are slots.
#include <cmath>

#include <doctest/doctest.h>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/generate/generator.hpp"
#include "engine/kv/kv_eviction.hpp"
#include "engine/serve/llm_engine.hpp"
#include "kernels/cpu/rope.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

const test::loaded& stories() {
  static const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  return l;
}

std::vector<request_params> long_requests(const tokenizer& tok, int count, int32_t max_tokens) {
  const char* prompts[] = {"Once upon a time", "The cat", "Lily and Tom went to the", "One day", "She saw a big", "Tim had"};
  std::vector<request_params> out;
  for (int i = 0; i < count; ++i) {
    request_params p;
    p.prompt = tok.encode(prompts[i % 6], true);
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
    p.sampling.temperature = i % 2 ? 0.0f : 0.9f;
    p.sampling.seed = 40 + i;
    out.push_back(p);
  }
  return out;
}

// Runs every request to the end; each step, checks `each_step`.
std::vector<std::vector<int32_t>> run_all(llm_engine& e, const std::vector<request_params>& reqs,
                                          const std::function<void()>& each_step = {}) {
  for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(e.add_request(request_id{i}, reqs[i]).has_value());
  std::vector<std::vector<int32_t>> out(reqs.size());
  for (int steps = 0; e.has_unfinished() && steps < 20000; ++steps) {
    for (const step_output& o : e.step()) out[o.id.value].insert(out[o.id.value].end(), o.new_tokens.begin(), o.new_tokens.end());
    if (each_step) each_step();
  }
  CHECK_FALSE(e.has_unfinished());
  return out;
}

engine_config small_pool(uint32_t blocks) {
  engine_config cfg;
  cfg.sched.kv.block_size = 16;
  cfg.sched.kv.num_blocks = blocks;
  cfg.sched.max_step_tokens = 64;
  cfg.sched.max_running = 8;
  return cfg;
}

}  // namespace

TEST_CASE("a KV budget no request reaches changes nothing") {
  const auto& l = stories();
  const auto reqs = long_requests(l.tok, 4, 60);
  for (kv_policy p : {kv_policy::streaming, kv_policy::h2o, kv_policy::scissorhands}) {
    CAPTURE(kv_policy_name(p));
    engine_config plain = small_pool(64), evicting = plain;
    evicting.sched.eviction = {p, 128, -1, -1, 16};
    llm_engine a(l.m, l.tok, plain), b(l.m, l.tok, evicting);
    CHECK(run_all(a, reqs) == run_all(b, reqs));  // (the attention figures cost no bit)
    CHECK(b.stats().evicted_tokens == 0);
  }
}

TEST_CASE("with a KV budget every request stays within it, and long requests that preempt each other all fit") {
  const auto& l = stories();
  const auto reqs = long_requests(l.tok, 6, 200);
  const uint32_t blocks = 24;  // each request alone wants 13 blocks; within a 48-token budget, 3
  {
    llm_engine plain(l.m, l.tok, small_pool(blocks));
    run_all(plain, reqs);
    CHECK(plain.stats().preemptions > 0);
  }
  for (kv_policy p : {kv_policy::streaming, kv_policy::h2o, kv_policy::scissorhands}) {
    CAPTURE(kv_policy_name(p));
    engine_config cfg = small_pool(blocks);
    cfg.sched.eviction = {p, 48, 4, -1, 8};
    llm_engine e(l.m, l.tok, cfg);
    uint32_t most = 0;
    const auto got = run_all(e, reqs, [&] { most = std::max(most, e.kv().used); });
    CHECK(e.stats().preemptions == 0);
    CHECK(most <= reqs.size() * 3);  // never more than the budget's blocks each
    CHECK(e.stats().evicted_tokens >= reqs.size() * (200 - 48));
    for (const auto& t : got) CHECK(t.size() == 200);
  }
}

TEST_CASE("a request's own KV policy overrides the deployment's, alone of the batch") {
  const auto& l = stories();
  auto reqs = long_requests(l.tok, 4, 120);
  for (auto& r : reqs) r.sampling.temperature = 0.0f;
  // Requests 0 and 2 name their own budget, under a deployment without eviction and under
  // one whose default evicts everything else.
  std::vector<request_params> mixed = reqs;
  mixed[0].eviction = kv_eviction_config{kv_policy::h2o, 48, -1, -1, 16};
  mixed[2].eviction = kv_eviction_config{kv_policy::streaming, 48, 4, -1, 16};
  llm_engine plain(l.m, l.tok, small_pool(64));
  const auto want = run_all(plain, reqs);
  {
    llm_engine e(l.m, l.tok, small_pool(64));
    const auto got = run_all(e, mixed);
    CHECK(e.stats().evicted_tokens > 0);
    CHECK(got[1] == want[1]);
    CHECK(got[3] == want[3]);
    CHECK(got[0].size() == 120);
    CHECK(got[2].size() == 120);
  }
  {
    engine_config cfg = small_pool(64);
    cfg.sched.eviction = {kv_policy::scissorhands, 48, -1, -1, 8};
    std::vector<request_params> opted_out = reqs;
    opted_out[1].eviction = kv_eviction_config{};  // none: the whole cache
    llm_engine e(l.m, l.tok, cfg);
    const auto got = run_all(e, opted_out);
    CHECK(got[1] == want[1]);
    CHECK(got[0] != want[0]);  // (120 tokens within 48 of cache drift from the full cache)
  }
}

TEST_CASE("a draft model and early exit follow the evictions: the same text, and drafts still kept") {
  const auto& l = stories();
  // Greedy and seeded requests of 150 tokens, each past its budget of 48 many times over.
  const std::vector<request_params> reqs = long_requests(l.tok, 4, 150);
  for (kv_policy policy : {kv_policy::h2o, kv_policy::streaming}) {
    CAPTURE(kv_policy_name(policy));
    engine_config cfg = small_pool(64);
    cfg.sched.eviction = {policy, 48, -1, -1, 16};
    llm_engine plain(l.m, l.tok, cfg);
    const auto want = run_all(plain, reqs);
    engine_config drafting = cfg;
    drafting.spec.k = 3;
    for (spec_method method : {spec_method::draft, spec_method::early_exit}) {
      CAPTURE(spec_method_name(method));
      drafting.spec.method = method;
      drafting.draft = method == spec_method::draft ? &l.m : nullptr;  // the target drafts for itself
      drafting.spec.exit_layer = l.m.config.num_layers - 1;            // (drafts this model keeps)
      llm_engine e(l.m, l.tok, drafting);
      const auto got = run_all(e, reqs);
      // Greedy requests give the text the evicting engine gives without drafts (sampled
      // ones the same distribution, which a seed does not pin).
      CHECK(got[1] == want[1]);
      CHECK(got[3] == want[3]);
      CHECK(e.stats().evicted_tokens > 0);
      // A draft that lost track of the slots (wrong tokens or RoPE positions in them) would
      // have its drafts rejected: they are kept about as often as without eviction. The
      // target as its own draft keeps nearly all: its cache makes the target's compactions,
      // so its keys are the target's (but for tokens it caught up on after a compaction).
      engine_config whole = drafting;
      whole.sched.eviction = {};
      llm_engine full(l.m, l.tok, whole);
      run_all(full, reqs);
      const spec_tally& t = e.stats().spec;
      const spec_tally& f = full.stats().spec;
      REQUIRE(t.proposed > 100);
      REQUIRE(f.proposed > 100);
      const double rate = static_cast<double>(t.accepted) / static_cast<double>(t.proposed);
      const double full_rate = static_cast<double>(f.accepted) / static_cast<double>(f.proposed);
      CHECK(rate > (method == spec_method::draft ? 0.95 : 0.75) * full_rate);
      MESSAGE(spec_method_name(method) << " " << kv_policy_name(policy) << ": " << t.accepted << " of " << t.proposed
                                       << " drafts kept; without eviction " << f.accepted << " of " << f.proposed);
    }
  }
}

TEST_CASE("a request's KV policy is refused with the reason where it cannot run or does not fit") {
  const auto& l = stories();
  request_params p = long_requests(l.tok, 1, 20)[0];
  {
    llm_engine e(l.m, l.tok, small_pool(64));
    p.eviction = kv_eviction_config{kv_policy::streaming, 8, 4, 8, 16};
    auto st = e.add_request(request_id{1}, p);
    REQUIRE_FALSE(st.has_value());
    CHECK(st.err().message.find("budget") != std::string::npos);
    p.eviction = kv_eviction_config{kv_policy::h2o, l.m.config.max_seq_len + 1, -1, -1, 16};
    st = e.add_request(request_id{2}, p);
    REQUIRE_FALSE(st.has_value());
    CHECK(st.err().message.find("past the model's context") != std::string::npos);
  }
  {
    engine_config cfg = small_pool(64);
    cfg.spec.method = spec_method::early_exit;
    cfg.spec.tree = {2, 2};
    llm_engine e(l.m, l.tok, cfg);
    p.eviction = kv_eviction_config{kv_policy::h2o, 64, -1, -1, 16};
    auto st = e.add_request(request_id{3}, p);
    REQUIRE_FALSE(st.has_value());
    CHECK(st.err().message.find("token trees and KV eviction") != std::string::npos);
    p.eviction = kv_eviction_config{};  // asking for none is always fine
    CHECK(e.add_request(request_id{4}, p).has_value());
  }
}

TEST_CASE("evicting requests share cached prompts, never change a block another request reads, and write their "
          "own text, hit or not") {
  const auto& l = stories();
  // A long shared opening (three blocks and more), then each request's own words.
  const std::string opening =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her big red "
      "ball and her little brown dog Max. One day, she saw";
  const char* endings[] = {" a dog", " a cat", " a bird", " a tree"};
  std::vector<request_params> reqs;
  for (int i = 0; i < 4; ++i) {
    request_params p;
    p.prompt = l.tok.encode(opening + endings[i], true);
    p.max_tokens = 100;
    p.ignore_eos = true;
    p.sampling.temperature = 0.0f;
    reqs.push_back(p);
  }
  REQUIRE(reqs[0].prompt.size() > 40);
  // Requests 1 and 3 evict within 48 tokens; 0 and 2 keep the whole cache.
  std::vector<request_params> mixed = reqs;
  mixed[1].eviction = kv_eviction_config{kv_policy::h2o, 48, -1, -1, 16};
  mixed[3].eviction = kv_eviction_config{kv_policy::streaming, 48, 4, -1, 16};
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : {reqs[0], reqs[2], mixed[1], mixed[3]}) {
    llm_engine e(l.m, l.tok, small_pool(64));
    alone.push_back(run_all(e, {r})[0]);
  }
  engine_config cfg = small_pool(64);
  cfg.sched.max_step_tokens = 256;
  llm_engine e(l.m, l.tok, cfg);
  // Request 0 first, so the opening is cached when the others arrive.
  REQUIRE(e.add_request(request_id{0}, mixed[0]).has_value());
  std::vector<std::vector<int32_t>> out(4);
  uint64_t cached_prompt = 0;
  auto collect = [&] {
    for (const step_output& o : e.step()) {
      out[o.id.value].insert(out[o.id.value].end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.id.value == 1 && o.num_cached_prompt_tokens > 0) cached_prompt = o.num_cached_prompt_tokens;
    }
  };
  collect();
  for (uint64_t i = 1; i < 4; ++i) REQUIRE(e.add_request(request_id{i}, mixed[i]).has_value());
  for (int steps = 0; e.has_unfinished() && steps < 2000; ++steps) collect();
  // The evicting request's prompt came from the cache, in part: its first chunk ends at its
  // budget (48), and the hit leaves the 32 queries whose attention H2O counts to compute.
  CHECK(cached_prompt == 16);
  CHECK(e.stats().evicted_tokens > 0);
  // The requests with whole caches read the shared blocks unchanged, and the evicting ones
  // write what they write alone, without a hit and in a batch of one.
  CHECK(out[0] == alone[0]);
  CHECK(out[2] == alone[1]);
  CHECK(out[1] == alone[2]);
  CHECK(out[3] == alone[3]);
  // A later request with the same opening hits the cache, whose blocks are intact.
  REQUIRE(e.add_request(request_id{4}, reqs[2]).has_value());
  std::vector<int32_t> again;
  int32_t hit = 0;
  for (int steps = 0; e.has_unfinished() && steps < 2000; ++steps)
    for (const step_output& o : e.step()) {
      again.insert(again.end(), o.new_tokens.begin(), o.new_tokens.end());
      hit = std::max(hit, o.num_cached_prompt_tokens);
    }
  CHECK(hit >= 32);
  CHECK(again == alone[1]);
}

TEST_CASE("an evicting request's prompt chunks are whole whatever else runs: its text is its own alone") {
  // Where a chunk ends decides which queries a policy counts and which tokens it has
  // evicted before the next chunk: a chunk cut short by other requests' tokens would make
  // its text depend on the batch. It waits for a step with room instead.
  const auto& l = stories();
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her big red "
      "ball and her little brown dog Max. One day, she saw a big tree in the park. She wanted to climb it, but her "
      "mom said no. Lily was sad, so Max brought her the ball and they played until the sun went down.";
  for (kv_policy p : {kv_policy::streaming, kv_policy::h2o, kv_policy::scissorhands}) {
    CAPTURE(kv_policy_name(p));
    request_params evicting;
    evicting.prompt = l.tok.encode(story, true);
    REQUIRE(evicting.prompt.size() > 80);  // three chunks and more under a budget of 40
    evicting.max_tokens = 60;
    evicting.ignore_eos = true;
    evicting.sampling.temperature = 0.0f;
    evicting.eviction = kv_eviction_config{p, 40, 4, 12, 8};
    llm_engine solo(l.m, l.tok, small_pool(64));
    const auto alone = run_all(solo, {evicting})[0];
    // Two requests with long prompts first, each wanting more than a step's 64 tokens (in
    // namespaces of their own: no prefix hit shortens them).
    std::vector<request_params> reqs = long_requests(l.tok, 2, 30);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].prompt = l.tok.encode(story + " The end.", true);
      reqs[i].cache_namespace = 1 + i;
    }
    reqs.push_back(evicting);
    llm_engine e(l.m, l.tok, small_pool(64));
    const auto got = run_all(e, reqs);
    CHECK(e.stats().evicted_tokens > 0);
    CHECK(got[2] == alone);
  }
}

TEST_CASE("n-gram speculation under a KV budget: drafts verified, every request within its budget") {
  const auto& l = stories();
  // Repetitive prompts, so that n-gram lookup finds drafts.
  std::vector<request_params> reqs = long_requests(l.tok, 4, 160);
  for (auto& r : reqs) {
    r.prompt = l.tok.encode("The cat sat. The cat sat. The cat sat. The cat", true);
    r.sampling.temperature = 0.0f;
  }
  const uint32_t blocks = 16;  // 4 requests x 3 blocks within 40 tokens (and drafts), and spare
  for (kv_policy p : {kv_policy::h2o, kv_policy::streaming}) {
    CAPTURE(kv_policy_name(p));
    engine_config cfg = small_pool(blocks);
    cfg.sched.eviction = {p, 40, 4, -1, 16};
    cfg.spec.method = spec_method::ngram;
    cfg.spec.k = 4;
    llm_engine e(l.m, l.tok, cfg);
    uint32_t most = 0;
    const auto got = run_all(e, reqs, [&] { most = std::max(most, e.kv().used); });
    for (const auto& t : got) CHECK(t.size() == 160);
    CHECK(e.stats().preemptions == 0);
    CHECK(most <= reqs.size() * 3);
    CHECK(e.stats().evicted_tokens > 0);
    CHECK(e.stats().spec.accepted > 0);
  }
}

TEST_CASE("a compaction whose claim is not granted is taken back, and comes again with the next grant") {
  scheduler_config cfg;
  cfg.max_step_tokens = 64;
  cfg.kv.num_blocks = 32;
  cfg.kv.block_size = 4;
  cfg.context = 512;
  cfg.vocab = 512;
  cfg.remote_kv = true;
  cfg.eviction = {kv_policy::h2o, 8, -1, -1, 16};
  scheduler s(cfg, test::tok512());
  kv_block_manager m(cfg.kv.num_blocks, cfg.kv.block_size, true);  // the block manager elsewhere
  request_params p;
  p.prompt = {1, 100, 101, 102, 103, 104};
  p.max_tokens = 30;
  p.ignore_eos = true;
  p.sampling.temperature = 0.0f;
  REQUIRE(s.add(request_id{1}, p).has_value());
  bool refused_once = false, compacted_after = false;
  for (int step = 0; step < 40 && s.has_unfinished(); ++step) {
    step_draft d = s.begin_step();
    const int32_t evicted_before = s.find(request_id{1})->eviction.evicted;
    const uint64_t total_before = s.evicted_tokens();
    bool refused = false;
    while (auto q = s.next_claims(d)) {
      const bool rewrites = !q->claims.empty() && q->claims[0].rewrite_from >= 0;
      if (rewrites && !refused_once) {
        // The step's budget is spent before this claim: no grant, nothing changed elsewhere.
        refused = refused_once = true;
        s.apply(d, kv_step_grants{});
        continue;
      }
      auto g = m.grant(*q);
      REQUIRE_MESSAGE(g.has_value(), (g ? "" : g.err().message));
      compacted_after = compacted_after || (refused_once && rewrites);
      s.apply(d, std::move(g).value());
    }
    step_plan plan = s.end_step(d);
    if (refused) {
      CHECK(plan.compactions.empty());
      CHECK(plan.chunks.empty());
      CHECK(s.find(request_id{1})->eviction.evicted == evicted_before);
      CHECK(s.evicted_tokens() == total_before);
    }
    std::vector<sample_result> samples(static_cast<size_t>(plan.num_samples()));
    for (auto& x : samples) x.token = 105;
    s.update_from_output(plan, samples);
  }
  CHECK(refused_once);
  CHECK(compacted_after);
  CHECK_FALSE(s.has_unfinished());
}

TEST_CASE("an evicting request computed again, its cache lost or moved with its output, evicts as it did") {
  const auto& l = stories();
  for (kv_policy policy : {kv_policy::streaming, kv_policy::h2o, kv_policy::scissorhands}) {
    CAPTURE(kv_policy_name(policy));
    engine_config cfg = small_pool(64);
    cfg.sched.eviction = {policy, 48, -1, -1, 16};
    request_params p = long_requests(l.tok, 2, 160)[1];  // greedy
    llm_engine whole(l.m, l.tok, cfg);
    const std::vector<int32_t> want = run_all(whole, {p})[0];
    REQUIRE(want.size() == 160);
    REQUIRE(whole.stats().evicted_tokens > 0);
    // Moved off a failed replica with 70 tokens delivered (compacted several times by
    // then): the rest is what the whole run wrote.
    request_params moved = p;
    moved.delivered.assign(want.begin(), want.begin() + 70);
    llm_engine other(l.m, l.tok, cfg);
    CHECK(run_all(other, {moved})[0] == std::vector<int32_t>(want.begin() + 70, want.end()));
    // Its cache lost (a stage gone) after 90 tokens: computed again, the same text.
    llm_engine lost(l.m, l.tok, cfg);
    REQUIRE(lost.add_request(request_id{0}, p).has_value());
    std::vector<int32_t> got;
    bool reset = false;
    for (int steps = 0; lost.has_unfinished() && steps < 5000; ++steps) {
      for (const step_output& o : lost.step()) got.insert(got.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (got.size() >= 90 && !reset) {
        CHECK(lost.reset_kv() == 1);
        reset = true;
      }
    }
    CHECK(reset);
    CHECK(got == want);
  }
}

TEST_CASE("a sliding-window model under a KV budget: the slots out of the window go first") {
  test::loaded windowed = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  windowed.m.config.sliding_window = 16;
  const auto reqs = long_requests(windowed.tok, 3, 200);
  llm_engine plain(windowed.m, windowed.tok, small_pool(64));
  const auto want = run_all(plain, reqs);
  for (kv_policy p : {kv_policy::h2o, kv_policy::scissorhands}) {
    CAPTURE(kv_policy_name(p));
    // A budget of three windows, of which the policy holds only the last 2 tokens for
    // recency: every compaction finds enough out of the window to drop, so that nothing
    // the model sees goes (whatever the policy would rank first), and the text is the
    // model's without eviction.
    engine_config cfg = small_pool(64);
    cfg.sched.eviction = {p, 48, -1, 2, 16};
    llm_engine evicting(windowed.m, windowed.tok, cfg);
    CHECK(run_all(evicting, reqs) == want);
    CHECK(evicting.stats().evicted_tokens > 0);
  }
}

TEST_CASE("streaming decodes past the model's context, and the other policies stop at it") {
  const auto& l = stories();
  const int32_t context = l.m.config.max_seq_len;
  request_params p = long_requests(l.tok, 1, 2 * context + 100)[0];
  generator_options o;
  o.eviction = {kv_policy::streaming, 96, 4, -1, 16};
  auto streamed = generator(l.m, l.tok, o).generate({p});
  REQUIRE(streamed.has_value());
  CHECK((*streamed)[0].tokens.size() == static_cast<size_t>(2 * context + 100));
  CHECK((*streamed)[0].reason == finish_reason::length);
  o.eviction = {kv_policy::h2o, 96, -1, -1, 16};
  auto h2o = generator(l.m, l.tok, o).generate({p});
  REQUIRE(h2o.has_value());
  CHECK((*h2o)[0].tokens.size() == static_cast<size_t>(context) - p.prompt.size());
}

TEST_CASE("a compaction moves each kept slot down exactly, and with positions in the cache keys turn back") {
  const auto& l = stories();
  const model_config& c = l.m.config;
  const std::vector<int32_t> kept{0, 1, 2, 7, 8, 20, 21, 33, 38, 39};
  for (dtype type : {dtype::f32, dtype::f16, dtype::q8_0})
    for (bool rotate : {false, true}) {
      CAPTURE(static_cast<int>(type));
      CAPTURE(rotate);
      thread_pool pool(1);
      no_collective solo;
      kv_cache cache(transformer_shard::cache_shape(c, shard_spec{}, 4, 16, type));
      transformer_shard shard(l.m, shard_spec{}, cache, pool, solo);
      const std::vector<block_id> table = test::block_ids({3, 0, 2});
      std::vector<int32_t> tokens;
      for (int32_t i = 0; i < 40; ++i) tokens.push_back(1 + (i * 37) % 500);
      step_batch b;
      b.add(tokens, 0, table, 0);
      std::vector<float> hidden(tokens.size() * c.dim);
      shard.forward(b, hidden.data(), nullptr);
      const std::vector<uint32_t> t32{3, 0, 2};
      const int32_t kv_dim = c.num_kv_heads * c.head_dim;
      auto read = [&](int32_t layer, int32_t slot, std::vector<float>& k, std::vector<float>& v) {
        k.resize(kv_dim);
        v.resize(kv_dim);
        paged_kv_read(cache.layer(layer), t32.data(), slot, k.data(), v.data());
      };
      std::vector<std::vector<float>> before_k(c.num_layers * 40), before_v(c.num_layers * 40);
      for (int32_t layer = 0; layer < c.num_layers; ++layer)
        for (int32_t s = 0; s < 40; ++s) read(layer, s, before_k[layer * 40 + s], before_v[layer * 40 + s]);
      step_batch move;
      move.compactions.push_back({table, kept, rotate, {}});
      shard.forward(move, nullptr, nullptr);
      const std::vector<float> freqs = rope_frequencies(c);
      for (int32_t layer = 0; layer < c.num_layers; ++layer)
        for (size_t i = 0; i < kept.size(); ++i) {
          std::vector<float> k, v;
          read(layer, static_cast<int32_t>(i), k, v);
          const auto& ok = before_k[layer * 40 + kept[i]];
          const auto& ov = before_v[layer * 40 + kept[i]];
          if (!rotate || kept[i] == static_cast<int32_t>(i)) {
            CHECK(k == ok);
            CHECK(v == ov);
            continue;
          }
          // The key as it was, turned by (slot - old slot) positions, independently.
          std::vector<float> want = ok, cs(c.rope_dim / 2), sn(c.rope_dim / 2);
          for (int32_t j = 0; j < c.rope_dim / 2; ++j) {
            const double angle = double(static_cast<int32_t>(i) - kept[i]) * freqs[j];
            cs[j] = static_cast<float>(std::cos(angle));
            sn[j] = static_cast<float>(std::sin(angle));
          }
          rope(want.data(), c.num_kv_heads, c.head_dim, c.rope_dim, cs.data(), sn.data(), c.rope);
          // Stored again in the cache's type: F32 to rounding, F16 to its 11 bits, int8 to
          // half a step of the head's new scale (its largest value / 127).
          for (int32_t h = 0; h < c.num_kv_heads; ++h) {
            float big = 0.0f;
            for (int32_t d = 0; d < c.head_dim; ++d) big = std::max(big, std::fabs(want[h * c.head_dim + d]));
            for (int32_t d = h * c.head_dim; d < (h + 1) * c.head_dim; ++d) {
              const double tol = type == dtype::f32 ? 1e-5 * (1.0 + big) : type == dtype::f16 ? 1e-3 * std::fabs(want[d]) + 1e-6
                                                                                                : big / 254.0 * 1.01 + 1e-6;
              CHECK(std::fabs(k[d] - want[d]) <= tol);
            }
          }
          if (type != dtype::q8_0) CHECK(v == ov);  // (int8 values are quantized again, their scale
          else                                     // the same to rounding)
            for (int32_t d = 0; d < kv_dim; ++d) CHECK(v[d] == doctest::Approx(ov[d]).epsilon(1e-5).scale(1.0));
        }
    }
}

}  // namespace troupe
