// Verification by the target: rejection sampling of a chain of drafts and of a token
// tree, whose output must be distributed as plain sampling's (chi-square over seeded
// draws, under every sampler setting), and their greedy walks.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/sample/rng.hpp"
#include "engine/sample/sampler.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {
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

TEST_CASE("a tree's candidates are the k best logits, the lower id first among equals") {
  rng r(17);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t vocab = 1 + static_cast<int32_t>(r.next() % 300);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& x : logits) x = static_cast<float>(r.next() % 40) * 0.25f;  // many ties
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    sampling_params p;
    p.temperature = 0.0f;
    const std::vector<int32_t> prompt = {1};
    const sampler s(p, prompt);
    for (const int32_t k : {0, 1, 4, 16, vocab}) {
      CAPTURE(vocab);
      CAPTURE(k);
      std::vector<float> l = logits;
      const std::vector<int32_t> want(order.begin(), order.begin() + std::min(k, vocab));
      CHECK(s.ranked(l.data(), vocab, k) == want);
    }
  }
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

}  // namespace troupe
