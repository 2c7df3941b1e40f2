// troupe-client: generate text through a troupe gateway (Cap'n Proto RPC), printing what
// troupe-run prints for the same request: the prompt, then the continuation as it streams.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "actors/client/troupe_client.hpp"
#include "tools/common/cli.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  CLI::App app{
      "troupe-client: generate through a troupe gateway over Cap'n Proto RPC.\n\n"
      "Prints the prompt, then the continuation as it streams, as troupe-run does; -n counts\n"
      "tokens after BOS with the prompt included, as troupe-run's -n does. --health, --stats\n"
      "and --cancel ID ask the gateway instead of generating. A gateway with API keys wants one\n"
      "in the environment: TROUPE_API_KEY (never on the command line). A gateway with a\n"
      "certificate ([gateway] tls_cert) speaks TLS: connect to capnps://HOST:PORT, and name\n"
      "the CA that signed it with --ca (or TROUPE_CA) unless the system trusts it. A deployment\n"
      "with several gateways: name them all, separated by commas; a gateway lost mid-stream\n"
      "hands the stream to the next, and no token is printed twice.\n\n"
      "Example:\n  troupe-client --connect 127.0.0.1:7400 -p \"Once upon a time\" -n 64 -t 0\n",
      "troupe-client"};
  std::string address = "127.0.0.1:7400", prompt, slo_class, ca_file;
  int32_t steps = 256, top_k = 0;
  float temperature = 1.0f, top_p = 0.9f, min_p = 0.0f;
  uint64_t seed = 0;
  std::vector<std::string> stops, biases;
  bool ids = false, health = false, stats = false, ignore_eos = false, timing = false;
  int64_t cancel = -1;
  app.add_option("-c,--connect", address, "gateway HOST:PORT (capnps://HOST:PORT: over TLS; several: A:P,B:Q)")
      ->check(tools::host_port())
      ->capture_default_str();
  app.add_option("--ca", ca_file, "capnps://: the CA file (PEM) the gateway's certificate must chain to (default: $TROUPE_CA, else the system's)")
      ->check(CLI::ExistingFile);
  app.add_option("-p,--prompt", prompt, "prompt text");
  app.add_option("-n,--steps", steps, "tokens after BOS, prompt included")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  app.add_option("-t,--temperature", temperature, "0 is greedy")->check(CLI::Range(0.0f, 2.0f))->capture_default_str();
  app.add_option("--top-p", top_p, "nucleus sampling mass, in (0, 1]")->capture_default_str();
  app.add_option("--top-k", top_k, "keep the k most likely tokens; 0: all")->check(tools::non_negative())->capture_default_str();
  app.add_option("--min-p", min_p, "drop tokens below this fraction of the top probability")->capture_default_str();
  app.add_option("-s,--seed", seed, "random seed: the same seed, the same tokens")->capture_default_str();
  app.add_option("--stop", stops, "stop string (repeatable)");
  app.add_option("--logit-bias", biases, "TOKEN=BIAS (repeatable): add BIAS, in [-100, 100], to the token's logit before each choice")
      ->check(tools::token_bias_entry());
  app.add_option("--class", slo_class, "the request's SLO class, a [[class]] of the topology (default: its default_class)");
  app.add_flag("--ids", ids, "print the generated token ids instead of text");
  app.add_flag("--ignore-eos", ignore_eos, "generate until -n even past EOS (benchmarks)");
  app.add_flag("--time", timing, "print first-token latency and tokens/s on stderr");
  app.add_flag("--health", health, "ask whether the gateway can serve now");
  app.add_flag("--stats", stats, "print the gateway's counters");
  app.add_option("--cancel", cancel, "cancel a request by id")->check(tools::non_negative());
  CLI11_PARSE(app, argc, argv);

  auto client = troupe_client::connect(address, "", ca_file);
  if (health) {
    auto h = client->health();
    if (!h) {
      std::fprintf(stderr, "troupe-client: %s\n", h.err().message.c_str());
      return 1;
    }
    if (h->ready && h->replicas_ready == h->replicas)
      std::printf("ready\n");
    else if (h->ready)
      std::printf("degraded: %u of %u replicas ready (%llu outage(s) so far): %s\n", h->replicas_ready, h->replicas,
                  static_cast<unsigned long long>(h->outages), h->detail.c_str());
    else
      std::printf("not ready%s%s\n", h->detail.empty() ? "" : ": ", h->detail.c_str());
    return h->ready ? 0 : 3;
  }
  if (stats) {
    auto s = client->stats();
    if (!s) {
      std::fprintf(stderr, "troupe-client: %s\n", s.err().message.c_str());
      return 1;
    }
    std::printf("running %u\nwaiting %u\nkv_blocks_used %u\nkv_blocks_free %u\n", s->running, s->waiting, s->kv_used, s->kv_free);
    return 0;
  }
  if (cancel >= 0) {
    auto f = client->cancel(static_cast<uint64_t>(cancel));
    if (!f) {
      std::fprintf(stderr, "troupe-client: %s\n", f.err().message.c_str());
      return 1;
    }
    std::printf("%s\n", *f ? "cancelled" : "no such request");
    return *f ? 0 : 3;
  }

  request_params p;
  p.sampling.temperature = temperature;
  p.sampling.top_p = top_p;
  p.sampling.top_k = top_k;
  p.sampling.min_p = min_p;
  p.sampling.seed = seed;
  p.sampling.logit_bias = tools::parse_token_biases(biases);
  p.stop_strings = stops;
  p.max_tokens = steps;
  p.ignore_eos = ignore_eos;
  p.slo_class = slo_class;
  const auto t0 = std::chrono::steady_clock::now();
  auto first = t0;
  size_t received = 0;
  // The prompt is echoed with the first answer (or a successful answer without tokens),
  // so that a request that fails at once (no gateway, refused) prints its error alone.
  bool echoed = false;
  auto echo = [&] {
    if (!echoed && !ids) std::printf("%s", prompt.c_str());
    echoed = true;
  };
  auto r = client->generate(prompt, p, true, [&](const client_chunk& c) {
    echo();
    if (received == 0 && !c.tokens.empty()) first = std::chrono::steady_clock::now();
    received += c.tokens.size();
    if (ids)
      for (int32_t t : c.tokens) std::printf("%d ", t);
    else
      std::fwrite(c.text.data(), 1, c.text.size(), stdout);
    // Whoever reads the output has gone (`| head`, a closed terminal): end as a program
    // that writes to a closed pipe does, at once, rather than receive the rest for no one
    // (the RPC library ignores SIGPIPE, so the write only fails). The gateway then ends
    // the request.
    if (std::fflush(stdout) != 0 && errno == EPIPE) {
      std::signal(SIGPIPE, SIG_DFL);
      std::raise(SIGPIPE);
    }
  });
  if (r) echo();
  if (echoed) std::printf("\n");
  std::fflush(stdout);
  if (!r) {
    std::fprintf(stderr, "troupe-client: %s\n", r.err().message.c_str());
    return 1;
  }
  if (timing) {
    const auto t1 = std::chrono::steady_clock::now();
    const double decode_s = std::chrono::duration<double>(t1 - first).count();
    std::fprintf(stderr, "troupe-client: %zu tokens, first after %.1f ms, then %.1f tok/s\n", received,
                 std::chrono::duration<double, std::milli>(first - t0).count(),
                 received > 1 && decode_s > 0 ? (received - 1) / decode_s : 0.0);
  }
  if (!r->sequence_ok) {
    std::fprintf(stderr, "troupe-client: chunks arrived out of sequence\n");
    return 2;
  }
  return 0;
}
