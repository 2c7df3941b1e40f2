// model_logits MODEL OUT PREFILL TOKEN...: runs MODEL (any format troupe loads) over the
// tokens on one CPU shard: the first PREFILL of them as one step, then one token a step,
// and writes the logits of positions PREFILL-1 .. n-1 to OUT as float32 rows. The
// families test (families_test.py) compares them with its torch reference.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/forward/kv_cache.hpp"
#include "engine/forward/transformer_shard.hpp"
#include "engine/kv/block_id.hpp"
#include "engine/model/model.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: model_logits MODEL OUT PREFILL TOKEN...\n");
    return 2;
  }
  auto m = load_model(argv[1]);
  if (!m) {
    std::fprintf(stderr, "model_logits: %s\n", m.err().message.c_str());
    return 1;
  }
  const model_config& c = m->config;
  const int32_t prefill = std::atoi(argv[3]);
  std::vector<int32_t> tokens;
  for (int i = 4; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  const int32_t n = static_cast<int32_t>(tokens.size());
  if (prefill < 1 || prefill > n || n > c.max_seq_len) {
    std::fprintf(stderr, "model_logits: PREFILL must be in 1..%d and the tokens fit the context\n", n);
    return 2;
  }
  const int32_t block = 16, blocks = (n + block - 1) / block;
  std::vector<block_id> table;
  for (int32_t b = 0; b < blocks; ++b) table.push_back(block_id{static_cast<uint32_t>(b)});
  kv_cache cache(transformer_shard::cache_shape(c, shard_spec{}, blocks, block, dtype::f32));
  thread_pool pool(1);
  no_collective solo;
  transformer_shard shard(*m, shard_spec{}, cache, pool, solo);
  std::vector<float> hidden(int64_t{n} * c.dim), logits(c.vocab_size);
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) {
    std::fprintf(stderr, "model_logits: cannot write %s\n", argv[2]);
    return 1;
  }
  for (int32_t pos = 0; pos < n;) {
    const int32_t count = pos == 0 ? prefill : 1;
    step_batch b;
    b.add(std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + count), pos, table, true);
    shard.forward(b, hidden.data(), logits.data());
    std::fwrite(logits.data(), sizeof(float), logits.size(), out);
    pos += count;
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
