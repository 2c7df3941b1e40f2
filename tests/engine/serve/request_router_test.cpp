// The router's decisions, event by event, on a clock the test moves: no actors, no sleeps.
#include "engine/serve/request_router.hpp"

#include <doctest/doctest.h>

namespace troupe {

namespace {

using namespace std::chrono_literals;

const router_clock::time_point t0{};

// Two replicas, both found and ready.
request_router two_ready(std::chrono::milliseconds wait = 30s) {
  request_router r(2, wait);
  for (size_t k = 0; k < 2; ++k) {
    r.replica_found(k);
    CHECK(r.replica_health(k, true, "", t0).empty());
  }
  return r;
}

const std::vector<int32_t> none;

}  // namespace

TEST_CASE("router: a first attempt carries the client's id to the replica with the fewest requests") {
  request_router r = two_ready();
  auto a = r.accept(7, t0);
  REQUIRE(a.sends.size() == 1);
  CHECK(a.sends[0].request == 7);
  CHECK(a.sends[0].attempt == 7);
  CHECK(a.sends[0].replica == 0);  // a tie: the first
  CHECK_FALSE(a.sends[0].resubmission);
  auto b = r.accept(8, t0);
  REQUIRE(b.sends.size() == 1);
  CHECK(b.sends[0].replica == 1);
  CHECK(r.replica(0).active == 1);
  CHECK(r.replica(1).active == 1);
  // The same id again is refused, to that caller alone; the first keeps going.
  auto again = r.accept(7, t0);
  REQUIRE(again.ends.size() == 1);
  CHECK(again.ends[0].outcome == route_outcome::failed);
  CHECK(again.ends[0].code == error_code::invalid);
  CHECK(again.ends[0].why == "request id in use");
  CHECK(r.has_request(7));
  CHECK(r.num_requests() == 2);
}

TEST_CASE("router: chunks are numbered for the client, and the final result takes the next number") {
  request_router r = two_ready();
  REQUIRE(r.accept(3, t0).sends.size() == 1);
  const std::vector<int32_t> a{10, 11}, b{12};
  auto c0 = r.chunk(3, a, t0 + 5ms);
  auto c1 = r.chunk(3, b, t0 + 9ms);
  REQUIRE(c0);
  REQUIRE(c1);
  CHECK(c0->request == 3);
  CHECK(c0->seq == 0);
  CHECK(c1->seq == 1);
  CHECK(r.delivered(3) == std::vector<int32_t>{10, 11, 12});
  const std::vector<int32_t> last{13};
  auto e = r.done(3, last, t0 + 20ms);
  REQUIRE(e);
  CHECK(e->outcome == route_outcome::finished);
  CHECK(e->seq == 2);
  CHECK(e->delivered_tokens == 4);
  CHECK(e->ttft_ms == doctest::Approx(5.0));
  CHECK(e->e2e_ms == doctest::Approx(20.0));
  CHECK(e->replica == 0);
  CHECK_FALSE(r.has_request(3));
  CHECK(r.replica(0).active == 0);
  // Nothing more of that attempt goes anywhere.
  CHECK_FALSE(r.chunk(3, a, t0 + 21ms));
  CHECK_FALSE(r.done(3, none, t0 + 22ms));
}

TEST_CASE("router: a replica lost mid-stream: the request goes on elsewhere with what it delivered, and the old attempt's late chunks are dropped") {
  request_router r = two_ready();
  REQUIRE(r.accept(1, t0).sends.at(0).replica == 0);
  const std::vector<int32_t> a{5, 6, 7};
  REQUIRE(r.chunk(1, a, t0 + 1ms));
  auto lost = r.replica_lost(0, "scheduler down", t0 + 2ms);
  REQUIRE(lost.sends.size() == 1);
  const route_send s = lost.sends[0];
  CHECK(s.request == 1);
  CHECK(s.replica == 1);
  CHECK(s.attempt >= request_router::first_resubmission_id);
  CHECK(s.resubmission);
  CHECK(r.delivered(1) == a);  // the frame is rebuilt with these: never streamed again
  CHECK(r.resubmitted() == 1);
  CHECK(r.failovers() == 1);
  CHECK(r.outages() == 1);
  // The lost replica's answers, arriving late, go nowhere.
  const std::vector<int32_t> stale{99};
  CHECK_FALSE(r.chunk(1, stale, t0 + 3ms));
  CHECK_FALSE(r.done(1, stale, t0 + 3ms));
  // The new attempt's chunks continue the client's numbering.
  const std::vector<int32_t> b{8};
  auto c = r.chunk(s.attempt, b, t0 + 4ms);
  REQUIRE(c);
  CHECK(c->request == 1);
  CHECK(c->seq == 1);
  CHECK(r.delivered(1) == std::vector<int32_t>{5, 6, 7, 8});
  auto e = r.done(s.attempt, none, t0 + 5ms);
  REQUIRE(e);
  CHECK(e->seq == 2);
  CHECK(e->resubmits == 1);
  CHECK(e->replica == 1);
}

TEST_CASE("router: every replica down: requests wait, then go to the first that is ready again") {
  request_router r = two_ready();
  REQUIRE(r.accept(1, t0).sends.size() == 1);
  REQUIRE(r.accept(2, t0).sends.size() == 1);
  auto first = r.replica_lost(0, "gone", t0 + 1ms);
  REQUIRE(first.sends.size() == 1);  // request 1 to replica 1
  CHECK(first.sends[0].replica == 1);
  auto second = r.replica_lost(1, "gone too", t0 + 2ms);
  CHECK(second.sends.empty());  // nowhere to go: both wait
  CHECK(second.ends.empty());
  CHECK(r.num_ready() == 0);
  CHECK(r.not_ready_detail(std::vector<std::string>{"r0", "r1"}) == "replica r0: gone; replica r1: gone too");
  CHECK(r.tick(t0 + 1s).empty());
  // Replica 1 comes back: found, then ready.
  r.replica_found(1);
  auto back = r.replica_health(1, true, "", t0 + 2s);
  REQUIRE(back.sends.size() == 2);
  for (const auto& s : back.sends) {
    CHECK(s.replica == 1);
    CHECK(s.attempt >= request_router::first_resubmission_id);
  }
  CHECK(r.replica(1).active == 2);
}

TEST_CASE("router: a request waiting past the wait timeout ends as unavailable, not a moment before") {
  request_router r(1, 500ms);
  REQUIRE(r.accept(4, t0).sends.empty());  // no replica found yet: parked
  CHECK(r.tick(t0 + 500ms).empty());
  auto late = r.tick(t0 + 501ms);
  REQUIRE(late.ends.size() == 1);
  CHECK(late.ends[0].request == 4);
  CHECK(late.ends[0].outcome == route_outcome::failed);
  CHECK(late.ends[0].code == error_code::unavailable);
  CHECK(late.ends[0].why == "no replica could serve the request within 500 ms");
  CHECK(late.ends[0].seq == 0);
  CHECK_FALSE(r.has_request(4));
  // A resubmitted request's wait counts from its loss, not its arrival.
  r.replica_found(0);
  REQUIRE(r.replica_health(0, true, "", t0 + 1s).empty());
  REQUIRE(r.accept(5, t0 + 1s).sends.size() == 1);
  REQUIRE(r.replica_lost(0, "gone", t0 + 2s).sends.empty());
  CHECK(r.tick(t0 + 2500ms).empty());
  CHECK(r.tick(t0 + 2501ms).ends.size() == 1);
}

TEST_CASE("router: cancelling a waiting request ends it at once, and a sent one is cancelled on its replica") {
  request_router r(1, 30s);
  REQUIRE(r.accept(1, t0).sends.empty());
  route_actions out;
  CHECK(r.cancel(1, t0 + 1ms, out));
  REQUIRE(out.ends.size() == 1);
  CHECK(out.ends[0].outcome == route_outcome::cancelled);
  CHECK_FALSE(r.has_request(1));
  CHECK_FALSE(r.cancel(1, t0 + 2ms, out));  // no longer here
  r.replica_found(0);
  REQUIRE(r.replica_health(0, true, "", t0).empty());
  REQUIRE(r.accept(2, t0).sends.size() == 1);
  route_actions c;
  CHECK(r.cancel(2, t0 + 3ms, c));
  REQUIRE(c.cancels.size() == 1);
  CHECK(c.cancels[0].replica == 0);
  CHECK(c.cancels[0].attempt == 2);
  CHECK(c.ends.empty());  // the replica ends it
  CHECK(r.has_request(2));
  CHECK(r.done(2, none, t0 + 4ms).has_value());
}

TEST_CASE("router: cancelled during a resubmission, a request ends once, as cancelled, and is never sent again") {
  request_router r = two_ready();
  REQUIRE(r.accept(1, t0).sends.at(0).replica == 0);
  const std::vector<int32_t> a{5};
  REQUIRE(r.chunk(1, a, t0 + 1ms));
  // Cancelled while its replica was going down: the cancel went there, then the replica
  // is lost before it answers.
  route_actions c;
  REQUIRE(r.cancel(1, t0 + 2ms, c));
  REQUIRE(c.cancels.size() == 1);
  auto lost = r.replica_lost(0, "down", t0 + 3ms);
  CHECK(lost.sends.empty());
  REQUIRE(lost.ends.size() == 1);
  CHECK(lost.ends[0].outcome == route_outcome::cancelled);
  CHECK(lost.ends[0].seq == 1);
  CHECK(lost.ends[0].delivered_tokens == 1);
  CHECK_FALSE(r.has_request(1));
  // And cancelled while parked after a loss (no replica to go to): ended at once.
  REQUIRE(r.accept(2, t0 + 4ms).sends.at(0).replica == 1);
  REQUIRE(r.replica_lost(1, "down", t0 + 5ms).sends.empty());
  route_actions p;
  REQUIRE(r.cancel(2, t0 + 6ms, p));
  REQUIRE(p.ends.size() == 1);
  CHECK(p.ends[0].outcome == route_outcome::cancelled);
  r.replica_found(0);
  CHECK(r.replica_health(0, true, "", t0 + 7ms).sends.empty());  // nothing left to send
}

TEST_CASE("router: a request the actor cannot carry on ends once, as failed") {
  request_router r = two_ready();
  REQUIRE(r.accept(9, t0).sends.size() == 1);
  auto e = r.fail(9, error_code::internal, "no frame", t0 + 1ms);
  REQUIRE(e);
  CHECK(e->outcome == route_outcome::failed);
  CHECK(e->why == "no frame");
  CHECK(r.replica(0).active == 0);
  CHECK_FALSE(r.fail(9, error_code::internal, "again", t0 + 2ms));
  CHECK_FALSE(r.done(9, none, t0 + 3ms));
}

TEST_CASE("router: a replica that fails again soon after coming back is in the same outage") {
  request_router r = two_ready();
  CHECK(r.replica_health(0, false, "recovering", t0).empty());
  CHECK(r.outages() == 1);
  // Flapping while it recovers: back, down, back, lost, found, back.
  r.replica_health(0, true, "", t0 + 1s);
  r.replica_health(0, false, "a stage rejoining", t0 + 2s);
  r.replica_health(0, true, "", t0 + 3s);
  r.replica_lost(0, "scheduler down", t0 + 4s);
  r.replica_found(0);
  r.replica_health(0, true, "", t0 + 5s);
  CHECK(r.outages() == 1);
  // Ready for longer than the settling time, then down: another outage.
  r.replica_health(0, false, "recovering", t0 + 5s + request_router::outage_settle);
  CHECK(r.outages() == 2);
  // The other replica's outage is its own.
  r.replica_health(1, false, "recovering", t0 + 5s + request_router::outage_settle);
  CHECK(r.outages() == 3);
}

TEST_CASE("router: when a replica last stopped being ready is kept, outage or not") {
  request_router r = two_ready();
  CHECK_FALSE(r.last_down());
  r.replica_health(0, false, "recovering", t0 + 1s);
  CHECK(r.last_down() == t0 + 1s);
  r.replica_health(0, false, "still recovering", t0 + 2s);  // no change of state: not a new time
  CHECK(r.last_down() == t0 + 1s);
  r.replica_health(0, true, "", t0 + 3s);
  CHECK(r.last_down() == t0 + 1s);
  // Down again within the settling time: the same outage, a new time.
  r.replica_health(0, false, "a stage rejoining", t0 + 4s);
  CHECK(r.outages() == 1);
  CHECK(r.last_down() == t0 + 4s);
  // A replica lost while ready stops being ready too.
  r.replica_lost(1, "scheduler down", t0 + 5s);
  CHECK(r.last_down() == t0 + 5s);
}

TEST_CASE("router: a replica that stops being ready takes nothing new, and each stop counts as an outage") {
  request_router r = two_ready();
  CHECK(r.replica_health(0, false, "recovering", t0).empty());
  CHECK(r.outages() == 1);
  CHECK(r.replica_health(0, false, "recovering", t0).empty());  // still down: not another
  CHECK(r.outages() == 1);
  for (uint64_t id = 1; id <= 3; ++id) CHECK(r.accept(id, t0).sends.at(0).replica == 1);
  CHECK(r.num_ready() == 1);
  CHECK(r.not_ready_detail(std::vector<std::string>{"a", "b"}) == "replica a: recovering");
  // News from a scheduler the router gave up on changes nothing.
  REQUIRE(r.replica_lost(0, "down", t0).sends.empty());
  CHECK(r.replica_health(0, true, "", t0).empty());
  CHECK(r.num_ready() == 1);
}

namespace {

// Three replicas, kv-aware, all ready.
request_router kv_aware(size_t n = 3) {
  route_config cfg;
  cfg.policy = route_policy::kv_aware;
  cfg.stream_tokens = 10;
  cfg.recent_ttl = 5s;
  request_router r(n, cfg);
  for (size_t k = 0; k < n; ++k) {
    r.replica_found(k);
    CHECK(r.replica_health(k, true, "", t0).empty());
  }
  return r;
}

// A prompt of `blocks` whole blocks of 16 from `first` (and one token more), in namespace ns.
route_prompt prompt_of(int32_t first, size_t blocks, uint64_t ns = 0) {
  std::vector<int32_t> t(blocks * 16 + 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<int32_t>(i);
  route_prompt p;
  p.chain = prefix_chain(t, ns, 16);
  p.tokens = static_cast<int32_t>(t.size());
  p.block_size = 16;
  return p;
}

}  // namespace

TEST_CASE("router, kv-aware: a prompt goes where its prefix was sent before, while that replica's queue costs less than the prefix") {
  request_router r = kv_aware();
  // Nothing cached anywhere: load alone, so the first free replica.
  CHECK(r.accept(1, t0, prompt_of(0, 8)).sends.at(0).replica == 0);
  CHECK(r.replica(0).pending_tokens == 129);
  // The same prefix again: replica 0 holds 128 of its 129 tokens, cost 1 + 129 + 10 there
  // against 129 elsewhere... and 129 < 140, so it goes elsewhere while the first is queued.
  CHECK(r.accept(2, t0, prompt_of(0, 8)).sends.at(0).replica == 1);
  // Once the first has its first token, replica 0's queue is one stream (10): 1 + 10 wins.
  REQUIRE(r.chunk(1, std::vector<int32_t>{5}, t0 + 1ms));
  CHECK(r.replica(0).pending_tokens == 0);
  REQUIRE(r.chunk(2, std::vector<int32_t>{5}, t0 + 1ms));
  CHECK(r.accept(3, t0 + 2ms, prompt_of(0, 8)).sends.at(0).replica == 0);
  CHECK(r.prefix_routed() == 1);
  CHECK(r.expected_hit_tokens() == 128);
  // A prompt sharing only the first half of the blocks gets them where they are.
  route_prompt half = prompt_of(0, 8);
  auto other = prompt_of(5000, 8);
  std::copy(other.chain.begin() + 4, other.chain.end(), half.chain.begin() + 4);
  REQUIRE(r.chunk(3, std::vector<int32_t>{5}, t0 + 3ms));
  const auto s4 = r.accept(4, t0 + 4ms, half).sends.at(0);
  CHECK(r.expected_hit_tokens() == 128 + 64);
  CHECK(r.replica(s4.replica).pending_tokens == 65);
  // An unrelated prompt goes to the least loaded: replica 2, which has nothing.
  CHECK(r.accept(5, t0 + 5ms, prompt_of(9000, 8)).sends.at(0).replica == 2);
}

TEST_CASE("router, kv-aware: a scheduler's summary counts, other namespaces do not match, and sent prompts are forgotten after their time") {
  request_router r = kv_aware(2);
  // Replica 1 says it holds the prompt's blocks; replica 0 holds nothing and is idle.
  prefix_summary s(16);
  for (uint64_t h : prompt_of(0, 8).chain) s.add(h);
  r.replica_summary(1, s);
  CHECK(r.accept(1, t0, prompt_of(0, 8)).sends.at(0).replica == 1);
  CHECK(r.expected_hit_tokens() == 128);
  // The same tokens under another namespace share nothing: the emptier replica.
  CHECK(r.accept(2, t0, prompt_of(0, 8, 99)).sends.at(0).replica == 0);
  // Request 2's blocks count at replica 0 within the time they are remembered...
  REQUIRE(r.chunk(1, std::vector<int32_t>{5}, t0 + 1ms));
  REQUIRE(r.chunk(2, std::vector<int32_t>{5}, t0 + 1ms));
  CHECK(r.accept(3, t0 + 1s, prompt_of(0, 8, 99)).sends.at(0).replica == 0);
  REQUIRE(r.done(3, none, t0 + 1s));
  // ... and not after (nothing says replica 0 still holds them): load decides, a tie
  // going to the first replica with the fewest requests.
  REQUIRE(r.done(1, none, t0 + 2s));
  REQUIRE(r.done(2, none, t0 + 2s));
  r.replica_summary(1, prefix_summary{});
  CHECK(r.accept(4, t0 + 7s, prompt_of(0, 8, 99)).sends.at(0).replica == 0);
  REQUIRE(r.chunk(4, std::vector<int32_t>{5}, t0 + 7s));
  CHECK(r.accept(5, t0 + 7s, prompt_of(0, 8, 99)).sends.at(0).replica == 0);  // recent again
  // A request without a prompt (the frame could not be read) goes by load.
  CHECK(r.accept(6, t0 + 7s).sends.at(0).replica == 1);
}

TEST_CASE("router, kv-aware: a lost replica's summary and recent prompts are forgotten, its pending tokens with it") {
  request_router r = kv_aware(2);
  prefix_summary s(16);
  for (uint64_t h : prompt_of(0, 8).chain) s.add(h);
  r.replica_summary(0, s);
  CHECK(r.accept(1, t0, prompt_of(0, 8)).sends.at(0).replica == 0);
  const auto moved = r.replica_lost(0, "down", t0 + 1ms);
  REQUIRE(moved.sends.size() == 1);
  CHECK(moved.sends[0].replica == 1);
  CHECK(r.replica(0).pending_tokens == 0);
  CHECK(r.replica(1).pending_tokens == 129);
  CHECK_FALSE(r.replica(0).summary);
  r.replica_found(0);
  CHECK(r.replica_health(0, true, "", t0 + 2ms).empty());
  // Replica 1 now has the prompt (sent there); replica 0 has nothing.
  REQUIRE(r.chunk(moved.sends[0].attempt, std::vector<int32_t>{5}, t0 + 3ms));
  CHECK(r.accept(2, t0 + 4ms, prompt_of(0, 8)).sends.at(0).replica == 1);
  REQUIRE(r.done(moved.sends[0].attempt, none, t0 + 5ms));
  REQUIRE(r.done(2, none, t0 + 5ms));
  CHECK(r.replica(1).pending_tokens == 0);
  CHECK(r.replica(1).active == 0);
}

TEST_CASE("router, kv-aware: a replica short of free blocks for the prompt costs the tokens that must wait for them") {
  request_router r = kv_aware(2);
  // Both idle with nothing cached; replica 0 has 3 free blocks, the prompt needs 9 (129
  // tokens and one to generate into): 6 short, 96 tokens. Replica 1 has room.
  r.replica_free_blocks(0, 3);
  r.replica_free_blocks(1, 100);
  CHECK(r.accept(1, t0, prompt_of(0, 8)).sends.at(0).replica == 1);
  // With its prefix on replica 0, only the last block is missing there: 2 blocks fit in 3.
  prefix_summary s(16);
  for (uint64_t h : prompt_of(5000, 8).chain) s.add(h);
  r.replica_summary(0, s);
  CHECK(r.accept(2, t0, prompt_of(5000, 8)).sends.at(0).replica == 0);
  // Unknown free blocks count nothing.
  r.replica_free_blocks(0, -1);
  r.replica_free_blocks(1, -1);
  REQUIRE(r.done(1, none, t0 + 1ms));
  REQUIRE(r.done(2, none, t0 + 1ms));
  CHECK(r.accept(3, t0 + 2ms, prompt_of(9000, 8)).sends.at(0).replica == 0);
}

TEST_CASE("router: a request refused before any token goes to a replica that has not refused it, and ends when none is left") {
  for (route_policy policy : {route_policy::least_loaded, route_policy::kv_aware}) {
    route_config cfg;
    cfg.policy = policy;
    request_router r(3, cfg);
    for (size_t k = 0; k < 3; ++k) {
      r.replica_found(k);
      CHECK(r.replica_health(k, true, "", t0).empty());
    }
    CHECK(r.replica_health(2, false, "recovering", t0).empty());  // not ready: never tried
    auto a = r.accept(7, t0, prompt_of(0, 4));
    REQUIRE(a.sends.size() == 1);
    const size_t first = a.sends[0].replica;
    auto b = r.refused(7, "class 'chat': too late", t0 + 1ms);
    REQUIRE(b.sends.size() == 1);
    CHECK(b.ends.empty());
    CHECK(b.sends[0].replica != first);
    CHECK(b.sends[0].replica != 2);
    CHECK(b.sends[0].attempt != 7);  // a new attempt
    CHECK_FALSE(b.sends[0].resubmission);  // nothing delivered
    CHECK(r.replica(first).active == 0);
    CHECK(r.redirected() == 1);
    // The old attempt's news is dropped.
    CHECK_FALSE(r.done(7, none, t0 + 2ms));
    // The second refuses too: nothing is left; the client hears the last reason.
    auto c = r.refused(b.sends[0].attempt, "class 'chat': still too late", t0 + 3ms);
    CHECK(c.sends.empty());
    REQUIRE(c.ends.size() == 1);
    CHECK(c.ends[0].outcome == route_outcome::failed);
    CHECK(c.ends[0].code == error_code::unavailable);
    CHECK(c.ends[0].why == "class 'chat': still too late");
    CHECK(c.ends[0].resubmits == 1);
    CHECK_FALSE(r.has_request(7));
    CHECK(r.replica(0).active + r.replica(1).active == 0);
    CHECK(r.replica(0).pending_tokens + r.replica(1).pending_tokens == 0);
    // An attempt given up on changes nothing.
    CHECK(r.refused(999, "x", t0 + 4ms).empty());
  }
}


TEST_CASE("router: a request that comes with delivered tokens goes on after them, and keeps them through a failover") {
  request_router r = two_ready();
  route_prompt p;
  p.delivered = {5, 6};  // what another gateway gave its client
  auto sent = r.accept(1, t0, p);
  REQUIRE(sent.sends.size() == 1);
  CHECK(sent.sends[0].resubmission);  // its frame carries them
  CHECK(sent.sends[0].attempt != 1);
  CHECK(r.delivered(1) == std::vector<int32_t>{5, 6});
  const std::vector<int32_t> more{7};
  REQUIRE(r.chunk(sent.sends[0].attempt, more, t0 + 1ms));
  auto lost = r.replica_lost(sent.sends[0].replica, "down", t0 + 2ms);
  REQUIRE(lost.sends.size() == 1);
  CHECK(r.delivered(1) == std::vector<int32_t>{5, 6, 7});
}

TEST_CASE("router: each gateway's router numbers its attempts in a part of its own") {
  route_config a, b;
  b.gateway = 1;
  request_router ra(1, a), rb(1, b);
  for (auto* r : {&ra, &rb}) {
    r->replica_found(0);
    r->replica_health(0, true, "", t0);
  }
  route_prompt p;
  p.delivered = {1};
  const uint64_t x = ra.accept(7, t0, p).sends.at(0).attempt, y = rb.accept(7, t0, p).sends.at(0).attempt;
  CHECK(x != y);
  CHECK(x >= request_router::first_resubmission_id);
  CHECK(y >= request_router::first_resubmission_id);
  CHECK(request_id_base(0, 1) != request_id_base(0, 0));
  CHECK(request_id_base(1, 0) > request_id_base(0, 0x3fff));
}

}  // namespace troupe
