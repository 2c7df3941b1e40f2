#include "engine/tokenizer/tokenizer_json.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uintmax_t max_file = uintmax_t{512} << 20;
constexpr int64_t max_ids = int64_t{1} << 22;

expected<std::string> read_text(const fs::path& p) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) return error{p.string() + ": " + ec.message()};
  if (size > max_file) return error{p.string() + ": " + std::to_string(size) + " bytes is too large"};
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

expected<json> parse_object(std::string_view text, const std::string& where) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return error{where + ": not a JSON object"};
  return j;
}

expected<json> read_json(const fs::path& p) {
  auto text = read_text(p);
  if (!text) return text.err();
  return parse_object(*text, p.string());
}

// Every object of type `type` in a (possibly Sequence) pre-tokenizer, normalizer or decoder.
void collect(const json& node, const std::string& type, std::vector<const json*>& out) {
  if (!node.is_object()) return;
  if (node.contains("type") && node["type"] == type) out.push_back(&node);
  for (const char* list : {"pretokenizers", "normalizers", "decoders"})
    if (node.contains(list) && node[list].is_array())
      for (const auto& child : node[list]) collect(child, type, out);
}

std::string token_text(const json& t) {  // "<s>" or {"content": "<s>", ...}
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

}  // namespace

expected<vocabulary> load_tokenizer_json(const std::string& path, int32_t vocab_size) {
  auto text = read_text(path);
  if (!text) return text.err();
  std::string config_text;
  const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) {
    auto c = read_text(config);
    if (!c) return c.err();
    config_text = std::move(*c);
  }
  return parse_tokenizer_json(*text, config_text, path, vocab_size);
}

expected<vocabulary> parse_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json,
                                          const std::string& path, int32_t vocab_size) {
  auto parsed = parse_object(tokenizer_json, path);
  if (!parsed) return parsed.err();
  const json& j = *parsed;
  auto bad = [&](const std::string& what) { return error{path + ": " + what}; };
  if (!j.contains("model") || !j["model"].is_object()) return bad("no model object");
  const json& m = j["model"];
  const std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "BPE";
  if (type != "BPE") return bad("model type " + type + " is not supported (BPE is)");
  if (!m.contains("vocab") || !m["vocab"].is_object()) return bad("model.vocab is not an object");

  std::vector<const json*> byte_level, splits;
  for (const char* part : {"pre_tokenizer", "decoder"})
    if (j.contains(part)) collect(j[part], "ByteLevel", byte_level);
  if (j.contains("pre_tokenizer")) collect(j["pre_tokenizer"], "Split", splits);
  vocabulary v;
  v.style = byte_level.empty() ? vocab_style::sentencepiece : vocab_style::byte_level;
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    // NFC, and SentencePiece's Prepend("\u2581") and Replace(" ", "\u2581"), which the
    // sentencepiece style does itself; nothing else.
    std::string unknown;
    std::function<void(const json&)> walk = [&](const json& n) {
      const std::string t = n.is_object() && n.contains("type") && n["type"].is_string() ? n["type"].get<std::string>() : "?";
      if (t == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
        for (const auto& c : n["normalizers"]) walk(c);
      } else if (t == "NFC") {
        v.nfc = true;
      } else if (t != "Prepend" && t != "Replace" && unknown.empty()) {
        unknown = t;
      }
    };
    walk(j["normalizer"]);
    if (!unknown.empty()) return bad("normalizer " + unknown + " is not supported (NFC, Prepend and Replace are)");
  }

  // Pieces by id; added tokens may extend the vocabulary.
  std::vector<std::string> pieces;
  std::vector<token_kind> kinds;
  auto place = [&](int64_t id, std::string piece, token_kind kind) -> status {
    if (id < 0 || id >= max_ids) return bad("token id " + std::to_string(id) + " is out of range");
    if (static_cast<size_t>(id) >= pieces.size()) {
      pieces.resize(id + 1);
      kinds.resize(id + 1, token_kind::unused);
    }
    pieces[id] = std::move(piece);
    kinds[id] = kind;
    return ok();
  };
  const std::string space_mark = "\xe2\x96\x81";  // U+2581
  for (const auto& [stored, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) return bad("model.vocab[" + stored + "] is not an id");
    std::string piece = stored;
    token_kind kind = token_kind::normal;
    if (v.style == vocab_style::byte_level) {
      auto bytes = byte_level_decode(stored);
      if (!bytes) return bad("model.vocab: '" + stored + "' is not byte-level text");
      piece = std::move(*bytes);
    } else {
      for (size_t at = piece.find(space_mark); at != std::string::npos; at = piece.find(space_mark, at + 1))
        piece.replace(at, space_mark.size(), 1, ' ');
      unsigned b;
      char tail;
      if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%2X>%c", &b, &tail) == 1) kind = token_kind::byte;
    }
    if (auto st = place(id.get<int64_t>(), std::move(piece), kind); !st) return st.err();
  }
  std::unordered_map<std::string, int32_t> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || token_text(t).empty())
        return bad("an added token has no id or content");
      const bool special = t.contains("special") && t["special"].is_boolean() && t["special"].get<bool>();
      if (auto st = place(t["id"].get<int64_t>(), token_text(t), special ? token_kind::control : token_kind::user_defined); !st)
        return st.err();
      added[token_text(t)] = static_cast<int32_t>(t["id"].get<int64_t>());
    }
  if (vocab_size > 0) {
    if (static_cast<int32_t>(pieces.size()) > vocab_size)
      return bad(std::to_string(pieces.size()) + " token ids, more than the model's " + std::to_string(vocab_size));
    pieces.resize(vocab_size);
    kinds.resize(vocab_size, token_kind::unused);
  }
  for (size_t i = 0; i < pieces.size(); ++i)
    if (kinds[i] == token_kind::unused && pieces[i].empty()) pieces[i] = "<unused_" + std::to_string(i) + ">";
  v.pieces = std::move(pieces);
  v.kinds = std::move(kinds);
  // (SentencePiece-like: pieces no merge makes merge last.)
  const size_t num_merges = m.contains("merges") && m["merges"].is_array() ? m["merges"].size() : 0;
  v.scores.assign(v.pieces.size(), -static_cast<float>(num_merges + 1));

  // Merges: "a b" strings or [a, b] pairs, by rank.
  std::unordered_map<std::string, int32_t> ids;
  for (int32_t i = 0; i < v.size(); ++i)
    if (v.kinds[i] == token_kind::normal || v.kinds[i] == token_kind::byte) ids.emplace(v.pieces[i], i);
  auto as_piece = [&](const std::string& stored) -> std::optional<std::string> {
    if (v.style == vocab_style::byte_level) return byte_level_decode(stored);
    std::string p = stored;
    for (size_t at = p.find(space_mark); at != std::string::npos; at = p.find(space_mark, at + 1)) p.replace(at, space_mark.size(), 1, ' ');
    return p;
  };
  if (m.contains("merges") && m["merges"].is_array()) {
    const json& merges = m["merges"];
    for (size_t r = 0; r < merges.size(); ++r) {
      std::string a, b;
      if (merges[r].is_string()) {
        const std::string s = merges[r].get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) return bad("merge " + std::to_string(r) + " '" + s + "' is not two pieces");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (merges[r].is_array() && merges[r].size() == 2 && merges[r][0].is_string() && merges[r][1].is_string()) {
        a = merges[r][0].get<std::string>();
        b = merges[r][1].get<std::string>();
      } else {
        return bad("merge " + std::to_string(r) + " is neither \"a b\" nor [a, b]");
      }
      auto pa = as_piece(a), pb = as_piece(b);
      if (!pa || !pb) return bad("merge " + std::to_string(r) + " is not byte-level text");
      auto ia = ids.find(*pa), ib = ids.find(*pb), im = ids.find(*pa + *pb);
      if (ia == ids.end() || ib == ids.end() || im == ids.end())
        return bad("merge " + std::to_string(r) + " '" + a + " " + b + "' names a piece the vocabulary lacks");
      if (v.style == vocab_style::byte_level)
        v.merges.emplace_back(ia->second, ib->second);
      else
        v.scores[im->second] = std::max(v.scores[im->second], -static_cast<float>(r));  // earlier merges score higher
    }
  }

  if (v.style == vocab_style::byte_level) {
    v.ignore_merges = m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>();
    if (!splits.empty()) {
      const json& pat = (*splits[0]).contains("pattern") ? (*splits[0])["pattern"] : json();
      if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
        return bad("the pre-tokenizer splits on something other than a Regex pattern (not supported)");
      v.pattern = pat["Regex"].get<std::string>();
    } else {
      v.pattern = gpt2_pattern;
    }
  } else {
    // SentencePiece's dummy prefix: a Prepend normalizer or a Metaspace pre-tokenizer.
    std::vector<const json*> prepend, metaspace;
    if (j.contains("normalizer")) collect(j["normalizer"], "Prepend", prepend);
    if (j.contains("pre_tokenizer")) collect(j["pre_tokenizer"], "Metaspace", metaspace);
    v.add_space_prefix = !prepend.empty() ||
                         (!metaspace.empty() && (!metaspace[0]->contains("prepend_scheme") ||
                                                 (*metaspace[0])["prepend_scheme"] != "never"));
  }

  // Special ids: tokenizer_config.json where there is one, else the usual names.
  auto id_of = [&](const std::string& text) -> int32_t {
    if (auto it = added.find(text); it != added.end()) return it->second;
    if (auto it = ids.find(text); it != ids.end()) return it->second;
    return -1;
  };
  int32_t bos = -1, eos = -1;
  std::optional<bool> add_bos;
  if (!config_json.empty()) {
    auto c = parse_object(config_json, (fs::path(path).parent_path() / "tokenizer_config.json").string());
    if (!c) return c.err();
    if (c->contains("bos_token")) bos = id_of(token_text((*c)["bos_token"]));
    if (c->contains("eos_token")) eos = id_of(token_text((*c)["eos_token"]));
    if (c->contains("add_bos_token") && (*c)["add_bos_token"].is_boolean()) add_bos = (*c)["add_bos_token"].get<bool>();
  }
  for (const char* name : {"<|begin_of_text|>", "<s>"})
    if (bos < 0) bos = id_of(name);
  for (const char* name : {"<|eot_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>", "</s>"})
    if (eos < 0) eos = id_of(name);
  if (eos < 0) return bad("no end-of-text token (eos_token in tokenizer_config.json, or a known name)");
  // The model's text starts with BOS where the config says so, else where the post-
  // processor's template does (a SentencePiece-like vocabulary always).
  if (!add_bos) {
    bool templated = false;
    if (j.contains("post_processor") && j["post_processor"].is_object() && j["post_processor"].dump().find("TemplateProcessing") != std::string::npos)
      templated = bos >= 0 && j["post_processor"].dump().find(json(v.pieces[bos]).dump()) != std::string::npos;
    add_bos = v.style == vocab_style::sentencepiece ? bos >= 0 : templated;
  }
  v.add_bos = *add_bos && bos >= 0;
  v.bos_id = bos >= 0 ? bos : eos;
  v.eos_id = eos;
  v.unk_id = m.contains("unk_token") ? std::max(0, id_of(token_text(m["unk_token"]))) : 0;
  if (auto e = validate(v)) return bad(*e);
  return v;
}

std::string chat_template_beside(const std::string& tokenizer_json_path) {
  const fs::path config = fs::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  if (!fs::exists(config)) return "";
  auto c = read_json(config);
  if (!c || !c->contains("chat_template")) return "";
  const json& t = (*c)["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const auto& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") && named["template"].is_string())
        return named["template"].get<std::string>();
  return "";
}

}  // namespace troupe
