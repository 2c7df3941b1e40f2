#include "kernels/cuda/device.hpp"

#include <dlfcn.h>

namespace troupe::cuda {

std::string where_of(const std::source_location& where) {
  std::string file = where.file_name();
  if (const size_t slash = file.rfind('/'); slash != std::string::npos) file.erase(0, slash + 1);
  return file + ":" + std::to_string(where.line());
}

void check(cudaError_t status, const char* what, std::source_location where) {
  if (status != cudaSuccess)
    throw cuda_error(std::string(what) + ": " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status) + " (" +
                     where_of(where) + ")");
}

void check_launch(const char* kernel, std::source_location where) { check(cudaGetLastError(), kernel, where); }

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
