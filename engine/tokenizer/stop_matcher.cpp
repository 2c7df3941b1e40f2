#include "engine/tokenizer/stop_matcher.hpp"

#include <algorithm>

namespace troupe {

stop_matcher::stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string stop_matcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > hold; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string stop_matcher::flush() {
  std::string out = stopped_ ? std::string() : held_;
  held_.clear();
  return out;
}

}  // namespace troupe
