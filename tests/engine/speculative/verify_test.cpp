// Verification by the target: rejection sampling of a chain of drafts and of a token
// tree, whose output must be distributed as plain sampling's (chi-square over seeded
// draws, under every sampler setting), and their greedy walks.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/sample/rng.hpp"
#include "engine/sample/sampler.hpp"
#include "kernels/cpu/sample.hpp"
#include "tests/support/chi_square.hpp"

namespace troupe {
namespace {

using test::chi_square;

// A chi-square check of one position's draws, with what it was (for CAPTURE).
struct position_check {
  std::string what;
  test::chi_square_result r;
};

// The distribution plain sampling draws from after `history` (the prompt, then these
// tokens), for the logits `row`.
std::vector<double> plain_distribution(const sampling_params& p, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& history, const std::vector<float>& row) {
  sampler ref(p, prompt);
  for (int32_t t : history) ref.replay(t);
  std::vector<float> logits = row, probs(row.size());
  ref.distribution(logits.data(), static_cast<int32_t>(row.size()), probs.data());
  return {probs.begin(), probs.end()};
}

// Counts of draws by what came before them.
using counts_by = std::map<std::vector<int32_t>, std::vector<int64_t>>;

void count(counts_by& c, std::vector<int32_t> before, int32_t token, int32_t vocab) {
  auto& v = c[std::move(before)];
  v.resize(static_cast<size_t>(vocab), 0);
  ++v[static_cast<size_t>(token)];
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t m = 0;
  for (int64_t x : v) m += x;
  return m;
}

// Histories with at least `min_draws` draws after them, each checked against plain
// sampling's distribution there (its row from row_of); how many were checked.
int check_positions(const counts_by& c, int64_t min_draws, const sampling_params& p, const std::vector<int32_t>& prompt,
                    const std::function<std::vector<float>(const std::vector<int32_t>&)>& row_of) {
  int checked = 0;
  for (const auto& [history, counts] : c) {
    const int64_t m = total(counts);
    if (m < min_draws) continue;
    const auto r = chi_square(counts, plain_distribution(p, prompt, history, row_of(history)), m);
    std::string after;
    for (int32_t t : history) after += std::to_string(t) + " ";
    CAPTURE(after);
    CAPTURE(m);
    CAPTURE(r.chi);
    CAPTURE(r.critical);
    CHECK(r.passes());
    ++checked;
  }
  return checked;
}

}  // namespace

// Each position is checked where its history was seen often enough for the test to have
// power (min_draws), and every position must have been checked at least once: the first
// token, the second after an accepted first draft, and the bonus token after both drafts
// were accepted (its own row of logits).
TEST_CASE("rejection sampling emits the target's distribution at every position, under every sampler setting") {
  constexpr int32_t vocab = 12;
  const std::vector<float> l0 = {1.0f, 2.5f, 0.3f, -1.0f, 1.9f, 0.0f, 2.2f, -0.5f, 1.4f, 0.8f, -2.0f, 1.7f};
  const std::vector<float> l1 = {0.2f, -0.4f, 2.1f, 1.1f, 0.9f, 1.6f, -1.2f, 0.4f, 2.4f, 0.1f, 1.3f, -0.7f};
  const std::vector<float> l2 = {1.5f, 0.5f, -0.3f, 2.0f, 0.1f, 1.2f, 0.7f, 2.6f, -1.0f, 0.9f, 0.2f, 1.1f};
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
  auto row_of = [&](const std::vector<int32_t>& history) { return history.empty() ? l0 : history.size() == 1 ? l1 : l2; };

  for (const setting& s : settings) {
    CAPTURE(s.name);
    const int32_t n = 150000;
    counts_by positions[3];  // the first token, the second, the bonus third: by their history
    rng draft_rng(99);
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
      std::copy(l2.begin(), l2.end(), rows.begin() + 2 * vocab);
      const std::vector<int32_t> drafted = {d0, d1};
      const auto got = target.verify(rows.data(), vocab, drafted, s.point_mass ? std::span<const float>{} : std::span<const float>(q));
      REQUIRE(!got.empty());
      REQUIRE(got.size() <= 3);
      // A token after the first comes only after an accepted draft.
      for (size_t k = 0; k + 1 < got.size(); ++k) REQUIRE(got[k].token == drafted[k]);
      std::vector<int32_t> history;
      for (size_t k = 0; k < got.size(); ++k) {
        count(positions[k], history, got[k].token, vocab);
        history.push_back(got[k].token);
      }
    }
    // The first token over every draw; the later ones by the drafts accepted before them.
    CHECK(check_positions(positions[0], n, s.p, prompt, row_of) == 1);
    CHECK(check_positions(positions[1], 500, s.p, prompt, row_of) >= 1);
    CHECK(check_positions(positions[2], 500, s.p, prompt, row_of) >= 1);
  }
}

// Trees fixed, and trees drawn afresh for every draw (the verifier must emit the target's
// distribution whatever tree it is handed, as long as the tree does not depend on the
// target's own randomness).
TEST_CASE("a token tree's verification emits the target's distribution, whichever tree and branch") {
  constexpr int32_t vocab = 12;
  const std::vector<std::vector<float>> l = {
      {1.0f, 2.5f, 0.3f, -1.0f, 1.9f, 0.0f, 2.2f, -0.5f, 1.4f, 0.8f, -2.0f, 1.7f},
      {0.2f, -0.4f, 2.1f, 1.1f, 0.9f, 1.6f, -1.2f, 0.4f, 2.4f, 0.1f, 1.3f, -0.7f},
      {1.5f, 0.5f, -0.3f, 2.0f, 0.1f, 1.2f, 0.7f, 2.6f, -1.0f, 0.9f, 0.2f, 1.1f},
      {-0.5f, 1.8f, 0.6f, 0.0f, 2.3f, -1.4f, 1.0f, 0.3f, 1.9f, 2.2f, 0.4f, 0.8f},
      {0.9f, 0.1f, 1.7f, -0.2f, 0.5f, 2.1f, 1.3f, -0.9f, 0.6f, 1.5f, 2.4f, 0.0f},
      {2.0f, -1.1f, 0.8f, 1.4f, -0.3f, 0.2f, 1.9f, 1.1f, 0.4f, -0.6f, 1.2f, 2.3f},
      {0.3f, 1.6f, -0.8f, 2.2f, 1.0f, 0.7f, -0.1f, 1.8f, 2.5f, 0.6f, -1.3f, 0.9f}};
  // The tree's shape: three children of the sequence's end; two under the first, one under
  // the second. Node i's row is l[i + 1]; the sequence end's, l[0].
  const std::vector<int32_t> parent = {-1, -1, -1, 0, 0, 1};
  const std::vector<int32_t> fixed = {4, 2, 6, 3, 7, 8};
  std::vector<sampling_params> settings(4);
  for (auto& p : settings) p.temperature = 1.0f;
  settings[1].temperature = 0.6f;
  settings[1].top_k = 5;
  settings[2].top_p = 0.8f;
  settings[3].repetition_penalty = 1.3f;
  settings[3].presence_penalty = 0.4f;
  settings[3].logit_bias = {{2, 1.5f}, {8, -3.0f}};
  const std::vector<int32_t> prompt = {1, 4, 4, 6, 2};
  for (const bool drawn : {false, true}) {
    for (size_t si = 0; si < settings.size(); ++si) {
      CAPTURE(drawn);
      CAPTURE(si);
      const int32_t n = 100000;
      counts_by first, second;  // second: by (the first token, the node it was)
      std::vector<int64_t> depth(4, 0);
      rng tree_rng(77);
      for (int32_t i = 0; i < n; ++i) {
        sampling_params p = settings[si];
        p.seed = 5000 + static_cast<uint64_t>(i);
        sampler target(p, prompt);
        // A drawn tree: distinct tokens among siblings, from the tree's own generator.
        std::vector<int32_t> draft = fixed;
        if (drawn) {
          auto distinct = [&](size_t from, size_t count) {
            for (size_t k = from; k < from + count; ++k)
              do draft[k] = static_cast<int32_t>(tree_rng.uniform() * vocab) % vocab;
              while (std::find(draft.begin() + static_cast<ptrdiff_t>(from), draft.begin() + static_cast<ptrdiff_t>(k), draft[k]) !=
                     draft.begin() + static_cast<ptrdiff_t>(k));
          };
          distinct(0, 3);
          distinct(3, 2);
          distinct(5, 1);
        }
        std::vector<float> rows(l[0].begin(), l[0].end());
        for (size_t node = 0; node < draft.size(); ++node) rows.insert(rows.end(), l[node + 1].begin(), l[node + 1].end());
        std::vector<int32_t> path;
        const auto got = target.verify_tree(rows.data(), vocab, draft, parent, path);
        REQUIRE(got.size() == path.size() + 1);
        for (size_t j = 0; j < path.size(); ++j) CHECK(got[j].token == draft[static_cast<size_t>(path[j])]);
        ++depth[path.size()];
        count(first, {}, got[0].token, vocab);
        // The second token follows the row of the node the first was; the key records both.
        if (got.size() >= 2) count(second, {got[0].token, path[0]}, got[1].token, vocab);
      }
      CHECK(depth[1] > 0);
      CHECK(depth[2] > 0);
      auto row_of = [&](const std::vector<int32_t>& history) { return history.empty() ? l[0] : l[static_cast<size_t>(history[1]) + 1]; };
      CHECK(check_positions(first, n, settings[si], prompt, row_of) == 1);
      // The second token after each (first token, node it was): the node's row, after the
      // first token alone as history.
      int checked = 0;
      for (const auto& [key, counts] : second) {
        const int64_t m = total(counts);
        if (m < 500) continue;
        const auto r = chi_square(counts, plain_distribution(settings[si], prompt, {key[0]}, l[static_cast<size_t>(key[1]) + 1]), m);
        const int32_t token = key[0], node = key[1];  // (variables: clang 14 captures no binding)
        CAPTURE(token);
        CAPTURE(node);
        CAPTURE(m);
        CAPTURE(r.chi);
        CHECK(r.passes());
        ++checked;
      }
      CHECK(checked >= 1);
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
