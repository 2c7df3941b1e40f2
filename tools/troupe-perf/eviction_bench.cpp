#include "tools/troupe-perf/eviction_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/generate/generator.hpp"
#include "engine/kv/kv_eviction.hpp"

namespace troupe::tools {

namespace {

const char* const prompt_text = "Once upon a time";

// One seeded generation of `length` tokens (EOS ignored) under `eviction`: the prompt,
// then the output.
std::vector<int32_t> generate(const model& m, const tokenizer& tok, const kv_eviction_config& eviction, uint64_t seed,
                              int32_t length, float temperature, int32_t threads) {
  generator_options o;
  o.num_threads = threads;
  o.eviction = eviction;
  generation_request r;
  r.prompt = tok.encode(prompt_text, true);
  r.max_tokens = length;
  r.ignore_eos = true;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  auto res = generator(m, tok, o).generate({r});
  if (!res) {
    std::fprintf(stderr, "troupe-perf: %s\n", res.err().message.c_str());
    std::exit(1);
  }
  std::vector<int32_t> text = r.prompt;
  text.insert(text.end(), (*res)[0].tokens.begin(), (*res)[0].tokens.end());
  return text;
}

// The full-cache model's negative log-likelihood of text[from..to), each token given what
// precedes it: in one pass where the text fits the context, else in chunks of half the
// context, each with up to half a context of history before it.
struct nll_sum {
  double nll = 0.0;
  int64_t tokens = 0;
};

nll_sum full_cache_nll(const model& m, const std::vector<int32_t>& text, size_t from, size_t to, int32_t threads) {
  const int32_t context = m.config.max_seq_len, vocab = m.config.vocab_size, bs = 16;
  thread_pool pool(threads);
  no_collective solo;
  kv_cache cache(transformer_shard::cache_shape(m.config, shard_spec{}, (context + bs - 1) / bs, bs, kv_cache_type_for(m)));
  transformer_shard shard(m, shard_spec{}, cache, pool, solo);
  std::vector<block_id> table;
  for (int32_t b = 0; b < (context + bs - 1) / bs; ++b) table.push_back(block_id{static_cast<uint32_t>(b)});
  nll_sum out;
  const size_t half = static_cast<size_t>(context / 2);
  for (size_t a = std::max<size_t>(from, 1); a < to;) {
    const bool whole = to <= static_cast<size_t>(context);
    const size_t b = whole ? to : std::min(to, a + half);
    const size_t start = whole ? 0 : (a > half ? a - half : 0);
    std::vector<int32_t> input(text.begin() + static_cast<int64_t>(start), text.begin() + static_cast<int64_t>(b) - 1);
    step_batch batch;
    batch.add(input, 0, table, static_cast<int32_t>(input.size()));
    std::vector<float> hidden(input.size() * m.config.dim), logits(input.size() * vocab);
    shard.forward(batch, hidden.data(), logits.data());
    for (size_t i = a; i < b; ++i) {
      const float* row = logits.data() + (i - 1 - start) * vocab;
      const float top = *std::max_element(row, row + vocab);
      double z = 0.0;
      for (int32_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - top);
      out.nll += std::log(z) + top - row[text[i]];
      ++out.tokens;
    }
    a = b;
  }
  return out;
}

// The share of the 4-grams of text[from..to) that already occurred earlier in that span.
double repeated_4grams(const std::vector<int32_t>& text, size_t from, size_t to) {
  std::set<std::vector<int32_t>> seen;
  int64_t total = 0, repeated = 0;
  for (size_t i = from; i + 4 <= to; ++i) {
    std::vector<int32_t> g(text.begin() + static_cast<int64_t>(i), text.begin() + static_cast<int64_t>(i) + 4);
    ++total;
    repeated += !seen.insert(std::move(g)).second;
  }
  return total ? double(repeated) / double(total) : 0.0;
}

}  // namespace

void run_eviction_bench(const model& m, const tokenizer& tok, const eviction_bench_options& o) {
  const int32_t context = m.config.max_seq_len;
  const size_t prompt = tok.encode(prompt_text, true).size();
  const int32_t length = o.length > 0 ? o.length : context - static_cast<int32_t>(prompt);
  std::printf("### KV eviction: %d seeded generations of %d tokens (temperature %.1f) per row\n\n", o.texts, length,
              o.temperature);
  std::printf("| policy | budget | full-cache perplexity of its text | against the full cache's | repeated 4-grams |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: |\n");
  double anchor = 0.0;
  auto row = [&](const std::string& name, const kv_eviction_config& e, const std::string& budget) {
    nll_sum total;
    double repeats = 0.0;
    for (int32_t s = 0; s < o.texts; ++s) {
      const auto text = generate(m, tok, e, 1000 + s, length, o.temperature, o.threads);
      const nll_sum n = full_cache_nll(m, text, prompt, text.size(), o.threads);
      total.nll += n.nll;
      total.tokens += n.tokens;
      repeats += repeated_4grams(text, prompt, text.size());
      std::fprintf(stderr, "\r%s %s: %d of %d generations", name.c_str(), budget.c_str(), s + 1, o.texts);
    }
    std::fprintf(stderr, "\n");
    const double ppl = std::exp(total.nll / double(std::max<int64_t>(total.tokens, 1)));
    if (!e.enabled()) anchor = ppl;
    std::printf("| %s | %s | %.3f | %+.1f%% | %.1f%% |\n", name.c_str(), budget.c_str(), ppl, 100.0 * (ppl / anchor - 1.0),
                100.0 * repeats / o.texts);
    std::fflush(stdout);
  };
  row("full cache", kv_eviction_config{}, "-");
  for (const auto& name : o.policies)
    for (int32_t pct : o.budgets) {
      kv_eviction_config e;
      e.policy = parse_kv_policy(name).value_or(kv_policy::none);
      e.budget = std::max(8, length * pct / 100);
      row(name, e, std::to_string(pct) + "% (" + std::to_string(e.budget) + ")");
    }

  if (o.long_factor <= 1) return;
  const int32_t long_length = o.long_factor * context;
  std::printf("\n### Streaming past the context: one seeded generation of %d tokens (%dx the context of %d)\n\n",
              long_length, o.long_factor, context);
  std::printf("Each segment scored by the full-cache model with up to half a context of history before it.\n\n");
  std::printf("| budget | segment (tokens) | full-cache perplexity | repeated 4-grams |\n| ---: | --- | ---: | ---: |\n");
  for (int32_t pct : o.budgets) {
    kv_eviction_config e;
    e.policy = kv_policy::streaming;
    e.budget = std::max(8, context * pct / 100);
    const auto text = generate(m, tok, e, 7, long_length, o.temperature, o.threads);
    for (int32_t seg = 0; seg < o.long_factor; ++seg) {
      const size_t a = std::max(prompt, static_cast<size_t>(seg) * context), b = static_cast<size_t>(seg + 1) * context;
      const nll_sum n = full_cache_nll(m, text, a, std::min(b, text.size()), o.threads);
      std::printf("| %d%% of the context (%d) | %zu-%zu | %.3f | %.1f%% |\n", pct, e.budget, a, b,
                  std::exp(n.nll / double(std::max<int64_t>(n.tokens, 1))), 100.0 * repeated_4grams(text, a, b));
      std::fflush(stdout);
    }
  }
}

}  // namespace troupe::tools
