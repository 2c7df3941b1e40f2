// TROUPE_ASSERT: checks an invariant of the program (never of outside input), prints the
// failed expression with the values given as context, and aborts. Outside input is
// validated where it is read and reported as an error value instead.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace troupe::detail {

template <class... Args>
[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line,
                                     const Args&... context) {
  std::ostringstream os;
  ((os << ' ' << context), ...);
  std::fprintf(stderr, "%s:%d: assertion failed: %s%s%s\n", file, line, expr,
               sizeof...(Args) ? " |" : "", os.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace troupe::detail

#define TROUPE_ASSERT(cond, ...)                                                   \
  do {                                                                             \
    if (__builtin_expect(!(cond), 0))                                              \
      ::troupe::detail::assert_fail(#cond, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
