#include "engine/model/config.hpp"

#include <cmath>
#include <sstream>

namespace troupe {

int64_t model_config::num_params() const {
  const int64_t d = dim, h = hidden_dim, kv = kv_dim();
  const int64_t per_layer = d * d * 2 + d * kv * 2 + d * h * 3 + 2 * d;
  return per_layer * num_layers + int64_t{vocab_size} * d + d;
}

std::optional<std::string> validate(model_config& c) {
  auto bad = [](const char* field, int64_t v, const char* rule) {
    return std::string(field) + " = " + std::to_string(v) + " " + rule;
  };
  if (c.dim <= 0 || c.dim > max_dim) return bad("dim", c.dim, "is out of range");
  if (c.hidden_dim <= 0 || c.hidden_dim > 4 * max_dim)
    return bad("hidden_dim", c.hidden_dim, "is out of range");
  if (c.num_layers <= 0 || c.num_layers > max_layers)
    return bad("num_layers", c.num_layers, "is out of range");
  if (c.num_heads <= 0 || c.num_heads > c.dim) return bad("num_heads", c.num_heads, "is out of range");
  if (c.num_kv_heads <= 0 || c.num_kv_heads > c.num_heads)
    return bad("num_kv_heads", c.num_kv_heads, "must be in 1..num_heads");
  if (c.num_heads % c.num_kv_heads != 0)
    return bad("num_kv_heads", c.num_kv_heads, "must divide num_heads");
  if (c.dim % c.num_heads != 0) return bad("num_heads", c.num_heads, "must divide dim");
  if (c.head_dim == 0) c.head_dim = c.dim / c.num_heads;
  if (c.head_dim != c.dim / c.num_heads) return bad("head_dim", c.head_dim, "must be dim / num_heads");
  if (c.rope_dim == 0) c.rope_dim = c.head_dim;
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    return bad("rope_dim", c.rope_dim, "must be even and at most head_dim");
  if (c.vocab_size <= 0 || c.vocab_size > max_vocab)
    return bad("vocab_size", c.vocab_size, "is out of range");
  if (c.max_seq_len <= 0 || c.max_seq_len > max_context)
    return bad("max_seq_len", c.max_seq_len, "is out of range");
  if (!(c.rope_base > 1.0f) || !std::isfinite(c.rope_base))
    return "rope_base = " + std::to_string(c.rope_base) + " must be a finite number above 1";
  if (!(c.rms_eps > 0.0f) || !(c.rms_eps < 1.0f))
    return "rms_eps = " + std::to_string(c.rms_eps) + " must be in (0, 1)";
  return std::nullopt;
}

std::string describe(const model_config& c) {
  std::ostringstream os;
  os << "dim " << c.dim << ", hidden " << c.hidden_dim << ", " << c.num_layers << " layers, "
     << c.num_heads << " heads (" << c.num_kv_heads << " kv), vocab " << c.vocab_size
     << ", context " << c.max_seq_len << ", " << c.num_params() << " parameters";
  return os.str();
}

}  // namespace troupe
