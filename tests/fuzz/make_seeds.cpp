// Writes the fuzz targets' seed corpora, the inputs committed under tests/fuzz/corpus:
// fuzz_make_seeds OUT_DIR. Every seed is a valid input of its kind, so the fuzzer starts
// from what the parsers accept. (The topology parser's seeds are the shipped topologies,
// deploy/*.toml.) tools/fuzz.sh --make-seeds runs it.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include <sentencepiece_trainer.h>

#include "actors/wire/activations_codec.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/control_codec.hpp"
#include "actors/wire/draft_codec.hpp"
#include "actors/wire/kv_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/kv/kv_tiers.hpp"
#include "engine/model/checkpoint_writer.hpp"
#include "engine/sched/scheduler.hpp"
#include "engine/speculative/heads.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "tests/fuzz/heads_target.hpp"
#include "tests/fuzz/wire_setup.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A seed: the selector byte, then the bytes.
void seed(const fs::path& dir, const std::string& name, int selector, const std::vector<uint8_t>& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary);
  if (selector >= 0) out.put(static_cast<char>(selector));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void seed(const fs::path& dir, const std::string& name, int selector, const std::string& text) {
  seed(dir, name, selector, std::vector<uint8_t>(text.begin(), text.end()));
}

void check(const status& s) {
  if (!s) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", s.err().message.c_str());
    std::exit(1);
  }
}

void model_files(const fs::path& out, const fs::path& scratch) {
  checkpoint_spec spec;
  spec.config.dim = 32;  // (Q8_0 rows: a multiple of 32)
  spec.config.hidden_dim = 32;
  spec.config.num_layers = 1;
  spec.config.num_heads = 2;
  spec.config.num_kv_heads = 2;
  spec.config.vocab_size = 300;
  spec.config.max_seq_len = 64;
  spec.config.head_dim = 16;
  spec.config.rope_dim = 16;
  const auto src = random_weights(1);
  const vocabulary v = synthetic_vocabulary(300);
  spec.type = dtype::f16;
  check(write_gguf((scratch / "m.gguf").string(), spec, v, src, {}, "{{ messages }}"));
  seed(out, "gguf-f16", 0, read_file(scratch / "m.gguf"));
  spec.type = dtype::q8_0;
  check(write_gguf((scratch / "m.gguf").string(), spec, v, src));
  seed(out, "gguf-q8_0", 0, read_file(scratch / "m.gguf"));
  spec.type = dtype::f32;
  check(write_llama2c((scratch / "m.bin").string(), spec, src));
  seed(out, "llama2c-v0", 1, read_file(scratch / "m.bin"));
  spec.type = dtype::q8_0;
  spec.group_size = 16;
  check(write_llama2c((scratch / "m.bin").string(), spec, src));
  seed(out, "llama2c-v2", 1, read_file(scratch / "m.bin"));
  spec.type = dtype::bf16;
  check(write_hf_dir((scratch / "hf").string(), spec, src));
  seed(out, "safetensors", 2, read_file(scratch / "hf" / "model.safetensors"));
  seed(out, "config", 3, read_file(scratch / "hf" / "config.json"));

  // Head files for heads_target(): Medusa heads with classifiers of their own, and an
  // EAGLE layer.
  const model target = fuzz::heads_target();
  const int64_t dim = target.config.dim, vocab = target.config.vocab_size, ffn = 48;
  const std::vector<float> ramp(static_cast<size_t>(vocab * 2 * dim), 0.01f);
  std::vector<head_tensor> medusa;
  for (const char* h : {"medusa.0", "medusa.1"}) {
    medusa.push_back({std::string(h) + ".0.weight", {dim, dim}, ramp.data()});
    medusa.push_back({std::string(h) + ".0.bias", {dim}, ramp.data()});
    medusa.push_back({std::string(h) + ".output.weight", {vocab, dim}, ramp.data()});
  }
  check(write_heads((scratch / "h.gguf").string(), medusa, target, fuzz::heads_vocabulary()));
  seed(out, "heads-medusa", 4, read_file(scratch / "h.gguf"));
  const std::vector<head_tensor> eagle = {
      {"eagle.fc.weight", {dim, 2 * dim}, ramp.data()},   {"eagle.fc.bias", {dim}, ramp.data()},
      {"eagle.attn_norm.weight", {dim}, ramp.data()},     {"eagle.attn_q.weight", {dim, dim}, ramp.data()},
      {"eagle.attn_k.weight", {dim, dim}, ramp.data()},   {"eagle.attn_v.weight", {dim, dim}, ramp.data()},
      {"eagle.attn_output.weight", {dim, dim}, ramp.data()}, {"eagle.ffn_norm.weight", {dim}, ramp.data()},
      {"eagle.ffn_gate.weight", {ffn, dim}, ramp.data()}, {"eagle.ffn_up.weight", {ffn, dim}, ramp.data()},
      {"eagle.ffn_down.weight", {dim, ffn}, ramp.data()}};
  check(write_heads((scratch / "h.gguf").string(), eagle, target, fuzz::heads_vocabulary()));
  seed(out, "heads-eagle", 4, read_file(scratch / "h.gguf"));
}

void tokenizer_files(const fs::path& out, const fs::path& scratch) {
  const vocabulary v = synthetic_vocabulary(300);
  check(write_llama2c_vocabulary((scratch / "tokenizer.bin").string(), v));
  std::vector<uint8_t> bin = {300 & 0xff, 300 >> 8};
  const auto file = read_file(scratch / "tokenizer.bin");
  bin.insert(bin.end(), file.begin(), file.end());
  seed(out, "llama2c", 0, bin);

  // A byte-level tokenizer.json: the 256 bytes, two merges, an end-of-text token; then the
  // config beside it after a NUL.
  std::string vocab, merges = R"("h e", "he l")";
  for (int b = 0; b < 256; ++b) {
    std::string piece = byte_level_encode(std::string(1, static_cast<char>(b)));
    std::string escaped;
    for (char c : piece) escaped += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    vocab += "\"" + escaped + "\": " + std::to_string(b) + ", ";
  }
  vocab += R"("he": 256, "hel": 257)";
  const std::string json = R"({"model": {"type": "BPE", "vocab": {)" + vocab + R"(}, "merges": [)" + merges +
                           R"(]}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": " ?\\p{L}+|\\s+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}, "added_tokens": [{"id": 258, "content": "<|endoftext|>", "special": true}]})";
  seed(out, "tokenizer-json", 1, json);
  seed(out, "tokenizer-json-config", 1,
       json + std::string(1, '\0') + R"({"bos_token": null, "eos_token": {"content": "<|endoftext|>"}, "add_bos_token": false})");

  // A SentencePiece BPE model trained as Llama's was, small.
  {
    std::ofstream corpus(scratch / "corpus.txt");
    for (int i = 0; i < 200; ++i)
      corpus << "the little cat sat on a mat and the dog ran to the park " << i << " times\n";
  }
  const auto st = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (scratch / "corpus.txt").string() + " --model_prefix=" + (scratch / "sp").string() +
      " --vocab_size=300 --model_type=bpe --byte_fallback=true --normalization_rule_name=identity"
      " --remove_extra_whitespaces=false --minloglevel=2");
  if (!st.ok()) {
    std::fprintf(stderr, "fuzz_make_seeds: sentencepiece: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  seed(out, "sentencepiece", 2, read_file(scratch / "sp.model"));
}

void wire_frames(const fs::path& out) {
  const std::vector<float> hidden(3 * fuzz::dim, 0.5f), sums(4, 1.0f);
  seed(out, "activations", 0, wire::encode_activations(1, 3, fuzz::dim, hidden.data(), sums));
  seed(out, "linked-activations", 1, wire::encode_linked_activations(1, 3, fuzz::dim, sums));
  const tokenizer tok(fuzz::small_vocabulary());
  request_params p;
  p.max_tokens = 8;
  p.stop_strings = {"end"};
  p.stop_tokens = {7};
  p.sampling.temperature = 0.7f;
  p.sampling.logit_bias = {{5, -1.0f}};
  seed(out, "request-text", 2, wire::encode_generate_request_text("Once upon a time", p));
  p.prompt = {1, 40, 41, 42};
  seed(out, "request-tokens", 3, wire::encode_generate_request_tokens(p));
  step_output so;
  so.id = request_id{7};
  so.new_tokens = {40, 41};
  so.text = "ab";
  so.logprobs.resize(2);
  so.logprobs[0].token = 40;
  so.logprobs[1].token = 41;
  seed(out, "chunk", 4, wire::encode_token_chunk(7, 2, so));
  seed(out, "chunk-peek", 5, wire::encode_token_chunk(7, 2, so));
  so.finished = true;
  so.reason = finish_reason::length;
  seed(out, "result", 6, wire::encode_generate_result(7, so, 3));
  seed(out, "route", 7, wire::encode_generate_request_text("hello", p));
  seed(out, "renumber", 8, wire::encode_token_chunk(7, 2, so));
  seed(out, "final", 9, wire::encode_final_result(7, 3, so));
  wire::node_health h;
  h.node = "n0";
  h.pid = 42;
  h.ready = true;
  seed(out, "health", 10, wire::encode_node_health(h));
  wire::nccl_invite g;
  g.size = 2;
  g.rank = 1;
  g.node = "127.0.0.1";
  seed(out, "nccl", 11, wire::encode_nccl_invite(g));
  draft_order o;
  o.session = 1;
  draft_order_slot s;
  s.id = request_id{3};
  s.max_tokens = 2;
  s.tokens = {1, 40, 41};
  s.blocks = {block_id{0}};
  s.prompt_tokens = 3;
  s.sampling = sampling_params{};
  o.slots.push_back(s);
  s.id = request_id{4};  // under KV eviction: one token gone, the slots' positions named
  s.tokens = {1, 40, 41, 42, 43};
  s.evicted = 1;
  s.positions = {0, 2, 3};
  o.slots.push_back(s);
  o.compactions.push_back({request_id{4}, {0, 2, 3}, false, {block_id{0}}, {}});
  seed(out, "draft-order", 12, wire::encode_draft_order(o));
  draft_answer a;
  a.session = 1;
  drafted d;
  d.id = request_id{3};
  d.tokens = {42, 43};
  a.slots.push_back(d);
  seed(out, "drafts", 13, wire::encode_drafts(a, fuzz::vocab));

  // The stateful decoders: a scheduler's plans, the KV claims of a step.
  scheduler sched(fuzz::small_scheduler(), tok);
  for (uint64_t id = 0; id < 3; ++id) {
    request_params q;
    q.prompt = {1, 40, 41, 42, 43, 44};
    q.max_tokens = 3;
    q.ignore_eos = true;
    if (!sched.add(request_id{id}, q)) std::exit(1);
  }
  wire::step_encoder enc;
  for (int step = 0; sched.has_unfinished() && step < 3; ++step) {
    const step_plan plan = sched.schedule();
    seed(out, "plan-" + std::to_string(step), 16, enc.encode(plan, {}));
    std::vector<sample_result> samples(plan.num_samples());
    for (auto& r : samples) r.token = 45;
    (void)sched.update_from_output(plan, samples);
  }
  wire::kv_claim_sender tx(fuzz::kv_limits());
  tx.restart(1);
  kv_step_request q;
  q.budget = 8;
  const std::vector<int32_t> toks{1, 40, 41, 42, 43};
  kv_claim claim;
  claim.id = request_id{1};
  claim.admit = true;
  claim.tokens = toks;
  q.claims = {claim};
  seed(out, "claims", 14, tx.encode(q));
  kv_step_grants grants;
  kv_grant grant;
  grant.id = request_id{1};
  grant.count = 5;
  grant.added = {block_id{0}};
  grants.grants.push_back(grant);
  seed(out, "grants", 15, wire::encode_kv_grants(1, grants));
  const std::vector<wire::chosen_token> chosen = {{request_id{1}, 40}, {request_id{2}, 41}};
  seed(out, "step-result", 17, wire::encode_step_result(1, chosen, sums));
}

void openai(const fs::path& out) {
  seed(out, "completion", 0,
       R"({"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "stop": ["\n"], "logit_bias": {"5": -100}, "seed": 3, "stream": true, "stream_options": {"include_usage": true}})");
  seed(out, "completion-ids", 0, R"({"model": "m", "prompt": [[1, 2, 3], "text"], "n": 2, "logprobs": 2, "echo": false})");
  seed(out, "chat", 1,
       R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 8, "kv_eviction": {"policy": "streaming", "budget": 64}})");
  seed(out, "tokenize", 2, R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "add_special_tokens": false})");
  seed(out, "detokenize", 3, R"({"model": "m", "tokens": [1, 2, 3]})");
}

// HTTP requests as clients send them (selector: the piece size they arrive in).
void http_requests(const fs::path& out) {
  seed(out, "get", 0, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  seed(out, "post", 4,
       "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 26\r\n"
       "Authorization: Bearer k\r\n\r\n{\"model\":\"m\",\"prompt\":\"a\"}");
  seed(out, "chunked", 2, "POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  seed(out, "pipelined", 7,
       "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiHEAD /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  seed(out, "expect", 5, "POST /x HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\nabcd");
  seed(out, "bad-length", 6, "POST /x HTTP/1.1\r\nContent-Length: 12abc\r\n\r\n{}");
}

std::vector<uint8_t> seal_bytes(const std::string& name, std::span<const std::byte> payload) {
  const auto r = seal_record(name, payload);
  std::vector<uint8_t> out(r.size());
  std::memcpy(out.data(), r.data(), r.size());
  return out;
}

// KV records as the channel and the stores carry them.
void kv_records(const fs::path& out) {
  std::vector<std::byte> payload(96);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7);
  const std::string name = "kv/0123456789abcdef/3";
  seed(out, "record", 0, seal_bytes(name, payload));
  std::vector<uint8_t> named{static_cast<uint8_t>(name.size())};
  named.insert(named.end(), name.begin(), name.end());
  const auto r = seal_bytes(name, payload);
  named.insert(named.end(), r.begin(), r.end());
  seed(out, "named-record", 1, named);
  seed(out, "empty-payload", 0, seal_bytes("x", {}));
}

// The frames of a step link and of a KV channel, as their readers take them in pieces;
// the byte after the selector seeds the piece sizes.
void link_frames(const fs::path& out) {
  auto u32 = [](std::vector<uint8_t>& b, uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  std::vector<uint8_t> steps{7};
  for (const std::string& plan : {std::string("a plan"), std::string(300, 'p')}) {
    const std::string act(40, 'a');
    u32(steps, 0x4c535254);  // "TRSL"
    u32(steps, 1);
    u32(steps, static_cast<uint32_t>(plan.size()));
    u32(steps, 3);
    u32(steps, static_cast<uint32_t>(act.size()));
    steps.insert(steps.end(), plan.begin(), plan.end());
    steps.insert(steps.end(), act.begin(), act.end());
  }
  seed(out, "steps", 0, steps);
  std::vector<uint8_t> kv{3};
  u32(kv, 0x48564b54);  // "TKVH"
  u32(kv, 1);
  std::vector<std::byte> payload(64);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 5);
  for (const std::string& name : {std::string("kv/0123456789abcdef/0"), std::string("kv/0123456789abcdef/1")}) {
    const auto r = seal_bytes(name, payload);
    u32(kv, 0x42564b54);  // "TKVB"
    u32(kv, static_cast<uint32_t>(r.size()));
    kv.insert(kv.end(), r.begin(), r.end());
  }
  seed(out, "kv-blocks", 1, kv);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path scratch = fs::temp_directory_path() / ("fuzz-seeds-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  model_files(out / "model_files", scratch);
  tokenizer_files(out / "tokenizer_files", scratch);
  wire_frames(out / "wire");
  openai(out / "openai");
  http_requests(out / "http_reader");
  kv_records(out / "kv_records");
  link_frames(out / "link_frames");
  fs::remove_all(scratch);
  return 0;
}
