#include "engine/model/safetensors_file.hpp"

#include <cstring>

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

using json = nlohmann::json;

// The largest header accepted: real files hold a few hundred bytes per tensor.
constexpr uint64_t max_header = uint64_t{100} << 20;

expected<dtype> dtype_named_st(const std::string& name) {
  if (name == "F32") return dtype::f32;
  if (name == "F16") return dtype::f16;
  if (name == "BF16") return dtype::bf16;
  return error{"dtype " + name + " is not supported (F32, F16 and BF16 are)"};
}

}  // namespace

const safetensors_tensor* safetensors_file::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

expected<safetensors_file> safetensors_file::parse(mapped_file file) {
  const std::string path = file.path();
  auto bad = [&](const std::string& what) { return error{path + ": " + what}; };
  if (file.size() < 8) return bad("too short for a safetensors header (" + std::to_string(file.size()) + " bytes)");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > max_header || n > file.size() - 8)
    return bad("header of " + std::to_string(n) + " bytes does not fit the file of " + std::to_string(file.size()));
  const char* begin = reinterpret_cast<const char*>(file.data()) + 8;
  const json header = json::parse(begin, begin + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("the header is not a JSON object");
  const uint8_t* data = file.data() + 8 + n;
  const uint64_t data_size = file.size() - 8 - n;

  safetensors_file f;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "tensor " + name + ": ";
    if (!t.is_object()) return bad(where + "not an object");
    if (!t.contains("dtype") || !t["dtype"].is_string()) return bad(where + "no dtype");
    auto type = dtype_named_st(t["dtype"].get<std::string>());
    if (!type) return bad(where + type.err().message);
    if (!t.contains("shape") || !t["shape"].is_array()) return bad(where + "no shape");
    safetensors_tensor st;
    st.type = *type;
    uint64_t count = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 32)) return bad(where + "a dimension is not a size");
      const uint64_t dim = d.get<uint64_t>();
      st.shape.push_back(static_cast<int64_t>(dim));
      // Checked before multiplying: [2^32, 2^32] would wrap to 0 elements.
      if (dim != 0 && count > (uint64_t{1} << 40) / dim) return bad(where + "too many elements");
      count *= dim;
    }
    const auto& off = t.contains("data_offsets") ? t["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return bad(where + "data_offsets is not a pair of offsets");
    const uint64_t lo = off[0].get<uint64_t>(), hi = off[1].get<uint64_t>();
    if (lo > hi || hi > data_size)
      return bad(where + "bytes " + std::to_string(lo) + ".." + std::to_string(hi) + " are outside the data (" +
                 std::to_string(data_size) + " bytes)");
    const uint64_t elem = st.type == dtype::f32 ? 4 : 2;
    if (hi - lo != count * elem)
      return bad(where + std::to_string(hi - lo) + " bytes for " + std::to_string(count) + " elements of " +
                 std::to_string(elem) + " bytes");
    st.data = data + lo;
    if (reinterpret_cast<uintptr_t>(st.data) % elem != 0)
      return bad(where + "data at byte " + std::to_string(8 + n + lo) + " is not aligned to its element size");
    st.num_bytes = static_cast<int64_t>(hi - lo);
    f.tensors_.emplace(name, std::move(st));
  }
  f.file_ = std::move(file);
  return f;
}

}  // namespace troupe
