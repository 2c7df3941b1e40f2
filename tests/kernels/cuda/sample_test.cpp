// Sampling on the device against kernels/cpu/sample.hpp's definition, the same u for
// both.
#include "kernels/cpu/argmax.hpp"
#include "kernels/cpu/sample.hpp"
#include "kernels/cuda/sample.hpp"

#include "tests/kernels/cuda/gpu_test_support.hpp"

namespace troupe {

using namespace gpu_test;

TEST_CASE("greedy choices take the first of equal maxima, as the CPU's argmax does") {
  const int32_t rows = 9, n = 1001, stride = 1003;
  auto x = randoms(size_t(rows) * stride, 9);
  x[size_t(2) * stride + 500] = 50.0f;  // a tie: the first wins
  x[size_t(2) * stride + 7] = 50.0f;
  x[size_t(4) * stride + n - 1] = 60.0f;  // the last column
  auto dx = on_device(x);
  auto greedy = on_device(std::vector<token_choice>(rows, token_choice::greedy()));
  cuda::buffer<float> ws(cuda::sample_workspace(rows, n));
  auto out = poisoned<int32_t>(rows);
  cuda::sample(dx.get(), stride, rows, n, greedy.get(), ws.get(), out.get(), nullptr);
  sync();
  const auto got = out.download();
  for (int32_t r = 0; r < rows; ++r) CHECK(got[r] == argmax(x.data() + size_t(r) * stride, n));
}

TEST_CASE("sampling on the device draws the CPU's token for the same u: temperature, top-k, top-p, min-p, greedy") {
  const int32_t vocab = 5003, stride = vocab + 7;
  const std::vector<truncation> hows{
      {1.0f, 0, 1.0f, 0.0f},    {0.7f, 40, 1.0f, 0.0f}, {1.3f, 0, 0.9f, 0.0f},  {1.0f, 0, 1.0f, 0.05f},
      {0.8f, 50, 0.8f, 0.01f},  {0.0f, 0, 1.0f, 0.0f},  {1.0f, 1, 1.0f, 0.0f},  {0.05f, 0, 0.5f, 0.0f},
      {1.0f, 3000, 1.0f, 0.0f}, {2.5f, 0, 0.999f, 0.0f}};  // the last two keep more than 2,048
  const int32_t draws_per = 6, rows = static_cast<int32_t>(hows.size()) * draws_per;
  auto logits = randoms(size_t(rows) * stride, 71, 4.0f);
  for (int32_t r = 0; r < rows; ++r) {  // ties among the likely tokens
    logits[size_t(r) * stride + 10] = logits[size_t(r) * stride + 20] = 4.5f;
    logits[size_t(r) * stride + 30] = 4.5f;
  }
  std::vector<token_choice> choices(rows);
  std::mt19937 g(72);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int32_t r = 0; r < rows; ++r) choices[r] = {hows[r / draws_per], std::min(unit(g), 0.99999f)};
  auto dlogits = on_device(logits);
  auto dchoices = on_device(choices);
  cuda::buffer<float> ws(cuda::sample_workspace(rows, vocab));
  auto out = poisoned<int32_t>(rows);
  cuda::sample(dlogits.get(), stride, rows, vocab, dchoices.get(), ws.get(), out.get(), nullptr);
  sync();
  const auto got = out.download();
  sample_scratch scratch;
  int32_t near_boundary = 0;
  for (int32_t r = 0; r < rows; ++r) {
    const truncation& how = choices[r].how;
    const float u = choices[r].u;
    CAPTURE(r);
    CAPTURE(how.temperature);
    CAPTURE(how.top_k);
    CAPTURE(how.top_p);
    CAPTURE(how.min_p);
    CAPTURE(u);
    const float* row = logits.data() + size_t(r) * stride;
    if (how.temperature == 0.0f) {
      CHECK(got[r] == argmax(row, vocab));
      continue;
    }
    REQUIRE(got[r] >= 0);
    REQUIRE(got[r] < vocab);
    const size_t hows_index = size_t(r / draws_per);
    if (hows_index + 2 >= hows.size()) {
      // Drawn in index order: any token of the kept set, which holds every token at least as
      // likely as the least likely one the CPU keeps (its walk ends there as u nears 1).
      const int32_t last_kept = sample(row, vocab, how, 0.9999999f, scratch);
      CHECK(row[got[r]] >= row[last_kept] - 1e-5f);
      continue;
    }
    const int32_t want = sample(row, vocab, how, u, scratch);
    if (got[r] == want) continue;
    ++near_boundary;  // only a u within rounding of a boundary may go the other way
    CHECK((got[r] == sample(row, vocab, how, std::max(0.0f, u - 1e-4f), scratch) ||
           got[r] == sample(row, vocab, how, std::min(0.99999f, u + 1e-4f), scratch)));
  }
  CHECK(near_boundary <= 2);
}

}  // namespace troupe
