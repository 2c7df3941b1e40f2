// newcomers: connections to one of troupe's own listeners (a step link, a KV channel) that
// have not yet proved themselves (their TLS handshake, or their hello, under way), and
// which of them makes room when every slot is taken. A newcomer that has sent nothing yet
// goes first, the oldest of those; only when every one has sent bytes does the oldest of
// all go. A stranger's silent connections therefore never cut short a peer whose
// handshake is under way, however many it opens, and one that sends bytes slowly loses its
// slots to newer ones, while a real handshake takes milliseconds.
#pragma once

#include <atomic>

namespace troupe {

struct newcomer_flags {
  std::atomic<bool> heard{false};  // its first bytes arrived (the thread serving it saw them)
  std::atomic<bool> cut{false};    // cut short to make room
  std::atomic<bool> done{false};   // no longer a newcomer: it proved itself, or its thread is over
};

// Of the newcomers in [first, last) (oldest first), the one to cut short for room: the
// oldest silent one, else the oldest; `last` when every one is done or cut already.
template <class It, class FlagsOf>
It newcomer_to_cut(It first, It last, FlagsOf flags_of) {
  It any = last;
  for (It it = first; it != last; ++it) {
    const newcomer_flags& f = flags_of(*it);
    if (f.done.load() || f.cut.load()) continue;
    if (!f.heard.load()) return it;
    if (any == last) any = it;
  }
  return any;
}

// Waits until fd has bytes to read (or is closed), at most timeout_ms: false when the time
// passed first.
bool wait_readable(int fd, int timeout_ms);

}  // namespace troupe
