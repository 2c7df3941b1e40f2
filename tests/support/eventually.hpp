// eventually: waits for something another thread or process makes true (a figure a
// server counts, a log line, a port that answers), looking again and again, within a
// bound. The one place tests wait by the clock: each waits for its event, never for a
// fixed time, and a bound that passes is a failure the caller reports.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace troupe::test {

// Calls `holds` until it returns true (then true) or `bound` has passed (then false); it
// looks at once, then after 1 ms, doubling the pause up to 20 ms.
template <class Holds>
bool eventually(Holds holds, std::chrono::milliseconds bound = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + bound;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (holds()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace troupe::test
