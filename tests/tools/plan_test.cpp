// troupe-plan's model: costs per token, the hardware profiles, the roofline per stage, the
// scheduler simulation, the search and the calibration fit, on profiles whose figures
// make the expected answers plain.
#include <doctest/doctest.h>

#include "tools/troupe-plan/planner.hpp"

using namespace troupe;
using namespace troupe::plan;

namespace {

// A device with round figures: 100 GB/s of weights and cache, 1 TFLOP/s at every batch,
// free links, no overhead.
hardware_profile round_device() {
  hardware_profile h;
  h.name = "round";
  h.kind = "gpu";
  h.memory_gib = 16;
  h.devices_per_node = 8;
  h.rates = {{1, 100, 100, 1000, 1000, -1}};
  h.link_gbs = 1e6;
  h.net_gbs = 1e6;
  h.price_per_hour = 1;
  return h;
}

model_cost cost_110m() { return cost_of(*named_shape("110m", dtype::bf16, dtype::f16)); }

// Every request `prompt` + `output` tokens; a closed loop of `clients` sending `requests`
// in all, each the moment its last reply ends.
traffic fixed_lengths(int32_t prompt, int32_t output, int clients = 8, int requests = 200) {
  traffic t;
  t.prompt = {prompt, prompt};
  t.output = {output, output};
  t.concurrency = clients;
  t.requests = requests;
  t.client_gap_ms = 0;
  return t;
}

}  // namespace

TEST_CASE("costs per token follow the shape") {
  const model_shape s = *named_shape("llama2-7b", dtype::bf16, dtype::f16);
  const model_cost c = cost_of(s);
  // The layer matrices and the classifier are the parameters but for norms (and the
  // embedding, which num_params counts once with the classifier).
  const int64_t norms = int64_t{2} * s.config.dim * s.config.num_layers + s.config.dim;
  CHECK(c.layer_params * c.layers + c.classifier_params + norms == s.config.num_params());
  CHECK(c.layer_bytes == doctest::Approx(2.0 * c.layer_params));
  // Llama 3 8B: 8 KV heads of 128, f16: 4 KiB per token and layer, 128 KiB per token.
  const model_cost l3 = cost_of(*named_shape("llama3-8b", dtype::bf16, dtype::f16));
  CHECK(l3.kv_bytes_per_token() == doctest::Approx(128.0 * 1024));
  CHECK(weight_bytes(32, dtype::q8_0) == doctest::Approx(34.0));
  CHECK(weight_bytes(10, dtype::f32) == doctest::Approx(40.0));
  CHECK_FALSE(named_shape("no-such-model", dtype::bf16, dtype::f16).has_value());
}

TEST_CASE("stages split the layers, the first ones taking the remainder") {
  int32_t total = 0;
  for (int s = 0; s < 5; ++s) total += stage_layers(12, 5, s);
  CHECK(total == 12);
  CHECK(stage_layers(12, 5, 0) == 3);
  CHECK(stage_layers(12, 5, 1) == 3);
  CHECK(stage_layers(12, 5, 4) == 2);
}

TEST_CASE("a stage's step is about the longer of streaming its weights and its arithmetic") {
  const model_cost m = cost_110m();
  hardware_profile h = round_device();
  const layout whole;
  step_rows one;
  one.decode = one.logits = 1;
  const double weights_ms = m.weight_bytes_total() / 100e9 * 1e3;
  CHECK(stage_ms(m, h, whole, 0, one) == doctest::Approx(weights_ms).epsilon(0.001));  // (10x the arithmetic)
  step_rows many;
  many.prefill = 4096;
  many.logits = 1;
  const double flops = 4096 * m.layer_flops(m.layers) + m.classifier_flops();
  CHECK(stage_ms(m, h, whole, 0, many) == doctest::Approx(flops / 1e12 * 1e3).epsilon(0.001));  // (no context)
  // Where the two are equal, neither hides the other entirely.
  step_rows even;
  even.decode = even.logits = static_cast<int32_t>(m.weight_bytes_total() / 100e9 * 1e12 /
                                                   (m.layer_flops(m.layers) + m.classifier_flops()));
  CHECK(stage_ms(m, h, whole, 0, even) > 1.2 * weights_ms);
  // Two tensor shards each stream half; the overhead is added once per step.
  h.step_overhead_ms = 2;
  const layout tp2{2, 1, 1, 1};
  CHECK(stage_ms(m, h, tp2, 0, one) ==
        doctest::Approx(weights_ms / 2 + 2 + 2.0 * m.layers * 4 * m.dim / 1e15 * 1e3).epsilon(0.001));
  // Attention reads each decode row's context.
  step_rows deep = one;
  deep.decode_context = 1000;
  CHECK(stage_ms(m, h, whole, 0, deep) - stage_ms(m, h, whole, 0, one) ==
        doctest::Approx(1000 * m.kv_bytes_per_token() / 100e9 * 1e3));
}

TEST_CASE("one request alone: its first token after its prompt's step, then one step per token") {
  const model_cost m = cost_110m();
  const hardware_profile h = round_device();
  const prediction p = simulate(m, h, layout{}, scheduler_limits{}, fixed_lengths(100, 20, 1, 3));
  REQUIRE(p.completed == 3);
  step_rows prompt;
  prompt.prefill = 100;
  prompt.logits = 1;
  prompt.prefill_context = 100 * 50.0;
  CHECK(p.ttft_p50_ms == doctest::Approx(stage_ms(m, h, layout{}, 0, prompt)));
  // Each decode step attends over a context one longer: the TPOT is their mean.
  double sum = 0;
  for (int k = 1; k < 20; ++k) {
    step_rows d;
    d.decode = d.logits = 1;
    d.decode_context = 100 + k;
    sum += stage_ms(m, h, layout{}, 0, d);
  }
  CHECK(p.tpot_p50_ms == doctest::Approx(sum / 19));
  CHECK(p.mean_running == doctest::Approx(1));
}

TEST_CASE("a pipeline's token crosses every stage, and two micro-batches keep both busy") {
  const model_cost m = cost_110m();
  const hardware_profile h = round_device();
  const traffic one = fixed_lengths(8, 64, 1, 1);
  const prediction whole = simulate(m, h, layout{}, scheduler_limits{}, one);
  const prediction piped = simulate(m, h, layout{1, 2, 1, 1}, scheduler_limits{}, one);
  // Bandwidth-bound: the two stages stream what one did, one after the other.
  CHECK(piped.tpot_p50_ms == doctest::Approx(whole.tpot_p50_ms).epsilon(0.01));
  const prediction piped_two = simulate(m, h, layout{1, 2, 1, 1}, scheduler_limits{}, fixed_lengths(8, 64, 2, 2));
  // Each stage works on one micro-batch while the other is on the other stage: the slower
  // stage (the one with the classifier) sets the pace, two tokens per two of its steps.
  step_rows d;
  d.decode = d.logits = 1;
  const layout two_stages{1, 2, 1, 1};
  const double first = stage_ms(m, h, two_stages, 0, d), last = stage_ms(m, h, two_stages, 1, d);
  REQUIRE(last > first);
  CHECK(piped_two.output_tokens_per_s ==
        doctest::Approx(piped.output_tokens_per_s * (first + last) / last).epsilon(0.05));
}

TEST_CASE("Poisson arrivals above what a replica serves build a queue") {
  const model_cost m = cost_110m();
  const hardware_profile h = round_device();
  const double capacity = simulate(m, h, layout{}, scheduler_limits{}, fixed_lengths(200, 100, 64)).requests_per_s;
  auto at = [&](double rate, int replicas) {
    traffic t = fixed_lengths(200, 100);
    t.rate = rate;
    return simulate(m, h, layout{1, 1, replicas, 1}, scheduler_limits{}, t);
  };
  const prediction light = at(0.3 * capacity, 1), heavy = at(3 * capacity, 1);
  CHECK(light.completed == 200);
  CHECK(heavy.completed == 200);
  CHECK(light.requests_per_s == doctest::Approx(0.3 * capacity).epsilon(0.25));  // keeps up
  CHECK(heavy.ttft_p99_ms > 10 * light.ttft_p99_ms);
  // Two replicas halve each one's load.
  CHECK(at(1.5 * capacity, 2).ttft_p99_ms < heavy.ttft_p99_ms / 10);
}

TEST_CASE("a full KV cache holds requests back") {
  const model_cost m = cost_110m();
  const hardware_profile h = round_device();
  const traffic t = fixed_lengths(100, 50, 8, 16);
  scheduler_limits room;
  room.kv_tokens = 2 * 150;  // two requests at a time
  CHECK(simulate(m, h, layout{}, room, t).peak_running == 2);
  CHECK(simulate(m, h, layout{}, scheduler_limits{}, t).peak_running == 8);
}

TEST_CASE("memory: weights per device, and the requests the rest holds") {
  const model_cost m = cost_of(*named_shape("llama3-70b", dtype::bf16, dtype::f16));
  const hardware_profile l4 = gpu_named("l4").value();
  const traffic t = fixed_lengths(1000, 1000);
  CHECK_FALSE(fit_memory(m, l4, layout{}, t).why_not.empty());
  const memory_fit eight = fit_memory(m, gpu_named("h100").value(), layout{8, 1, 1, 1}, t);
  REQUIRE(eight.why_not.empty());
  CHECK(eight.weights_gib == doctest::Approx(m.weight_bytes_total() / 8 / (1024.0 * 1024 * 1024)));
  CHECK(eight.kv_per_request_mib == doctest::Approx(2000 * m.kv_bytes_per_token() / (1024.0 * 1024)));
  CHECK(eight.max_concurrency == eight.kv_tokens / 2000);
}

TEST_CASE("the plan: the cheapest layout within the targets, and why the others are not") {
  const model_config c = named_shape("llama3-8b", dtype::bf16, dtype::f16)->config;
  const model_cost m = cost_of(*named_shape("llama3-8b", dtype::bf16, dtype::f16));
  plan_request r;
  r.load = fixed_lengths(500, 200, 8, 100);
  r.load.rate = 4;
  r.goal.tpot_p99_ms = 60;
  r.max_devices = 8;
  const std::vector<candidate> out = plan_layouts(m, c, gpu_named("l4").value(), r);
  REQUIRE_FALSE(out.empty());
  const candidate& best = out.front();
  REQUIRE(best.why_not.empty());
  CHECK(best.p.tpot_p99_ms <= 60);
  CHECK(best.l.replicas * best.replica_rate >= 4);
  for (const candidate& k : out)
    if (k.why_not.empty()) CHECK(k.cost_per_m_output >= best.cost_per_m_output);
  // A tighter target than one L4 can stream the weights for needs more devices.
  r.goal.tpot_p99_ms = 25;
  const std::vector<candidate> tight = plan_layouts(m, c, gpu_named("l4").value(), r);
  REQUIRE(tight.front().why_not.empty());
  CHECK(tight.front().l.tp * tight.front().l.pp > 1);
  CHECK(tight.front().cost_per_m_output > best.cost_per_m_output);
}

TEST_CASE("the step overhead and all-reduce latency fitted to a run are the ones that produced it") {
  const model_cost m = cost_110m();
  hardware_profile h = round_device();
  const traffic t = fixed_lengths(50, 40, 4, 12);
  h.step_overhead_ms = 3.5;
  const double measured = simulate(m, h, layout{}, scheduler_limits{}, t).tpot_p50_ms;
  h.step_overhead_ms = 0;
  auto overhead = fit_to_tpot(m, h, layout{}, scheduler_limits{}, t, measured, fitted::step_overhead_ms);
  REQUIRE(overhead.has_value());
  CHECK(*overhead == doctest::Approx(3.5).epsilon(0.01));
  CHECK_FALSE(fit_to_tpot(m, h, layout{}, scheduler_limits{}, t, 0.001, fitted::step_overhead_ms).has_value());
  // Tensor shards: the all-reduce latency, with the step overhead as it is.
  const layout tp2{2, 1, 1, 1};
  h.link_latency_us = 40;
  const double sharded = simulate(m, h, tp2, scheduler_limits{}, t).tpot_p50_ms;
  h.link_latency_us = 0;
  auto latency = fit_to_tpot(m, h, tp2, scheduler_limits{}, t, sharded, fitted::link_latency_us);
  REQUIRE(latency.has_value());
  CHECK(*latency == doctest::Approx(40).epsilon(0.01));
}

TEST_CASE("profiles: the table, files round trip, bad files say what is wrong") {
  CHECK_FALSE(gpu_named("tpu").has_value());
  hardware_profile h = gpu_named("h200").value();
  h.rates.push_back({4, 1, 2, 3, 4, 0.5});
  h.rates.front().threads = 1;
  const auto back = profile_from_json(profile_to_json(h), "x");
  REQUIRE(back.has_value());
  CHECK(back->name == h.name);
  CHECK(back->rates.size() == 2);
  CHECK(back->rates[1].prefill_gflops == 4);
  CHECK(back->step_overhead_for(4) == 0.5);
  CHECK(back->step_overhead_for(1) == h.step_overhead_ms);
  // Between measured thread counts, the nearest below scaled by the threads.
  CHECK(back->rates_for(8).weight_gbs == doctest::Approx(2));
  CHECK(back->rates_for(2).threads == 2);
  CHECK(back->rates_for(2).weight_gbs == doctest::Approx(2 * back->rates[0].weight_gbs));
  auto refused = [](const std::string& text) {
    auto p = profile_from_json(text, "f.json");
    return p.has_value() ? std::string() : p.err().message;
  };
  CHECK(refused("[1,2]").find("not a JSON object") != std::string::npos);
  std::string no_rates = profile_to_json(h);
  no_rates.replace(no_rates.find("\"rates\""), 7, "\"rate_s\"");
  CHECK(refused(no_rates).find("\"rates\"") != std::string::npos);
  std::string negative = profile_to_json(h);
  negative.replace(negative.find("\"memory_gib\": "), 14, "\"memory_gib\": -");
  CHECK(refused(negative).find("memory_gib") != std::string::npos);
  hardware_profile backwards = h;
  backwards.rates = {{2, 1, 1, 1, 1, -1}, {1, 1, 1, 1, 1, -1}};
  CHECK(refused(profile_to_json(backwards)).find("ascend") != std::string::npos);
}
