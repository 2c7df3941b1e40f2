// sample(), the definition of one draw (kernels/cpu/sample.hpp), against expectations
// worked out by hand: which token each u picks, at the edges of every token's share, under
// each truncation; then the frequencies of many seeded draws against the probabilities.
#include "kernels/cpu/sample.hpp"

#include <array>
#include <cmath>
#include <map>
#include <vector>

#include <doctest/doctest.h>

#include "engine/sample/rng.hpp"

namespace troupe {

namespace {

// Weights 1, 4, 1, 2 (logits ln 1, ln 4, ln 1, ln 2). sample() scales them by the top one:
// probabilities 0.25, 1, 0.25, 0.5, total 2. In index order the shares end at u = 0.125,
// 0.625, 0.75 and 1. Sorted by probability (ties: lower index first) the order is 1, 3, 0, 2.
const std::vector<float> logits = {0.0f, std::log(4.0f), 0.0f, std::log(2.0f)};

struct draw_case {
  const char* what;
  truncation how;
  float u;
  int32_t want;
};

// truncation{temperature, top_k, top_p, min_p}. Each u sits 0.005 or more from a share's
// edge, further than float rounding of the probabilities can move it.
const draw_case cases[] = {
    // No truncation: index order over the whole mass.
    {"plain, first share", {1.0f, 0, 1.0f, 0.0f}, 0.0f, 0},
    {"plain, end of token 0", {1.0f, 0, 1.0f, 0.0f}, 0.12f, 0},
    {"plain, start of token 1", {1.0f, 0, 1.0f, 0.0f}, 0.13f, 1},
    {"plain, end of token 1", {1.0f, 0, 1.0f, 0.0f}, 0.62f, 1},
    {"plain, start of token 2", {1.0f, 0, 1.0f, 0.0f}, 0.63f, 2},
    {"plain, end of token 2", {1.0f, 0, 1.0f, 0.0f}, 0.745f, 2},
    {"plain, start of token 3", {1.0f, 0, 1.0f, 0.0f}, 0.755f, 3},
    {"plain, u just under 1", {1.0f, 0, 1.0f, 0.0f}, 0.99999994f, 3},
    // Temperature 0.5 squares the weights: 1/16, 1, 1/16, 1/4 of 1.375; shares end at
    // 0.04545, 0.77273, 0.81818, 1.
    {"temperature 0.5, token 0", {0.5f, 0, 1.0f, 0.0f}, 0.04f, 0},
    {"temperature 0.5, token 1", {0.5f, 0, 1.0f, 0.0f}, 0.05f, 1},
    {"temperature 0.5, still token 1", {0.5f, 0, 1.0f, 0.0f}, 0.765f, 1},
    {"temperature 0.5, token 2", {0.5f, 0, 1.0f, 0.0f}, 0.78f, 2},
    {"temperature 0.5, token 3", {0.5f, 0, 1.0f, 0.0f}, 0.825f, 3},
    // Top-k: sorted order; k = 2 keeps 1 and 3 (mass 1.5, edge at 2/3), k = 3 adds 0
    // (mass 1.75, edges at 0.5714 and 0.8571), k = 1 is the argmax whatever u.
    {"top-k 1, u just under 1", {1.0f, 1, 1.0f, 0.0f}, 0.99999994f, 1},
    {"top-k 2, token 1", {1.0f, 2, 1.0f, 0.0f}, 0.66f, 1},
    {"top-k 2, token 3", {1.0f, 2, 1.0f, 0.0f}, 0.675f, 3},
    {"top-k 2, u just under 1", {1.0f, 2, 1.0f, 0.0f}, 0.99999994f, 3},
    {"top-k 3, token 1", {1.0f, 3, 1.0f, 0.0f}, 0.565f, 1},
    {"top-k 3, token 3", {1.0f, 3, 1.0f, 0.0f}, 0.58f, 3},
    {"top-k 3, still token 3", {1.0f, 3, 1.0f, 0.0f}, 0.85f, 3},
    {"top-k 3, token 0", {1.0f, 3, 1.0f, 0.0f}, 0.865f, 0},
    {"top-k larger than the vocabulary: all, sorted", {1.0f, 9, 1.0f, 0.0f}, 0.8f, 0},
    // Top-p: the shortest sorted prefix whose mass reaches top_p x 2 (prefix masses 1, 1.5,
    // 1.75, 2).
    {"top-p 0.45 keeps token 1 alone", {1.0f, 0, 0.45f, 0.0f}, 0.99999994f, 1},
    {"top-p 0.55 keeps 1 and 3: token 1", {1.0f, 0, 0.55f, 0.0f}, 0.66f, 1},
    {"top-p 0.55 keeps 1 and 3: token 3", {1.0f, 0, 0.55f, 0.0f}, 0.675f, 3},
    {"top-p 0.74 still keeps two", {1.0f, 0, 0.74f, 0.0f}, 0.99999994f, 3},
    {"top-p 0.8 keeps three", {1.0f, 0, 0.8f, 0.0f}, 0.99999994f, 0},
    {"top-p 0.9 keeps all four, sorted", {1.0f, 0, 0.9f, 0.0f}, 0.99999994f, 2},
    // Min-p: probabilities (top = 1) of min_p or more, sorted.
    {"min-p 0.55 keeps token 1 alone", {1.0f, 0, 1.0f, 0.55f}, 0.99999994f, 1},
    {"min-p 0.45 keeps 1 and 3: token 1", {1.0f, 0, 1.0f, 0.45f}, 0.66f, 1},
    {"min-p 0.45 keeps 1 and 3: token 3", {1.0f, 0, 1.0f, 0.45f}, 0.675f, 3},
    {"min-p 0.2 keeps all four, sorted: token 0 where index order gives 3", {1.0f, 0, 1.0f, 0.2f}, 0.8f, 0},
    // Together: top-k, then top-p of the whole mass; min-p first of all.
    {"top-k 3 and top-p 0.8: three kept", {1.0f, 3, 0.8f, 0.0f}, 0.865f, 0},
    {"top-k 3 and top-p 0.55: two kept", {1.0f, 3, 0.55f, 0.0f}, 0.865f, 3},
    {"min-p 0.45 and top-p 0.9: the two min-p keeps", {1.0f, 0, 0.9f, 0.45f}, 0.7f, 3},
    {"min-p 0.2 and top-k 2", {1.0f, 2, 1.0f, 0.2f}, 0.675f, 3},
};

}  // namespace

TEST_CASE("sample(): the token each u picks, at the edges of every share, under each truncation") {
  sample_scratch scratch;
  for (const draw_case& c : cases) {
    CAPTURE(c.what);
    CAPTURE(c.u);
    CHECK(sample(logits.data(), static_cast<int32_t>(logits.size()), c.how, c.u, scratch) == c.want);
  }
}

TEST_CASE("choose(): temperature 0 takes the first of equal maxima, anything else draws") {
  sample_scratch scratch;
  const std::vector<float> tied = {0.5f, 2.0f, -1.0f, 2.0f};
  CHECK(choose(tied.data(), 4, token_choice::greedy(), scratch) == 1);
  token_choice drawn{{1.0f, 0, 1.0f, 0.0f}, 0.7f};
  CHECK(choose(logits.data(), 4, drawn, scratch) == 2);
  drawn.u = 0.1f;
  CHECK(choose(logits.data(), 4, drawn, scratch) == 0);
}

// Seeded, so the counts are always the same; the bound says how far they may be from the
// probabilities: 4.5 standard deviations of a binomial count.
TEST_CASE("sample(): many seeded draws land on each token as often as its probability says") {
  struct distribution_case {
    const char* what;
    truncation how;
    std::array<double, 4> probability;
  };
  const distribution_case dists[] = {
      {"plain", {1.0f, 0, 1.0f, 0.0f}, {0.125, 0.5, 0.125, 0.25}},
      {"temperature 2", {2.0f, 0, 1.0f, 0.0f}, {1 / (2 + 2 + std::sqrt(2.0)), 2 / (2 + 2 + std::sqrt(2.0)),
                                                 1 / (2 + 2 + std::sqrt(2.0)), std::sqrt(2.0) / (2 + 2 + std::sqrt(2.0))}},
      {"top-k 3", {1.0f, 3, 1.0f, 0.0f}, {0.25 / 1.75, 1 / 1.75, 0, 0.5 / 1.75}},
      {"top-p 0.55", {1.0f, 0, 0.55f, 0.0f}, {0, 1 / 1.5, 0, 0.5 / 1.5}},
      {"min-p 0.45", {1.0f, 0, 1.0f, 0.45f}, {0, 1 / 1.5, 0, 0.5 / 1.5}},
  };
  const int n = 40000;
  sample_scratch scratch;
  for (const auto& d : dists) {
    CAPTURE(d.what);
    rng r(1234);
    std::array<int, 4> counts{};
    for (int i = 0; i < n; ++i) ++counts.at(sample(logits.data(), 4, d.how, r.uniform(), scratch));
    for (int t = 0; t < 4; ++t) {
      CAPTURE(t);
      const double p = d.probability[t];
      const double sd = std::sqrt(n * p * (1 - p));
      CAPTURE(counts[t]);
      CAPTURE(n * p);
      if (p == 0) CHECK(counts[t] == 0);
      else CHECK(std::fabs(counts[t] - n * p) <= 4.5 * sd);
    }
  }
}

TEST_CASE("distribution() is the distribution sample() draws from, under every truncation") {
  // sample() over u evenly spread in [0, 1): the share of u landing on each token is its
  // probability, which distribution() must give (speculative decoding verifies with it).
  std::vector<float> l(40);
  for (int32_t i = 0; i < 40; ++i) l[i] = std::sin(1.7f * static_cast<float>(i)) * 3.0f;
  const truncation cases[] = {{1.0f, 0, 1.0f, 0.0f}, {0.7f, 5, 1.0f, 0.0f}, {1.3f, 0, 0.8f, 0.0f},
                              {1.0f, 0, 1.0f, 0.2f}, {0.9f, 12, 0.9f, 0.05f}};
  sample_scratch scratch;
  for (const truncation& t : cases) {
    CAPTURE(t.temperature);
    CAPTURE(t.top_k);
    CAPTURE(t.top_p);
    CAPTURE(t.min_p);
    std::vector<float> probs(40);
    distribution(l.data(), 40, t, probs.data(), scratch);
    double total = 0.0;
    for (float p : probs) total += p;
    CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
    constexpr int n = 200000;
    std::vector<int> hits(40, 0);
    for (int i = 0; i < n; ++i) ++hits[sample(l.data(), 40, t, (static_cast<float>(i) + 0.5f) / n, scratch)];
    for (int32_t i = 0; i < 40; ++i) {
      CAPTURE(i);
      CHECK(std::fabs(static_cast<double>(hits[i]) / n - probs[i]) < 2e-5);  // (the grid: 5e-6 per edge)
      if (probs[i] == 0.0f) CHECK(hits[i] == 0);
    }
  }
  // Greedy: all of it on the first largest logit.
  std::vector<float> probs(40);
  distribution(l.data(), 40, truncation{0.0f, 0, 1.0f, 0.0f}, probs.data(), scratch);
  int32_t best = 0;
  for (int32_t i = 1; i < 40; ++i)
    if (l[i] > l[best]) best = i;
  CHECK(probs[best] == 1.0f);
}

TEST_CASE("draw() walks weights in index order, skipping zeros, and needs no normalizing") {
  const std::vector<float> w = {0.0f, 2.0f, 0.0f, 1.0f, 1.0f};
  CHECK(draw(w.data(), 5, 0.0f) == 1);
  CHECK(draw(w.data(), 5, 0.49f) == 1);
  CHECK(draw(w.data(), 5, 0.5f) == 3);
  CHECK(draw(w.data(), 5, 0.74f) == 3);
  CHECK(draw(w.data(), 5, 0.99f) == 4);
}

}  // namespace troupe
