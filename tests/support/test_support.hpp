// Helpers shared by the tests: paths to the shared models, reference outputs, seeded
// random data and scratch directories.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "engine/kv/block_id.hpp"
#include "tests/support/random_data.hpp"

#include "engine/model/model.hpp"
#include "engine/tokenizer/tokenizer.hpp"

namespace troupe::test {

std::string shared_path(const std::string& rel);  // under ../shared (or $TROUPE_SHARED_DIR)
std::string models_dir();                         // ../shared/models/stories260K
std::string data_path(const std::string& rel);    // tests/data of this repository

struct reference_case {
  std::string prompt;
  int32_t steps;
  std::vector<int32_t> ids_after_bos;
  std::string text;
  std::vector<float> logprobs;  // of each generated token, where the file has them
};
// Reads a reference .jsonl file (one object per line with prompt, steps, ids_after_bos,
// text, and optionally logprobs).
std::vector<reference_case> read_reference(const std::string& path);

// Block tables from plain numbers, and back: blocks first, first + 1, ... (count of
// them); the blocks named; the numbers of blocks, for comparing and printing.
std::vector<block_id> block_range(int64_t count, uint32_t first = 0);
std::vector<block_id> block_ids(std::initializer_list<uint32_t> values);
std::vector<uint32_t> block_values(std::span<const block_id> blocks);

// A fresh directory under the system temp dir, removed by the destructor.
// A file's bytes, and a file made of bytes (replacing any there).
std::vector<char> read_all(const std::string& path);
void write_all(const std::string& path, const std::vector<char>& bytes);

class temp_dir {
 public:
  temp_dir();
  ~temp_dir();
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct loaded {
  model m;
  tokenizer tok;
};
// The stories260K vocabulary (tok512.bin), loaded once.
const tokenizer& tok512();

// Loads a model and its tokenizer (from the GGUF itself, or tok512.bin); fails the test on error.
loaded load(const std::string& model_path, const std::string& tokenizer_path = "");

}  // namespace troupe::test
