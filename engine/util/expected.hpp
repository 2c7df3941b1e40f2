// expected<T>: a value or an error message, for outcomes that are not bugs (a file that
// does not parse, a flag out of range). Errors say what was wrong and where, in words an
// operator can act on.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "kernels/common/assert.hpp"

namespace troupe {

struct error {
  std::string message;
};

template <class T>
class [[nodiscard]] expected {
 public:
  expected(T value) : v_(std::move(value)) {}
  expected(error e) : v_(std::move(e)) {}

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    TROUPE_ASSERT(has_value(), err().message);
    return std::get<0>(v_);
  }
  T&& value() && {
    TROUPE_ASSERT(has_value(), err().message);
    return std::get<0>(std::move(v_));
  }
  const T& value() const& {
    TROUPE_ASSERT(has_value(), err().message);
    return std::get<0>(v_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

  const error& err() const {
    TROUPE_ASSERT(!has_value());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, error> v_;
};

// For operations that return nothing but may fail.
struct ok_t {};
using status = expected<ok_t>;
inline status ok() { return ok_t{}; }

}  // namespace troupe
