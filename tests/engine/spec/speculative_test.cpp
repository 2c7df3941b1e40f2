// Speculative decoding: the proposers, the adaptive draft length, verification by
// rejection sampling (its output distribution, by chi-square over seeded draws), and the
// engine loop's output against plain decoding, token for token under greedy.
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
#include "engine/spec/heads.hpp"
#include "engine/spec/ngram_proposer.hpp"
#include "engine/spec/speculative.hpp"
#include "kernels/cpu/sample.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

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

TEST_CASE("single drafts rejected again and again pause a request's drafting, for longer each time") {
  request_params p;
  p.prompt = {1, 5, 6};
  p.max_tokens = 1000;
  request r(request_id{1}, p, 0);
  r.num_computed_tokens = 2;
  r.state = request_state::running;
  speculative_config c;
  c.method = spec_method::ngram;
  c.k = 4;
  std::vector<request*> running = {&r};
  auto wanted = [&] {
    plan_drafts(running, c, 512);
    return r.drafts.wanted;
  };
  CHECK(wanted() == 4);
  after_verify(r, 4, 0, c);  // nothing taken: one next
  CHECK(wanted() == 1);
  after_verify(r, 1, 0, c);  // a first single miss: keep trying
  CHECK(wanted() == 1);
  after_verify(r, 1, 0, c);  // a second: four steps without drafts
  for (int i = 0; i < 4; ++i) CHECK(wanted() == 0);
  CHECK(wanted() == 1);
  after_verify(r, 1, 0, c);  // a third: eight
  for (int i = 0; i < 8; ++i) CHECK(wanted() == 0);
  CHECK(wanted() == 1);
  after_verify(r, 1, 1, c);  // taken: the streak ends, the length grows
  CHECK(r.drafts.misses == 0);
  CHECK(wanted() == 2);
  for (int i = 0; i < 10; ++i) after_verify(r, 1, 0, c);
  CHECK(r.drafts.pause == 64);
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

// Pearson's chi-square of counts against probabilities (cells of expectation under 5
// merged into one).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n, int* dof) {
  double chi = 0.0, rest_obs = 0.0, rest_exp = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    if (e < 5.0) {
      rest_obs += static_cast<double>(counts[i]);
      rest_exp += e;
      continue;
    }
    chi += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++cells;
  }
  if (rest_exp > 0.0) {
    chi += (rest_obs - rest_exp) * (rest_obs - rest_exp) / std::max(rest_exp, 1e-9);
    ++cells;
  }
  *dof = cells - 1;
  return chi;
}

// The chi-square value a correct sampler exceeds with probability 1e-4, for dof degrees
// of freedom (Wilson-Hilferty).
double critical(int dof) {
  const double z = 3.719;  // the standard normal's 1e-4 upper quantile
  const double k = dof;
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

}  // namespace

TEST_CASE("rejection sampling emits the target's distribution at every position, under every sampler setting") {
  constexpr int32_t vocab = 12;
  const std::vector<float> l0 = {1.0f, 2.5f, 0.3f, -1.0f, 1.9f, 0.0f, 2.2f, -0.5f, 1.4f, 0.8f, -2.0f, 1.7f};
  const std::vector<float> l1 = {0.2f, -0.4f, 2.1f, 1.1f, 0.9f, 1.6f, -1.2f, 0.4f, 2.4f, 0.1f, 1.3f, -0.7f};
  // The draft's own logits: a different, overconfident guess.
  const std::vector<float> g0 = {0.0f, 0.5f, 3.0f, 0.0f, 2.8f, 0.0f, 0.2f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> g1 = {0.0f, 0.0f, 0.4f, 3.1f, 0.0f, 0.0f, 0.0f, 2.2f, 0.0f, 0.0f, 0.0f, 0.0f};
  struct setting {
    std::string name;
    sampling_params p;
    bool point_mass;  // drafts chosen as certain (an n-gram's), not drawn from q
  };
  std::vector<setting> settings;
  auto add = [&](const char* name, auto&& set, bool point = false) {
    sampling_params p;
    p.temperature = 1.0f;
    set(p);
    settings.push_back({name, p, point});
  };
  add("plain", [](sampling_params&) {});
  add("temperature 0.6, top-k 5", [](sampling_params& p) { p.temperature = 0.6f; p.top_k = 5; });
  add("top-p 0.8", [](sampling_params& p) { p.top_p = 0.8f; });
  add("min-p 0.2, temperature 1.4", [](sampling_params& p) { p.min_p = 0.2f; p.temperature = 1.4f; });
  add("penalties and a bias", [](sampling_params& p) {
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.4f;
    p.logit_bias = {{2, 1.5f}, {8, -3.0f}};
  });
  add("point-mass drafts", [](sampling_params&) {}, true);
  const std::vector<int32_t> prompt = {1, 4, 4, 6, 2};

  for (const setting& s : settings) {
    CAPTURE(s.name);
    // The distributions plain decoding draws from: p0 after the prompt, p1 after d0 too.
    const int32_t n = 24000;
    std::vector<int64_t> first(vocab, 0), second(vocab, 0);
    std::map<int32_t, std::vector<int64_t>> second_by_d0;
    int64_t accepted_first = 0;
    rng draft_rng(99);
    std::vector<double> p0(vocab), q0(vocab);
    for (int32_t i = 0; i < n; ++i) {
      sampling_params p = s.p;
      p.seed = 1000 + static_cast<uint64_t>(i);
      sampler target(p, prompt);
      // The draft: two tokens drawn from its own distributions (shaped by the same sampler
      // settings), or chosen as certain.
      sampler view = target;
      std::vector<float> q(2 * vocab);
      std::vector<float> row = g0;
      view.distribution(row.data(), vocab, q.data());
      const int32_t d0 = s.point_mass ? 4 : draw(q.data(), vocab, draft_rng.uniform());
      view.replay(d0);
      row = g1;
      view.distribution(row.data(), vocab, q.data() + vocab);
      const int32_t d1 = s.point_mass ? 3 : draw(q.data() + vocab, vocab, draft_rng.uniform());
      std::vector<float> rows(3 * vocab);
      std::copy(l0.begin(), l0.end(), rows.begin());
      std::copy(l1.begin(), l1.end(), rows.begin() + vocab);
      std::copy(l1.begin(), l1.end(), rows.begin() + 2 * vocab);  // (after d1: unused below)
      const std::vector<int32_t> drafted = {d0, d1};
      const auto got = target.verify(rows.data(), vocab, drafted, s.point_mass ? std::span<const float>{} : std::span<const float>(q));
      REQUIRE(!got.empty());
      REQUIRE(got.size() <= 3);
      ++first[got[0].token];
      if (got[0].token == d0 && got.size() >= 2) {
        // The second position, where the first was the drafted token: compare by d0.
        auto& c = second_by_d0[d0];
        c.resize(vocab, 0);
        ++c[got[1].token];
        ++accepted_first;
      }
    }
    {
      sampler ref(s.p, prompt);
      std::vector<float> row = l0, probs(vocab);
      ref.distribution(row.data(), vocab, probs.data());
      for (int32_t t = 0; t < vocab; ++t) p0[t] = probs[t];
      int dof = 0;
      const double chi = chi_square(first, p0, n, &dof);
      CAPTURE(chi);
      CAPTURE(dof);
      CHECK(chi < critical(dof));
    }
    CHECK(accepted_first > 0);
    for (auto& [d0, counts] : second_by_d0) {
      int64_t m = 0;
      for (int64_t c : counts) m += c;
      if (m < 2000) continue;
      sampler ref(s.p, prompt);
      ref.replay(d0);
      std::vector<float> row = l1, probs(vocab);
      ref.distribution(row.data(), vocab, probs.data());
      std::vector<double> p1(probs.begin(), probs.end());
      int dof = 0;
      const double chi = chi_square(counts, p1, m, &dof);
      const auto first = d0;  // (a variable: clang 14 captures no binding)
      CAPTURE(first);
      CAPTURE(chi);
      CHECK(chi < critical(dof));
    }
  }
}

TEST_CASE("a token tree's verification emits the target's distribution, whichever branch is taken") {
  constexpr int32_t vocab = 12;
  const std::vector<std::vector<float>> l = {
      {1.0f, 2.5f, 0.3f, -1.0f, 1.9f, 0.0f, 2.2f, -0.5f, 1.4f, 0.8f, -2.0f, 1.7f},
      {0.2f, -0.4f, 2.1f, 1.1f, 0.9f, 1.6f, -1.2f, 0.4f, 2.4f, 0.1f, 1.3f, -0.7f},
      {1.5f, 0.5f, -0.3f, 2.0f, 0.1f, 1.2f, 0.7f, 2.6f, -1.0f, 0.9f, 0.2f, 1.1f},
      {-0.5f, 1.8f, 0.6f, 0.0f, 2.3f, -1.4f, 1.0f, 0.3f, 1.9f, 2.2f, 0.4f, 0.8f}};
  // The tree: three children of the sequence's end (tokens 4, 2, 6); two under the first
  // (3, 7), one under the second (8). Node i's row follows its path.
  const std::vector<int32_t> draft = {4, 2, 6, 3, 7, 8};
  const std::vector<int32_t> parent = {-1, -1, -1, 0, 0, 1};
  const std::vector<int> row_of = {0, 1, 2, 3, 1, 1, 2};  // row 0, then node i's at i + 1
  std::vector<sampling_params> settings(4);
  for (auto& p : settings) p.temperature = 1.0f;
  settings[1].temperature = 0.6f;
  settings[1].top_k = 5;
  settings[2].top_p = 0.8f;
  settings[3].repetition_penalty = 1.3f;
  settings[3].presence_penalty = 0.4f;
  settings[3].logit_bias = {{2, 1.5f}, {8, -3.0f}};
  const std::vector<int32_t> prompt = {1, 4, 4, 6, 2};
  for (size_t si = 0; si < settings.size(); ++si) {
    CAPTURE(si);
    const int32_t n = 24000;
    std::vector<int64_t> first(vocab, 0);
    std::map<int32_t, std::vector<int64_t>> second;  // by the first token
    std::vector<int64_t> depth(4, 0);
    for (int32_t i = 0; i < n; ++i) {
      sampling_params p = settings[si];
      p.seed = 5000 + static_cast<uint64_t>(i);
      sampler target(p, prompt);
      std::vector<float> rows;
      for (int r : row_of) rows.insert(rows.end(), l[r].begin(), l[r].end());
      std::vector<int32_t> path;
      const auto got = target.verify_tree(rows.data(), vocab, draft, parent, path);
      REQUIRE(got.size() == path.size() + 1);
      for (size_t j = 0; j < path.size(); ++j) CHECK(got[j].token == draft[path[j]]);
      ++depth[path.size()];
      ++first[got[0].token];
      if (got.size() >= 2) {
        auto& c = second[got[0].token];
        c.resize(vocab, 0);
        ++c[got[1].token];
      }
    }
    CHECK(depth[1] > 0);
    CHECK(depth[2] > 0);
    sampler ref(settings[si], prompt);
    std::vector<float> row = l[0], probs(vocab);
    ref.distribution(row.data(), vocab, probs.data());
    int dof = 0;
    double chi = chi_square(first, std::vector<double>(probs.begin(), probs.end()), n, &dof);
    CAPTURE(chi);
    CHECK(chi < critical(dof));
    // After a first token the tree holds, the second follows that node's row.
    for (const auto& [token, counts] : second) {
      int64_t m = 0;
      for (int64_t c : counts) m += c;
      const auto node = std::find(draft.begin(), draft.begin() + 3, token) - draft.begin();
      REQUIRE(node < 3);
      if (m < 2000) continue;
      sampler after(settings[si], prompt);
      after.replay(token);
      std::vector<float> r = l[row_of[node + 1]], p1(vocab);
      after.distribution(r.data(), vocab, p1.data());
      const double c2 = chi_square(counts, std::vector<double>(p1.begin(), p1.end()), m, &dof);
      const auto t = token;  // (a variable: clang 14 captures no binding)
      CAPTURE(t);
      CAPTURE(c2);
      CHECK(c2 < critical(dof));
    }
  }
}

TEST_CASE("greedy tree verification follows the argmax down the tree, then emits one more") {
  constexpr int32_t vocab = 6;
  // Row 0's argmax is 3 (the second child), its row's argmax 5 (its child), whose row's is 0.
  const std::vector<float> r0 = {0, 1, 2, 9, 1, 0}, r_a = {9, 0, 0, 0, 0, 0}, r_b = {0, 0, 0, 0, 1, 8},
                           r_c = {7, 0, 0, 0, 0, 0};
  const std::vector<int32_t> draft = {2, 3, 4, 5};
  const std::vector<int32_t> parent = {-1, -1, 0, 1};
  std::vector<float> rows;
  for (const auto* r : {&r0, &r_a, &r_b, &r_a, &r_c}) rows.insert(rows.end(), r->begin(), r->end());
  sampling_params p;
  p.temperature = 0.0f;
  const std::vector<int32_t> prompt = {1};
  sampler s(p, prompt);
  std::vector<int32_t> path;
  const auto got = s.verify_tree(rows.data(), vocab, draft, parent, path);
  REQUIRE(got.size() == 3);
  CHECK(got[0].token == 3);
  CHECK(got[1].token == 5);
  CHECK(got[2].token == 0);
  CHECK(path == std::vector<int32_t>{1, 3});
  // A tree whose first level misses: the argmax alone.
  const std::vector<int32_t> miss = {1, 2};
  const std::vector<int32_t> flat = {-1, -1};
  std::vector<float> rows2;
  for (const auto* r : {&r0, &r_a, &r_a}) rows2.insert(rows2.end(), r->begin(), r->end());
  sampler s2(p, prompt);
  const auto got2 = s2.verify_tree(rows2.data(), vocab, miss, flat, path);
  REQUIRE(got2.size() == 1);
  CHECK(got2[0].token == 3);
  CHECK(path.empty());
}

TEST_CASE("greedy verification keeps drafts while they are the argmax, then the argmax") {
  constexpr int32_t vocab = 6;
  sampling_params p;
  p.temperature = 0.0f;
  sampler s(p, std::vector<int32_t>{1});
  std::vector<float> rows = {0, 5, 1, 0, 0, 0,   // argmax 1
                             0, 0, 0, 7, 0, 0,   // argmax 3
                             0, 0, 0, 0, 9, 0,   // argmax 4
                             2, 0, 0, 0, 0, 0};  // argmax 0
  auto ids = [](const std::vector<sample_result>& r) {
    std::vector<int32_t> out;
    for (const auto& x : r) out.push_back(x.token);
    return out;
  };
  std::vector<float> a = rows;
  CHECK(ids(s.verify(a.data(), vocab, std::vector<int32_t>{1, 3, 4}, {})) == std::vector<int32_t>{1, 3, 4, 0});
  a = rows;
  CHECK(ids(s.verify(a.data(), vocab, std::vector<int32_t>{1, 2, 4}, {})) == std::vector<int32_t>{1, 3});
  a = rows;
  CHECK(ids(s.verify(a.data(), vocab, std::vector<int32_t>{5, 3, 4}, {})) == std::vector<int32_t>{1});
}

namespace {

struct outcome {
  std::vector<int32_t> tokens;
  std::string text;
  finish_reason reason = finish_reason::none;
  std::vector<float> logprobs;
};

std::map<uint64_t, outcome> run_all(llm_engine& engine, const std::vector<request_params>& reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(engine.add_request(request_id{i}, reqs[i]).has_value());
  std::map<uint64_t, outcome> out;
  int steps = 0;
  while (engine.has_unfinished()) {
    REQUIRE(++steps < 100000);
    for (step_output& o : engine.step()) {
      outcome& x = out[o.id.value];
      x.tokens.insert(x.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      x.text += o.text;
      for (const auto& lp : o.logprobs) x.logprobs.push_back(lp.logprob);
      if (o.finished) x.reason = o.reason;
    }
  }
  const kv_usage u = engine.kv();
  CHECK(u.used == 0);  // every block back
  return out;
}

// A draft of the target's first `layers` layers (its embedding, final norm and
// classifier): it agrees with the target often, not always. Written to a file, loaded,
// and the file removed (the model keeps its mapping).
model truncated_draft(const model& target, int32_t layers) {
  const std::string path = (std::filesystem::temp_directory_path() / "troupe_spec_draft.bin").string();
  checkpoint_spec spec;
  spec.config = target.config;
  spec.config.num_layers = layers;
  spec.type = dtype::f32;
  REQUIRE(write_llama2c(path, spec, weights_of(target)).has_value());
  auto draft = load_model(path);
  std::filesystem::remove(path);
  REQUIRE(draft.has_value());
  return std::move(draft).value();
}

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
                              {"EAGLE head (trained), a tree", spec_method::eagle, 4, nullptr, eagle->get(), {3, 2, 1, 1}}};
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
    CHECK(st.spec_verifies > 0);
    CHECK(st.spec_accepted > 0);
    CHECK(st.spec_accepted <= st.spec_proposed);
    if (v.draft == &l.m) CHECK(st.spec_accepted == st.spec_proposed);  // a draft that is the target
    MESSAGE(v.name << ": " << st.spec_accepted << " of " << st.spec_proposed << " drafts accepted in "
                   << st.spec_verifies << " verifies; " << st.steps << " steps");
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
    CHECK(first.stats().spec_verifies > 0);
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
