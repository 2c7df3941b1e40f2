// stats: the summaries the tools print: percentiles (linear between ranks) and medians.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace troupe::tools {

// The p-th percentile (0..100) of v, interpolated between neighbouring ranks; 0 if empty.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

inline double median(std::vector<double> v) { return percentile(std::move(v), 50); }

}  // namespace troupe::tools
