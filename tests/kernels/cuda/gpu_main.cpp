// The GPU suite's main: without a CUDA device it says so and exits with 77, which ctest
// reports as skipped (SKIP_RETURN_CODE), never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstdio>

#include <doctest/doctest.h>

#include "kernels/cuda/device.hpp"

int main(int argc, char** argv) {
  const int devices = troupe::cuda::device_count();
  if (devices == 0) {
    std::printf("no CUDA device: the GPU tests are skipped\n");
    return 77;
  }
  std::printf("CUDA device 0: %s (%d device(s))\n", troupe::cuda::device_name(0).c_str(), devices);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
