// Seeded random test data. Kernel-level: it needs nothing but the engine's header-only
// generator, so the kernel suite links the kernels alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::test {

// n floats drawn uniformly from [lo, hi), the same for the same seed on every machine.
std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

}  // namespace troupe::test
