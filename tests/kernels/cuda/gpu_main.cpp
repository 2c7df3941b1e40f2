// The GPU suite's main: without a CUDA device it says so and exits with 77, which ctest
// reports as skipped (SKIP_RETURN_CODE), never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstdio>

#include <doctest/doctest.h>

#include "engine/forward/nccl_group.hpp"
#include "kernels/cuda/device.hpp"

int main(int argc, char** argv) {
  const int devices = troupe::cuda::device_count();
  if (devices == 0) {
    std::printf("no CUDA device: the GPU tests are skipped\n");
    return 77;
  }
  std::printf("CUDA device 0: %s (%d device(s))\n", troupe::cuda::device_name(0).c_str(), devices);
  // The tensor-parallel and device-link cases over NCCL need it, and two devices.
  if (const troupe::status nccl = troupe::nccl_usable(); !nccl)
    std::printf("%s: the NCCL cases are skipped\n", nccl.err().message.c_str());
  else if (devices < 2)
    std::printf("one device: the two-device NCCL cases are skipped\n");
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
