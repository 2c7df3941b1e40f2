// troupe-bench: a serving benchmark for troupe (capnp://HOST:PORT) and any
// OpenAI-compatible server (http://HOST:PORT): seeded workloads at a fixed concurrency
// or Poisson arrivals, timing every token as a client sees it; prints a Markdown table
// and writes JSON.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/client/troupe_client.hpp"
#include "tools/common/cli.hpp"
#include "tools/common/stats.hpp"

using namespace troupe;
using clock_type = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// What went wrong below HTTP, in words (the library's own names are one word each).
std::string transport_error(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect (refused, or no route to the endpoint)";
    case httplib::Error::ConnectionTimeout: return "timed out connecting";
    case httplib::Error::Read:
      return "the connection failed or closed while reading the reply (no HTTP answer: if this is troupe's Cap'n "
             "Proto endpoint, name it capnp://HOST:PORT)";
    case httplib::Error::Write:
      return "the connection closed while the request was being sent (if this is troupe's Cap'n Proto endpoint, "
             "name it capnp://HOST:PORT)";
    case httplib::Error::Canceled: return "cancelled";
    default: return httplib::to_string(e);
  }
}

struct workload {
  int requests = 32;
  int concurrency = 8;
  double rate = 0;            // requests/s (Poisson); 0: closed loop at `concurrency`
  int prompt_words = 100;     // words of the prompt (roughly tokens)
  int output_tokens = 64;
  int shared_prefix_words = 0;  // words every prompt starts with
  int prefixes = 1;             // ... one of this many shared prefixes (tenants' system prompts)
  uint64_t seed = 1;
  std::string model;
  std::string api_key;
  bool chat = false;
  int turns = 1;  // multi-turn chat: each conversation sends this many growing requests
  int think_ms = 0;  // ... pausing this long between its turns (a user reading)
  std::string slo_class;  // the requests' SLO class (empty: the server's default)
};

struct sample {
  bool ok = false;
  std::string error;
  double ttft_ms = 0, e2e_ms = 0, tpot_ms = 0;
  std::vector<double> itl_ms;
  std::vector<double> turn_ttft_ms;  // a conversation's: every turn's time to first token
  int64_t output_tokens = 0, prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the server reports cached (usage)
  std::string text;  // the output, for --outputs
  bool failed_over = false;  // its gateway was lost and another finished it (Cap'n Proto)
};

const char* words[] = {"the", "little", "dog", "ran", "to", "park", "and", "saw", "a", "big", "red", "ball", "she",
                       "was", "happy", "they", "played", "in", "sun", "with", "friends", "one", "day", "tom",
                       "lily", "went", "home", "mom", "said", "yes"};

std::string prompt_for(const workload& w, int i) {
  // Request i's tenant, drawn from the seed; tenant 0's prefix is the one --prefixes 1 gives.
  std::mt19937_64 tenant(w.seed * 7919 + static_cast<uint64_t>(i));
  const uint64_t j = w.prefixes > 1 ? tenant() % static_cast<uint64_t>(w.prefixes) : 0;
  std::mt19937_64 shared(w.seed + j * 0x9e3779b97f4a7c15ull), own(w.seed * 1000003 + static_cast<uint64_t>(i));
  std::string p;
  for (int k = 0; k < w.shared_prefix_words; ++k) p += std::string(k ? " " : "") + words[shared() % 30];
  for (int k = 0; k < w.prompt_words - w.shared_prefix_words; ++k) p += std::string(p.empty() ? "" : " ") + words[own() % 30];
  return p;
}

// How the HTTP endpoint is reached: http:// or https://, then with the CA its certificate
// must chain to (--ca, $TROUPE_CA, else the system's). Set once, before any request.
struct http_site {
  bool https = false;
  std::string ca;
};
http_site site;

httplib::Client open_http(const std::string& host, int port) {
  httplib::Client cli((site.https ? "https://" : "http://") + host + ":" + std::to_string(port));
  if (site.https) {
    cli.enable_server_certificate_verification(true);
    if (!site.ca.empty()) cli.set_ca_cert_path(site.ca.c_str());
  }
  return cli;
}

// The model an OpenAI-compatible server serves, from its /v1/models (the first listed), for
// a run that names none; or why there is none.
expected<std::string> served_model(const std::string& host, int port, const std::string& api_key) {
  httplib::Client cli = open_http(host, port);
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  const auto res = cli.Get("/v1/models", headers);
  if (!res) return error{"GET /v1/models: " + transport_error(res.error())};
  if (res->status != 200) return error{"GET /v1/models answered " + std::to_string(res->status)};
  const json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return error{"GET /v1/models lists no model"};
  return j["data"][0]["id"].get<std::string>();
}

sample run_http(const std::string& host, int port, const workload& w, int i, const json* history = nullptr,
                std::string* reply = nullptr) {
  sample s;
  httplib::Client cli = open_http(host, port);
  cli.set_read_timeout(600, 0);
  cli.set_connection_timeout(10, 0);
  json body = {{"model", w.model}, {"max_tokens", w.output_tokens}, {"temperature", 0}, {"stream", true},
               {"stream_options", {{"include_usage", true}}}, {"seed", w.seed + i}};
  const std::string prompt = prompt_for(w, i);
  if (w.chat) {
    body["messages"] = history ? *history : json::array();
    body["messages"].push_back({{"role", "user"}, {"content", prompt}});
  } else
    body["prompt"] = prompt;
  httplib::Request req;
  req.method = "POST";
  req.path = w.chat ? "/v1/chat/completions" : "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!w.api_key.empty()) req.set_header("Authorization", "Bearer " + w.api_key);
  if (!w.slo_class.empty()) req.set_header("X-Troupe-Class", w.slo_class);
  const auto t0 = clock_type::now();
  auto last = t0;
  std::string buffer;
  int64_t chunks_with_text = 0;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    for (size_t nl; (nl = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, nl + 2)) {
      const std::string ev = buffer.substr(0, nl);
      if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
      json j = json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) s.error = "server error";
      if (j.contains("usage") && j["usage"].is_object()) {
        s.output_tokens = j["usage"].value("completion_tokens", 0);
        s.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        if (const auto d = j["usage"].find("prompt_tokens_details"); d != j["usage"].end() && d->is_object())
          s.cached_tokens = d->value("cached_tokens", 0);
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const auto& c = j["choices"][0];
      const std::string text = w.chat ? c.value("delta", json::object()).value("content", "") : c.value("text", "");
      if (text.empty()) continue;
      if (reply) *reply += text;
      const auto now = clock_type::now();
      if (chunks_with_text++ == 0)
        s.ttft_ms = std::chrono::duration<double, std::milli>(now - t0).count();
      else
        s.itl_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
      last = now;
    }
    return true;
  };
  auto res = cli.send(req);
  const auto t1 = clock_type::now();
  if (!res) {
    s.error = "connection: " + transport_error(res.error());
    return s;
  }
  if (res->status != 200) {
    s.error = "http " + std::to_string(res->status);
    return s;
  }
  if (!s.error.empty()) return s;
  s.e2e_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (s.output_tokens == 0) s.output_tokens = chunks_with_text;  // no usage: count chunks
  if (s.output_tokens > 1) s.tpot_ms = (s.e2e_ms - s.ttft_ms) / static_cast<double>(s.output_tokens - 1);
  s.ok = chunks_with_text > 0;
  if (!s.ok) s.error = "no tokens";
  return s;
}

// Several gateways ("capnp://a:1,b:2"): request i tries them from the (i mod n)th on, so
// that the requests spread over them as a load balancer would spread them.
std::string gateways_from(const std::string& address, int i) {
  std::vector<std::string> list;
  std::string scheme;
  for (size_t from = 0; from <= address.size();) {
    size_t to = address.find(',', from);
    if (to == std::string::npos) to = address.size();
    std::string one = address.substr(from, to - from);
    if (const size_t s = one.find("://"); s != std::string::npos)
      scheme = one.substr(0, s + 3);
    else if (!one.empty())
      one = scheme + one;
    if (!one.empty()) list.push_back(one);
    from = to + 1;
  }
  if (list.size() < 2) return address;
  std::string out;
  for (size_t k = 0; k < list.size(); ++k) out += (k ? "," : "") + list[(k + static_cast<size_t>(i)) % list.size()];
  return out;
}

sample run_capnp(const std::string& address, const workload& w, int i) {
  sample s;
  auto client = troupe_client::connect(gateways_from(address, i));
  request_params p;
  p.sampling.temperature = 0.0f;
  p.sampling.seed = w.seed + static_cast<uint64_t>(i);
  p.max_tokens = w.output_tokens;
  p.ignore_eos = true;
  p.slo_class = w.slo_class;
  const auto t0 = clock_type::now();
  auto last = t0;
  bool first = true;
  auto r = client->generate(prompt_for(w, i), p, false, [&](const client_chunk& c) {
    if (c.tokens.empty()) return;
    const auto now = clock_type::now();
    if (first)
      s.ttft_ms = std::chrono::duration<double, std::milli>(now - t0).count();
    else
      s.itl_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    first = false;
    last = now;
  });
  const auto t1 = clock_type::now();
  if (!r) {
    s.error = r.err().message.substr(0, 240);  // (it names the gateway's address, then what went wrong)
    return s;
  }
  s.e2e_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  s.output_tokens = r->output_tokens;
  s.prompt_tokens = r->prompt_tokens;
  s.text = r->text;
  s.failed_over = r->attempts > 1;
  if (s.output_tokens > 1) s.tpot_ms = (s.e2e_ms - s.ttft_ms) / static_cast<double>(s.output_tokens - 1);
  s.ok = !first;
  // Every token exactly once, in order: chunks numbered without gaps, and as many tokens
  // streamed as the result counts.
  if (!r->sequence_ok) {
    s.ok = false;
    s.error = "stream out of sequence";
  } else if (r->tokens.size() != r->output_tokens) {
    s.ok = false;
    s.error = "streamed tokens differ from the count";
  } else if (r->reason == finish_reason::none) {
    s.ok = false;
    s.error = r->error.substr(0, 60);
  }
  return s;
}

json dist(const std::vector<double>& v) {
  return {{"p50", tools::percentile(v, 50)}, {"p90", tools::percentile(v, 90)}, {"p99", tools::percentile(v, 99)},
          {"max", v.empty() ? 0.0 : *std::max_element(v.begin(), v.end())}};
}

json run_level(const workload& w, const std::string& endpoint, bool http, const std::string& host, int port,
               const std::string& hostport, double slo_ttft, double slo_tpot, bool header,
               const std::string& outputs_path) {
  std::vector<sample> results(w.requests);
  std::atomic<int> next{0}, done{0};
  const bool tty = isatty(STDERR_FILENO);
  const auto t0 = clock_type::now();
  auto one = [&](int i) {
    if (http && w.chat && w.turns > 1) {
      // A conversation: each turn resends the history with the last reply appended.
      json history = json::array();
      sample all;
      all.ok = true;
      for (int t = 0; t < w.turns && all.ok; ++t) {
        std::string reply;
        sample s = run_http(host, port, w, i * w.turns + t, &history, &reply);
        history.push_back({{"role", "user"}, {"content", prompt_for(w, i * w.turns + t)}});
        history.push_back({{"role", "assistant"}, {"content", reply}});
        if (!s.ok) {
          all = s;
          break;
        }
        if (t == 0) all = s;  // the first turn's timings; later turns add their tokens
        else {
          all.output_tokens += s.output_tokens;
          all.prompt_tokens += s.prompt_tokens;
          all.cached_tokens += s.cached_tokens;
          all.itl_ms.insert(all.itl_ms.end(), s.itl_ms.begin(), s.itl_ms.end());
          all.e2e_ms += s.e2e_ms;
        }
        all.turn_ttft_ms.push_back(s.ttft_ms);
        if (w.think_ms > 0 && t + 1 < w.turns) std::this_thread::sleep_for(std::chrono::milliseconds(w.think_ms));
      }
      results[i] = all;
    } else {
      results[i] = http ? run_http(host, port, w, i) : run_capnp(hostport, w, i);
    }
    const int d = ++done;
    if (tty) std::fprintf(stderr, "\rtroupe-bench: %d/%d requests", d, w.requests);
  };
  std::vector<std::thread> threads;
  if (w.rate > 0) {
    std::mt19937_64 rng(w.seed);
    std::exponential_distribution<double> gap(w.rate);
    auto at = clock_type::now();
    for (int i = 0; i < w.requests; ++i) {
      std::this_thread::sleep_until(at);
      threads.emplace_back(one, i);
      at += std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(gap(rng)));
    }
  } else {
    for (int c = 0; c < w.concurrency; ++c)
      threads.emplace_back([&] {
        for (int i = next++; i < w.requests; i = next++) one(i);
      });
  }
  for (auto& t : threads) t.join();
  if (tty) std::fprintf(stderr, "\n");
  const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();

  std::vector<double> ttft, tpot, itl, e2e;
  int64_t out_tokens = 0, in_tokens = 0, cached_tokens = 0, completed = 0, good = 0;
  std::map<std::string, int> errors;
  if (!outputs_path.empty()) {
    std::ofstream f(outputs_path);
    for (size_t i = 0; i < results.size(); ++i)
      f << json{{"index", i}, {"ok", results[i].ok}, {"error", results[i].error}, {"text", results[i].text}}.dump(
               -1, ' ', false, json::error_handler_t::replace)
        << "\n";
  }
  for (const auto& s : results) {
    if (!s.ok) {
      ++errors[s.error.empty() ? "unknown" : s.error];
      continue;
    }
    ++completed;
    out_tokens += s.output_tokens;
    in_tokens += s.prompt_tokens;
    cached_tokens += s.cached_tokens;
    // A conversation counts every turn's first token (later turns resend the history: what
    // a prefix cache saves shows there).
    if (s.turn_ttft_ms.empty())
      ttft.push_back(s.ttft_ms);
    else
      ttft.insert(ttft.end(), s.turn_ttft_ms.begin(), s.turn_ttft_ms.end());
    e2e.push_back(s.e2e_ms);
    if (s.output_tokens > 1) tpot.push_back(s.tpot_ms);
    itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
    if ((slo_ttft <= 0 || s.ttft_ms <= slo_ttft) && (slo_tpot <= 0 || s.tpot_ms <= slo_tpot)) ++good;
  }
  json j = {{"endpoint", endpoint},     {"requests", w.requests},
            {"concurrency", w.rate > 0 ? json(nullptr) : json(w.concurrency)},
            {"rate", w.rate > 0 ? json(w.rate) : json(nullptr)},
            {"completed", completed},   {"errors", static_cast<int64_t>(w.requests) - completed},
            {"errors_by_kind", errors}, {"output_tokens", out_tokens},
            {"prompt_tokens", in_tokens}, {"cached_prompt_tokens", cached_tokens}, {"duration_s", secs},
            {"requests_per_s", completed / secs}, {"output_tokens_per_s", out_tokens / secs},
            {"goodput_requests_per_s", good / secs},
            {"failed_over", std::count_if(results.begin(), results.end(), [](const sample& s) { return s.failed_over; })},
            {"ttft_ms", dist(ttft)},    {"tpot_ms", dist(tpot)},
            {"itl_ms", dist(itl)},      {"e2e_ms", dist(e2e)}};
  if (header) {
    std::printf("| endpoint | load | done | errors | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms | E2E p50 / p99 ms |\n");
    std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  }
  char rate_text[32];
  std::snprintf(rate_text, sizeof rate_text, "%g req/s", w.rate);
  const std::string load = w.rate > 0 ? std::string(rate_text) : "c=" + std::to_string(w.concurrency);
  std::printf("| %s | %s | %lld | %lld | %.1f | %.0f / %.0f | %.1f / %.1f | %.1f / %.1f | %.0f / %.0f |\n", endpoint.c_str(),
              load.c_str(), static_cast<long long>(completed), static_cast<long long>(w.requests - completed),
              out_tokens / secs, tools::percentile(ttft, 50), tools::percentile(ttft, 99), tools::percentile(tpot, 50), tools::percentile(tpot, 99), tools::percentile(itl, 50), tools::percentile(itl, 99),
              tools::percentile(e2e, 50), tools::percentile(e2e, 99));
  for (const auto& [kind, n] : errors) std::fprintf(stderr, "troupe-bench: %d x %s\n", n, kind.c_str());
  std::fflush(stdout);
  return j;
}

// A chart of latency percentiles and throughput against load, as SVG.
void write_svg(const std::string& path, const std::vector<json>& levels, const std::string& xlabel,
               const std::string& title) {
  const double W = 720, H = 420, L = 70, R = 70, T = 40, B = 60;
  std::vector<double> xs, tput, ttft50, ttft99, tpot50;
  for (const auto& j : levels) {
    xs.push_back(j["rate"].is_null() ? j["concurrency"].get<double>() : j["rate"].get<double>());
    tput.push_back(j["output_tokens_per_s"].get<double>());
    ttft50.push_back(j["ttft_ms"]["p50"].get<double>());
    ttft99.push_back(j["ttft_ms"]["p99"].get<double>());
    tpot50.push_back(j["tpot_ms"]["p50"].get<double>());
  }
  auto maxof = [](const std::vector<double>& v) { return std::max(1e-9, *std::max_element(v.begin(), v.end())); };
  const double xmax = maxof(xs), lmax = std::max({maxof(ttft50), maxof(ttft99), maxof(tpot50)}), tmax = maxof(tput);
  auto X = [&](double x) { return L + (W - L - R) * x / xmax; };
  auto Y = [&](double v, double vmax) { return H - B - (H - T - B) * v / vmax; };
  std::ofstream f(path);
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>\n";
  f << "<rect width='100%' height='100%' fill='white'/>\n";
  f << "<text x='" << W / 2 << "' y='20' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  f << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B << "' stroke='black'/>\n";
  f << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B << "' stroke='black'/>\n";
  f << "<line x1='" << W - R << "' y1='" << T << "' x2='" << W - R << "' y2='" << H - B << "' stroke='black'/>\n";
  f << "<text x='" << W / 2 << "' y='" << H - 20 << "' text-anchor='middle'>" << xlabel << "</text>\n";
  f << "<text x='15' y='" << H / 2 << "' transform='rotate(-90 15 " << H / 2 << ")' text-anchor='middle'>latency (ms)</text>\n";
  f << "<text x='" << W - 15 << "' y='" << H / 2 << "' transform='rotate(90 " << W - 15 << " " << H / 2
    << ")' text-anchor='middle'>output tokens/s</text>\n";
  for (int t = 0; t <= 4; ++t) {
    const double y = T + (H - T - B) * t / 4.0;
    f << "<line x1='" << L << "' y1='" << y << "' x2='" << W - R << "' y2='" << y << "' stroke='#ddd'/>\n";
    f << "<text x='" << L - 5 << "' y='" << y + 4 << "' text-anchor='end'>" << static_cast<int>(lmax * (4 - t) / 4) << "</text>\n";
    f << "<text x='" << W - R + 5 << "' y='" << y + 4 << "'>" << static_cast<int>(tmax * (4 - t) / 4) << "</text>\n";
  }
  for (double x : xs)
    f << "<text x='" << X(x) << "' y='" << H - B + 16 << "' text-anchor='middle'>" << x << "</text>\n";
  auto line = [&](const std::vector<double>& v, double vmax, const char* color, const char* name, int idx) {
    f << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='";
    for (size_t i = 0; i < v.size(); ++i) f << X(xs[i]) << "," << Y(v[i], vmax) << " ";
    f << "'/>\n";
    for (size_t i = 0; i < v.size(); ++i) f << "<circle cx='" << X(xs[i]) << "' cy='" << Y(v[i], vmax) << "' r='3' fill='" << color << "'/>\n";
    f << "<rect x='" << L + 10 + idx * 150 << "' y='" << T - 14 << "' width='10' height='10' fill='" << color << "'/>";
    f << "<text x='" << L + 24 + idx * 150 << "' y='" << T - 5 << "'>" << name << "</text>\n";
  };
  line(ttft50, lmax, "#1f77b4", "TTFT p50", 0);
  line(ttft99, lmax, "#aec7e8", "TTFT p99", 1);
  line(tpot50, lmax, "#2ca02c", "TPOT p50", 2);
  line(tput, tmax, "#d62728", "output tok/s", 3);
  f << "</svg>\n";
}

}  // namespace

int main(int argc, char** argv) {
  // A server that closes a connection while a request is being written to it (a Cap'n
  // Proto endpoint given as http://, a server stopping) is that request's error, not the
  // end of the run: the HTTP library writes without MSG_NOSIGNAL.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "troupe-bench: measure a serving endpoint as its clients see it.\n\n"
      "Targets: http://HOST:PORT or https://HOST:PORT (any OpenAI-compatible server: streamed\n"
      "completions, tokens counted from its `usage`), or capnp://HOST:PORT or capnps://HOST:PORT\n"
      "(troupe's own API; --ca for the TLS ones; several gateways as capnp://A:P,B:Q: requests\n"
      "spread over them, and fail over from a lost one). Workloads are seeded;\n"
      "--shared-prefix N starts every prompt with the same N words (with --prefixes K, one of K\n"
      "such prefixes: tenants' system prompts). Prints a Markdown table and, with --json, writes\n"
      "completed, errors, output_tokens and ttft_ms / tpot_ms / itl_ms / e2e_ms objects with\n"
      "p50, p90, p99 and max.\n\n"
      "Example:\n  troupe-bench --endpoint http://127.0.0.1:8080 --requests 64 --concurrency 8 --json out.json\n",
      "troupe-bench"};
  std::string endpoint, json_path, outputs_path, ca_file;
  workload w;
  double slo_ttft = 0, slo_tpot = 0;
  app.add_option("--endpoint", endpoint,
                 "http://HOST:PORT, https://HOST:PORT, capnp://HOST:PORT or capnps://HOST:PORT (Cap'n Proto over TLS)")
      ->required();
  app.add_option("--ca", ca_file,
                 "https:// and capnps://: the CA file (PEM) the gateway's certificate must chain to (default: $TROUPE_CA, "
                 "else the system's)")
      ->check(CLI::ExistingFile);
  app.add_option("--model", w.model, "model name for HTTP servers (default: the first the server's /v1/models lists)");
  app.add_option("--api-key", w.api_key, "bearer key for HTTP servers");
  app.add_option("--requests", w.requests)->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--concurrency", w.concurrency, "requests in flight (closed loop)")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--rate", w.rate, "Poisson arrivals per second instead of a closed loop")->check(tools::non_negative());
  app.add_option("--prompt-words", w.prompt_words)->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--output-tokens", w.output_tokens)->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--shared-prefix", w.shared_prefix_words, "words every prompt shares at its start")->check(tools::non_negative());
  app.add_option("--class", w.slo_class,
                 "the requests' SLO class, a [[class]] of the server's topology (HTTP: the X-Troupe-Class header)");
  app.add_option("--prefixes", w.prefixes,
                 "with --shared-prefix: that many distinct shared prefixes (tenants' system prompts), each request "
                 "drawing one at random from the seed")
      ->check(CLI::Range(1, 100000));
  app.add_option("--seed", w.seed, "prompts' random seed: the same seed, the same prompts")->capture_default_str();
  app.add_flag("--chat", w.chat, "use /v1/chat/completions");
  app.add_option("--turns", w.turns, "multi-turn chat: turns per conversation, each resending the growing history (TTFT then counts every turn)")
      ->check(CLI::Range(1, 100))->capture_default_str();
  app.add_option("--think-ms", w.think_ms, "multi-turn chat: pause between a conversation's turns, in ms (a user reading)")
      ->check(CLI::Range(0, 600000))->capture_default_str();
  app.add_option("--slo-ttft-ms", slo_ttft, "goodput counts requests within this TTFT (0: no limit)");
  app.add_option("--slo-tpot-ms", slo_tpot, "goodput counts requests within this TPOT (0: no limit)");
  app.add_option("--outputs", outputs_path,
                 "write each request's output text here, one JSON line per request (capnp: streams are checked "
                 "for every token exactly once, in order)");
  app.add_option("--json", json_path, "write the results here (an array with --sweep-*)");
  std::vector<double> sweep;
  bool sweep_rate = false, requests_per_level = false, fresh_prompts = false;
  std::string svg_path;
  auto* sc = app.add_option("--sweep-concurrency", sweep, "run at each of these concurrencies")->delimiter(',');
  auto* sr = app.add_option("--sweep-rate", sweep, "run at each of these arrival rates")->delimiter(',');
  sc->excludes(sr);
  app.add_flag("--scale-requests", requests_per_level, "in a sweep, at least 2 x the level requests per level");
  app.add_flag("--fresh-prompts", fresh_prompts,
               "in a sweep, level k draws its prompts from seed + k, so that no level finds an earlier level's "
               "prompts in a prefix cache");
  app.add_option("--svg", svg_path, "with a sweep: a chart of latency percentiles and throughput against load");
  CLI11_PARSE(app, argc, argv);
  if (w.shared_prefix_words > w.prompt_words) w.prompt_words = w.shared_prefix_words + 1;
  sweep_rate = sr->count() > 0;

  site.https = endpoint.rfind("https://", 0) == 0;
  const bool http = site.https || endpoint.rfind("http://", 0) == 0, capnp = endpoint.rfind("capnp://", 0) == 0,
             capnps = endpoint.rfind("capnps://", 0) == 0;
  if (!http && !capnp && !capnps) {
    std::fprintf(stderr, "troupe-bench: --endpoint must start with http://, https://, capnp:// or capnps://\n");
    return 2;
  }
  if (!ca_file.empty()) ::setenv("TROUPE_CA", ca_file.c_str(), 1);  // the client library's
  if (const char* ca = std::getenv("TROUPE_CA")) site.ca = ca;
  std::string hostport = endpoint.substr(site.https ? 8 : http ? 7 : capnps ? 9 : 8);
  while (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "troupe-bench: --endpoint needs a port\n");
    return 2;
  }
  const std::string host = hostport.substr(0, colon);
  const int port = std::atoi(hostport.c_str() + colon + 1);
  if (capnps) hostport = "capnps://" + hostport;  // what the client library connects to
  if (http && w.model.empty()) {
    auto m = served_model(host, port, w.api_key);
    if (!m) {
      std::fprintf(stderr, "troupe-bench: %s (--model names the model without asking)\n", m.err().message.c_str());
      return 2;
    }
    w.model = *m;
    std::fprintf(stderr, "troupe-bench: model %s (the server's /v1/models)\n", w.model.c_str());
  }

  std::vector<json> levels;
  bool all_ok = true;
  std::vector<double> loads;
  if (!sweep.empty()) {
    for (double level : sweep) loads.push_back(level);
  } else {
    loads.push_back(w.rate > 0 ? w.rate : w.concurrency);
  }
  bool header = true;
  for (size_t k = 0; k < loads.size(); ++k) {
    const double level = loads[k];
    workload lw = w;
    if (fresh_prompts) lw.seed = w.seed + k;
    if (!sweep.empty()) {
      if (sweep_rate) lw.rate = level; else lw.concurrency = static_cast<int>(level);
      if (requests_per_level) lw.requests = std::max(w.requests, static_cast<int>(2 * level));
    }
    json j = run_level(lw, endpoint, http, host, port, hostport, slo_ttft, slo_tpot, header, outputs_path);
    header = false;
    all_ok = all_ok && j["errors"].get<int64_t>() == 0;
    levels.push_back(j);
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << (levels.size() == 1 ? levels[0] : json(levels)).dump(2) << "\n";
  }
  if (!svg_path.empty()) write_svg(svg_path, levels, sweep_rate ? "arrival rate (requests/s)" : "concurrent requests", endpoint);
  return all_ok ? 0 : 1;
}
