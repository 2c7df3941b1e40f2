#include "engine/sample/sampler.hpp"

#include <cmath>
#include <map>

#include <doctest/doctest.h>

#include "tests/support/chi_square.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

std::vector<float> logits_fixture() { return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f}; }

int32_t draw(sampling_params p, std::vector<float> l, std::vector<int32_t> prompt = {}) {
  sampler s(p, prompt);
  return s.sample(l.data(), static_cast<int32_t>(l.size())).token;
}

}  // namespace

TEST_CASE("greedy and top-k 1 choose the argmax") {
  sampling_params p;
  p.temperature = 0.0f;
  CHECK(draw(p, logits_fixture()) == 1);
  p.temperature = 1.5f;
  p.top_k = 1;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    CHECK(draw(p, logits_fixture()) == 1);
  }
}

TEST_CASE("the same seed gives the same tokens, and sampling follows the distribution") {
  sampling_params p;
  p.seed = 42;
  sampler a(p, {}), b(p, {});
  const int64_t n = 20000;
  std::vector<int64_t> counts(6, 0);
  for (int64_t i = 0; i < n; ++i) {
    auto la = logits_fixture(), lb = logits_fixture();
    const int32_t ta = a.sample(la.data(), 6).token;
    CHECK(ta == b.sample(lb.data(), 6).token);
    ++counts[static_cast<size_t>(ta)];
  }
  // The fixture's softmax, computed here: p(1) ~ 0.35, p(4) ~ 0.32, p(2) ~ 0.13, p(5) ~ 0.006.
  const auto l = logits_fixture();
  std::vector<double> probs(l.size());
  double sum = 0.0;
  for (size_t i = 0; i < l.size(); ++i) sum += probs[i] = std::exp(static_cast<double>(l[i]));
  for (double& x : probs) x /= sum;
  const auto r = test::chi_square(counts, probs, n);
  CAPTURE(r.chi);
  CAPTURE(r.dof);
  CHECK(r.dof == 5);  // every token a cell of its own: the test has its full power
  CHECK(r.passes());
}

// Both keep tokens 1 and 4 and draw between them in proportion: 4 takes e^2.9 / (e^3 +
// e^2.9) = 0.475 of the draws, 190 of 400 (binomial sd 10), so a sampler that always took
// the argmax, or never truncated, fails.
TEST_CASE("top-p and min-p keep only the head of the distribution, and draw within it") {
  sampling_params top_p;
  top_p.top_p = 0.5f;  // tokens 1 and 4 hold 0.67 of the mass; 1 alone 0.35
  sampling_params min_p;
  min_p.min_p = 0.5f;  // tokens within 2x of the top: 1 and 4 (2 has e^-1 = 0.37 of the top's)
  for (sampling_params p : {top_p, min_p}) {
    CAPTURE(p.top_p);
    CAPTURE(p.min_p);
    std::map<int32_t, int> counts;
    for (uint64_t seed = 0; seed < 400; ++seed) {
      p.seed = seed;
      ++counts[draw(p, logits_fixture())];
    }
    CHECK(counts[1] + counts[4] == 400);
    CHECK(counts[4] >= 150);
    CHECK(counts[4] <= 230);
  }
}

TEST_CASE("penalties push repeated tokens down") {
  sampling_params p;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.5f;  // token 1 seen in the prompt: 3.0 -> 2.0, token 4 wins
  CHECK(draw(p, logits_fixture(), {1}) == 4);
  sampling_params f;
  f.temperature = 0.0f;
  f.frequency_penalty = 0.2f;
  sampler s(f, {});
  auto l = logits_fixture();
  CHECK(s.sample(l.data(), 6).token == 1);  // output now holds token 1 once
  l = logits_fixture();
  CHECK(s.sample(l.data(), 6).token == 4);  // 3.0 - 0.2 < 2.9
}

TEST_CASE("log-probabilities are those of the softmax, top-n sorted") {
  sampling_params p;
  p.temperature = 0.0f;
  p.logprobs = 3;
  sampler s(p, {});
  auto l = logits_fixture();
  const auto r = s.sample(l.data(), 6);
  double z = 0;
  for (float v : logits_fixture()) z += std::exp(double(v));
  CHECK(r.logprob == doctest::Approx(3.0 - std::log(z)).epsilon(1e-5));
  REQUIRE(r.top.size() == 3);
  CHECK(r.top[0].token == 1);
  CHECK(r.top[1].token == 4);
  CHECK(r.top[2].token == 2);
  CHECK(r.top[1].logprob == doctest::Approx(2.9 - std::log(z)).epsilon(1e-5));
}

TEST_CASE("a logit bias moves its tokens' logits: -100 bans, +100 forces, and log-probabilities see it") {
  sampling_params p;
  p.temperature = 0.0f;
  p.logit_bias = {{1, -100.0f}};  // the argmax banned: the runner-up
  CHECK(draw(p, logits_fixture()) == 4);
  p.logit_bias = {{2, 1.5f}};  // 2 + 1.5 passes 3
  CHECK(draw(p, logits_fixture()) == 2);
  p.logit_bias = {{5, 100.0f}, {1, -3.0f}, {77, 5.0f}};  // (an id past these logits is skipped)
  p.temperature = 1.0f;
  p.logprobs = 2;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    p.seed = seed;
    sampler s(p, {});
    auto l = logits_fixture();
    const auto r = s.sample(l.data(), 6);
    CHECK(r.token == 5);
    CHECK(r.logprob > -1e-6f);  // of the biased logits: all the mass is on 5
    REQUIRE(r.top.size() == 2);
    CHECK(r.top[1].token == 4);  // 1 fell below 4 by its bias
  }
  // The bias applies at every step, beside the penalties.
  sampling_params q;
  q.temperature = 0.0f;
  q.presence_penalty = 2.0f;
  q.logit_bias = {{0, 2.5f}};  // 1 + 2.5 passes 3: chosen, penalised, then 1 and 4 come back
  sampler s(q, {});
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) {
    auto l = logits_fixture();
    got.push_back(s.sample(l.data(), 6).token);
  }
  CHECK(got == std::vector<int32_t>{0, 1, 4});
  CHECK_FALSE(s.needs_only_logits());
}

TEST_CASE("invalid parameters are named") {
  sampling_params p;
  p.top_p = 0.0f;
  CHECK(validate(p).has_value());
  p = {};
  p.temperature = -1.0f;
  CHECK(validate(p).has_value());
  p = {};
  p.temperature = NAN;
  CHECK(validate(p).has_value());
  p = {};
  p.logprobs = 21;
  CHECK(validate(p).has_value());
  p = {};
  p.logit_bias = {{3, 100.5f}};
  CHECK(validate(p).value().find("[-100, 100]") != std::string::npos);
  p.logit_bias = {{3, NAN}};
  CHECK(validate(p).has_value());
  p.logit_bias = {{-1, 1.0f}};
  CHECK(validate(p).value().find("negative") != std::string::npos);
  p.logit_bias = {{3, 1.0f}, {4, 1.0f}, {3, -1.0f}};
  CHECK(validate(p).value().find("token 3 appears twice") != std::string::npos);
  p.logit_bias.assign(max_logit_bias + 1, {});
  for (size_t i = 0; i < p.logit_bias.size(); ++i) p.logit_bias[i].token = static_cast<int32_t>(i);
  CHECK(validate(p).value().find("at most") != std::string::npos);
  p.logit_bias.pop_back();
  CHECK_FALSE(validate(p).has_value());
  CHECK_FALSE(validate(sampling_params{}).has_value());
}

TEST_CASE("a choice made elsewhere from next_choice, then replayed, leaves the sampler as its own draws would") {
  // One sampler draws for itself; the other hands each choice out (as the actors send it to
  // the last stage), makes it with kernels/cpu/sample, and records the token by replay.
  sampling_params p;
  p.temperature = 0.9f;
  p.top_k = 4;
  p.top_p = 0.95f;
  p.seed = 77;
  sampler own(p, {}), handed(p, {});
  CHECK(handed.needs_only_logits());
  sample_scratch scratch;
  const auto base = logits_fixture();
  for (int step = 0; step < 50; ++step) {
    auto l = base;
    l[step % l.size()] += 0.3f * static_cast<float>(step % 3);
    const token_choice c = handed.next_choice();
    CHECK(handed.next_choice().u == c.u);  // peeking draws nothing
    const int32_t elsewhere = sample(l.data(), static_cast<int32_t>(l.size()), c.how, c.u, scratch);
    handed.replay(elsewhere);
    CHECK(own.sample(l.data(), static_cast<int32_t>(l.size())).token == elsewhere);
  }
  // Penalties and log-probabilities need the sampler itself.
  p.repetition_penalty = 1.1f;
  CHECK_FALSE(sampler(p, {}).needs_only_logits());
  p.repetition_penalty = 1.0f;
  p.logprobs = 0;
  CHECK_FALSE(sampler(p, {}).needs_only_logits());
}

}  // namespace troupe
