#include "kernels/cuda/sample.hpp"

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"

namespace troupe::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxCandidates = 2048;

// Probability mass (count when counting) of the tokens with p >= floor.
__device__ float mass_above(const float* p, int32_t n, float floor, bool counting) {
  float s = 0.0f;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
    if (p[i] >= floor) s += counting ? 1.0f : p[i];
  return detail::block_sum(s);
}

// The largest floor >= lo (a probability in (0, 1]) with mass_above(floor) >= want; lo
// when even lo's mass falls short. Bisection over the float's bits, which order as the
// positive floats do.
__device__ float largest_floor(const float* p, int32_t n, float lo, float want, bool counting) {
  int32_t a = __float_as_int(lo), b = __float_as_int(1.0f);
  while (a < b) {
    const int32_t mid = a + (b - a + 1) / 2;
    if (mass_above(p, n, __int_as_float(mid), counting) >= want)
      a = mid;
    else
      b = mid - 1;
  }
  return __int_as_float(a);
}

// Index order: the token where u * (the mass of tokens >= floor) falls, walking 0..n.
// Each thread takes a contiguous run; the runs' sums are scanned, and the one run holding
// the point walks its tokens.
__device__ int32_t draw_in_index_order(const float* p, int32_t n, float floor, float u01) {
  __shared__ float runs[kThreads];
  __shared__ int32_t chosen;
  const int32_t per = (n + blockDim.x - 1) / blockDim.x;
  const int32_t begin = min(n, static_cast<int32_t>(threadIdx.x) * per), end = min(n, begin + per);
  float s = 0.0f;
  for (int32_t i = begin; i < end; ++i) s += p[i] >= floor ? p[i] : 0.0f;
  runs[threadIdx.x] = s;
  if (threadIdx.x == 0) chosen = -1;
  __syncthreads();
  // Inclusive scan (Hillis-Steele): run t then holds the mass up to the end of run t.
  for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {
    const float add = threadIdx.x >= off ? runs[threadIdx.x - off] : 0.0f;
    __syncthreads();
    runs[threadIdx.x] += add;
    __syncthreads();
  }
  const float total = runs[blockDim.x - 1];
  const float u = u01 * total;
  const float before = threadIdx.x > 0 ? runs[threadIdx.x - 1] : 0.0f;
  if (u >= before && u < runs[threadIdx.x]) {
    float acc = before;
    int32_t last = -1;
    for (int32_t i = begin; i < end; ++i) {
      if (!(p[i] >= floor)) continue;
      last = i;
      acc += p[i];
      if (u < acc) break;
    }
    atomicMax(&chosen, last);  // one run holds the point; -1 elsewhere
  }
  __syncthreads();
  if (chosen >= 0) return chosen;
  // Rounding left the point at the very end: the last token with mass, as the CPU's walk.
  int32_t last = -1;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
    if (p[i] >= floor && p[i] > 0.0f) last = max(last, i);
  __shared__ int32_t final_last;
  if (threadIdx.x == 0) final_last = -1;
  __syncthreads();
  atomicMax(&final_last, last);
  __syncthreads();
  return final_last >= 0 ? final_last : n - 1;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int64_t stride, int32_t vocab,
                                                          const token_choice* choices, float* workspace, int32_t* out) {
  __shared__ float cand_p[kMaxCandidates];
  __shared__ int32_t cand_i[kMaxCandidates];
  __shared__ int32_t count;
  const int32_t r = blockIdx.x;
  const float* row = logits + int64_t{r} * stride;
  const truncation prm = choices[r].how;
  const float u01 = choices[r].u;
  const int32_t top = detail::block_argmax(row, vocab);
  if (prm.temperature == 0.0f) {
    if (threadIdx.x == 0) out[r] = top;
    return;
  }
  float* p = workspace + int64_t{r} * vocab;
  const float top_logit = row[top], inv_t = 1.0f / prm.temperature;
  float s = 0.0f;
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    p[i] = expf((row[i] - top_logit) * inv_t);
    s += p[i];
  }
  const float total = detail::block_sum(s);  // its barrier also publishes p
  if (prm.top_k == 0 && prm.top_p >= 1.0f && prm.min_p == 0.0f) {
    const int32_t t = draw_in_index_order(p, vocab, 0.0f, u01);
    if (threadIdx.x == 0) out[r] = t;
    return;
  }
  // A floor under which no kept token lies: min-p's, raised to the k-th largest
  // probability, then to where the mass above reaches top-p's share (a hair under it, so
  // that rounding never leaves out a token the exact prefix below keeps).
  float floor = prm.min_p > 0.0f ? prm.min_p : __int_as_float(1);  // p >= the smallest positive float
  if (prm.top_k > 0) floor = largest_floor(p, vocab, floor, static_cast<float>(prm.top_k), true);
  if (prm.top_p < 1.0f) floor = largest_floor(p, vocab, floor, prm.top_p * total * (1.0f - 1e-5f), false);
  if (prm.min_p == 0.0f && floor == __int_as_float(1)) floor = 0.0f;  // nothing raised it: every token
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (p[i] >= floor) {
      const int32_t at = atomicAdd(&count, 1);
      if (at < kMaxCandidates) cand_p[at] = p[i], cand_i[at] = i;
    }
  __syncthreads();
  const int32_t n = count;
  if (n > kMaxCandidates) {
    const int32_t t = draw_in_index_order(p, vocab, floor, u01);
    if (threadIdx.x == 0) out[r] = t;
    return;
  }
  // Sort the candidates by probability, ties by index (bitonic, padded to a power of two).
  int32_t size = 1;
  while (size < n) size <<= 1;
  for (int32_t i = n + threadIdx.x; i < size; i += blockDim.x) cand_p[i] = -1.0f, cand_i[i] = INT32_MAX;
  __syncthreads();
  for (int32_t k = 2; k <= size; k <<= 1)
    for (int32_t j = k >> 1; j > 0; j >>= 1) {
      for (int32_t i = threadIdx.x; i < size; i += blockDim.x) {
        const int32_t partner = i ^ j;
        if (partner > i) {
          // Ascending runs put the element that comes first (higher p, lower index) first.
          const bool first_before = cand_p[i] > cand_p[partner] || (cand_p[i] == cand_p[partner] && cand_i[i] < cand_i[partner]);
          const bool ascending = (i & k) == 0;
          if (first_before != ascending) {
            const float tp = cand_p[i];
            cand_p[i] = cand_p[partner], cand_p[partner] = tp;
            const int32_t ti = cand_i[i];
            cand_i[i] = cand_i[partner], cand_i[partner] = ti;
          }
        }
      }
      __syncthreads();
    }
  if (threadIdx.x != 0) return;
  // The CPU's prefix and walk, in the same order.
  int32_t keep = n;
  if (prm.top_k > 0 && prm.top_k < keep) keep = prm.top_k;
  if (prm.top_p < 1.0f) {
    const float target = prm.top_p * total;
    float acc = 0.0f;
    int32_t m = 0;
    while (m < keep) {
      acc += cand_p[m++];
      if (acc >= target) break;
    }
    keep = m;
  }
  float mass = 0.0f;
  for (int32_t i = 0; i < keep; ++i) mass += cand_p[i];
  const float u = u01 * mass;
  float acc = 0.0f;
  for (int32_t i = 0; i < keep; ++i) {
    acc += cand_p[i];
    if (u < acc) {
      out[r] = cand_i[i];
      return;
    }
  }
  out[r] = cand_i[keep - 1];
}

}  // namespace

size_t sample_workspace(int32_t rows, int32_t vocab) { return size_t(rows) * size_t(vocab); }

void sample(const float* logits, int64_t stride, int32_t rows, int32_t vocab, const token_choice* choices,
            float* workspace, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  if (vocab <= 0) throw cuda_error("sample: the vocabulary is empty");
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, stride, vocab, choices, workspace, out);
  check_launch("sample");
}

}  // namespace troupe::cuda
