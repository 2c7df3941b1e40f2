// model: a loaded checkpoint: its validated shape, its weights (in place in the mapped
// file) and, for formats that carry one, its vocabulary. Immutable after loading (but for
// the cache of repacked matrices); shared read-only by every shard that runs part of it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/model/config.hpp"
#include "engine/model/packed_weights.hpp"
#include "engine/model/weights.hpp"
#include "engine/tokenizer/vocabulary.hpp"
#include "engine/util/expected.hpp"

namespace troupe {

struct model {
  std::string path;
  std::string format;  // e.g. "llama2.c v0 (f32)", "GGUF v3 (q8_0)"
  dtype weight_type = dtype::f32;  // the type of the layer matrices
  model_config config;
  model_weights weights;
  std::optional<vocabulary> vocab;  // GGUF files carry their vocabulary
  std::string chat_template;        // GGUF tokenizer.chat_template (Jinja text), if present
  // Repacked q8_0 matrices, made by the shards that use them (shared by copies).
  std::shared_ptr<packed_weights> packed = std::make_shared<packed_weights>();
};

// Loads a llama2.c checkpoint (legacy v0 or version 2 "ak42" Q8_0) or a GGUF file,
// chosen by the file's first bytes, or a Hugging Face model directory. Every size, shape and offset is checked against the
// header and the file; a problem is returned as an error naming the file.
expected<model> load_model(const std::string& path);

expected<model> load_llama2c(mapped_file file);
expected<model> load_gguf(mapped_file file);
// A Hugging Face model directory: config.json and safetensors weights.
expected<model> load_hf_dir(const std::string& dir);

}  // namespace troupe
