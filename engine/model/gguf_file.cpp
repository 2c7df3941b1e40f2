#include "engine/model/gguf_file.hpp"

#include "engine/util/byte_reader.hpp"

namespace troupe {

namespace {

constexpr uint64_t max_string = 1 << 20;   // a single key or value string
constexpr uint64_t max_dims = 4;
constexpr int max_array_depth = 3;

int scalar_size(gguf_type t) {
  switch (t) {
    case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
    case gguf_type::u16: case gguf_type::i16: return 2;
    case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
    case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: return 8;
    default: return 0;
  }
}

bool known_type(uint32_t t) { return t <= 12; }

bool read_string(byte_reader& r, std::string& out, const char* what) {
  uint64_t n = 0;
  if (!r.read(n, what)) return false;
  if (n > max_string) return r.fail(what, "string length " + std::to_string(n) + " is absurd");
  const uint8_t* p = nullptr;
  if (!r.bytes(n, p, what)) return false;
  out.assign(reinterpret_cast<const char*>(p), n);
  return true;
}

bool read_scalar(byte_reader& r, gguf_type t, gguf_value& v, const std::string& key) {
  switch (t) {
    case gguf_type::u8: { uint8_t x; if (!r.read(x, key)) return false; v.u = x; v.i = x; return true; }
    case gguf_type::i8: { int8_t x; if (!r.read(x, key)) return false; v.i = x; v.u = static_cast<uint64_t>(x); return true; }
    case gguf_type::u16: { uint16_t x; if (!r.read(x, key)) return false; v.u = x; v.i = x; return true; }
    case gguf_type::i16: { int16_t x; if (!r.read(x, key)) return false; v.i = x; v.u = static_cast<uint64_t>(x); return true; }
    case gguf_type::u32: { uint32_t x; if (!r.read(x, key)) return false; v.u = x; v.i = x; return true; }
    case gguf_type::i32: { int32_t x; if (!r.read(x, key)) return false; v.i = x; v.u = static_cast<uint64_t>(x); return true; }
    case gguf_type::u64: { uint64_t x; if (!r.read(x, key)) return false; v.u = x; v.i = static_cast<int64_t>(x); return true; }
    case gguf_type::i64: { int64_t x; if (!r.read(x, key)) return false; v.i = x; v.u = static_cast<uint64_t>(x); return true; }
    case gguf_type::f32: { float x; if (!r.read(x, key)) return false; v.f = x; return true; }
    case gguf_type::f64: { double x; if (!r.read(x, key)) return false; v.f = x; return true; }
    case gguf_type::boolean: {
      uint8_t x; if (!r.read(x, key)) return false;
      if (x > 1) return r.fail(key, "boolean value " + std::to_string(x));
      v.u = x; v.i = x; return true;
    }
    case gguf_type::string: return read_string(r, v.s, key.c_str());
    default: return r.fail(key, "unexpected value type");
  }
}

// Skips an array's elements, checking each against the file.
bool skip_array(byte_reader& r, gguf_type elem, uint64_t count, const std::string& key, int depth) {
  if (depth > max_array_depth) return r.fail(key, "arrays nested too deeply");
  if (const int sz = scalar_size(elem)) {
    if (count > r.remaining() / static_cast<uint64_t>(sz))
      return r.fail(key, "array of " + std::to_string(count) + " elements runs past the end of the file");
    return r.skip(count * static_cast<uint64_t>(sz), key);
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (elem == gguf_type::string) {
      uint64_t n = 0;
      if (!r.read(n, key)) return false;
      if (!r.skip(n, key)) return false;
    } else if (elem == gguf_type::array) {
      uint32_t t = 0;
      uint64_t c = 0;
      if (!r.read(t, key) || !r.read(c, key)) return false;
      if (!known_type(t)) return r.fail(key, "unknown array element type " + std::to_string(t));
      if (!skip_array(r, static_cast<gguf_type>(t), c, key, depth + 1)) return false;
    } else {
      return r.fail(key, "unknown array element type");
    }
  }
  return true;
}

uint64_t tensor_bytes(uint32_t type, uint64_t elems) {
  switch (type) {
    case ggml_f32: return elems * 4;
    case ggml_f16: case ggml_bf16: return elems * 2;
    case ggml_q8_0: return elems / 32 * 34;
    default: return 0;
  }
}

}  // namespace

std::optional<dtype> dtype_of_ggml(uint32_t t) {
  switch (t) {
    case ggml_f32: return dtype::f32;
    case ggml_f16: return dtype::f16;
    case ggml_bf16: return dtype::bf16;
    case ggml_q8_0: return dtype::q8_0;
    default: return std::nullopt;
  }
}

expected<gguf_file> gguf_file::parse(mapped_file file) {
  gguf_file g;
  byte_reader r(file.data(), file.size(), file.path());
  uint32_t magic = 0;
  uint64_t num_tensors = 0, num_kv = 0;
  r.read(magic, "magic");
  if (!r.failed() && magic != 0x46554747u)  // "GGUF"
    return error{file.path() + ": not a GGUF file (bad magic)"};
  r.read(g.version_, "version");
  if (!r.failed() && g.version_ != 2 && g.version_ != 3)
    return error{file.path() + ": GGUF version " + std::to_string(g.version_) +
                 " is not supported (2 and 3 are)"};
  r.read(num_tensors, "tensor count");
  r.read(num_kv, "metadata count");
  // Every entry takes at least 8 bytes; counts beyond that are corrupt.
  if (!r.failed() && (num_tensors > r.remaining() / 8 || num_kv > r.remaining() / 8))
    return error{file.path() + ": tensor count " + std::to_string(num_tensors) +
                 " or metadata count " + std::to_string(num_kv) + " exceeds the file size"};

  for (uint64_t k = 0; k < num_kv && !r.failed(); ++k) {
    std::string key;
    uint32_t type = 0;
    if (!read_string(r, key, "metadata key") || !r.read(type, "metadata type")) break;
    if (!known_type(type)) return error{file.path() + ": metadata '" + key + "' has unknown type " + std::to_string(type)};
    gguf_value v;
    v.type = static_cast<gguf_type>(type);
    if (v.type == gguf_type::array) {
      uint32_t et = 0;
      if (!r.read(et, key) || !r.read(v.count, key)) break;
      if (!known_type(et)) return error{file.path() + ": metadata '" + key + "' has unknown array element type " + std::to_string(et)};
      v.elem_type = static_cast<gguf_type>(et);
      v.offset = r.pos();
      if (!skip_array(r, v.elem_type, v.count, key, 1)) break;
    } else if (!read_scalar(r, v.type, v, key)) {
      break;
    }
    if (!g.kv_.emplace(key, std::move(v)).second)
      return error{file.path() + ": metadata key '" + key + "' appears twice"};
  }

  uint64_t alignment = 32;
  if (auto a = g.kv_.find("general.alignment"); a != g.kv_.end()) {
    alignment = a->second.u;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096)
      return error{file.path() + ": general.alignment " + std::to_string(alignment) + " is not a power of two up to 4096"};
  }

  for (uint64_t t = 0; t < num_tensors && !r.failed(); ++t) {
    gguf_tensor ti;
    uint32_t n_dims = 0;
    if (!read_string(r, ti.name, "tensor name") || !r.read(n_dims, "tensor dimension count")) break;
    if (n_dims == 0 || n_dims > max_dims)
      return error{file.path() + ": tensor '" + ti.name + "' has " + std::to_string(n_dims) + " dimensions"};
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t n = 0;
      if (!r.read(n, "tensor dimension")) break;
      if (n == 0 || n > (uint64_t{1} << 40) || elems > (uint64_t{1} << 40) / n)
        return error{file.path() + ": tensor '" + ti.name + "' has an absurd shape"};
      elems *= n;
      ti.dims.push_back(n);
    }
    r.read(ti.ggml_type, "tensor type");
    r.read(ti.offset, "tensor offset");
    if (r.failed()) break;
    if (!dtype_of_ggml(ti.ggml_type))
      return error{file.path() + ": tensor '" + ti.name + "' has type " + std::to_string(ti.ggml_type) +
                   ", which troupe does not read (it reads F32, F16, BF16 and Q8_0)"};
    if (ti.ggml_type == ggml_q8_0 && ti.dims[0] % 32 != 0)
      return error{file.path() + ": Q8_0 tensor '" + ti.name + "' has a row length not a multiple of 32"};
    ti.num_bytes = tensor_bytes(ti.ggml_type, elems);
    if (ti.offset % alignment != 0)
      return error{file.path() + ": tensor '" + ti.name + "' offset is not aligned"};
    if (!g.tensor_index_.emplace(ti.name, g.tensors_.size()).second)
      return error{file.path() + ": tensor '" + ti.name + "' appears twice"};
    g.tensors_.push_back(std::move(ti));
  }
  if (r.failed()) return error{r.error_message()};

  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  for (auto& ti : g.tensors_) {
    if (data_start > file.size() || ti.offset > file.size() - data_start ||
        ti.num_bytes > file.size() - data_start - ti.offset)
      return error{file.path() + ": tensor '" + ti.name + "' (" + std::to_string(ti.num_bytes) +
                   " bytes at data offset " + std::to_string(ti.offset) +
                   ") runs past the end of the file: truncated?"};
    ti.data = file.data() + data_start + ti.offset;
  }
  g.file_ = std::move(file);
  return g;
}

const gguf_value* gguf_file::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const gguf_tensor* gguf_file::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<int64_t> gguf_file::get_int(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  switch (v->type) {
    case gguf_type::u8: case gguf_type::u16: case gguf_type::u32:
    case gguf_type::i8: case gguf_type::i16: case gguf_type::i32: case gguf_type::i64:
      return v->i;
    case gguf_type::u64:
      if (v->u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<int64_t>(v->u);
    default: return std::nullopt;
  }
}

std::optional<double> gguf_file::get_float(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type == gguf_type::f32 || v->type == gguf_type::f64) return v->f;
  if (auto i = get_int(key)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string> gguf_file::get_string(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v || v->type != gguf_type::string) return std::nullopt;
  return v->s;
}

std::optional<bool> gguf_file::get_bool(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v || v->type != gguf_type::boolean) return std::nullopt;
  return v->u != 0;
}

expected<std::vector<std::string>> gguf_file::get_string_array(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v || v->type != gguf_type::array || v->elem_type != gguf_type::string)
    return error{path() + ": metadata '" + key + "' is missing or not an array of strings"};
  byte_reader r(file_.data(), file_.size(), path());
  r.seek(v->offset, key);
  std::vector<std::string> out(v->count);
  for (auto& s : out)
    if (!read_string(r, s, key.c_str())) return error{r.error_message()};
  return out;
}

expected<std::vector<double>> gguf_file::get_number_array(const std::string& key) const {
  const gguf_value* v = find(key);
  if (!v || v->type != gguf_type::array || scalar_size(v->elem_type) == 0 ||
      v->elem_type == gguf_type::boolean)
    return error{path() + ": metadata '" + key + "' is missing or not an array of numbers"};
  byte_reader r(file_.data(), file_.size(), path());
  r.seek(v->offset, key);
  std::vector<double> out(v->count);
  for (auto& d : out) {
    gguf_value e;
    if (!read_scalar(r, v->elem_type, e, key)) return error{r.error_message()};
    const bool is_float = v->elem_type == gguf_type::f32 || v->elem_type == gguf_type::f64;
    const bool is_unsigned = v->elem_type == gguf_type::u8 || v->elem_type == gguf_type::u16 ||
                             v->elem_type == gguf_type::u32 || v->elem_type == gguf_type::u64;
    d = is_float ? e.f : is_unsigned ? static_cast<double>(e.u) : static_cast<double>(e.i);
  }
  return out;
}

}  // namespace troupe
