#include "tests/support/random_data.hpp"

#include "engine/sample/rng.hpp"

namespace troupe::test {

std::vector<float> random_floats(size_t n, uint64_t seed, float lo, float hi) {
  rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = lo + (hi - lo) * r.uniform();
  return v;
}

}  // namespace troupe::test
