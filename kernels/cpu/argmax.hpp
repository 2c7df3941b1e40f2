// argmax: index of the largest of n floats (the first one on ties; n >= 1).
#pragma once

#include <cstdint>

namespace troupe {

int32_t argmax(const float* x, int32_t n);

}  // namespace troupe
