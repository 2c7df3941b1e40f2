// troupe-plan: how many devices a model and a traffic profile need, in which tensor and
// pipeline layout, with what latency, at what price; and what given layouts will do.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "engine/model/model.hpp"
#include "tools/common/model_loading.hpp"
#include "tools/troupe-plan/planner.hpp"

using namespace troupe;
using namespace troupe::plan;
using nlohmann::json;

namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "troupe-plan: %s\n", message.c_str());
  std::exit(2);
}

// "N" or "A-B" (a uniform range of token counts).
expected<length_range> range_of(const std::string& s, const char* flag) {
  length_range r;
  const size_t dash = s.find('-');
  char* end = nullptr;
  const long a = std::strtol(s.c_str(), &end, 10);
  long b = a;
  if (dash != std::string::npos) {
    if (end != s.c_str() + dash) return error{std::string(flag) + ": '" + s + "' is not N or MIN-MAX"};
    b = std::strtol(s.c_str() + dash + 1, &end, 10);
  }
  if (s.empty() || *end != '\0' || a < 1 || b < a || b > (1 << 22))
    return error{std::string(flag) + ": '" + s + "' is not N or MIN-MAX with 1 <= MIN <= MAX <= 4194304"};
  r.min = static_cast<int32_t>(a);
  r.max = static_cast<int32_t>(b);
  return r;
}

// "tp=2,pp=1,replicas=3,threads=1" (any subset; the rest 1).
expected<layout> layout_of(const std::string& s) {
  layout l;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    const size_t eq = part.find('=');
    char* end = nullptr;
    const long v = eq == std::string::npos ? 0 : std::strtol(part.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || *end != '\0' || v < 1 || v > 4096)
      return error{"--layout: '" + part + "' is not KEY=N (tp, pp, replicas, threads; N from 1 to 4096)"};
    const std::string key = part.substr(0, eq);
    if (key == "tp") l.tp = static_cast<int>(v);
    else if (key == "pp") l.pp = static_cast<int>(v);
    else if (key == "replicas") l.replicas = static_cast<int>(v);
    else if (key == "threads") l.threads = static_cast<int>(v);
    else return error{"--layout: no key '" + key + "' (tp, pp, replicas, threads)"};
  }
  return l;
}

std::string money(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v >= 1 ? "$%.2f" : "$%.4f", v);
  return b;
}

json prediction_json(const prediction& p) {
  return {{"completed", p.completed},
          {"output_tokens_per_s", p.output_tokens_per_s},
          {"requests_per_s", p.requests_per_s},
          {"ttft_ms", {{"p50", p.ttft_p50_ms}, {"p99", p.ttft_p99_ms}}},
          {"tpot_ms", {{"p50", p.tpot_p50_ms}, {"p99", p.tpot_p99_ms}}},
          {"mean_running", p.mean_running}};
}

json layout_json(const layout& l) {
  return {{"tp", l.tp}, {"pp", l.pp}, {"replicas", l.replicas}, {"threads", l.threads}, {"devices", l.devices()}};
}

}  // namespace

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
  std::string model_path, shape, weights_name, kv_name, hardware = "h100", prompt = "512", output = "256", json_path;
  std::vector<std::string> layouts;
  double price = -1, rate = 0, ttft = 0, tpot = 0;
  int concurrency = 0, requests = 200, max_devices = 1024;
  uint64_t seed = 1;
  scheduler_limits limits;
  int64_t kv_tokens = 0;
  auto add_common = [&](CLI::App* a) {
    a->add_option("--model", model_path, "a checkpoint troupe loads (its shape and weight type)");
    a->add_option("--shape", shape, "a named shape instead of a file: " + [] {
      std::string s;
      for (const auto& n : shape_names()) s += (s.empty() ? "" : ", ") + n;
      return s;
    }());
    a->add_option("--weights", weights_name, "the weights' type: bf16 (a named shape's default), f16, q8_0, f32");
    a->add_option("--kv-type", kv_name, "the KV cache's type: f16 (default; f32 for f32 weights), q8_0, f32");
    a->add_option("--hardware", hardware,
                  "a GPU from the table (h100, h200, a100, l40s, l4, a10g) or a profile file from troupe-perf "
                  "calibrate")
        ->capture_default_str();
    a->add_option("--price-per-hour", price, "price per device-hour (a CPU: per core); default: the table's or the profile's")
        ->check(CLI::NonNegativeNumber);
    a->add_option("--layout", layouts, "a layout to predict, tp=T,pp=P,replicas=R,threads=N (repeat for several)");
    a->add_option("--max-step-tokens", limits.max_step_tokens, "the scheduler's tokens per step")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 20));
    a->add_option("--max-running", limits.max_running, "the scheduler's requests per step")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 16));
    a->add_option("--kv-tokens", kv_tokens, "a replica's KV pool in tokens (default: what memory leaves)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  };
  add_common(&app);
  app.add_option("--rate", rate, "requests per second, Poisson arrivals")->check(CLI::PositiveNumber);
  app.add_option("--concurrency", concurrency, "a closed loop of this many clients instead (with --layout)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--requests", requests, "requests simulated")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--prompt-tokens", prompt, "prompt length: N, or MIN-MAX drawn uniformly")->capture_default_str();
  app.add_option("--output-tokens", output, "output length: N, or MIN-MAX drawn uniformly")->capture_default_str();
  app.add_option("--ttft-ms", ttft, "target time to first token, p99 (ms)")->check(CLI::NonNegativeNumber);
  app.add_option("--tpot-ms", tpot, "target time per output token, p99 (ms)")->check(CLI::NonNegativeNumber);
  app.add_option("--max-devices", max_devices, "the most devices a plan may use")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", seed, "the simulated traffic's seed")->capture_default_str();
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  auto* fit = app.add_subcommand("fit",
                                 "set a profile's step overhead (for the layout's threads per node), or with tensor "
                                 "shards its all-reduce latency, from a troupe-bench run of one layout");
  std::string bench_path, out_path;
  add_common(fit);
  fit->add_option("--bench", bench_path, "troupe-bench's --json of a closed-loop or Poisson run")->required();
  fit->add_option("--out", out_path, "the profile to write (may be --hardware's file)")->required();
  CLI11_PARSE(app, argc, argv);

  // The model.
  if (model_path.empty() == shape.empty()) die("name the model: --model FILE or --shape NAME");
  std::optional<dtype> weights_type, kv_type;
  if (!weights_name.empty() && !(weights_type = dtype_named(weights_name)))
    die("--weights: '" + weights_name + "' is not f32, f16, bf16 or q8_0");
  if (!kv_name.empty() && (!(kv_type = dtype_named(kv_name)) || *kv_type == dtype::bf16))
    die("--kv-type: '" + kv_name + "' is not f32, f16 or q8_0");
  model_shape ms;
  if (!model_path.empty()) {
    auto m = load_model(model_path);
    if (!m) die(m.err().message);
    ms.name = model_path;
    ms.config = m->config;
    ms.weights = weights_type.value_or(m->weight_type);
  } else {
    auto s = named_shape(shape, weights_type.value_or(dtype::bf16), dtype::f16);
    if (!s) die("--shape: no shape named '" + shape + "'");
    ms = *s;
  }
  ms.kv = kv_type.value_or(ms.weights == dtype::f32 ? dtype::f32 : dtype::f16);
  const model_cost cost = cost_of(ms);

  // The hardware.
  expected<hardware_profile> hw =
      hardware.find_first_of("./") != std::string::npos ? read_profile(hardware) : gpu_named(hardware);
  if (!hw) die(hw.err().message);
  if (price >= 0) hw->price_per_hour = price;

  std::vector<layout> given;
  for (const std::string& s : layouts) {
    auto l = layout_of(s);
    if (!l) die(l.err().message);
    if (hw->cpu() && l->tp * l->threads > hw->devices_per_node)
      die("--layout " + s + ": a stage's shards need " + std::to_string(l->tp * l->threads) + " cores; the profile has " +
          std::to_string(hw->devices_per_node));
    if (l->pp > ms.config.num_layers) die("--layout " + s + ": more stages than the model's layers");
    given.push_back(*l);
  }
  std::printf("model: %s, %.2f GiB of %s weights, KV %s: %.1f KiB per token\n", ms.name.c_str(),
              cost.weight_bytes_total() / (1024.0 * 1024 * 1024), std::string(dtype_name(ms.weights)).c_str(),
              std::string(dtype_name(ms.kv)).c_str(), cost.kv_bytes_per_token() / 1024);
  std::printf("hardware: %s (%s)\n", hw->name.c_str(), hw->source.c_str());

  if (fit->parsed()) {
    if (given.size() != 1) die("fit: name the one layout the run used with --layout");
    std::ifstream f(bench_path);
    if (!f) die(bench_path + ": cannot open");
    const json b = json::parse(f, nullptr, false);
    auto num = [&](const char* key) {
      if (b.is_discarded() || !b.is_object() || !b.contains(key) || !b[key].is_number())
        die(bench_path + ": not troupe-bench's --json (no number \"" + std::string(key) + "\")");
      return b[key].get<double>();
    };
    const double completed = num("completed");
    if (!(completed >= 1 && completed <= 100000)) die(bench_path + ": \"completed\" must be 1 to 100000");
    traffic t;
    t.requests = static_cast<int>(completed);
    const double prompt_mean = num("prompt_tokens") / completed, output_mean = num("output_tokens") / completed;
    if (!(prompt_mean >= 0 && prompt_mean <= ms.config.max_seq_len && output_mean >= 0 &&
          output_mean <= ms.config.max_seq_len))
      die(bench_path + ": its token counts per request do not fit the model's context of " +
          std::to_string(ms.config.max_seq_len));
    const int32_t p = std::max(1, static_cast<int32_t>(std::lround(prompt_mean)));
    const int32_t o = std::max(1, static_cast<int32_t>(std::lround(output_mean)));
    t.prompt = {p, p};
    t.output = {o, o};
    if (b.contains("rate") && b["rate"].is_number()) {
      t.rate = b["rate"].get<double>();
      if (!(t.rate > 0 && t.rate <= 1e6)) die(bench_path + ": \"rate\" must be above 0");
    } else {
      const double c = num("concurrency");
      if (!(c >= 1 && c <= 65536)) die(bench_path + ": \"concurrency\" must be 1 to 65536");
      t.concurrency = static_cast<int>(c);
    }
    if (!b.contains("tpot_ms") || !b["tpot_ms"].is_object() || !b["tpot_ms"].contains("p50") ||
        !b["tpot_ms"]["p50"].is_number())
      die(bench_path + ": no tpot_ms.p50");
    const double measured = b["tpot_ms"]["p50"].get<double>();
    scheduler_limits s = limits;
    s.kv_tokens = kv_tokens;
    const layout& l = given[0];
    const bool shards = l.tp > 1;
    auto value = fit_to_tpot(cost, *hw, l, s, t, measured, shards ? fitted::link_latency_us : fitted::step_overhead_ms);
    if (!value) die("fit: " + value.err().message);
    const std::string threads = std::to_string(l.threads) + (l.threads == 1 ? " thread" : " threads");
    if (shards) {
      hw->link_latency_us = *value;
      hw->source += "; all-reduce latency fitted to " + bench_path;
    } else {
      // The overhead belongs to nodes of this many threads; it is also the default for
      // the others until they are fitted themselves.
      bool placed = false;
      for (rate_point& r : hw->rates)
        if (r.threads == l.threads) {
          r.step_overhead_ms = *value;
          placed = true;
        }
      if (!placed || hw->step_overhead_ms == 0) hw->step_overhead_ms = *value;
      hw->source += "; step overhead (" + threads + ") fitted to " + bench_path;
    }
    std::ofstream o_file(out_path);
    o_file << profile_to_json(*hw);
    if (!o_file) die(out_path + ": cannot write");
    std::printf("%s %.3f %s: the TPOT p50 of %s under %d requests of %d+%d tokens (%.2f ms measured)\n",
                shards ? "all-reduce latency" : ("step overhead with " + threads).c_str(), *value,
                shards ? "us" : "ms", l.describe().c_str(), t.requests, p, o, measured);
    std::printf("wrote %s\n", out_path.c_str());
    return 0;
  }

  traffic t;
  t.requests = requests;
  t.seed = seed;
  auto pr = range_of(prompt, "--prompt-tokens");
  auto orange = range_of(output, "--output-tokens");
  if (!pr) die(pr.err().message);
  if (!orange) die(orange.err().message);
  t.prompt = *pr;
  t.output = *orange;
  if (int64_t{t.prompt.max} + t.output.max > ms.config.max_seq_len)
    die("the longest prompt and output (" + std::to_string(int64_t{t.prompt.max} + t.output.max) +
        " tokens) do not fit the model's context of " + std::to_string(ms.config.max_seq_len));
  if (rate > 0 && concurrency > 0) die("--rate and --concurrency are two traffic profiles: give one");
  t.rate = rate;
  t.concurrency = concurrency;
  limits.kv_tokens = kv_tokens;
  const targets goal{ttft, tpot};
  bool served = true;  // a plan was asked for and found (or layouts were predicted)
  json out = {{"model", ms.name}, {"hardware", hw->name}, {"layouts", json::array()}};

  if (!given.empty()) {
    if (rate <= 0 && concurrency <= 0) die("give the traffic: --rate R or --concurrency C");
    std::printf("traffic: %s, %d requests, prompts %d-%d tokens, outputs %d-%d\n\n",
                rate > 0 ? (std::to_string(rate) + " requests/s").c_str() : ("c=" + std::to_string(concurrency)).c_str(),
                requests, t.prompt.min, t.prompt.max, t.output.min, t.output.max);
    std::printf("| layout | devices | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | KV per request | fits at once | cost per 1M out |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const layout& l : given) {
      const memory_fit mem = fit_memory(cost, *hw, l, t);
      scheduler_limits s = limits;
      if (mem.why_not.empty()) s.kv_tokens = s.kv_tokens > 0 ? s.kv_tokens : mem.kv_tokens;
      const prediction p = simulate(cost, *hw, l, s, t);
      const double per_m = l.devices() * hw->price_per_hour / 3600 / std::max(1e-12, p.output_tokens_per_s) * 1e6;
      std::printf("| %s | %d | %.1f | %.0f / %.0f | %.1f / %.1f | %.1f MiB | %lld | %s |%s\n", l.describe().c_str(),
                  l.devices(), p.output_tokens_per_s, p.ttft_p50_ms, p.ttft_p99_ms, p.tpot_p50_ms, p.tpot_p99_ms,
                  mem.kv_per_request_mib, static_cast<long long>(mem.max_concurrency), money(per_m).c_str(),
                  mem.why_not.empty() ? "" : (" " + mem.why_not).c_str());
      json j = prediction_json(p);
      j["layout"] = layout_json(l);
      j["kv_per_request_mib"] = mem.kv_per_request_mib;
      j["max_concurrency"] = mem.max_concurrency;
      j["cost_per_million_output_tokens"] = per_m;
      out["layouts"].push_back(j);
    }
  } else {
    if (rate <= 0) die("planning needs the traffic's --rate (requests/s); or predict given layouts with --layout");
    plan_request r;
    r.load = t;
    r.goal = goal;
    r.limits = limits;
    r.max_devices = max_devices;
    std::fprintf(stderr, "troupe-plan: simulating each layout (a few seconds)...\n");
    const std::vector<candidate> cands = plan_layouts(cost, ms.config, *hw, r);
    std::printf("traffic: %.3g requests/s, prompts %d-%d tokens, outputs %d-%d; targets TTFT p99 %s, TPOT p99 %s\n\n",
                rate, t.prompt.min, t.prompt.max, t.output.min, t.output.max,
                ttft > 0 ? (std::to_string(static_cast<int>(ttft)) + " ms").c_str() : "none",
                tpot > 0 ? (std::to_string(static_cast<int>(tpot)) + " ms").c_str() : "none");
    std::printf("| layout | devices | per replica req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | weights / KV per device GiB | KV per request | fits at once | cost per 1M out / all |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const candidate& k : cands) {
      json j = {{"layout", layout_json(k.l)}, {"weights_gib_per_device", k.memory.weights_gib},
                {"kv_gib_per_device", k.memory.kv_gib}, {"kv_per_request_mib", k.memory.kv_per_request_mib},
                {"max_concurrency", k.memory.max_concurrency}};
      if (!k.why_not.empty()) {
        std::printf("| %s | | | | | | | | | %s |\n", k.l.describe().c_str(), k.why_not.c_str());
        j["why_not"] = k.why_not;
      } else {
        std::printf("| %s | %d | %.3g | %.1f | %.0f / %.0f | %.1f / %.1f | %.1f / %.1f | %.1f MiB | %lld | %s / %s |\n",
                    k.l.describe().c_str(), k.l.devices(), k.replica_rate, k.p.output_tokens_per_s, k.p.ttft_p50_ms,
                    k.p.ttft_p99_ms, k.p.tpot_p50_ms, k.p.tpot_p99_ms, k.memory.weights_gib, k.memory.kv_gib,
                    k.memory.kv_per_request_mib, static_cast<long long>(k.memory.max_concurrency),
                    money(k.cost_per_m_output).c_str(), money(k.cost_per_m_total).c_str());
        j.update(prediction_json(k.p));
        j["replica_rate"] = k.replica_rate;
        j["cost_per_million_output_tokens"] = k.cost_per_m_output;
        j["cost_per_million_tokens"] = k.cost_per_m_total;
      }
      out["layouts"].push_back(j);
    }
    if (!cands.empty() && cands.front().why_not.empty()) {
      const candidate& best = cands.front();
      std::printf("\nplan: %s, %d %s, %s per million output tokens\n", best.l.describe().c_str(), best.l.devices(),
                  hw->cpu() ? "cores" : "devices", money(best.cost_per_m_output).c_str());
    } else {
      std::printf("\nno layout serves this profile within the targets and --max-devices\n");
      served = false;
    }
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) die(json_path + ": cannot write");
  }
  return served ? 0 : 1;
}
