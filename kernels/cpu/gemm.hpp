// gemm: y = x W^T for every token of a step, with W in any stored dtype.
//
//   x: [num_tokens][x_stride] floats, the first w.cols of each row used
//   y: [num_tokens][y_stride] floats, the first w.rows of each row written
//   y[m][n] = sum_k x[m][k] * W[n][k]
//
// Each output element is computed by the same sequence of float operations whatever
// num_tokens is, whichever tokens share the step and however rows are split over
// threads: weights are dequantized to float (float(q) * scale for q8_0), multiplied into
// sixteen lane accumulators in column order and reduced by a fixed tree. That makes
// batched decoding bit-identical to decoding each sequence alone (batch invariance).
// On CPUs with AMX, q8_0 weights with groups of 32 or 64 run with int8 activations
// instead (gemm_w8a8.hpp): batch-invariant too, by another definition.
#pragma once

#include <cstdint>

#include "kernels/common/matrix_view.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe {

void gemm(const float* x, int64_t x_stride, int32_t num_tokens, const matrix_view& w, float* y,
          int64_t y_stride, thread_pool& pool);

// Several GEMMs over the same input in one parallel region (Q, K and V; gate and up):
// one fork-join instead of several, and each thread streams a longer run of weights.
// Results are bit-identical to separate gemm() calls.
struct gemm_output {
  const matrix_view* w;
  float* y;
  int64_t y_stride;
};
void gemm_multi(const float* x, int64_t x_stride, int32_t num_tokens, const gemm_output* outs,
                int num_outs, thread_pool& pool);

}  // namespace troupe
