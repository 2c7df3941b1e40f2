#include "kernels/cuda/device.hpp"

namespace troupe::cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw cuda_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error here
    return 0;
  }
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return p.name;
}

}  // namespace troupe::cuda
