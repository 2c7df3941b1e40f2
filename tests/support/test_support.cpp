#include "tests/support/test_support.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <doctest/doctest.h>

namespace troupe::test {

// TROUPE_SHARED_DIR in the environment overrides the configured directory (a GPU machine
// that runs binaries built elsewhere keeps the models beside them).
std::string shared_path(const std::string& rel) {
  const char* env = std::getenv("TROUPE_SHARED_DIR");
  return std::string(env != nullptr && *env != '\0' ? env : TROUPE_SHARED_DIR) + "/" + rel;
}
std::string models_dir() { return shared_path("models/stories260K"); }
std::string data_path(const std::string& rel) { return std::string(TROUPE_TEST_DATA_DIR) + "/" + rel; }

namespace {

// Minimal reader for the reference files' flat JSON objects.
std::string json_string(const std::string& line, const std::string& key) {
  const size_t k = line.find("\"" + key + "\"");
  REQUIRE(k != std::string::npos);
  size_t i = line.find('"', line.find(':', k) + 1) + 1;
  std::string out;
  for (; i < line.size() && line[i] != '"'; ++i) {
    if (line[i] != '\\') {
      out += line[i];
      continue;
    }
    const char e = line[++i];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'u': {
        const unsigned cp = std::stoul(line.substr(i + 1, 4), nullptr, 16);
        i += 4;
        if (cp < 0x80) out += static_cast<char>(cp);
        else if (cp < 0x800) { out += static_cast<char>(0xc0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3f)); }
        else { out += static_cast<char>(0xe0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f)); out += static_cast<char>(0x80 | (cp & 0x3f)); }
        break;
      }
      default: out += e;
    }
  }
  return out;
}

// The elements of a flat array of numbers, as text.
std::vector<std::string> json_array(const std::string& line, const std::string& key) {
  const size_t k = line.find("\"" + key + "\"");
  REQUIRE(k != std::string::npos);
  const size_t a = line.find('[', k);
  const size_t b = line.find(']', a);
  REQUIRE((a != std::string::npos && b != std::string::npos));
  const std::string items = line.substr(a + 1, b - a - 1);
  std::vector<std::string> out;
  for (size_t p = 0; p < items.size();) {
    size_t q = items.find(',', p);
    if (q == std::string::npos) q = items.size();
    out.push_back(items.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

}  // namespace

std::vector<reference_case> read_reference(const std::string& path) {
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot read " << path);
  std::vector<reference_case> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    reference_case c;
    c.prompt = json_string(line, "prompt");
    c.text = json_string(line, "text");
    const size_t s = line.find("\"steps\"");
    c.steps = std::stoi(line.substr(line.find(':', s) + 1));
    for (const std::string& v : json_array(line, "ids_after_bos")) c.ids_after_bos.push_back(std::stoi(v));
    if (line.find("\"logprobs\"") != std::string::npos)
      for (const std::string& v : json_array(line, "logprobs")) c.logprobs.push_back(std::stof(v));
    out.push_back(std::move(c));
  }
  REQUIRE(!out.empty());
  return out;
}

std::vector<block_id> block_range(int64_t count, uint32_t first) {
  std::vector<block_id> out(static_cast<size_t>(count));
  for (size_t i = 0; i < out.size(); ++i) out[i] = block_id{first + static_cast<uint32_t>(i)};
  return out;
}

std::vector<block_id> block_ids(std::initializer_list<uint32_t> values) {
  std::vector<block_id> out;
  for (uint32_t v : values) out.push_back(block_id{v});
  return out;
}

std::vector<uint32_t> block_values(std::span<const block_id> blocks) {
  std::vector<uint32_t> out;
  for (block_id b : blocks) out.push_back(b.value);
  return out;
}

temp_dir::temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-test-XXXXXX").string();
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  path_ = tmpl;
}

temp_dir::~temp_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

const tokenizer& tok512() {
  static const tokenizer t = [] {
    auto v = load_llama2c_vocabulary(models_dir() + "/tok512.bin", 512);
    REQUIRE(v.has_value());
    return tokenizer(std::move(v).value());
  }();
  return t;
}

loaded load(const std::string& model_path, const std::string& tokenizer_path) {
  auto m = load_model(model_path);
  REQUIRE_MESSAGE(m.has_value(), (m.has_value() ? "" : m.err().message));
  if (m->vocab && tokenizer_path.empty()) {
    vocabulary v = *m->vocab;
    return {std::move(m).value(), tokenizer(std::move(v))};
  }
  auto v = load_llama2c_vocabulary(tokenizer_path.empty() ? models_dir() + "/tok512.bin" : tokenizer_path,
                                   m->config.vocab_size);
  REQUIRE_MESSAGE(v.has_value(), (v.has_value() ? "" : v.err().message));
  return {std::move(m).value(), tokenizer(std::move(v).value())};
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace troupe::test
