// utf8_stream: turns a stream of token bytes into text that never splits a UTF-8
// character. push() returns the complete characters available so far and keeps an
// unfinished one for the next call; finish() flushes, replacing an unfinished or invalid
// sequence with U+FFFD. One per generated sequence; not shared between threads.
#pragma once

#include <string>
#include <string_view>

namespace troupe {

class utf8_stream {
 public:
  std::string push(std::string_view bytes);
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace troupe
