// Speculative decoding: the proposers, the adaptive draft length and the draft plan, and
// the engine loop's output against plain decoding, token for token under greedy, with each
// proposer, chains and trees (verification itself: verify_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include <doctest/doctest.h>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/sample/rng.hpp"
#include "engine/sample/sampler.hpp"
#include "engine/serve/llm_engine.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/speculative/ngram_proposer.hpp"
#include "engine/speculative/speculative.hpp"
#include "kernels/cpu/sample.hpp"
#include "tests/engine/speculative/spec_test_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

using spec_test::outcome;
using spec_test::run_all;
using spec_test::truncated_draft;

TEST_CASE("n-gram lookup proposes what followed the latest match of the longest suffix") {
  using v = std::vector<int32_t>;
  // "1 2 3 9 | 1 2 3 7 | 1 2 3": the latest "1 2 3" before the end is followed by 7.
  CHECK(ngram_proposer::lookup(v{1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3}, 3, 1, 4) == v{7, 1, 2});
  // The longest suffix wins over a later, shorter match: "5 1 2" occurs once, followed by 4.
  CHECK(ngram_proposer::lookup(v{5, 1, 2, 4, 8, 1, 2, 6, 5, 1, 2}, 2, 1, 3) == v{4, 8});
  // k caps the proposal; the end of the sequence cuts it.
  CHECK(ngram_proposer::lookup(v{4, 5, 6, 4}, 8, 1, 4) == v{5, 6, 4});
  // Nothing matches, or the suffix is shorter than the minimum.
  CHECK(ngram_proposer::lookup(v{1, 2, 3, 4}, 3, 1, 4).empty());
  CHECK(ngram_proposer::lookup(v{1, 2, 1}, 3, 2, 4).empty());
  CHECK(ngram_proposer::lookup(v{7}, 3, 1, 4).empty());
}

TEST_CASE("the draft length grows after full acceptance, falls to what was accepted, within its cap") {
  CHECK(next_draft_length(3, 3, 3, 5) == 4);
  CHECK(next_draft_length(5, 5, 5, 5) == 5);
  CHECK(next_draft_length(4, 4, 1, 5) == 2);
  CHECK(next_draft_length(4, 4, 0, 5) == 1);
  CHECK(next_draft_length(2, 1, 1, 5) == 3);  // a proposal cut short, fully taken
}

namespace {

// One decoding request (its prompt computed but the last token) under an n-gram
// configuration, and the draft slots plan_drafts gives it each step.
struct one_decoding {
  request r{request_id{1}, params(), 0};
  speculative_config c;
  std::vector<request*> running{&r};

  one_decoding() {
    r.num_computed_tokens = 2;
    r.state = request_state::running;
    c.method = spec_method::ngram;
  }
  static request_params params() {
    request_params p;
    p.prompt = {1, 5, 6};
    p.max_tokens = 1000;
    return p;
  }
  int32_t wanted() {
    plan_drafts(running, c, 512);
    return r.drafts.wanted;
  }
  void verified(int32_t proposed, int32_t accepted) { after_verify(r, proposed, accepted, c); }
};

}  // namespace

TEST_CASE("single drafts rejected again and again pause a request's drafting, for longer each time") {
  one_decoding d;
  d.c.k = 4;
  CHECK(d.wanted() == 4);
  d.verified(4, 0);  // nothing taken: one next
  CHECK(d.wanted() == 1);
  d.verified(1, 0);  // a first single miss: keep trying
  CHECK(d.wanted() == 1);
  d.verified(1, 0);  // a second: four steps without drafts
  for (int i = 0; i < 4; ++i) CHECK(d.wanted() == 0);
  CHECK(d.wanted() == 1);
  d.verified(1, 0);  // a third: eight
  for (int i = 0; i < 8; ++i) CHECK(d.wanted() == 0);
  CHECK(d.wanted() == 1);
  d.verified(1, 1);  // taken: the streak ends, the length grows
  CHECK(d.r.drafts.misses == 0);
  CHECK(d.wanted() == 2);
  for (int i = 0; i < 10; ++i) d.verified(1, 0);
  CHECK(d.r.drafts.pause == 64);
}

TEST_CASE("a token tree that keeps nothing gives way to single drafts until one is kept") {
  one_decoding d;
  d.c.tree = {2, 2};
  d.c.max_step_tokens = 16;
  CHECK(d.wanted() == 6);  // the whole tree
  d.verified(6, 0);        // it kept nothing: a single draft next
  CHECK(d.wanted() == 1);
  d.verified(1, 0);  // single misses pause drafting as a chain's do
  CHECK(d.wanted() == 1);
  d.verified(1, 0);
  for (int i = 0; i < 4; ++i) CHECK(d.wanted() == 0);
  CHECK(d.wanted() == 1);
  d.verified(1, 1);  // kept: the whole tree again
  CHECK(d.r.drafts.misses == 0);
  CHECK(d.wanted() == 6);
  d.verified(6, 2);  // a path kept: the tree stays
  CHECK(d.wanted() == 6);
}

TEST_CASE("draft slots shrink as the batch grows, and respect max_tokens, the context and each request's cap") {
  const tokenizer& tok = test::tok512();
  (void)tok;
  std::vector<std::unique_ptr<request>> owned;
  auto make = [&](int32_t prompt_len, int32_t max_tokens, int32_t cap) {
    request_params p;
    p.prompt.assign(prompt_len, 5);
    p.max_tokens = max_tokens;
    p.speculative = cap;
    owned.push_back(std::make_unique<request>(request_id{owned.size()}, p, owned.size()));
    request& r = *owned.back();
    r.num_computed_tokens = prompt_len - 1;  // decoding: one known token to compute
    r.state = request_state::running;
    return &r;
  };
  speculative_config c;
  c.method = spec_method::ngram;
  c.k = 4;
  c.max_step_tokens = 8;
  std::vector<request*> running = {make(10, 100, -1)};
  plan_drafts(running, c, 512);
  CHECK(running[0]->drafts.wanted == 4);
  running.push_back(make(10, 100, -1));
  running.push_back(make(10, 100, 1));   // its own cap: one
  running.push_back(make(10, 3, -1));    // max_tokens 3 leaves room for two drafts
  plan_drafts(running, c, 512);
  // 8 tokens for 4 requests: 4 drafts to share, in scheduling order.
  CHECK(running[0]->drafts.wanted == 4);
  CHECK(running[1]->drafts.wanted == 0);
  running[0]->drafts.length = 1;
  plan_drafts(running, c, 512);
  CHECK(running[0]->drafts.wanted == 1);
  CHECK(running[1]->drafts.wanted == 3);
  running[1]->drafts.length = 1;
  plan_drafts(running, c, 512);
  CHECK(running[2]->drafts.wanted == 1);
  CHECK(running[3]->drafts.wanted == 1);
  running[3]->drafts.length = 4;
  running[2]->params.speculative = 0;
  plan_drafts(running, c, 12);  // the context: 12 - 10 - 1 = 1 draft at most
  CHECK(running[2]->drafts.wanted == 0);
  CHECK(running[3]->drafts.wanted == 1);
  // Eight requests decoding fill the step: no drafts.
  while (running.size() < 8) running.push_back(make(10, 100, -1));
  plan_drafts(running, c, 512);
  for (request* r : running) CHECK(r->drafts.wanted == 0);
}


namespace {

std::vector<request_params> random_requests(uint64_t seed, int count, float temperature) {
  rng r(seed);
  std::vector<request_params> reqs;
  for (int i = 0; i < count; ++i) {
    request_params p;
    p.prompt.push_back(1);
    const int len = 2 + static_cast<int>(r.next() % 30);
    for (int k = 1; k < len; ++k) p.prompt.push_back(3 + static_cast<int32_t>(r.next() % 500));
    if (i % 3 == 0)  // a repeated phrase, where n-gram lookup finds matches
      for (int k = 0; k < 12; ++k) p.prompt.push_back(p.prompt[1 + k % 4]);
    p.sampling.temperature = temperature;
    p.sampling.seed = 17 + static_cast<uint64_t>(i);
    p.max_tokens = 1 + static_cast<int32_t>(r.next() % 60);
    if (i % 5 == 1) p.stop_strings = {"the"};
    if (i % 7 == 2) p.sampling.logprobs = 2;
    if (i % 4 == 3) p.sampling.repetition_penalty = 1.2f;
    reqs.push_back(std::move(p));
  }
  return reqs;
}

}  // namespace

TEST_CASE("greedy output with each proposer is the plain output, token for token, under preemption") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model draft = truncated_draft(l.m, 2);
  const std::vector<request_params> reqs = random_requests(5, 24, 0.0f);

  engine_config base;
  base.num_threads = 2;
  base.sched.kv.block_size = 16;
  base.sched.max_step_tokens = 64;
  base.sched.max_running = 12;
  base.sched.kv.num_blocks = 14;  // fewer than the requests need at once: preemption
  std::map<uint64_t, outcome> plain;
  {
    llm_engine e(l.m, l.tok, base);
    plain = run_all(e, reqs);
    CHECK(e.stats().preemptions > 0);
  }
  // The proposers trained for stories260K (tests/data/README.md).
  auto trained_draft = load_model(test::data_path("stories260K-draft.gguf"));
  REQUIRE(trained_draft.has_value());
  auto medusa = load_heads(test::data_path("stories260K-medusa.gguf"), l.m, &l.tok.vocab());
  auto eagle = load_heads(test::data_path("stories260K-eagle.gguf"), l.m, &l.tok.vocab());
  REQUIRE(medusa.has_value());
  REQUIRE(eagle.has_value());
  struct variant {
    std::string name;
    spec_method method;
    int32_t k;
    const model* draft;
    const speculative_heads* heads = nullptr;
    std::vector<int32_t> tree = {};
    int32_t tree_auto = 0;
  };
  const variant variants[] = {{"ngram", spec_method::ngram, 4, nullptr},
                              {"early exit", spec_method::early_exit, 3, nullptr},
                              {"draft model (2 of 5 layers)", spec_method::draft, 4, &draft},
                              {"draft model (the target itself)", spec_method::draft, 5, &l.m},
                              {"draft model (trained)", spec_method::draft, 4, &*trained_draft},
                              {"Medusa heads (trained)", spec_method::medusa, 4, nullptr, medusa->get()},
                              {"EAGLE head (trained)", spec_method::eagle, 5, nullptr, eagle->get()},
                              {"ngram, a tree", spec_method::ngram, 4, nullptr, nullptr, {2, 1, 1}},
                              {"early exit, a tree", spec_method::early_exit, 3, nullptr, nullptr, {3, 2}},
                              {"draft model (trained), a tree", spec_method::draft, 4, &*trained_draft, nullptr, {2, 2, 2, 1}},
                              {"Medusa heads (trained), a tree", spec_method::medusa, 4, nullptr, medusa->get(), {4, 2, 2, 1}},
                              {"EAGLE head (trained), a tree", spec_method::eagle, 4, nullptr, eagle->get(), {3, 2, 1, 1}},
                              {"Medusa heads (trained), a tree chosen as it goes", spec_method::medusa, 4, nullptr,
                               medusa->get(), {1, 1, 1, 1}, 15}};
  for (const variant& v : variants) {
    CAPTURE(v.name);
    engine_config cfg = base;
    cfg.spec.method = v.method;
    cfg.spec.k = v.k;
    cfg.spec.exit_layer = 2;
    cfg.spec.max_step_tokens = 64;  // drafts for every request, batched as they are
    cfg.draft = v.draft;
    cfg.heads = v.heads;
    cfg.spec.tree = v.tree;
    cfg.spec.tree_auto = v.tree_auto;
    llm_engine e(l.m, l.tok, cfg);
    const auto got = run_all(e, reqs);
    REQUIRE(got.size() == plain.size());
    for (const auto& [id, want] : plain) {
      const auto request = id;  // (a variable: clang 14 captures no binding)
      CAPTURE(request);
      const outcome& g = got.at(id);
      CHECK(g.tokens == want.tokens);
      CHECK(g.text == want.text);
      CHECK(g.reason == want.reason);
      REQUIRE(g.logprobs.size() == want.logprobs.size());
      for (size_t i = 0; i < g.logprobs.size(); ++i) CHECK(g.logprobs[i] == doctest::Approx(want.logprobs[i]).epsilon(1e-4));
    }
    const engine_stats& st = e.stats();
    CHECK(st.preemptions > 0);
    CHECK(st.spec.verifies > 0);
    CHECK(st.spec.accepted > 0);
    CHECK(st.spec.accepted <= st.spec.proposed);
    if (v.draft == &l.m) CHECK(st.spec.accepted == st.spec.proposed);  // a draft that is the target
    // By depth: every verify offers depth 1; a depth is offered no more often than the one
    // above it, and kept at most as often as offered; the kept drafts, one per depth a
    // verify reached and kept, are the accepted ones.
    CHECK(st.spec.offered_at[0] == st.spec.verifies);
    uint64_t kept = 0;
    for (size_t d = 0; d < st.spec.offered_at.size(); ++d) {
      CHECK(st.spec.kept_at[d] <= st.spec.offered_at[d]);
      if (d > 0) CHECK(st.spec.offered_at[d] <= st.spec.offered_at[d - 1]);
      if (d > 0) CHECK(st.spec.kept_at[d] <= st.spec.kept_at[d - 1]);
      kept += st.spec.kept_at[d];
    }
    CHECK(kept == st.spec.accepted);
    MESSAGE(v.name << ": " << st.spec.accepted << " of " << st.spec.proposed << " drafts accepted in "
                   << st.spec.verifies << " verifies; " << st.steps << " steps");
  }
}

TEST_CASE("a request whose blocks hold its sequence but not its drafts decodes to the end, drafting less") {
  // The pool holds the prompt and every output token, with no room for a tree's 24 nodes
  // or a chain's 4 drafts past the last block: drafts are dropped before anything else
  // gives way, and nothing ends short.
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  request_params p;
  p.prompt = l.tok.encode("Once upon a time", true);
  p.max_tokens = 128 - static_cast<int32_t>(p.prompt.size());
  p.sampling.temperature = 0.0f;
  engine_config base;
  base.sched.kv.block_size = 16;
  base.sched.kv.num_blocks = 8;  // 128 tokens exactly
  base.sched.max_step_tokens = 64;
  std::map<uint64_t, outcome> plain;
  {
    llm_engine e(l.m, l.tok, base);
    plain = run_all(e, {p});
  }
  REQUIRE(plain.at(0).tokens.size() == static_cast<size_t>(p.max_tokens));
  for (const std::vector<int32_t>& tree : {std::vector<int32_t>{}, std::vector<int32_t>{4, 4, 1}}) {
    CAPTURE(tree.size());
    engine_config cfg = base;
    cfg.spec.method = spec_method::ngram;
    cfg.spec.k = 4;
    cfg.spec.tree = tree;
    cfg.spec.max_step_tokens = 64;
    llm_engine e(l.m, l.tok, cfg);
    const auto got = run_all(e, {p});
    CHECK(got.at(0).tokens == plain.at(0).tokens);
    CHECK(got.at(0).reason == plain.at(0).reason);
    CHECK(e.stats().preemptions == 0);
  }
}

TEST_CASE("sampling with speculation is reproducible by seed and workload") {
  // (Drafts depend on the batch, which sets each request's share of draft slots, and
  // rejection sampling draws by the drafts: a seeded request repeats its output for the
  // same workload, and keeps the target's distribution in any.)
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model draft = truncated_draft(l.m, 2);
  auto medusa = load_heads(test::data_path("stories260K-medusa.gguf"), l.m, &l.tok.vocab());
  auto eagle = load_heads(test::data_path("stories260K-eagle.gguf"), l.m, &l.tok.vocab());
  REQUIRE(medusa.has_value());
  REQUIRE(eagle.has_value());
  const std::vector<request_params> reqs = random_requests(9, 8, 0.9f);
  for (spec_method method :
       {spec_method::draft, spec_method::ngram, spec_method::early_exit, spec_method::medusa, spec_method::eagle}) {
    CAPTURE(spec_method_name(method));
    engine_config cfg;
    cfg.num_threads = 2;
    cfg.sched.kv.num_blocks = 256;
    cfg.spec.method = method;
    cfg.spec.k = 4;
    cfg.spec.max_step_tokens = 64;
    cfg.draft = &draft;
    cfg.heads = method == spec_method::medusa ? medusa->get() : eagle->get();
    llm_engine first(l.m, l.tok, cfg), second(l.m, l.tok, cfg);
    const auto a = run_all(first, reqs), b = run_all(second, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) CHECK(a.at(i).tokens == b.at(i).tokens);
    CHECK(first.stats().spec.verifies > 0);
  }
}

TEST_CASE("speculative settings that do not fit the model are refused at the start") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  engine_config cfg;
  auto refused = [&](const char* needle) {
    const status st = llm_engine::check(l.m, cfg);
    REQUIRE(!st.has_value());
    CAPTURE(st.err().message);
    CHECK(st.err().message.find(needle) != std::string::npos);
    CHECK_THROWS_AS(llm_engine(l.m, l.tok, cfg), std::invalid_argument);
  };
  cfg.spec.method = spec_method::ngram;
  cfg.spec.k = 0;
  refused("k must be in 1..16");
  cfg.spec.k = 17;
  refused("k must be in 1..16");
  cfg.spec.k = 4;
  cfg.spec.method = spec_method::early_exit;
  cfg.spec.exit_layer = 5;  // stories260K has 5 layers
  refused("exit layer 5 is outside the model");
  cfg.spec.method = spec_method::draft;
  refused("needs a draft model");
  // A draft with another vocabulary.
  checkpoint_spec other;
  other.config = l.m.config;
  other.config.vocab_size = 320;
  other.config.num_layers = 1;
  const std::string path = (std::filesystem::temp_directory_path() / "troupe_spec_vocab320.bin").string();
  REQUIRE(write_llama2c(path, other, random_weights(3)).has_value());
  auto d = load_model(path);
  REQUIRE(d.has_value());
  cfg.draft = &*d;
  refused("share the target's vocabulary");
  std::filesystem::remove(path);
  // A request's own cap out of range.
  cfg = engine_config{};
  llm_engine e(l.m, l.tok, cfg);
  request_params p;
  p.prompt = {1, 5};
  p.speculative = 17;
  CHECK(!e.add_request(request_id{1}, p).has_value());
}

}  // namespace troupe
