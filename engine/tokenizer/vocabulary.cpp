#include "engine/tokenizer/vocabulary.hpp"

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
  if (vocab_size <= 0) return error{path + ": vocabulary size " + std::to_string(vocab_size) + " is invalid"};
  byte_reader r(file->data(), file->size(), path);
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

std::optional<std::string> validate(vocabulary& v) {
  const int32_t n = v.size();
  if (n < 3) return "vocabulary has " + std::to_string(n) + " tokens";
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
