// The GPU suite's main. Its cases fall in three parts by what they need: one device (the
// default), NCCL (test suite "nccl") and two devices over NCCL (test suite "two_devices").
// `--needs=device|nccl|two_devices` as the first argument runs one part; ctest runs each as
// a test of its own. A part whose needs this machine lacks says so and exits with 77, which
// ctest reports as skipped (SKIP_RETURN_CODE), never as passed. A device survey that fails
// for any reason but "no driver" or "no device" is a failure, not a skip. The last line
// counts the cases run, skipped and failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/forward/nccl_group.hpp"
#include "kernels/cuda/device.hpp"

namespace {

int cases_run = 0, cases_failed = 0, cases_skipped = 0;

struct count_listener : doctest::IReporter {
  explicit count_listener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& s) override {
    ++cases_run;
    cases_failed += s.failure_flags != 0 || s.numAssertsFailedCurrentTest > 0;
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override { ++cases_skipped; }
};

}  // namespace

DOCTEST_REGISTER_LISTENER("gpu_counts", 1, count_listener);

int main(int argc, char** argv) {
  std::string needs = "device";
  std::vector<char*> args(argv, argv + argc);
  if (argc > 1 && std::strncmp(argv[1], "--needs=", 8) == 0) {
    needs = argv[1] + 8;
    args.erase(args.begin() + 1);
  }
  if (needs != "device" && needs != "nccl" && needs != "two_devices") {
    std::fprintf(stderr, "--needs=%s: expected device, nccl or two_devices\n", needs.c_str());
    return 2;
  }
  const troupe::cuda::device_survey devices = troupe::cuda::survey_devices();
  if (!devices.error.empty()) {
    std::printf("the CUDA runtime cannot count this machine's devices: %s\n", devices.error.c_str());
    return 1;
  }
  if (devices.count == 0) {
    std::printf("no CUDA device: the GPU tests that need %s are skipped\n", needs.c_str());
    return 77;
  }
  std::printf("CUDA device 0: %s (%d device(s))\n", troupe::cuda::device_name(0).c_str(), devices.count);
  if (needs != "device") {
    if (const troupe::status nccl = troupe::nccl_usable(); !nccl) {
      std::printf("%s: the cases that need %s are skipped\n", nccl.err().message.c_str(), needs.c_str());
      return 77;
    }
    if (needs == "two_devices" && devices.count < 2) {
      std::printf("one device: the two-device cases are skipped\n");
      return 77;
    }
  }
  // This part's cases: one test suite, or every case outside both.
  std::string filter = needs == "device" ? "--test-suite-exclude=nccl,two_devices" : "--test-suite=" + needs;
  args.push_back(filter.data());
  doctest::Context ctx(static_cast<int>(args.size()), args.data());
  const int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  std::printf("gpu suite (needs %s): %d cases run, %d skipped, %d failed\n", needs.c_str(), cases_run, cases_skipped,
              cases_failed);
  if (cases_run == 0) {
    std::printf("no test case matches the filters given\n");
    return 1;
  }
  return rc;
}
