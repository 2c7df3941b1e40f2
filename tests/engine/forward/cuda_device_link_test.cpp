// Pipeline stages on GPUs joined by a device link: the first stage's rank 0 sends its
// hidden states over NCCL (send/recv) to the next stage instead of through the host. Two
// stages on two devices against one shard of every layer; a receiver released when its
// link is aborted (and both shards going on through the host); and the links a shard cannot
// have, refused (one device). The two-device cases need NCCL and a second device: they are
// the suite's part "two_devices", reported skipped where the machine lacks them
// (gpu_main.cpp).
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <span>

#include <doctest/doctest.h>

#include "engine/forward/cuda_shard.hpp"
#include "engine/forward/forward_shard.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "kernels/cpu/argmax.hpp"
#include "kernels/cuda/device.hpp"
#include "tests/support/tensor_parallel.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {


model random_model(test::temp_dir& dir) {
  const model_config c = test::splittable_config();
  const std::string path = dir.file("link.gguf");
  REQUIRE(write_gguf(path, {c, dtype::f32, 32, false}, synthetic_vocabulary(c.vocab_size), random_weights(23)).has_value());
  auto m = load_model(path);
  REQUIRE(m.has_value());
  return std::move(m).value();
}

std::unique_ptr<forward_shard> gpu_shard(const model& m, int32_t first, int32_t end, int device, int32_t blocks) {
  cuda_shard_options o;
  o.device = device;
  o.weights = dtype::f32;
  o.num_blocks = blocks;
  auto made = make_cuda_shard(m, shard_spec{first, end, tp_slice{}}, o);
  REQUIRE_MESSAGE(made.has_value(), (made ? "" : made.err().message));
  return std::move(made).value();
}

// Joins `from` (sender) and `to` (receiver) by a new device link, each on a thread of its
// own (connecting waits for the other).
std::shared_ptr<nccl_group> link(forward_shard& from, forward_shard& to) {
  auto g = nccl_group::create(2);
  REQUIRE_MESSAGE(g.has_value(), (g ? "" : g.err().message));
  std::shared_ptr<nccl_group> group = *g;
  auto sender = std::async(std::launch::async, [&] { return from.connect_link(link_side::output, group, 0); });
  auto receiver = std::async(std::launch::async, [&] { return to.connect_link(link_side::input, group, 1); });
  const status s = sender.get(), r = receiver.get();
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.err().message));
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.err().message));
  REQUIRE(from.has_link(link_side::output));
  REQUIRE(to.has_link(link_side::input));
  return group;
}

}  // namespace

TEST_CASE("two GPU stages joined by a device link give one shard's logits and tokens, nothing through the host" *
          doctest::test_suite("two_devices")) {
  test::temp_dir dir;
  const model m = random_model(dir);
  const model_config& c = m.config;
  const std::vector<int32_t> prompt{1, 17, 200, 45, 99, 3, 250};
  const int32_t steps = 6;
  const std::vector<block_id> blocks = test::blocks_for(static_cast<int32_t>(prompt.size()) + steps);
  const auto nb = static_cast<int32_t>(blocks.size());

  auto whole = gpu_shard(m, 0, 0, 0, nb);
  const test::tp_run one = test::run_steps({whole.get()}, c, prompt, steps, blocks);

  auto first = gpu_shard(m, 0, 1, 0, nb);
  auto second = gpu_shard(m, 1, c.num_layers, 1, nb);
  auto group = link(*first, *second);
  test::tp_run two;
  std::vector<int32_t> tokens = prompt;
  int32_t computed = 0;
  for (int32_t s = 0; s < steps; ++s) {
    step_batch batch;
    batch.add(std::span(tokens).subspan(computed), computed, blocks, true);
    // The first stage answers before its send is received (the receiver posts its side
    // only when the step reaches it), and leaves the host buffer alone.
    std::vector<float> hidden(size_t(batch.num_tokens()) * c.dim, std::numeric_limits<float>::quiet_NaN());
    first->forward(batch, hidden.data(), nullptr);
    CHECK(std::isnan(hidden[0]));
    std::vector<float> logits(c.vocab_size);
    REQUIRE(second->take_next_input_from_link());
    second->forward(batch, hidden.data(), logits.data());
    computed = static_cast<int32_t>(tokens.size());
    tokens.push_back(argmax(logits.data(), c.vocab_size));
    two.tokens.push_back(tokens.back());
    two.logits.push_back(std::move(logits));
  }
  const double worst = test::worst_relative_difference(one, two);
  MESSAGE("two linked stages against one shard: worst logit difference ", worst, " of the largest logit");
  CHECK(worst <= 1e-5);
  CHECK(one.tokens == two.tokens);
}

TEST_CASE("a receiver waiting on an aborted device link is released, and both stages go on through the host" *
          doctest::test_suite("two_devices")) {
  test::temp_dir dir;
  const model m = random_model(dir);
  const model_config& c = m.config;
  const std::vector<block_id> blocks = test::blocks_for(16);
  auto first = gpu_shard(m, 0, 1, 0, 1);
  auto second = gpu_shard(m, 1, c.num_layers, 1, 1);
  auto group = link(*first, *second);
  const std::vector<int32_t> tokens{1, 2, 3};
  step_batch batch;
  batch.add(std::span(tokens), 0, blocks, true);

  // Nothing was sent: the receiver waits until the link is aborted.
  std::vector<float> logits(c.vocab_size);
  std::vector<float> hidden(tokens.size() * c.dim, std::numeric_limits<float>::quiet_NaN());
  REQUIRE(second->take_next_input_from_link());
  auto waiting = std::async(std::launch::async, [&]() -> std::string {
    try {
      second->forward(batch, hidden.data(), logits.data());
      return "received nothing, yet went on";
    } catch (const device_link_broken&) {
      return "released";
    }
  });
  CHECK(waiting.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  group->abort();
  REQUIRE(waiting.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(waiting.get() == "released");
  CHECK_FALSE(second->has_link(link_side::input));

  // The sender drops the aborted link before its next step and writes the host buffer; the
  // receiver, its link gone, takes no input from one.
  first->forward(batch, hidden.data(), nullptr);
  CHECK_FALSE(first->has_link(link_side::output));
  CHECK(std::isfinite(hidden[0]));
  CHECK_FALSE(second->take_next_input_from_link());
  second->forward(batch, hidden.data(), logits.data());
  CHECK(std::isfinite(logits[0]));
}

TEST_CASE("device links a shard cannot have are refused with the reason") {
  test::temp_dir dir;
  const model m = random_model(dir);
  auto g = nccl_group::create(2);
  std::shared_ptr<nccl_group> group = g ? *g : nullptr;
  auto first = gpu_shard(m, 0, 1, 0, 1);
  auto last = gpu_shard(m, 1, m.config.num_layers, 0, 1);
  auto in_first = first->connect_link(link_side::input, group, 1);
  REQUIRE_FALSE(in_first.has_value());
  CHECK(in_first.err().message.find("first stage") != std::string::npos);
  auto out_last = last->connect_link(link_side::output, group, 0);
  REQUIRE_FALSE(out_last.has_value());
  CHECK(out_last.err().message.find("before the last") != std::string::npos);
  auto wrong_rank = last->connect_link(link_side::input, group, 0);
  REQUIRE_FALSE(wrong_rank.has_value());
  CHECK(wrong_rank.err().message.find("rank 0") != std::string::npos);
  CHECK_FALSE(first->has_link(link_side::output));
  CHECK_FALSE(last->has_link(link_side::input));
  CHECK_FALSE(last->take_next_input_from_link());
}

}  // namespace troupe
