// A replica's figures across scheduler restarts: counters add up, figures of "now" are
// the current scheduler's alone.
#include <doctest/doctest.h>

#include "actors/scheduler_figures.hpp"

namespace troupe {

TEST_CASE("scheduler figures: earlier schedulers' counters are added, their figures of now are not") {
  scheduler_figures gone;
  gone.cached = 7;
  gone.hit_tokens = 100;
  gone.queried_tokens = 300;
  gone.spec = {5, 12, 8, {1, 2, 2}, {5, 4}, {4, 3}};
  gone.eviction = {40, 2, 256, 200};
  gone.tiers = {64, 1, 9, 30};
  scheduler_figures base;
  add_counters(base, gone);
  add_counters(base, gone);  // two schedulers before this one

  scheduler_figures now;
  now.cached = 3;
  now.hit_tokens = 10;
  now.spec = {1, 2, 2, {0, 0, 1, 0}, {1, 1, 0}, {1, 1, 0}};  // a longer list than before
  now.eviction = {4, 1, 128, 100};
  now.tiers = {0, 0, 1, 12};
  const scheduler_figures all = with_counters(base, now);
  CHECK(all.cached == 3);
  CHECK(all.hit_tokens == 210);
  CHECK(all.queried_tokens == 600);
  CHECK(all.spec.verifies == 11);
  CHECK(all.spec.proposed == 26);
  CHECK(all.spec.accepted == 18);
  CHECK(all.spec.by_accepted == std::vector<uint64_t>{2, 4, 5, 0});
  CHECK(all.spec.offered_at == std::vector<uint64_t>{11, 9, 0});
  CHECK(all.spec.kept_at == std::vector<uint64_t>{9, 7, 0});
  CHECK(all.eviction.evicted_tokens == 84);
  CHECK(all.eviction.requests == 1);  // now's
  CHECK(all.eviction.budget_tokens == 128);
  CHECK(all.eviction.held_tokens == 100);
  CHECK(all.tiers.loaded_tokens == 128);
  CHECK(all.tiers.failed_loads == 2);
  CHECK(all.tiers.saved_blocks == 19);
  CHECK(all.tiers.directory == 12);  // now's
}

}  // namespace troupe
