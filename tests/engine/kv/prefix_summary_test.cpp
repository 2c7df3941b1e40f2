// The prefix summary a scheduler publishes for kv-aware routing: what the block manager
// caches reads as present, absent prefixes mostly as absent, and other namespaces never
// share a chain.
#include "engine/kv/prefix_summary.hpp"

#include <doctest/doctest.h>

#include <numeric>

#include "engine/kv/kv_block_manager.hpp"

namespace troupe {

namespace {

std::vector<int32_t> tokens_from(int32_t first, size_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace

TEST_CASE("prefix summary: a block manager's cached prefixes are found by a prompt's chain, one block short of its last token") {
  kv_block_manager m(64, 4, true);
  const auto prompt = tokens_from(100, 13);  // three whole blocks and one token
  kv_step_request q;
  q.budget = 64;
  q.claims.push_back(kv_claim{.id = request_id{1}, .admit = true, .ns = 7, .tokens = prompt});
  REQUIRE(m.grant(q));
  const prefix_summary s = m.summary();
  CHECK(s.entries() == 3);
  // The same prompt, or a longer one sharing it, finds those three blocks.
  CHECK(s.leading(prefix_chain(prompt, 7, 4)) == 3);
  auto longer = prompt;
  for (int32_t t : tokens_from(900, 8)) longer.push_back(t);
  CHECK(prefix_chain(longer, 7, 4).size() == 5);
  CHECK(s.leading(prefix_chain(longer, 7, 4)) == 3);
  // A prompt that differs in its second block finds only the first.
  auto forked = prompt;
  forked[5] = 1;
  CHECK(s.leading(prefix_chain(forked, 7, 4)) == 1);
  // Another namespace shares nothing, even for the same tokens.
  CHECK(s.leading(prefix_chain(prompt, 8, 4)) == 0);
  // The block holding the last token is never looked up.
  CHECK(prefix_chain(tokens_from(0, 12), 7, 4).size() == 2);
  CHECK(prefix_chain({}, 7, 4).empty());
}

TEST_CASE("prefix summary: false positives stay rare at the sizing, and the words round-trip and are checked") {
  prefix_summary s(2000);
  for (uint64_t h = 0; h < 2000; ++h) s.add(h * 0x9e3779b97f4a7c15ull + 1);
  for (uint64_t h = 0; h < 2000; ++h) CHECK(s.contains(h * 0x9e3779b97f4a7c15ull + 1));
  size_t false_hits = 0;
  for (uint64_t h = 0; h < 20000; ++h) false_hits += s.contains(h * 0xc2b2ae3d27d4eb4full + 12345);
  CHECK(false_hits < 20000 * 5 / 100);  // about 1.2% at ten bits and four probes
  CHECK(s.size_bytes() <= 2000 * 10 / 8 * 2);

  const auto words = s.to_words();
  auto back = prefix_summary::from_words(words);
  REQUIRE(back);
  CHECK(back->entries() == 2000);
  CHECK(back->contains(1));
  CHECK(back->to_words() == words);
  // Cut, padded, or with a foreign header: refused.
  CHECK_FALSE(prefix_summary::from_words({}));
  CHECK_FALSE(prefix_summary::from_words(std::span(words).first(words.size() - 1)));
  auto padded = words;
  padded.push_back(0);
  CHECK_FALSE(prefix_summary::from_words(padded));
  auto foreign = words;
  foreign[0] ^= uint64_t{1} << 60;
  CHECK_FALSE(prefix_summary::from_words(foreign));
  auto huge = words;
  huge[0] = (huge[0] & ~(uint64_t{0xff} << 32)) | uint64_t{60} << 32;
  CHECK_FALSE(prefix_summary::from_words(huge));
  // An empty summary holds nothing.
  CHECK(prefix_summary{}.leading(std::vector<uint64_t>{1, 2}) == 0);
}

}  // namespace troupe
