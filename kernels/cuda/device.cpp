#include "kernels/cuda/device.hpp"

#include <dlfcn.h>

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

device_survey survey_devices() {
  device_survey s;
  const cudaError_t status = cudaGetDeviceCount(&s.count);
  if (status == cudaSuccess) return s;
  (void)cudaGetLastError();
  s.count = 0;
  if (status == cudaErrorNoDevice) return s;
  // No driver at all reads as an insufficient one: only a driver library that is there
  // makes that a problem.
  if (status == cudaErrorInsufficientDriver) {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == nullptr) return s;
    dlclose(driver);
  }
  s.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
  return s;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return p.name;
}

}  // namespace troupe::cuda
