#include "engine/serve/replica_recovery.hpp"

#include <algorithm>

namespace troupe {

using std::chrono::milliseconds;

replica_recovery::replica_recovery(milliseconds recovery_timeout, recovery_clock::time_point now)
    : recovery_timeout_(recovery_timeout), not_ready_since_(now) {}

recovery_step replica_recovery::look_up_at(recovery_clock::time_point at) {
  phase_ = recovery_phase::looking_up;
  recovery_step s;
  s.what = recovery_step::next::look_up;
  s.at = at;
  s.epoch = epoch_;
  return s;
}

recovery_step replica_recovery::start(recovery_clock::time_point now) { return look_up_at(now); }

recovery_step replica_recovery::lost(std::string why, recovery_clock::time_point now) {
  ++epoch_;
  why_ = std::move(why);
  const bool was_ready = ready();
  if (was_ready) not_ready_since_ = now;
  // The first loss is looked into at once; repeated ones wait 50 ms, doubling to 2 s.
  const int32_t n = ++losses_;
  const milliseconds pause{n <= 1 ? 0 : std::min(2000, 25 << std::min(n - 1, 7))};
  recovery_step s = look_up_at(now + pause);
  s.drop_in_flight = true;
  s.announce = was_ready;
  return s;
}

recovery_step replica_recovery::looked_up(uint64_t epoch, bool all_found, recovery_clock::time_point now) {
  if (epoch != epoch_ || phase_ != recovery_phase::looking_up) return {};
  if (!all_found) {
    const milliseconds pause{std::min(1000, 25 << std::min(lookup_rounds_++, 5))};
    return look_up_at(now + pause);
  }
  phase_ = recovery_phase::linking;
  recovery_step s;
  s.what = recovery_step::next::open_links;
  s.epoch = epoch_;
  return s;
}

recovery_step replica_recovery::links_made(uint64_t epoch) {
  if (epoch != epoch_ || phase_ != recovery_phase::linking) return {};
  phase_ = recovery_phase::resetting_kv;
  recovery_step s;
  s.what = recovery_step::next::reset_kv;
  s.epoch = epoch_;
  return s;
}

recovery_step replica_recovery::kv_reset(uint64_t epoch) {
  if (epoch != epoch_ || phase_ != recovery_phase::resetting_kv) return {};
  phase_ = recovery_phase::canary;
  recovery_step s;
  s.what = recovery_step::next::run_canary;
  s.epoch = epoch_;
  return s;
}

recovery_step replica_recovery::canary_passed(uint64_t epoch, recovery_clock::time_point now) {
  if (epoch != epoch_ || phase_ != recovery_phase::canary) return {};
  phase_ = recovery_phase::ready;
  losses_ = 0;
  lookup_rounds_ = 0;
  last_outage_ = std::chrono::duration_cast<milliseconds>(now - not_ready_since_);
  recovery_step s;
  s.epoch = epoch_;
  s.announce = true;
  return s;
}

std::optional<std::string> replica_recovery::overdue(recovery_clock::time_point now, const std::string& replica) const {
  if (ready() || now - not_ready_since_ < recovery_timeout_) return std::nullopt;
  return "replica " + replica + " did not recover within " + std::to_string(recovery_timeout_.count() / 1000) + " s (" +
         why_ + ")";
}

}  // namespace troupe
