// KV eviction policies on crafted attention patterns: which slots each keeps.
#include "engine/kv/kv_eviction.hpp"

#include <doctest/doctest.h>

namespace troupe {

namespace {

std::vector<int32_t> range(int32_t from, int32_t to) {
  std::vector<int32_t> v;
  for (int32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::vector<int32_t> join(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// One step's attention over n slots: `rows` rows, most of it on `hot`, the rest even.
std::vector<float> attention(int32_t n, int32_t rows, const std::vector<int32_t>& hot) {
  std::vector<float> mass(static_cast<size_t>(n), 0.2f * rows / n);
  for (int32_t h : hot) mass[h] += 0.8f * rows / static_cast<float>(hot.size());
  return mass;
}

}  // namespace

TEST_CASE("streaming keeps the attention sinks and the most recent tokens, whatever the attention") {
  kv_eviction_config c{kv_policy::streaming, 8, 4, -1, 16};
  kv_eviction_state s;
  s.append(20, 0);
  s.observe(attention(20, 4, {7, 9}), 4);
  CHECK(s.choose(c, 8) == join(range(0, 4), range(16, 20)));
  CHECK(s.choose(c, 5) == join(range(0, 4), range(19, 20)));
  CHECK(s.choose(c, 3) == range(0, 3));  // fewer than the sinks: the sinks it can
  c.sinks = 0;
  CHECK(s.choose(c, 6) == range(14, 20));
  // After eviction each slot remembers its position in the sequence.
  c.sinks = 2;
  s.retain(s.choose(c, 5));
  CHECK(std::vector<int32_t>(s.positions().begin(), s.positions().end()) == std::vector<int32_t>{0, 1, 17, 18, 19});
  s.append(2, 20);
  CHECK(std::vector<int32_t>(s.positions().begin(), s.positions().end()) == std::vector<int32_t>{0, 1, 17, 18, 19, 20, 21});
}

TEST_CASE("h2o keeps the recent window and the heavy hitters by attention received in total") {
  kv_eviction_config c{kv_policy::h2o, 7, -1, 4, 16};
  kv_eviction_state s;
  s.append(20, 0);
  // Slots 2, 7 and 11 draw most of the attention over four steps; 5 drew a lot once.
  s.observe(attention(20, 8, {2, 7, 11}), 8);
  s.observe(attention(20, 8, {5}), 8);
  s.observe(attention(20, 8, {2, 7, 11}), 8);
  s.observe(attention(20, 8, {2, 7, 11}), 8);
  s.observe(attention(20, 8, {2, 7, 11}), 8);
  CHECK(s.choose(c, 7) == std::vector<int32_t>{2, 7, 11, 16, 17, 18, 19});
  CHECK(s.choose(c, 8) == std::vector<int32_t>{2, 5, 7, 11, 16, 17, 18, 19});
  // The window's tokens are kept whatever they received; with a window of half the budget
  // by default.
  c.window = -1;
  CHECK(c.window_kept() == 3);
  CHECK(s.choose(c, 6) == std::vector<int32_t>{2, 7, 11, 17, 18, 19});
  // Ties (no attention seen yet) go to the later tokens.
  kv_eviction_state fresh;
  fresh.append(10, 0);
  CHECK(fresh.choose(c, 5) == std::vector<int32_t>{5, 6, 7, 8, 9});
  // Scores travel with their slots.
  s.retain(std::vector<int32_t>{2, 7, 11, 16, 17, 18, 19});
  CHECK(s.scores()[0] > s.scores()[3]);
}

TEST_CASE("scissorhands keeps the tokens whose importance persisted over its history") {
  kv_eviction_config c{kv_policy::scissorhands, 6, -1, 2, 4};
  kv_eviction_state s;
  s.append(12, 0);
  // Slot 3 is important in every step; slot 8 only long ago (before the history of 4
  // steps); slot 1 in the last three steps; slot 5 in two of the last four.
  s.observe(attention(12, 6, {8}), 6);
  s.observe(attention(12, 6, {8}), 6);
  s.observe(attention(12, 6, {3, 5, 8}), 6);
  s.observe(attention(12, 6, {3, 1}), 6);
  s.observe(attention(12, 6, {3, 1, 5}), 6);
  s.observe(attention(12, 6, {3, 1}), 6);
  // Low-importance steps in the last four: slot 3: 0; slot 1: 1; slot 5: 2; slot 8: 3;
  // the others: 4. A total score would favour slot 8.
  CHECK(s.choose(c, 6) == std::vector<int32_t>{1, 3, 5, 8, 10, 11});
  CHECK(s.choose(c, 5) == std::vector<int32_t>{1, 3, 5, 10, 11});
  CHECK(s.choose(c, 4) == std::vector<int32_t>{1, 3, 10, 11});
  c.policy = kv_policy::h2o;
  CHECK(s.choose(c, 4) == std::vector<int32_t>{3, 8, 10, 11});
}

TEST_CASE("KV eviction settings that cannot work are refused with the reason") {
  auto why = [](kv_eviction_config c, bool topology = false) { return validate(c, topology).value_or(""); };
  CHECK(why({kv_policy::none, 0, -1, -1, 16}).empty());
  CHECK(why({kv_policy::streaming, 64, 4, 60, 16}).empty());
  CHECK(why({kv_policy::streaming, 64, 4, 61, 16}).find("--kv-budget must be at least --sinks + --window") != std::string::npos);
  CHECK(why({kv_policy::streaming, 64, 4, 61, 16}, true).find("budget must be at least sinks + window") != std::string::npos);
  CHECK(why({kv_policy::streaming, 4, 4, -1, 16}).find("the window at least 1") != std::string::npos);
  CHECK(why({kv_policy::h2o, 1, -1, -1, 16}).find("--kv-budget of 2 tokens or more") != std::string::npos);
  CHECK(why({kv_policy::h2o, 32, -1, 32, 16}).find("no room for heavy hitters") != std::string::npos);
  CHECK(why({kv_policy::scissorhands, 32, -1, -1, 40}).find("history must be 1 to 32") != std::string::npos);
  CHECK(why({kv_policy::h2o, 32, -1, -3, 16}).find("--window must be 0 or more") != std::string::npos);
  CHECK(parse_kv_policy("h2o") == kv_policy::h2o);
  CHECK_FALSE(parse_kv_policy("lru").has_value());
}

}  // namespace troupe
