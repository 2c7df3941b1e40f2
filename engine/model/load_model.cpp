#include <cstring>
#include <filesystem>

#include "engine/model/model.hpp"

namespace troupe {

expected<model> load_model(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_hf_dir(path);
  auto file = mapped_file::open(path);
  if (!file) return file.err();
  if (file->size() >= 4 && std::memcmp(file->data(), "GGUF", 4) == 0)
    return load_gguf(std::move(file).value());
  return load_llama2c(std::move(file).value());
}

}  // namespace troupe
