#include "tools/troupe-plan/hardware.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace troupe::plan {

namespace {

using nlohmann::json;

struct datasheet {
  const char* name;
  const char* full_name;
  double memory_gib, bandwidth_gbs, bf16_tflops, link_gbs, price;
};

// Dense BF16 tensor throughput and memory bandwidth from the vendors' datasheets; link is
// the per-direction NVLink rate (PCIe 4.0 x16 for the cards without one). Prices are
// indicative on-demand cloud rates per GPU-hour: give yours with --price-per-hour.
constexpr datasheet sheets[] = {
    {"h100", "NVIDIA H100 SXM 80GB", 80, 3350, 989, 450, 3.00},
    {"h200", "NVIDIA H200 SXM 141GB", 141, 4800, 989, 450, 3.80},
    {"a100", "NVIDIA A100 SXM 80GB", 80, 2039, 312, 300, 1.80},
    {"l40s", "NVIDIA L40S 48GB", 48, 864, 362, 32, 1.00},
    {"l4", "NVIDIA L4 24GB", 24, 300, 121, 32, 0.80},
    {"a10g", "NVIDIA A10G 24GB", 24, 600, 70, 32, 1.00},
};

// What a serving step reaches of the datasheet: weight streaming at batch 1 near 70% of
// the memory bandwidth, matrix units near half their peak on decode batches and 70% on
// prompt chunks. Assumptions until a device is measured (troupe-perf gpu).
constexpr double bandwidth_efficiency = 0.70;
constexpr double decode_efficiency = 0.50;
constexpr double prefill_efficiency = 0.70;

expected<double> number(const json& j, const char* key, const std::string& where, double min, double max) {
  if (!j.contains(key)) return error{where + ": \"" + key + "\" is missing"};
  const json& v = j[key];
  if (!v.is_number()) return error{where + ": \"" + key + "\" must be a number"};
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    std::ostringstream os;
    os << where << ": \"" << key << "\" is " << d << ", outside [" << min << ", " << max << "]";
    return error{os.str()};
  }
  return d;
}

}  // namespace

rate_point hardware_profile::rates_for(int threads) const {
  TROUPE_ASSERT(!rates.empty());
  const rate_point* best = &rates.front();
  for (const rate_point& r : rates)
    if (r.threads <= threads) best = &r;
  if (best->threads >= threads) return *best;
  const double s = static_cast<double>(threads) / best->threads;  // more cores than measured
  rate_point r = *best;
  r.threads = threads;
  r.weight_gbs *= s;
  r.kv_gbs *= s;
  r.decode_gflops *= s;
  r.prefill_gflops *= s;
  return r;
}

double hardware_profile::step_overhead_for(int threads) const {
  for (const rate_point& r : rates)
    if (r.threads == threads && r.step_overhead_ms >= 0) return r.step_overhead_ms;
  return step_overhead_ms;
}

expected<hardware_profile> gpu_named(const std::string& name) {
  for (const datasheet& d : sheets) {
    if (name != d.name) continue;
    hardware_profile h;
    h.name = d.full_name;
    h.kind = "gpu";
    h.source = "datasheet, with assumed efficiencies (bandwidth 70%, matrix units 50% decode / 70% prefill)";
    h.memory_gib = d.memory_gib;
    h.devices_per_node = 8;
    rate_point r;
    r.weight_gbs = d.bandwidth_gbs * bandwidth_efficiency;
    r.kv_gbs = d.bandwidth_gbs * bandwidth_efficiency;
    r.decode_gflops = d.bf16_tflops * 1000 * decode_efficiency;
    r.prefill_gflops = d.bf16_tflops * 1000 * prefill_efficiency;
    h.rates = {r};
    h.link_gbs = d.link_gbs;
    h.link_latency_us = d.link_gbs >= 100 ? 8 : 25;
    h.net_gbs = 50;  // 400 Gb/s between nodes
    h.net_latency_us = 10;
    h.step_overhead_ms = 0.3;
    h.price_per_hour = d.price;
    return h;
  }
  std::string names;
  for (const datasheet& d : sheets) names += std::string(names.empty() ? "" : ", ") + d.name;
  return error{"no GPU named \"" + name + "\" in the table (" + names + "); or give a profile file"};
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (const datasheet& d : sheets) names.emplace_back(d.name);
  return names;
}

std::string profile_to_json(const hardware_profile& h) {
  json rates = json::array();
  for (const rate_point& r : h.rates) {
    json p = {{"threads", r.threads},
              {"weight_gbs", r.weight_gbs},
              {"kv_gbs", r.kv_gbs},
              {"decode_gflops", r.decode_gflops},
              {"prefill_gflops", r.prefill_gflops}};
    if (r.step_overhead_ms >= 0) p["step_overhead_ms"] = r.step_overhead_ms;
    rates.push_back(p);
  }
  const json j = {{"name", h.name},
                  {"kind", h.kind},
                  {"source", h.source},
                  {"memory_gib", h.memory_gib},
                  {"devices_per_node", h.devices_per_node},
                  {"rates", rates},
                  {"link_gbs", h.link_gbs},
                  {"link_latency_us", h.link_latency_us},
                  {"net_gbs", h.net_gbs},
                  {"net_latency_us", h.net_latency_us},
                  {"step_overhead_ms", h.step_overhead_ms},
                  {"price_per_hour", h.price_per_hour}};
  return j.dump(2) + "\n";
}

expected<hardware_profile> profile_from_json(const std::string& text, const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return error{where + ": not a JSON object"};
  hardware_profile h;
  for (const char* key : {"name", "kind"})
    if (!j.contains(key) || !j[key].is_string()) return error{where + ": \"" + key + "\" must be a string"};
  h.name = j["name"].get<std::string>();
  h.kind = j["kind"].get<std::string>();
  if (h.kind != "cpu" && h.kind != "gpu") return error{where + ": \"kind\" must be \"cpu\" or \"gpu\""};
  if (j.contains("source") && j["source"].is_string()) h.source = j["source"].get<std::string>();
  struct field {
    const char* key;
    double* out;
    double min, max;
  };
  double devices = 0;
  for (const field& f : {field{"memory_gib", &h.memory_gib, 0.001, 1e6}, field{"devices_per_node", &devices, 1, 4096},
                         field{"link_gbs", &h.link_gbs, 0.001, 1e6}, field{"link_latency_us", &h.link_latency_us, 0, 1e6},
                         field{"net_gbs", &h.net_gbs, 0.001, 1e6}, field{"net_latency_us", &h.net_latency_us, 0, 1e6},
                         field{"step_overhead_ms", &h.step_overhead_ms, 0, 1e5},
                         field{"price_per_hour", &h.price_per_hour, 0, 1e6}}) {
    auto v = number(j, f.key, where, f.min, f.max);
    if (!v) return v.err();
    *f.out = *v;
  }
  h.devices_per_node = static_cast<int>(devices);
  if (!j.contains("rates") || !j["rates"].is_array() || j["rates"].empty() || j["rates"].size() > 4096)
    return error{where + ": \"rates\" must be a list of 1 to 4096 rate points"};
  for (size_t i = 0; i < j["rates"].size(); ++i) {
    const json& p = j["rates"][i];
    const std::string at = where + ": rates[" + std::to_string(i) + "]";
    if (!p.is_object()) return error{at + " must be an object"};
    rate_point r;
    double threads = 0;
    for (const field& f : {field{"threads", &threads, 1, 4096}, field{"weight_gbs", &r.weight_gbs, 1e-3, 1e6},
                           field{"kv_gbs", &r.kv_gbs, 1e-3, 1e6}, field{"decode_gflops", &r.decode_gflops, 1e-3, 1e9},
                           field{"prefill_gflops", &r.prefill_gflops, 1e-3, 1e9}}) {
      auto v = number(p, f.key, at, f.min, f.max);
      if (!v) return v.err();
      *f.out = *v;
    }
    r.threads = static_cast<int>(threads);
    if (p.contains("step_overhead_ms")) {
      auto v = number(p, "step_overhead_ms", at, 0, 1e5);
      if (!v) return v.err();
      r.step_overhead_ms = *v;
    }
    if (!h.rates.empty() && r.threads <= h.rates.back().threads)
      return error{at + ": threads must ascend"};
    h.rates.push_back(r);
  }
  return h;
}

expected<hardware_profile> read_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return error{path + ": cannot open"};
  std::ostringstream text;
  text << f.rdbuf();
  if (text.str().size() > (1u << 20)) return error{path + ": larger than 1 MiB; not a profile"};
  return profile_from_json(text.str(), path);
}

}  // namespace troupe::plan
