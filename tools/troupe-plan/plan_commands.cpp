#include "tools/troupe-plan/plan_commands.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model/model.hpp"
#include "tools/common/model_loading.hpp"

namespace troupe::plan {
namespace {

using nlohmann::json;

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

plan_setup settle(const plan_options& o) {
  plan_setup setup;
  if (o.model_path.empty() == o.shape.empty()) die("name the model: --model FILE or --shape NAME");
  std::optional<dtype> weights_type, kv_type;
  if (!o.weights_name.empty() && !(weights_type = dtype_named(o.weights_name)))
    die("--weights: '" + o.weights_name + "' is not f32, f16, bf16 or q8_0");
  if (!o.kv_name.empty() && (!(kv_type = dtype_named(o.kv_name)) || *kv_type == dtype::bf16))
    die("--kv-type: '" + o.kv_name + "' is not f32, f16 or q8_0");
  if (!o.model_path.empty()) {
    auto m = load_model(o.model_path);
    if (!m) die(m.err().message);
    setup.ms.name = o.model_path;
    setup.ms.config = m->config;
    setup.ms.weights = weights_type.value_or(m->weight_type);
  } else {
    auto s = named_shape(o.shape, weights_type.value_or(dtype::bf16), dtype::f16);
    if (!s) die("--shape: no shape named '" + o.shape + "'");
    setup.ms = *s;
  }
  setup.ms.kv = kv_type.value_or(setup.ms.weights == dtype::f32 ? dtype::f32 : dtype::f16);
  setup.cost = cost_of(setup.ms);

  // The o.hardware.
  expected<hardware_profile> hw =
      o.hardware.find_first_of("./") != std::string::npos ? read_profile(o.hardware) : gpu_named(o.hardware);
  if (!hw) die(hw.err().message);
  setup.hw = *hw;
  if (o.price >= 0) setup.hw.price_per_hour = o.price;

  for (const std::string& s : o.layouts) {
    auto l = layout_of(s);
    if (!l) die(l.err().message);
    if (setup.hw.cpu() && l->tp * l->threads > setup.hw.devices_per_node)
      die("--layout " + s + ": a stage's shards need " + std::to_string(l->tp * l->threads) + " cores; the profile has " +
          std::to_string(setup.hw.devices_per_node));
    if (l->pp > setup.ms.config.num_layers) die("--layout " + s + ": more stages than the model's layers");
    setup.given.push_back(*l);
  }
  std::printf("model: %s, %.2f GiB of %s weights, KV %s: %.1f KiB per token\n", setup.ms.name.c_str(),
              setup.cost.weight_bytes_total() / (1024.0 * 1024 * 1024), std::string(dtype_name(setup.ms.weights)).c_str(),
              std::string(dtype_name(setup.ms.kv)).c_str(), setup.cost.kv_bytes_per_token() / 1024);
  std::printf("hardware: %s (%s)\n", setup.hw.name.c_str(), setup.hw.source.c_str());

  return setup;
}

int fit_profile(const plan_options& o, plan_setup& setup) {
  if (setup.given.size() != 1) die("fit: name the one layout the run used with --layout");
  std::ifstream f(o.bench_path);
  if (!f) die(o.bench_path + ": cannot open");
  const json b = json::parse(f, nullptr, false);
  auto num = [&](const char* key) {
    if (b.is_discarded() || !b.is_object() || !b.contains(key) || !b[key].is_number())
      die(o.bench_path + ": not troupe-bench's --json (no number \"" + std::string(key) + "\")");
    return b[key].get<double>();
  };
  const double completed = num("completed");
  if (!(completed >= 1 && completed <= 100000)) die(o.bench_path + ": \"completed\" must be 1 to 100000");
  traffic t;
  t.requests = static_cast<int>(completed);
  const double prompt_mean = num("prompt_tokens") / completed, output_mean = num("output_tokens") / completed;
  if (!(prompt_mean >= 0 && prompt_mean <= setup.ms.config.max_seq_len && output_mean >= 0 &&
        output_mean <= setup.ms.config.max_seq_len))
    die(o.bench_path + ": its token counts per request do not fit the model's context of " +
        std::to_string(setup.ms.config.max_seq_len));
  const int32_t p = std::max(1, static_cast<int32_t>(std::lround(prompt_mean)));
  const int32_t out = std::max(1, static_cast<int32_t>(std::lround(output_mean)));
  t.prompt = {p, p};
  t.output = {out, out};
  if (b.contains("rate") && b["rate"].is_number()) {
    t.rate = b["rate"].get<double>();
    if (!(t.rate > 0 && t.rate <= 1e6)) die(o.bench_path + ": \"rate\" must be above 0");
  } else {
    const double c = num("concurrency");
    if (!(c >= 1 && c <= 65536)) die(o.bench_path + ": \"concurrency\" must be 1 to 65536");
    t.concurrency = static_cast<int>(c);
  }
  if (!b.contains("tpot_ms") || !b["tpot_ms"].is_object() || !b["tpot_ms"].contains("p50") ||
      !b["tpot_ms"]["p50"].is_number())
    die(o.bench_path + ": no tpot_ms.p50");
  const double measured = b["tpot_ms"]["p50"].get<double>();
  scheduler_limits s = o.limits;
  s.kv_tokens = o.kv_tokens;
  const layout& l = setup.given[0];
  const bool shards = l.tp > 1;
  auto value = fit_to_tpot(setup.cost, setup.hw, l, s, t, measured, shards ? fitted::link_latency_us : fitted::step_overhead_ms);
  if (!value) die("fit: " + value.err().message);
  const std::string threads = std::to_string(l.threads) + (l.threads == 1 ? " thread" : " threads");
  if (shards) {
    setup.hw.link_latency_us = *value;
    setup.hw.source += "; all-reduce latency fitted to " + o.bench_path;
  } else {
    // The overhead belongs to nodes of this many threads; it is also the default for
    // the others until they are fitted themselves.
    bool placed = false;
    for (rate_point& r : setup.hw.rates)
      if (r.threads == l.threads) {
        r.step_overhead_ms = *value;
        placed = true;
      }
    if (!placed || setup.hw.step_overhead_ms == 0) setup.hw.step_overhead_ms = *value;
    setup.hw.source += "; step overhead (" + threads + ") fitted to " + o.bench_path;
  }
  std::ofstream o_file(o.out_path);
  o_file << profile_to_json(setup.hw);
  if (!o_file) die(o.out_path + ": cannot write");
  std::printf("%s %.3f %s: the TPOT p50 of %s under %d requests of %d+%d tokens (%.2f ms measured)\n",
              shards ? "all-reduce latency" : ("step overhead with " + threads).c_str(), *value,
              shards ? "us" : "ms", l.describe().c_str(), t.requests, p, out, measured);
  std::printf("wrote %s\n", o.out_path.c_str());
  return 0;

}

int predict_or_plan(const plan_options& o, const plan_setup& setup) {
  traffic t;
  t.requests = o.requests;
  t.seed = o.seed;
  auto pr = range_of(o.prompt, "--prompt-tokens");
  auto orange = range_of(o.output, "--output-tokens");
  if (!pr) die(pr.err().message);
  if (!orange) die(orange.err().message);
  t.prompt = *pr;
  t.output = *orange;
  if (int64_t{t.prompt.max} + t.output.max > setup.ms.config.max_seq_len)
    die("the longest prompt and output (" + std::to_string(int64_t{t.prompt.max} + t.output.max) +
        " tokens) do not fit the model's context of " + std::to_string(setup.ms.config.max_seq_len));
  if (o.rate > 0 && o.concurrency > 0) die("--rate and --concurrency are two traffic profiles: give one");
  t.rate = o.rate;
  t.concurrency = o.concurrency;
  scheduler_limits limits = o.limits;
  limits.kv_tokens = o.kv_tokens;
  const targets goal{o.ttft, o.tpot};
  bool served = true;  // a plan was asked for and found (or o.layouts were predicted)
  json out = {{"model", setup.ms.name}, {"hardware", setup.hw.name}, {"layouts", json::array()}};

  if (!setup.given.empty()) {
    if (o.rate <= 0 && o.concurrency <= 0) die("give the traffic: --rate R or --concurrency C");
    std::printf("traffic: %s, %d requests, prompts %d-%d tokens, outputs %d-%d\n\n",
                o.rate > 0 ? (std::to_string(o.rate) + " requests/s").c_str() : ("c=" + std::to_string(o.concurrency)).c_str(),
                o.requests, t.prompt.min, t.prompt.max, t.output.min, t.output.max);
    std::printf("| layout | devices | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | KV per request | fits at once | cost per 1M out |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (const layout& l : setup.given) {
      const memory_fit mem = fit_memory(setup.cost, setup.hw, l, t);
      scheduler_limits s = limits;
      if (mem.why_not.empty()) s.kv_tokens = s.kv_tokens > 0 ? s.kv_tokens : mem.kv_tokens;
      const prediction p = simulate(setup.cost, setup.hw, l, s, t);
      const double per_m = l.devices() * setup.hw.price_per_hour / 3600 / std::max(1e-12, p.output_tokens_per_s) * 1e6;
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
    if (o.rate <= 0) die("planning needs the traffic's --rate (requests/s); or predict given layouts with --layout");
    plan_request r;
    r.load = t;
    r.goal = goal;
    r.limits = limits;
    r.max_devices = o.max_devices;
    std::fprintf(stderr, "troupe-plan: simulating each layout (a few seconds)...\n");
    const std::vector<candidate> cands = plan_layouts(setup.cost, setup.ms.config, setup.hw, r);
    std::printf("traffic: %.3g requests/s, prompts %d-%d tokens, outputs %d-%d; targets TTFT p99 %s, TPOT p99 %s\n\n",
                o.rate, t.prompt.min, t.prompt.max, t.output.min, t.output.max,
                o.ttft > 0 ? (std::to_string(static_cast<int>(o.ttft)) + " ms").c_str() : "none",
                o.tpot > 0 ? (std::to_string(static_cast<int>(o.tpot)) + " ms").c_str() : "none");
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
                  setup.hw.cpu() ? "cores" : "devices", money(best.cost_per_m_output).c_str());
    } else {
      std::printf("\nno layout serves this profile within the targets and --max-devices\n");
      served = false;
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << out.dump(2) << "\n";
    if (!f) die(o.json_path + ": cannot write");
  }
  return served ? 0 : 1;
}

}  // namespace troupe::plan
