// rate_limited_log: log lines about what strangers did (a refused connection, a broken
// frame, a corrupt record), at most `burst` in each `window`; past that, one line once the
// window is over saying how many were held back. A flood of bad input cannot fill the
// log, and the first lines of each burst are still there to read. Any thread.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string>

namespace troupe {

class rate_limited_log {
 public:
  using sink_fn = std::function<void(const std::string&)>;  // default: a line on stderr

  explicit rate_limited_log(sink_fn sink = {}, int burst = 20, std::chrono::seconds window = std::chrono::seconds(10));
  void operator()(const std::string& line);

 private:
  void write(const std::string& line) const;

  sink_fn sink_;
  int burst_;
  std::chrono::seconds window_;
  std::mutex mutex_;
  std::chrono::steady_clock::time_point opened_ = std::chrono::steady_clock::now();
  int lines_ = 0, held_ = 0;
};

}  // namespace troupe
