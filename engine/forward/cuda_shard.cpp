#include "engine/forward/cuda_shard.hpp"

namespace troupe {

expected<int> cuda_device_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 8 ||
      device.find_first_not_of("0123456789", 5) != std::string::npos)
    return error{"device '" + device + "' is not cuda:N"};
  return std::stoi(device.substr(5));
}

#if !defined(TROUPE_HAVE_CUDA)
status cuda_device_usable(int device) {
  return error{"device cuda:" + std::to_string(device) +
               ": this build of troupe has no CUDA (configure where nvcc is found, or with -DTROUPE_CUDA=ON)"};
}

expected<std::unique_ptr<forward_shard>> make_cuda_shard(const model&, const shard_spec&, const cuda_shard_options& o) {
  return error{"device cuda:" + std::to_string(o.device) +
               ": this build of troupe has no CUDA (configure where nvcc is found, or with -DTROUPE_CUDA=ON)"};
}
#endif

}  // namespace troupe
