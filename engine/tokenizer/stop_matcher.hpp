// stop_matcher: finds stop strings in a stream of generated text. Text is released only
// when it can no longer be the start of a stop string, so a client never receives part of
// a stop sequence. One per sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class stop_matcher {
 public:
  explicit stop_matcher(std::vector<std::string> stops);

  // Appends text; returns what may be released now. Sets stopped() when a stop string
  // appeared: the release then ends just before it, and later pushes return nothing.
  std::string push(std::string_view text);
  // Releases whatever is held back (at the end of the sequence).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace troupe
