#include "engine/forward/tp_slice.hpp"

namespace troupe {

std::optional<std::string> check_tp_split(const model_config& c, int32_t n, int32_t gs) {
  if (n < 1) return "tensor-parallel size " + std::to_string(n) + " must be at least 1";
  if (c.num_heads % n != 0 || c.num_kv_heads % n != 0)
    return std::to_string(c.num_heads) + " heads and " + std::to_string(c.num_kv_heads) +
           " KV heads cannot be split " + std::to_string(n) + " ways";
  if (c.hidden_dim % n != 0)
    return "FFN width " + std::to_string(c.hidden_dim) + " cannot be split " + std::to_string(n) + " ways";
  if (gs > 0 && ((c.num_heads / n) * c.head_dim % gs != 0 || (c.hidden_dim / n) % gs != 0))
    return "a " + std::to_string(n) + "-way split would cut Q8_0 groups of " + std::to_string(gs);
  return std::nullopt;
}

}  // namespace troupe
