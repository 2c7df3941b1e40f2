// The router with prefill and decode replicas (disaggregation), event by event on a
// clock the test moves: the two phases, the handoff, and each replica lost on the way.
#include "engine/serve/request_router.hpp"

#include <doctest/doctest.h>

namespace troupe {

namespace {

using namespace std::chrono_literals;

const router_clock::time_point t0{};

// Replicas 0 and 1 prefill, 2 and 3 decode; all found and ready.
request_router roles(route_policy policy = route_policy::least_loaded) {
  request_router r(4, route_config{.policy = policy});
  r.set_role(0, replica_role::prefill);
  r.set_role(1, replica_role::prefill);
  r.set_role(2, replica_role::decode);
  r.set_role(3, replica_role::decode);
  for (size_t k = 0; k < 4; ++k) {
    r.replica_found(k);
    CHECK(r.replica_health(k, true, "", t0).empty());
  }
  return r;
}

const std::vector<int32_t> first_token{42};

}  // namespace

TEST_CASE("roles: a request is prefilled on a prefill replica, then decoded where its KV went") {
  request_router r = roles();
  auto a = r.accept(7, t0);
  REQUIRE(a.sends.size() == 1);
  CHECK(a.sends[0].replica == 0);
  CHECK(a.sends[0].attempt == 7);
  CHECK(a.sends[0].kv_to == 2);
  CHECK(a.sends[0].kv_from == 0);
  CHECK(r.replica(2).incoming == 1);
  // The next goes to the other prefill replica, its KV to the other decode replica.
  auto b = r.accept(8, t0);
  REQUIRE(b.sends.size() == 1);
  CHECK(b.sends[0].replica == 1);
  CHECK(b.sends[0].kv_to == 3);

  // The first token arrives inside the prefill replica's end, which hands off.
  auto c = r.chunk(7, first_token, t0 + 40ms);
  REQUIRE(c);
  CHECK(c->seq == 0);
  auto h = r.handed_off(7, 96, t0 + 40ms);
  REQUIRE(h.sends.size() == 1);
  CHECK(h.ends.empty());
  CHECK(h.sends[0].replica == 2);
  CHECK(h.sends[0].resubmission);  // with the token delivered
  CHECK(h.sends[0].kv_from == 96);
  CHECK(h.sends[0].kv_to == -1);
  CHECK(h.sends[0].attempt != 7);  // a fresh attempt: the prefill one is over
  CHECK(r.delivered(7) == first_token);
  CHECK(r.replica(0).active == 0);
  CHECK(r.replica(2).active == 1);
  CHECK(r.replica(2).incoming == 0);
  CHECK(r.handoffs() == 1);
  CHECK(r.resubmitted() == 0);  // a handoff is no failover

  // A late message of the prefill attempt is dropped; the decode attempt's chunks go on.
  CHECK_FALSE(r.chunk(7, first_token, t0 + 41ms));
  const uint64_t decode = h.sends[0].attempt;
  auto next = r.chunk(decode, std::vector<int32_t>{43}, t0 + 60ms);
  REQUIRE(next);
  CHECK(next->request == 7);
  CHECK(next->seq == 1);
  auto end = r.done(decode, std::vector<int32_t>{44}, t0 + 80ms);
  REQUIRE(end);
  CHECK(end->ttft_ms == doctest::Approx(40));  // the prefill replica's first token
  CHECK(end->delivered_tokens == 3);
  CHECK(end->seq == 2);
}

TEST_CASE("roles: the decode replica lost before the handoff: another decodes, computing the prompt") {
  request_router r = roles();
  auto a = r.accept(7, t0);
  REQUIRE(a.sends.size() == 1);
  REQUIRE(a.sends[0].kv_to == 2);
  CHECK(r.replica_lost(2, "node down", t0 + 10ms).sends.empty());  // nothing of 7 ran there yet
  REQUIRE(r.chunk(7, first_token, t0 + 40ms));
  auto h = r.handed_off(7, 96, t0 + 40ms);
  REQUIRE(h.sends.size() == 1);
  CHECK(h.sends[0].replica == 3);
  CHECK(h.sends[0].kv_from == 0);  // its KV went to the lost one
}

TEST_CASE("roles: a prefill replica lost mid-prefill: the request is prefilled again elsewhere, once") {
  request_router r = roles();
  auto a = r.accept(7, t0);
  REQUIRE(a.sends[0].replica == 0);
  auto moved = r.replica_lost(0, "node down", t0 + 10ms);
  REQUIRE(moved.sends.size() == 1);
  CHECK(moved.sends[0].replica == 1);
  CHECK(moved.sends[0].kv_to >= 2);
  CHECK_FALSE(moved.sends[0].resubmission);
  CHECK(r.replica(2).incoming + r.replica(3).incoming == 1);  // counted once
  CHECK(r.resubmitted() == 1);

  // Both prefill replicas gone: a decode replica computes the request whole.
  auto again = r.replica_lost(1, "node down", t0 + 20ms);
  REQUIRE(again.sends.size() == 1);
  CHECK(again.sends[0].replica >= 2);
  CHECK(again.sends[0].kv_to == -1);
  CHECK(r.replica(2).incoming + r.replica(3).incoming == 0);
}

TEST_CASE("roles: a prefill replica lost after the first token: the decode replica goes on from it") {
  request_router r = roles();
  REQUIRE(r.accept(7, t0).sends.size() == 1);
  REQUIRE(r.chunk(7, first_token, t0 + 40ms));
  auto moved = r.replica_lost(0, "node down", t0 + 45ms);
  REQUIRE(moved.sends.size() == 1);
  CHECK(moved.sends[0].replica == 2);  // where its KV was going
  CHECK(moved.sends[0].resubmission);
  CHECK(moved.sends[0].kv_from == 0);  // never handed off: computed there
  CHECK(r.delivered(7) == first_token);
}

TEST_CASE("roles: without a ready decode replica nothing is prefilled, and requests wait for one") {
  request_router r = roles();
  CHECK(r.replica_health(2, false, "recovering", t0).empty());
  CHECK(r.replica_health(3, false, "recovering", t0).empty());
  auto a = r.accept(7, t0);
  CHECK(a.sends.empty());
  auto back = r.replica_health(3, true, "", t0 + 5ms);
  REQUIRE(back.sends.size() == 1);
  CHECK(back.sends[0].replica == 0);
  CHECK(back.sends[0].kv_to == 3);
}

TEST_CASE("roles: a request every prefill replica refused is refused, not computed whole by a decode replica") {
  request_router r = roles();
  auto a = r.accept(7, t0);
  REQUIRE(a.sends.size() == 1);
  CHECK(a.sends[0].replica == 0);
  auto again = r.refused(a.sends[0].attempt, "class 'chat': the first token would come too late", t0 + 1ms);
  REQUIRE(again.sends.size() == 1);
  CHECK(again.sends[0].replica == 1);  // the other prefill replica
  CHECK(again.sends[0].kv_to >= 2);
  auto no = r.refused(again.sends[0].attempt, "class 'chat': the first token would come too late", t0 + 2ms);
  CHECK(no.sends.empty());
  REQUIRE(no.ends.size() == 1);
  CHECK(no.ends[0].outcome == route_outcome::failed);
  CHECK(no.ends[0].code == error_code::unavailable);
  CHECK(no.ends[0].why == "class 'chat': the first token would come too late");
  CHECK(r.replica(2).incoming + r.replica(3).incoming == 0);
  CHECK(r.replica(2).active + r.replica(3).active == 0);
  // With no prefill replica ready, a decode replica still computes requests whole.
  CHECK(r.replica_health(0, false, "recovering", t0).empty());
  CHECK(r.replica_health(1, false, "recovering", t0).empty());
  auto whole = r.accept(8, t0 + 3ms);
  REQUIRE(whole.sends.size() == 1);
  CHECK(whole.sends[0].replica >= 2);
  CHECK(whole.sends[0].kv_to == -1);
}

TEST_CASE("roles: cancelled while prefilling, a request ends at its handoff and goes no further") {
  request_router r = roles();
  REQUIRE(r.accept(7, t0).sends.size() == 1);
  route_actions c;
  REQUIRE(r.cancel(7, t0 + 5ms, c));
  REQUIRE(c.cancels.size() == 1);
  REQUIRE(r.chunk(7, first_token, t0 + 40ms));
  auto h = r.handed_off(7, 96, t0 + 40ms);
  CHECK(h.sends.empty());
  REQUIRE(h.ends.size() == 1);
  CHECK(h.ends[0].outcome == route_outcome::cancelled);
  CHECK(r.replica(2).incoming == 0);
  CHECK_FALSE(r.has_request(7));
}

TEST_CASE("roles: a handoff from an attempt that was not prefilling ends the request as failed") {
  request_router r = roles();
  REQUIRE(r.accept(7, t0).sends.size() == 1);
  auto h = r.handed_off(7, 0, t0 + 40ms);  // no token came
  REQUIRE(h.ends.size() == 1);
  CHECK(h.ends[0].outcome == route_outcome::failed);
  CHECK(h.ends[0].code == error_code::internal);
  CHECK(r.handed_off(99, 0, t0).empty());  // unknown attempts are ignored
}

}  // namespace troupe

namespace troupe {

TEST_CASE("roles: the pool can serve while a decode replica is ready, whatever the prefill replicas say") {
  request_router r = roles();
  CHECK(r.can_serve());
  CHECK(r.replica_health(2, false, "recovering", t0).empty());
  CHECK(r.can_serve());
  CHECK(r.replica_health(3, false, "recovering", t0).empty());
  CHECK_FALSE(r.can_serve());  // prefill replicas alone finish nothing
  CHECK(r.num_ready() == 2);
  CHECK(r.replica_health(0, false, "recovering", t0).empty());
  CHECK(r.replica_health(1, false, "recovering", t0).empty());
  CHECK(r.replica_health(2, true, "", t0).empty());
  CHECK(r.can_serve());  // a decode replica computes requests whole
}

}  // namespace troupe
