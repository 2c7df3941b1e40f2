// Loading a model and its tokenizer for a tool, with progress and errors worded for the
// operator: the vocabulary comes from the tokenizer file named with -z (a llama2.c
// tokenizer.bin, a tokenizer.json or a SentencePiece .model), else from the GGUF file
// itself, else from a model directory's tokenizer.json or tokenizer.model, else from
// tokenizer.bin beside the model (or in its directory).
#pragma once

#include <optional>
#include <string>

#include "engine/model/model.hpp"
#include "engine/tokenizer/tokenizer.hpp"

namespace troupe::tools {

struct loaded_model {
  model m;
  std::optional<tokenizer> tok;
  std::string tokenizer_source = {};  // the file the vocabulary came from ("" for the model's own)
};

expected<loaded_model> load_model_and_tokenizer(const std::string& model_path,
                                                const std::string& tokenizer_path);

// "512 KiB", "1.2 GiB"
std::string human_bytes(double bytes);

}  // namespace troupe::tools
