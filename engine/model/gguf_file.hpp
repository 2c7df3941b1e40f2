// gguf_file: a parsed GGUF (version 2 or 3) file: its metadata and tensor directory, with
// every count, length, type and offset checked against the file before use. Values stay
// in the mapped file; arrays are read on demand.
//
// Reference for the format: the GGUF specification (little-endian; strings are a u64
// length then bytes; tensor data begins at the first multiple of general.alignment after
// the directory).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/util/expected.hpp"
#include "engine/util/mapped_file.hpp"
#include "kernels/common/dtype.hpp"

namespace troupe {

enum class gguf_type : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

struct gguf_value {
  gguf_type type = gguf_type::u8;
  // scalars
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  // arrays: element type, count, and the offset of the first element in the file
  gguf_type elem_type = gguf_type::u8;
  uint64_t count = 0;
  size_t offset = 0;
};

struct gguf_tensor {
  std::string name;
  std::vector<uint64_t> dims;  // dims[0] is the innermost (contiguous) dimension
  uint32_t ggml_type = 0;
  uint64_t offset = 0;         // from the start of the data section
  const uint8_t* data = nullptr;
  uint64_t num_bytes = 0;
};

class gguf_file {
 public:
  static expected<gguf_file> parse(mapped_file file);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  const gguf_value* find(const std::string& key) const;
  const gguf_tensor* tensor(const std::string& name) const;
  const std::vector<gguf_tensor>& tensors() const { return tensors_; }

  // Typed metadata getters: the value if the key exists with a compatible type.
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  expected<std::vector<std::string>> get_string_array(const std::string& key) const;
  expected<std::vector<double>> get_number_array(const std::string& key) const;

  mapped_file take_file() { return std::move(file_); }

 private:
  mapped_file file_;
  uint32_t version_ = 0;
  std::map<std::string, gguf_value> kv_;
  std::vector<gguf_tensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// ggml type ids of the tensor types troupe reads.
inline constexpr uint32_t ggml_f32 = 0, ggml_f16 = 1, ggml_q8_0 = 8, ggml_bf16 = 30;
std::optional<dtype> dtype_of_ggml(uint32_t ggml_type);

}  // namespace troupe
