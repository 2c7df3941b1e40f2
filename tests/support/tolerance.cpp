#include "tests/support/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace troupe::test {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

bool comparable(std::span<const float> a, std::span<const float> b) {
  return !a.empty() && a.size() == b.size() && all_finite(a) && all_finite(b);
}

}  // namespace

bool all_finite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

double max_abs_difference(std::span<const float> got, std::span<const float> want) {
  if (!comparable(got, want)) return inf;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
  return worst;
}

double max_relative_difference(std::span<const float> got, std::span<const float> want) {
  if (!comparable(got, want)) return inf;
  double largest = 0;
  for (float w : want) largest = std::max(largest, std::fabs(double(w)));
  return largest > 0 ? max_abs_difference(got, want) / largest : inf;
}

double max_range_difference(std::span<const float> got, std::span<const float> want) {
  if (!comparable(got, want)) return inf;
  const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
  const double range = double(*hi) - *lo;
  return range > 0 ? max_abs_difference(got, want) / range : inf;
}

bool same_finite_bits(std::span<const float> a, std::span<const float> b) {
  return comparable(a, b) && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

std::string first_non_finite(std::span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return "value " + std::to_string(i) + " is " + std::to_string(v[i]);
  return "";
}

}  // namespace troupe::test
