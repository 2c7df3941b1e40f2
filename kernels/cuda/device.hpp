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
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::cuda {

struct cuda_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws cuda_error naming `what` unless status is cudaSuccess.
void check(cudaError_t status, const char* what);
// The kernel launches queued since the last check, and their configuration.
void check_launch(const char* kernel);

// The number of CUDA devices this process can use (0 without a driver or a device).
int device_count();
std::string device_name(int device);

// An owning buffer of n elements of T in device memory.
template <typename T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(size_t n) : n_(n) {
    if (n) check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  ~buffer() {
    if (p_) cudaFree(p_);
  }
  buffer(buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  buffer& operator=(buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }

  void upload(const T* host, size_t n) {
    if (n > n_) throw cuda_error("upload: " + std::to_string(n) + " elements into a buffer of " + std::to_string(n_));
    check(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    if (n_) check(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  // Every byte set to `byte` (0xFF makes floats NaN: outputs a kernel forgets show up).
  void fill_bytes(int byte) { check(cudaMemset(p_, byte, n_ * sizeof(T)), "cudaMemset"); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// An owning buffer of n elements of T in page-locked host memory: copies between it and the
// device run asynchronously at full PCIe speed.
template <typename T>
class pinned {
 public:
  pinned() = default;
  explicit pinned(size_t n) : n_(n) {
    if (n) check(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMallocHost");
  }
  ~pinned() {
    if (p_) cudaFreeHost(p_);
  }
  pinned(pinned&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  pinned& operator=(pinned&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  pinned(const pinned&) = delete;
  pinned& operator=(const pinned&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace troupe::cuda
