// device: what the CUDA kernels need from the runtime, for host code compiled by the C++
// compiler: error checks that turn a CUDA failure into an exception naming the call, an
// owning device buffer, and whether a device exists at all (tests skip without one).
//
// Every kernel in kernels/cuda/ takes device pointers and a stream, and has a CPU
// reference with the same meaning in kernels/cpu/ (the differential tests compare them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::cuda {

struct cuda_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws cuda_error unless status is cudaSuccess, naming `what`, the error, and the file
// and line of the call.
void check(cudaError_t status, const char* what, std::source_location where = std::source_location::current());
// The kernel launches queued since the last check, and their configuration.
void check_launch(const char* kernel, std::source_location where = std::source_location::current());
// "file.cu:123": where a failure came from, for the messages above.
std::string where_of(const std::source_location& where);

// The number of CUDA devices this process can use (0 without a driver or a device).
int device_count();
std::string device_name(int device);

// What the runtime says about this machine's devices. A machine without a GPU has no
// NVIDIA driver library, or the driver finds no device: count 0, no error. Anything else
// that stops the runtime from counting (a driver too old for this runtime, one that fails
// to start, devices that are busy or lost) hides GPUs that are there: an error naming it.
struct device_survey {
  int count = 0;
  std::string error;  // empty: count is the truth
};
device_survey survey_devices();

namespace detail {

// An owning array of n elements of T, from Memory::allocate (which throws on failure) and
// back to Memory::release.
template <typename T, typename Memory>
class owned_array {
 public:
  owned_array() = default;
  explicit owned_array(size_t n) : n_(n) {
    if (n) p_ = static_cast<T*>(Memory::allocate(n * sizeof(T)));
  }
  ~owned_array() {
    if (p_) Memory::release(p_);
  }
  owned_array(owned_array&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  owned_array& operator=(owned_array&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  owned_array(const owned_array&) = delete;
  owned_array& operator=(const owned_array&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct device_memory {
  static void* allocate(size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  static void release(void* p) { cudaFree(p); }
};

struct pinned_memory {
  static void* allocate(size_t bytes) {
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    return p;
  }
  static void release(void* p) { cudaFreeHost(p); }
};

}  // namespace detail

// An owning buffer of n elements of T in device memory.
template <typename T>
class buffer : public detail::owned_array<T, detail::device_memory> {
 public:
  using detail::owned_array<T, detail::device_memory>::owned_array;
  using detail::owned_array<T, detail::device_memory>::get;
  using detail::owned_array<T, detail::device_memory>::size;

  void upload(const T* host, size_t n) {
    if (n > size()) throw cuda_error("upload: " + std::to_string(n) + " elements into a buffer of " + std::to_string(size()));
    check(cudaMemcpy(get(), host, n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  std::vector<T> download() const {
    std::vector<T> out(size());
    if (size()) check(cudaMemcpy(out.data(), get(), size() * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  // Every byte set to `byte` (0xFF makes floats NaN: outputs a kernel forgets show up).
  void fill_bytes(int byte) { check(cudaMemset(get(), byte, size() * sizeof(T)), "cudaMemset"); }
};

// An owning buffer of n elements of T in page-locked host memory: copies between it and the
// device run asynchronously at full PCIe speed.
template <typename T>
using pinned = detail::owned_array<T, detail::pinned_memory>;

}  // namespace troupe::cuda
