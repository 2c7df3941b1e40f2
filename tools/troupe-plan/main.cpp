// troupe-plan: how many devices a model and a traffic profile need, in which tensor and
// pipeline layout, with what latency, at what price; and what given layouts will do.
#include <CLI/CLI.hpp>

#include "tools/troupe-plan/plan_commands.hpp"

using namespace troupe;
using namespace troupe::plan;


int main(int argc, char** argv) {
  CLI::App app{
      "troupe-plan: plan a deployment: devices, tensor/pipeline layout and replicas, expected\n"
      "TTFT, TPOT and throughput, KV memory per request, and cost per million tokens.\n\n"
      "  troupe-plan --shape llama3-8b --hardware h100 --rate 20 --prompt-tokens 200-2000 \\\n"
      "      --output-tokens 100-400 --ttft-ms 1000 --tpot-ms 50          the cheapest layouts\n"
      "  troupe-plan --model m.gguf --hardware machine.json --concurrency 8 \\\n"
      "      --layout pp=1,threads=2 --layout pp=2                          what given layouts do\n"
      "  troupe-perf calibrate m.gguf -o machine.json                     measure this machine\n"
      "  troupe-plan fit --hardware machine.json --model m.gguf --layout pp=1,threads=2 \\\n"
      "      --bench bench.json --out machine.json        the serving path's cost per step, from a\n"
      "                                                   troupe-bench run of that layout (with\n"
      "                                                   tp=2 or more: the all-reduce latency)\n\n"
      "The model: a roofline per pipeline stage (a smooth maximum of streaming the weights and\n"
      "the arithmetic, plus attention's KV reads, all-reduces between tensor shards, and a\n"
      "fixed cost per step) drives a simulation of troupe's scheduler (token budget per step,\n"
      "running requests first, then waiting ones; P micro-batches through P stages) over\n"
      "seeded traffic. Latency targets are p99s. GPU figures come from datasheets with\n"
      "assumed efficiencies (see docs/operations.md); a CPU's from troupe-perf calibrate,\n"
      "where a device is one core."};
  plan::plan_options o;
  auto add_common = [&](CLI::App* a) {
    a->add_option("--model", o.model_path, "a checkpoint troupe loads (its shape and weight type)");
    a->add_option("--shape", o.shape, "a named shape instead of a file: " + [] {
      std::string s;
      for (const auto& n : shape_names()) s += (s.empty() ? "" : ", ") + n;
      return s;
    }());
    a->add_option("--weights", o.weights_name, "the weights' type: bf16 (a named shape's default), f16, q8_0, f32");
    a->add_option("--kv-type", o.kv_name, "the KV cache's type: f16 (default; f32 for f32 weights), q8_0, f32");
    a->add_option("--hardware", o.hardware,
                  "a GPU from the table (h100, h200, a100, l40s, l4, a10g) or a profile file from troupe-perf "
                  "calibrate")
        ->capture_default_str();
    a->add_option("--price-per-hour", o.price, "price per device-hour (a CPU: per core); default: the table's or the profile's")
        ->check(CLI::NonNegativeNumber);
    a->add_option("--layout", o.layouts, "a layout to predict, tp=T,pp=P,replicas=R,threads=N (repeat for several)");
    a->add_option("--max-step-tokens", o.limits.max_step_tokens, "the scheduler's tokens per step")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    a->add_option("--max-running", o.limits.max_running, "the scheduler's requests per step")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    a->add_option("--kv-tokens", o.kv_tokens, "a replica's KV pool in tokens (default: what memory leaves)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  };
  add_common(&app);
  app.add_option("--rate", o.rate, "requests per second, Poisson arrivals")->check(CLI::PositiveNumber);
  app.add_option("--concurrency", o.concurrency, "a closed loop of this many clients instead (with --layout)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--requests", o.requests, "requests simulated")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--prompt-tokens", o.prompt, "prompt length: N, or MIN-MAX drawn uniformly")->capture_default_str();
  app.add_option("--output-tokens", o.output, "output length: N, or MIN-MAX drawn uniformly")->capture_default_str();
  app.add_option("--ttft-ms", o.ttft, "target time to first token, p99 (ms)")->check(CLI::NonNegativeNumber);
  app.add_option("--tpot-ms", o.tpot, "target time per output token, p99 (ms)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-devices", o.max_devices, "the most devices a plan may use")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", o.seed, "the simulated traffic's seed")->capture_default_str();
  app.add_option("--json", o.json_path, "also write the results as JSON to this file");
  auto* fit = app.add_subcommand("fit",
                                 "set a profile's step overhead (for the layout's threads per node), or with tensor "
                                 "shards its all-reduce latency, from a troupe-bench run of one layout");
  add_common(fit);
  fit->add_option("--bench", o.bench_path, "troupe-bench's --json of a closed-loop or Poisson run")->required();
  fit->add_option("--out", o.out_path, "the profile to write (may be --hardware's file)")->required();
  CLI11_PARSE(app, argc, argv);
  plan_setup setup = settle(o);
  if (fit->parsed()) return fit_profile(o, setup);
  return predict_or_plan(o, setup);
}
