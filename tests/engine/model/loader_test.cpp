#include <doctest/doctest.h>

#include "engine/forward/transformer_shard.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "engine/model/gguf_file.hpp"
#include "tests/support/test_support.hpp"
#include "tests/support/tolerance.hpp"

namespace troupe {

namespace {

// Logits of the last token of `tokens`, computed on one shard.
std::vector<float> logits_of(const model& m, const std::vector<int32_t>& tokens) {
  shard_spec spec;
  kv_cache cache(transformer_shard::cache_shape(m.config, spec, 4, 16));
  thread_pool pool(1);
  no_collective solo;
  transformer_shard shard(m, spec, cache, pool, solo);
  step_batch batch;
  const std::vector<block_id> blocks = test::block_ids({0, 1, 2, 3});
  batch.add(tokens, 0, blocks, true);
  std::vector<float> hidden(tokens.size() * m.config.dim), logits(m.config.vocab_size);
  shard.forward(batch, hidden.data(), logits.data());
  return logits;
}

}  // namespace

TEST_CASE("the three stories260K files load with the model's shape") {
  for (const char* f : {"stories260K.bin", "stories260K.gguf", "stories260K_q8.bin"}) {
    CAPTURE(f);
    auto m = load_model(test::models_dir() + "/" + f);
    REQUIRE_MESSAGE(m.has_value(), (m ? "" : m.err().message));
    const model_config& c = m->config;
    CHECK(c.dim == 64);
    CHECK(c.hidden_dim == 172);
    CHECK(c.num_layers == 5);
    CHECK(c.num_heads == 8);
    CHECK(c.num_kv_heads == 4);
    CHECK(c.vocab_size == 512);
    CHECK(c.max_seq_len == 512);
    CHECK(c.rms_eps == doctest::Approx(1e-5));
  }
  auto g = load_model(test::models_dir() + "/stories260K.gguf");
  REQUIRE(g.has_value());
  REQUIRE(g->vocab.has_value());
  CHECK(g->vocab->size() == 512);
  CHECK(g->vocab->pieces[259] == " t");  // U+2581 became a space
  auto q = load_model(test::models_dir() + "/stories260K_q8.bin");
  REQUIRE(q.has_value());
  CHECK(q->weight_type == dtype::q8_0);
  CHECK(q->weights.layers[0].wq.group_size == 4);
}

TEST_CASE("GGUF weights are used in place in the mapping, not copied") {
  auto m = load_model(test::models_dir() + "/stories260K.gguf");
  REQUIRE(m.has_value());
  const uint8_t* lo = m->weights.file.data();
  const uint8_t* hi = lo + m->weights.file.size();
  for (const auto& l : m->weights.layers)
    for (const matrix_view* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3}) {
      const auto* p = static_cast<const uint8_t*>(v->data);
      CHECK((p >= lo && p < hi));
    }
  CHECK(m->weights.owned.empty());
}

TEST_CASE("the .bin and .gguf files of stories260K compute the same logits") {
  const test::loaded a = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const test::loaded b = test::load(test::models_dir() + "/stories260K.gguf");
  const std::vector<int32_t> toks{1, 403, 407, 261, 378};
  CHECK(test::same_finite_bits(logits_of(a.m, toks), logits_of(b.m, toks)));
}

TEST_CASE("GGUF F16, BF16 and Q8_0 and llama2.c Q8_0 conversions stay close to F32") {
  test::temp_dir dir;
  const test::loaded src = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const std::vector<int32_t> toks{1, 403, 407, 261, 378, 432, 383};
  const auto ref = logits_of(src.m, toks);
  // dim 64 and hidden 172: Q8_0 in GGUF needs multiples of 32, llama2.c groups of 4 do.
  struct conv { const char* name; dtype type; bool gguf; double tol; };
  for (conv c : {conv{"f16.gguf", dtype::f16, true, 5e-3}, conv{"bf16.gguf", dtype::bf16, true, 3e-2},
                 conv{"q8.bin", dtype::q8_0, false, 5e-2}, conv{"f32.bin", dtype::f32, false, 0.0}}) {
    CAPTURE(c.name);
    const std::string path = dir.file(c.name);
    const checkpoint_spec spec{src.m.config, c.type, 4, true};
    auto st = c.gguf ? write_gguf(path, spec, src.tok.vocab(), weights_of(src.m)) : write_llama2c(path, spec, weights_of(src.m));
    REQUIRE(st.has_value());
    auto m = load_model(path);
    REQUIRE_MESSAGE(m.has_value(), (m ? "" : m.err().message));
    CHECK(m->weight_type == c.type);
    CHECK(test::max_relative_difference(logits_of(*m, toks), ref) <= c.tol);
  }
}

TEST_CASE("a GGUF file's chat template is read from its metadata, and none is an empty string") {
  test::temp_dir dir;
  const test::loaded src = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const checkpoint_spec spec{src.m.config, dtype::f32, 32, true};
  const std::string jinja = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  REQUIRE(write_gguf(dir.file("with.gguf"), spec, src.tok.vocab(), weights_of(src.m), {}, jinja).has_value());
  auto with = load_model(dir.file("with.gguf"));
  REQUIRE(with.has_value());
  CHECK(with->chat_template == jinja);
  REQUIRE(write_gguf(dir.file("without.gguf"), spec, src.tok.vocab(), weights_of(src.m)).has_value());
  auto without = load_model(dir.file("without.gguf"));
  REQUIRE(without.has_value());
  CHECK(without->chat_template.empty());
}

TEST_CASE("a llama2.c checkpoint with a separate classifier loads it") {
  test::temp_dir dir;
  model_config c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.vocab_size = 300;
  c.max_seq_len = 32;
  for (dtype t : {dtype::f32, dtype::q8_0}) {
    const std::string path = dir.file("sep.bin");
    REQUIRE(write_llama2c(path, {c, t, 16, false}, random_weights(3)).has_value());
    auto m = load_model(path);
    REQUIRE_MESSAGE(m.has_value(), (m ? "" : m.err().message));
    CHECK(m->config.vocab_size == 300);
    CHECK(m->weights.classifier.rows == 300);
    if (t == dtype::f32) CHECK(m->weights.classifier.data != m->weights.token_embedding.data);
    else CHECK(m->weights.classifier.q != m->weights.token_embedding.q);
    CHECK(m->weights.classifier.at(5, 7) != m->weights.token_embedding.at(5, 7));
  }
}

}  // namespace troupe
