#include "engine/util/rate_limited_log.hpp"

#include <cstdio>
#include <utility>

namespace troupe {

rate_limited_log::rate_limited_log(sink_fn sink, int burst, std::chrono::seconds window)
    : sink_(std::move(sink)), burst_(burst), window_(window) {}

void rate_limited_log::write(const std::string& line) const {
  if (sink_)
    sink_(line);
  else
    std::fprintf(stderr, "%s\n", line.c_str());
}

void rate_limited_log::operator()(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (now - opened_ > window_) {
    if (held_ > 0)
      write(std::to_string(held_) + " more line(s) like the above in " + std::to_string(window_.count()) +
            " s, not logged one by one");
    opened_ = now;
    lines_ = held_ = 0;
  }
  if (++lines_ > burst_) {
    ++held_;
    return;
  }
  write(line);
}

}  // namespace troupe
