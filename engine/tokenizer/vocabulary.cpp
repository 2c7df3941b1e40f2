#include "engine/tokenizer/vocabulary.hpp"

#include <array>
#include <cstdio>
#include <tuple>

#include "engine/util/byte_reader.hpp"
#include "engine/util/mapped_file.hpp"

namespace troupe {

namespace {

bool is_byte_piece(const std::string& p) {
  unsigned v;
  char tail;
  return p.size() == 6 && std::sscanf(p.c_str(), "<0x%2X>%c", &v, &tail) == 1;
}

}  // namespace

expected<vocabulary> load_llama2c_vocabulary(const std::string& path, int32_t vocab_size) {
  auto file = mapped_file::open(path);
  if (!file) return file.err();
  return parse_llama2c_vocabulary(*file, vocab_size);
}

expected<vocabulary> parse_llama2c_vocabulary(const mapped_file& file, int32_t vocab_size) {
  const std::string& path = file.path();
  if (vocab_size <= 0) return error{path + ": vocabulary size " + std::to_string(vocab_size) + " is invalid"};
  byte_reader r(file.data(), file.size(), path);
  int32_t max_len = 0;
  r.read(max_len, "max_token_length");
  if (!r.failed() && (max_len <= 0 || max_len > 4096))
    return error{path + ": max_token_length " + std::to_string(max_len) +
                 " is not plausible; is this a llama2.c tokenizer.bin?"};
  vocabulary v;
  v.pieces.resize(vocab_size);
  v.scores.resize(vocab_size);
  for (int32_t i = 0; i < vocab_size && !r.failed(); ++i) {
    int32_t len = 0;
    const uint8_t* bytes = nullptr;
    r.read(v.scores[i], "token score");
    r.read(len, "token length");
    if (r.failed()) break;
    if (len < 0 || len > max_len)
      return error{path + ": token " + std::to_string(i) + " has length " + std::to_string(len) +
                   " (max_token_length is " + std::to_string(max_len) + ")"};
    if (!r.bytes(static_cast<size_t>(len), bytes, "token bytes")) break;
    v.pieces[i].assign(reinterpret_cast<const char*>(bytes), static_cast<size_t>(len));
  }
  if (r.failed())
    return error{r.error_message() + " (the model expects " + std::to_string(vocab_size) +
                 " tokens)"};
  if (r.remaining() != 0)
    return error{path + ": " + std::to_string(r.remaining()) + " bytes follow the " +
                 std::to_string(vocab_size) +
                 " tokens the model expects; the tokenizer does not belong to this model"};
  // llama2.c's exporter writes BOS and EOS as "\n<s>\n" and "\n</s>\n"; as control tokens
  // they are "<s>" and "</s>", the pieces chat templates write and GGUF files hold.
  for (auto [id, was, piece] : {std::tuple{v.bos_id, "\n<s>\n", "<s>"}, std::tuple{v.eos_id, "\n</s>\n", "</s>"}})
    if (id >= 0 && id < vocab_size && v.pieces[id] == was) v.pieces[id] = piece;
  if (auto e = validate(v)) return error{path + ": " + *e};
  return v;
}

const char* const llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// The code point GPT-2's table stores byte b as.
uint32_t byte_char(uint8_t b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
  // The others in byte order from U+0100: 0..32, then 127..160, then 173.
  uint32_t n = b <= 32 ? b : b <= 160 ? 33 + (b - 127) : 33 + 34;
  return 256 + n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (char c : bytes) append_utf8(out, byte_char(static_cast<uint8_t>(c)));
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view s) {
  static const auto table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_char(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c0 = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xe0) == 0xc0 && i + 1 < s.size()) {
      cp = ((c0 & 0x1fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3fu);
      i += 2;
    } else {
      return std::nullopt;  // three-byte characters and beyond are past the table
    }
    if (cp >= table.size() || table[cp] < 0) return std::nullopt;
    out += static_cast<char>(table[cp]);
  }
  return out;
}

std::string describe(const vocabulary& v) {
  if (v.style == vocab_style::byte_level)
    return "byte-level BPE, " + std::to_string(v.size()) + " tokens, " + std::to_string(v.merges.size()) + " merges" +
           (v.nfc ? ", NFC" : "");
  return "SentencePiece-style BPE, " + std::to_string(v.size()) + " tokens";
}

std::optional<std::string> validate(vocabulary& v) {
  const int32_t n = v.size();
  if (n < 3) return "vocabulary has " + std::to_string(n) + " tokens";
  if (v.style == vocab_style::byte_level) {
    if (v.scores.empty()) v.scores.assign(n, 0.0f);
    if (v.kinds.empty()) v.kinds.assign(n, token_kind::normal);
    if (v.pattern.empty()) return std::string("a byte-level vocabulary needs a pre-tokenizer pattern");
    if (auto e = pattern_error(v.pattern)) return "the pre-tokenizer pattern does not compile: " + *e;
    std::array<bool, 256> bytes{};
    for (int32_t i = 0; i < n; ++i)
      if (v.pieces[i].size() == 1 && v.kinds[i] == token_kind::normal) bytes[static_cast<uint8_t>(v.pieces[i][0])] = true;
    for (int b = 0; b < 256; ++b)
      if (!bytes[b]) return "byte-level vocabulary has no token for byte " + std::to_string(b);
    for (size_t r = 0; r < v.merges.size(); ++r) {
      const auto [a, b] = v.merges[r];
      if (a < 0 || a >= n || b < 0 || b >= n) return "merge " + std::to_string(r) + " names a token outside the vocabulary";
    }
    v.add_space_prefix = false;
  }
  if (v.scores.size() != v.pieces.size()) return std::string("scores and pieces differ in count");
  if (v.kinds.empty()) {
    v.kinds.assign(n, token_kind::normal);
    for (int32_t i = 0; i < n; ++i)
      if (is_byte_piece(v.pieces[i])) v.kinds[i] = token_kind::byte;
    for (int32_t id : {v.bos_id, v.eos_id})
      if (id >= 0 && id < n) v.kinds[id] = token_kind::control;
    if (v.unk_id >= 0 && v.unk_id < n) v.kinds[v.unk_id] = token_kind::unknown;
  }
  if (static_cast<int32_t>(v.kinds.size()) != n) return std::string("token types and pieces differ in count");
  for (auto [name, id] : {std::pair{"bos", v.bos_id}, std::pair{"eos", v.eos_id}})
    if (id < 0 || id >= n) return std::string(name) + " id " + std::to_string(id) + " is outside the vocabulary";
  for (int32_t i = 0; i < n; ++i)
    if (v.kinds[i] == token_kind::byte && !is_byte_piece(v.pieces[i]))
      return "byte token " + std::to_string(i) + " is not of the form <0xNN>";
  return std::nullopt;
}

}  // namespace troupe
