#include "kernels/cuda/gemv.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/rows.cuh"

namespace troupe::cuda {

namespace {

constexpr int kThreads = 256;
// Output columns a block computes at a time, for M rows: 8, fewer as M grows, so that the
// M x columns accumulators and the columns' weight loads stay in about 64 registers and
// several blocks fit on a multiprocessor (8 columns at 3+ rows took 146-188 registers,
// one block per multiprocessor).
template <int M>
constexpr int columns_for() {
  return M <= 2 ? 8 : M <= 4 ? 4 : 2;
}
constexpr size_t kMaxStaged = size_t{160} << 10;  // bytes of staged x per block

// The dot product of 8 packed 16-bit values of w and x, added to acc.
template <typename T>
__device__ inline float dot8(const uint4& w, const uint4& x, float acc) {
  const T* wv = reinterpret_cast<const T*>(&w);
  const T* xv = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(detail::to_float(wv[i]), detail::to_float(xv[i]), acc);
  return acc;
}

// x's m rows into xs ([m][k] of T), transformed as the source says.
template <typename T>
__device__ void stage(const gemv_source& src, int32_t m, int32_t k, T* xs) {
  if (src.kind == gemv_input::half) {
    const uint4* in = static_cast<const uint4*>(src.x);
    uint4* out = reinterpret_cast<uint4*>(xs);
#pragma unroll 4
    for (int32_t i = threadIdx.x; i < m * k / 8; i += blockDim.x) out[i] = in[i];
    return;
  }
  const float* xf = static_cast<const float*>(src.x);
  for (int32_t r = 0; r < m; ++r) {
    T* o = xs + int64_t{r} * k;
    if (src.kind == gemv_input::rmsnorm) {
      detail::rmsnorm_row(o, xf + int64_t{r} * k, src.norm, k, src.eps);
    } else if (src.kind == gemv_input::silu_mul) {
      const float* row = xf + int64_t{r} * 2 * k;
#pragma unroll 4
      for (int32_t i = threadIdx.x; i < k; i += blockDim.x) o[i] = detail::from_float<T>(detail::silu_times(row[i], row[k + i]));
    } else {
      const float* row = xf + int64_t{r} * k;
#pragma unroll 4
      for (int32_t i = threadIdx.x; i < k; i += blockDim.x) o[i] = detail::from_float<T>(row[i]);
    }
  }
}

// Blocks stay resident and take column groups of kColumns in turn (blockIdx.x, then
// gridDim.x further on), so each stages x once however many columns it computes.
template <typename T, int M, int kColumns = columns_for<M>()>
__global__ void __launch_bounds__(kThreads) gemv_kernel(gemv_source src, const T* w, float* y, int32_t n, int32_t k,
                                                        bool accumulate) {
  extern __shared__ uint4 staged[];
  __shared__ float partial[kThreads / 32][M * kColumns];
  T* xs = reinterpret_cast<T*>(staged);
  const int32_t chunks = k / 8, groups = (n + kColumns - 1) / kColumns;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint4 zero{0, 0, 0, 0};
  auto weights = [&](int32_t group, int32_t c, uint4* wv) {
    const int32_t col0 = group * kColumns;
#pragma unroll
    for (int j = 0; j < kColumns; ++j)
      wv[j] = col0 + j < n ? __ldcs(reinterpret_cast<const uint4*>(w + int64_t{col0 + j} * k) + c) : zero;
  };
  // The first weights are on their way while x is staged.
  uint4 wv[kColumns];
  int32_t group = blockIdx.x;
  if (threadIdx.x < chunks) weights(group, threadIdx.x, wv);
  stage<T>(src, M, k, xs);
  __syncthreads();
  for (; group < groups; group += gridDim.x) {
    float acc[M][kColumns];
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
      for (int j = 0; j < kColumns; ++j) acc[r][j] = 0.0f;
    for (int32_t c = threadIdx.x; c < chunks;) {
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const uint4 x = staged[int64_t{r} * chunks + c];
#pragma unroll
        for (int j = 0; j < kColumns; ++j) acc[r][j] = dot8<T>(wv[j], x, acc[r][j]);
      }
      c += kThreads;
      if (c < chunks) weights(group, c, wv);
    }
    // The next group's first weights, on their way during the reduction.
    if (group + gridDim.x < groups && threadIdx.x < chunks) weights(group + gridDim.x, threadIdx.x, wv);
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
      for (int j = 0; j < kColumns; ++j) {
        const float v = detail::warp_sum(acc[r][j]);
        if (lane == 0) partial[warp][r * kColumns + j] = v;
      }
    __syncthreads();
    if (threadIdx.x < M * kColumns) {
      const int r = threadIdx.x / kColumns, j = threadIdx.x % kColumns;
      const int32_t col = group * kColumns + j;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kThreads / 32; ++i) sum += partial[i][threadIdx.x];
      if (col < n) {
        float* out = y + int64_t{r} * n + col;
        *out = accumulate ? *out + sum : sum;
      }
    }
    __syncthreads();  // partial is written again for the next group
  }
}

// Blocks of gemv_kernel<T, M> that stay resident on the current device with `shared`
// bytes each, times its multiprocessors: asked of the driver once per device and size (a
// decode step launches the same few shapes again and again), with the kernel's shared
// memory limit raised past the default 48 KiB on the way.
template <typename T, int M>
int32_t resident_blocks(size_t shared) {
  static std::mutex mutex;
  static std::map<std::pair<int, size_t>, int32_t> known;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace({device, shared}, 0);
  if (fresh) {
    check(cudaFuncSetAttribute(gemv_kernel<T, M>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxStaged)),
          "gemv: cudaFuncSetAttribute");
    int per_sm = 0, sms = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<T, M>, kThreads, shared),
          "gemv: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    it->second = std::max(1, per_sm) * sms;
  }
  return it->second;
}

template <typename T, int M>
void launch(const gemv_source& x, const void* w, float* y, int32_t n, int32_t k, bool accumulate, cudaStream_t stream) {
  const size_t shared = size_t(M) * k * sizeof(T);
  const int32_t groups = (n + columns_for<M>() - 1) / columns_for<M>();
  const int32_t grid = std::max(1, std::min(groups, resident_blocks<T, M>(shared)));
  gemv_kernel<T, M><<<grid, kThreads, shared, stream>>>(x, static_cast<const T*>(w), y, n, k, accumulate);
}

template <typename T>
void launch_rows(int32_t m, const gemv_source& x, const void* w, float* y, int32_t n, int32_t k, bool accumulate,
                 cudaStream_t stream) {
  switch (m) {
    case 1: launch<T, 1>(x, w, y, n, k, accumulate, stream); break;
    case 2: launch<T, 2>(x, w, y, n, k, accumulate, stream); break;
    case 3: launch<T, 3>(x, w, y, n, k, accumulate, stream); break;
    case 4: launch<T, 4>(x, w, y, n, k, accumulate, stream); break;
    case 5: launch<T, 5>(x, w, y, n, k, accumulate, stream); break;
    case 6: launch<T, 6>(x, w, y, n, k, accumulate, stream); break;
    case 7: launch<T, 7>(x, w, y, n, k, accumulate, stream); break;
    case 8: launch<T, 8>(x, w, y, n, k, accumulate, stream); break;
    default: throw cuda_error("gemv: " + std::to_string(m) + " rows (1 to 8 are supported)");
  }
}

}  // namespace

bool gemv_fits(int32_t m, int32_t k) {
  return m >= 1 && m <= gemv_max_rows && k > 0 && k % 8 == 0 && size_t(m) * k * 2 <= kMaxStaged;
}

void gemv(dtype type, const gemv_source& x, const uint16_t* w, float* y, int32_t m, int32_t n, int32_t k,
          bool accumulate, cudaStream_t stream) {
  if (n == 0 || m == 0) return;
  if (!gemv_fits(m, k)) throw cuda_error("gemv: k must be a multiple of 8 and m 1 to 8, within the staging space");
  if ((reinterpret_cast<uintptr_t>(x.x) | reinterpret_cast<uintptr_t>(w)) % 16 != 0)
    throw cuda_error("gemv: x and w must be 16-byte aligned");
  if (x.kind == gemv_input::rmsnorm && x.norm == nullptr) throw cuda_error("gemv: an rmsnorm source needs the norm's weights");
  if (type == dtype::bf16)
    launch_rows<__nv_bfloat16>(m, x, w, y, n, k, accumulate, stream);
  else if (type == dtype::f16)
    launch_rows<__half>(m, x, w, y, n, k, accumulate, stream);
  else
    throw cuda_error("gemv: the weights must be bf16 or f16");
  check_launch("gemv");
}

}  // namespace troupe::cuda
