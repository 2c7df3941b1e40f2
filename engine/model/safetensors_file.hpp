// safetensors_file: one parsed safetensors file (Hugging Face's weight format): its
// tensor directory, every dtype, shape and byte range checked against the file before
// use. Tensors stay in the mapped file.
//
// The format: a little-endian u64 N, then N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the bytes after the
// header; row-major, the last dimension contiguous), and an optional "__metadata__"
// object of strings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/util/expected.hpp"
#include "engine/util/mapped_file.hpp"
#include "kernels/common/dtype.hpp"

namespace troupe {

struct safetensors_tensor {
  dtype type = dtype::f32;      // F32, F16 or BF16
  std::vector<int64_t> shape;   // outermost first
  const uint8_t* data = nullptr;
  int64_t num_bytes = 0;
};

class safetensors_file {
 public:
  static expected<safetensors_file> parse(mapped_file file);

  const std::string& path() const { return file_.path(); }
  const safetensors_tensor* tensor(const std::string& name) const;
  const std::map<std::string, safetensors_tensor>& tensors() const { return tensors_; }
  mapped_file take_file() { return std::move(file_); }

 private:
  mapped_file file_;
  std::map<std::string, safetensors_tensor> tensors_;
};

}  // namespace troupe
