#include "kernels/cpu/gemm_w8a8.hpp"

#include <cmath>

#include "kernels/cpu/gemm_w8a8_parts.hpp"

// The files of this kernel: gemm_w8a8_features.cpp (which kernel a process runs),
// gemm_w8a8_pack.cpp (the weights' records), gemm_w8a8_quantize.cpp (the activations),
// gemm_w8a8_vnni.cpp and gemm_w8a8_amx.cpp (the two vector kernels), and here the
// definition every kernel follows, and the choice among them for one call.

namespace troupe {

namespace {

using w8a8::amx_min_tokens;

// One group's step, the definition every kernel follows.
inline float accumulate(float acc, int32_t isum, float w_scale, float x_scale) {
  const float v = static_cast<float>(isum) * w_scale;
  return std::fma(v, x_scale, acc);
}

void rows_scalar(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, float* y, int64_t ys) {
  for (int32_t r = rb; r < re; ++r)
    for (int32_t t = 0; t < a.num_tokens; ++t) {
      float acc = 0.0f;
      for (int32_t g = 0; g < a.groups; ++g) {
        int32_t isum = 0;
        for (int32_t k = g * a.group; k < (g + 1) * a.group; ++k) isum += int32_t{a.at(t, k)} * int32_t{w.at(r, k)};
        acc = accumulate(acc, isum, w.scale_at(r, g), a.scale_at(t, g));
      }
      y[t * ys + r] = acc;
    }
}

}  // namespace

void gemm_w8a8_rows(const q8_activations& a, const q8_packed& w, int32_t rb, int32_t re, float* y, int64_t ys,
                    w8a8_kernel k, int32_t fetch_end) {
  TROUPE_ASSERT(a.group == w.group && a.cols == w.cols && 0 <= rb && rb <= re && re <= w.rows, a.group, w.group,
                a.cols, w.cols, rb, re, w.rows);
  TROUPE_ASSERT(k == w8a8_kernel::scalar || vnni_available(), "no VNNI on this CPU");
  TROUPE_ASSERT(k != w8a8_kernel::amx || amx_available(), "no AMX for this process");
  if (rb == re) return;
  if (k == w8a8_kernel::scalar) return rows_scalar(a, w, rb, re, y, ys);
  int32_t t = 0;
  if (k == w8a8_kernel::amx && a.num_tokens >= amx_min_tokens) t = w8a8::tokens_amx(a, w, rb, re, y, ys);
  w8a8::rows_vnni_from(a, w, rb, re, std::clamp(fetch_end, re, w.rows), t, y, ys);
}

}  // namespace troupe
