#include "tools/common/model_loading.hpp"

#include <cstdio>
#include <filesystem>

#include "engine/forward/kv_cache_type.hpp"
#include "engine/tokenizer/sentencepiece_model.hpp"
#include "engine/tokenizer/tokenizer_json.hpp"

namespace troupe::tools {

expected<loaded_model> load_model_and_tokenizer(const std::string& model_path,
                                                const std::string& tokenizer_path) {
  if (auto kv = kv_cache_type_from_environment(); !kv) return kv.err();
  auto m = load_model(model_path);
  if (!m) return m.err();
  loaded_model out{std::move(m).value(), std::nullopt};
  if (out.m.vocab && tokenizer_path.empty()) {
    out.tok.emplace(*out.m.vocab);
    return out;
  }
  std::string path = tokenizer_path;
  if (path.empty()) {
    const std::filesystem::path mp(model_path);
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::is_directory(mp, ec) ? mp : mp.parent_path();
    // A model directory's tokenizer.json, else its SentencePiece tokenizer.model, else
    // a llama2.c tokenizer.bin (beside a file, or in the directory).
    path.clear();
    if (std::filesystem::is_directory(mp, ec))
      for (const char* name : {"tokenizer.json", "tokenizer.model"})
        if (path.empty() && std::filesystem::exists(dir / name)) path = (dir / name).string();
    if (path.empty()) path = (dir / "tokenizer.bin").string();
    if (!std::filesystem::exists(path))
      return error{model_path + ": this checkpoint carries no vocabulary; name its tokenizer with -z (looked for " + path + ")"};
  }
  const bool json = path.ends_with(".json");
  auto v = json                       ? load_tokenizer_json(path, out.m.config.vocab_size)
           : path.ends_with(".model") ? load_sentencepiece_model(path, out.m.config.vocab_size)
                                      : load_llama2c_vocabulary(path, out.m.config.vocab_size);
  if (v && json && out.m.chat_template.empty()) out.m.chat_template = chat_template_beside(path);
  out.tokenizer_source = path;
  if (!v) return v.err();
  out.tok.emplace(std::move(v).value());
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

}  // namespace troupe::tools
