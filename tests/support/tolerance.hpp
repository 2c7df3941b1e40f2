// Comparisons of computed floats with what they should be. Every one of them fails where
// a value on either side is not finite, or the two sides differ in length or are empty: std::max(x,
// NaN) is x, so a largest difference taken naively passes all-NaN output, and memcmp
// passes two buffers that both hold NaN.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace troupe::test {

// Whether every value is finite (no NaN, no infinity).
bool all_finite(std::span<const float> v);

// max |got - want|; infinity where a value is not finite or the lengths differ.
double max_abs_difference(std::span<const float> got, std::span<const float> want);

// max |got - want| / max |want|; infinity as above, and where `want` is all zero.
double max_relative_difference(std::span<const float> got, std::span<const float> want);

// max |got - want| / (max want - min want): a logit error against the logits' spread;
// infinity as above, and where `want` is constant.
double max_range_difference(std::span<const float> got, std::span<const float> want);

// Bit for bit the same, and every value finite.
bool same_finite_bits(std::span<const float> a, std::span<const float> b);

// The first non-finite value of `v`, "" where there is none: a failure's explanation.
std::string first_non_finite(std::span<const float> v);

}  // namespace troupe::test
