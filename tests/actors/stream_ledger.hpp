// stream_ledger: what a sink actor in a test receives from a scheduler or the router,
// checked as it arrives: chunks numbered from 0 without gaps, the final chunk inside the
// result, the result's chunk count, and each request ending once.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/type_ids.hpp"
#include "actors/wire/client_codec.hpp"

namespace troupe::test {

struct ledger {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, uint32_t> next_seq;
  std::map<uint64_t, int> ends;
  std::map<uint64_t, wire::result_view> results;
  int chunks = 0;
};

// Receives until `count` requests have ended; calls `at_chunk(n)` after the n-th chunk.
inline void collect(caf::scoped_actor& self, ledger& lg, size_t count, const std::function<void(int)>& at_chunk = {}) {
  while (lg.ends.size() < count) {
    bool got = false;
    self->receive(
        [&](chunk_atom, const wire_message& m) {
          auto c = wire::decode_token_chunk(*m.bytes);
          REQUIRE(c.has_value());
          CHECK(c->seq == lg.next_seq[c->request]++);
          lg.tokens[c->request].insert(lg.tokens[c->request].end(), c->tokens.begin(), c->tokens.end());
          ++lg.chunks;
          if (at_chunk) at_chunk(lg.chunks);
          got = true;
        },
        [&](done_atom, const wire_message& m) {
          auto r = wire::decode_generate_result(*m.bytes);
          REQUIRE(r.has_value());
          if (r->last) {
            CHECK(r->last->seq == lg.next_seq[r->request]++);
            lg.tokens[r->request].insert(lg.tokens[r->request].end(), r->last->tokens.begin(), r->last->tokens.end());
          }
          CHECK(r->chunks == lg.next_seq[r->request]);
          ++lg.ends[r->request];
          lg.results[r->request] = *r;
          got = true;
        },
        caf::after(std::chrono::seconds(60)) >> [] {});
    REQUIRE(got);
  }
}

}  // namespace troupe::test
