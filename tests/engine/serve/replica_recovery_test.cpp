// A replica's recovery, event by event, on a clock the test moves: no actors, no sleeps.
#include "engine/serve/replica_recovery.hpp"

#include <vector>

#include <doctest/doctest.h>

namespace troupe {

namespace {

using namespace std::chrono_literals;
using next = recovery_step::next;

const recovery_clock::time_point t0{};

// From a lookup that found everything to ready, checking each step on the way.
void walk_to_ready(replica_recovery& r, recovery_clock::time_point now) {
  const uint64_t e = r.epoch();
  const recovery_step links = r.looked_up(e, true, now);
  REQUIRE(links.what == next::open_links);
  CHECK(r.phase() == recovery_phase::linking);
  const recovery_step reset = r.links_made(e);
  REQUIRE(reset.what == next::reset_kv);
  const recovery_step canary = r.kv_reset(e);
  REQUIRE(canary.what == next::run_canary);
  CHECK(r.phase() == recovery_phase::canary);
  const recovery_step done = r.canary_passed(e, now);
  CHECK(done.what == next::nothing);
  CHECK(done.announce);
  CHECK(r.ready());
}

}  // namespace

TEST_CASE("recovery: a scheduler starts by looking up its stages, and is ready once the canary passes") {
  replica_recovery r(30s, t0);
  CHECK_FALSE(r.ready());
  CHECK(r.why() == "starting");
  const recovery_step s = r.start(t0);
  CHECK(s.what == next::look_up);
  CHECK(s.at == t0);
  CHECK_FALSE(s.drop_in_flight);
  walk_to_ready(r, t0 + 40ms);
  CHECK(r.last_outage() == 40ms);
}

TEST_CASE("recovery: stages still missing are looked up again after 25 ms, doubling to 800") {
  replica_recovery r(30s, t0);
  REQUIRE(r.start(t0).what == next::look_up);
  std::vector<std::chrono::milliseconds> pauses;
  auto now = t0;
  for (int i = 0; i < 8; ++i) {
    const recovery_step s = r.looked_up(r.epoch(), false, now);
    REQUIRE(s.what == next::look_up);
    pauses.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(s.at - now));
    now = s.at;
  }
  CHECK(pauses == std::vector<std::chrono::milliseconds>{25ms, 50ms, 100ms, 200ms, 400ms, 800ms, 800ms, 800ms});
  walk_to_ready(r, now);
  // Ready again resets the pause: the next round of lookups starts at 25 ms.
  REQUIRE(r.lost("stage 1 went down", now).what == next::look_up);
  CHECK(r.looked_up(r.epoch(), false, now).at == now + 25ms);
}

TEST_CASE("recovery: a stage failing every step is retried at once, then after 50 ms doubling to 2 s, not in a spin") {
  replica_recovery r(30s, t0);
  REQUIRE(r.start(t0).what == next::look_up);
  walk_to_ready(r, t0);
  // Each canary fails: a loss, then lookups (all found), links, reset and canary again.
  std::vector<std::chrono::milliseconds> pauses;
  auto now = t0;
  for (int i = 0; i < 9; ++i) {
    const recovery_step s = r.lost("stage 0: this stage is broken", now);
    REQUIRE(s.what == next::look_up);
    CHECK(s.drop_in_flight);
    CHECK(s.announce == (i == 0));  // only the loss of a ready replica is news
    pauses.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(s.at - now));
    now = s.at;
    REQUIRE(r.looked_up(r.epoch(), true, now).what == next::open_links);
    REQUIRE(r.links_made(r.epoch()).what == next::reset_kv);
    REQUIRE(r.kv_reset(r.epoch()).what == next::run_canary);
  }
  CHECK(pauses == std::vector<std::chrono::milliseconds>{0ms, 50ms, 100ms, 200ms, 400ms, 800ms, 1600ms, 2000ms, 2000ms});
  CHECK(r.why() == "stage 0: this stage is broken");
  CHECK_FALSE(r.ready());
}

TEST_CASE("recovery: answers of an epoch overtaken by a loss change nothing") {
  replica_recovery r(30s, t0);
  REQUIRE(r.start(t0).what == next::look_up);
  const uint64_t first = r.epoch();
  REQUIRE(r.looked_up(first, true, t0).what == next::open_links);
  REQUIRE(r.lost("kv manager went down", t0 + 1ms).what == next::look_up);
  CHECK(r.epoch() == first + 1);
  // The old epoch's links, reset and canary come back late.
  CHECK(r.links_made(first).what == next::nothing);
  CHECK(r.kv_reset(first).what == next::nothing);
  CHECK(r.canary_passed(first, t0 + 2ms).what == next::nothing);
  CHECK_FALSE(r.ready());
  CHECK(r.phase() == recovery_phase::looking_up);
  // And answers out of turn within the epoch too.
  CHECK(r.kv_reset(r.epoch()).what == next::nothing);
  CHECK(r.canary_passed(r.epoch(), t0 + 2ms).what == next::nothing);
  walk_to_ready(r, t0 + 3ms);
}

TEST_CASE("recovery: waiting requests end once the replica has not been ready for the recovery timeout") {
  replica_recovery r(10s, t0);
  REQUIRE(r.start(t0).what == next::look_up);
  CHECK_FALSE(r.overdue(t0 + 9999ms, "r0"));
  REQUIRE(r.overdue(t0 + 10s, "r0"));
  CHECK(*r.overdue(t0 + 10s, "r0") == "replica r0 did not recover within 10 s (starting)");
  walk_to_ready(r, t0 + 11s);
  CHECK_FALSE(r.overdue(t0 + 60s, "r0"));
  // A loss counts from the moment the ready replica lost a part.
  REQUIRE(r.lost("stage 1 went down", t0 + 60s).announce);
  CHECK_FALSE(r.overdue(t0 + 69s, "r0"));
  REQUIRE(r.overdue(t0 + 70s, "r0"));
  CHECK(*r.overdue(t0 + 70s, "r0") == "replica r0 did not recover within 10 s (stage 1 went down)");
  // Further losses while not ready do not restart the clock.
  REQUIRE_FALSE(r.lost("stage 0 went down", t0 + 65s).announce);
  CHECK(r.overdue(t0 + 70s, "r0"));
}

}  // namespace troupe
