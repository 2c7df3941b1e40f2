// What the speculative decoding tests share: a run of an engine to its end (each
// request's tokens, text, finish and log-probabilities), and a draft model cut from the
// target's first layers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/model/checkpoint_writer.hpp"
#include "engine/model/model.hpp"
#include "engine/serve/llm_engine.hpp"

namespace troupe::spec_test {

struct outcome {
  std::vector<int32_t> tokens;
  std::string text;
  finish_reason reason = finish_reason::none;
  std::vector<float> logprobs;
};

inline std::map<uint64_t, outcome> run_all(llm_engine& engine, const std::vector<request_params>& reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(engine.add_request(request_id{i}, reqs[i]).has_value());
  std::map<uint64_t, outcome> out;
  int steps = 0;
  while (engine.has_unfinished()) {
    REQUIRE(++steps < 100000);
    for (step_output& o : engine.step()) {
      outcome& x = out[o.id.value];
      x.tokens.insert(x.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      x.text += o.text;
      for (const auto& lp : o.logprobs) x.logprobs.push_back(lp.logprob);
      if (o.finished) x.reason = o.reason;
    }
  }
  const kv_usage u = engine.kv();
  CHECK(u.used == 0);  // every block back
  return out;
}

// A draft of the target's first `layers` layers (its embedding, final norm and
// classifier): it agrees with the target often, not always. Written to a file, loaded,
// and the file removed (the model keeps its mapping).
inline model truncated_draft(const model& target, int32_t layers) {
  const std::string path = (std::filesystem::temp_directory_path() / "troupe_spec_draft.bin").string();
  checkpoint_spec spec;
  spec.config = target.config;
  spec.config.num_layers = layers;
  spec.type = dtype::f32;
  REQUIRE(write_llama2c(path, spec, weights_of(target)).has_value());
  auto draft = load_model(path);
  std::filesystem::remove(path);
  REQUIRE(draft.has_value());
  return std::move(draft).value();
}

}  // namespace troupe::spec_test
