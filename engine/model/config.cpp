#include "engine/model/config.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

namespace troupe {

const char* family_name(model_family f) {
  switch (f) {
    case model_family::mistral: return "mistral";
    case model_family::qwen2: return "qwen2";
    default: return "llama";
  }
}

const char* rope_scaling_name(rope_scaling_type t) {
  switch (t) {
    case rope_scaling_type::linear: return "linear";
    case rope_scaling_type::llama3: return "llama3";
    case rope_scaling_type::yarn: return "yarn";
    default: return "none";
  }
}

int64_t model_config::num_params() const {
  const int64_t d = dim, h = hidden_dim, q = q_dim(), kv = kv_dim();
  const int64_t per_layer = d * q * 2 + d * kv * 2 + d * h * 3 + 2 * d + (qkv_bias ? q + 2 * kv : 0);
  return per_layer * num_layers + int64_t{vocab_size} * d + d;
}

std::vector<float> rope_frequencies(const model_config& c) {
  const int32_t half = c.rope_dim / 2;
  const float dims = static_cast<float>(c.rope_dim);
  std::vector<float> f(half);
  for (int32_t i = 0; i < half; ++i) f[i] = 1.0f / powf(c.rope_base, static_cast<float>(2 * i) / dims);
  const rope_scaling& s = c.rope_scale;
  const float two_pi = 2.0f * std::numbers::pi_v<float>;
  switch (s.type) {
    case rope_scaling_type::none: break;
    case rope_scaling_type::linear:
      for (float& x : f) x /= s.factor;
      break;
    case rope_scaling_type::llama3: {
      const float old = static_cast<float>(s.original_context);
      const float low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
      for (float& x : f) {
        const float wavelen = two_pi / x;
        if (wavelen > low_wavelen) {
          x /= s.factor;
        } else if (wavelen >= high_wavelen) {
          const float smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          x = (1.0f - smooth) * x / s.factor + smooth * x;
        }
      }
      break;
    }
    case rope_scaling_type::yarn: {
      // The pair index at which a frequency makes `rotations` turns over the original context.
      auto correction = [&](float rotations) {
        return dims * std::log(static_cast<float>(s.original_context) / (rotations * two_pi)) /
               (2.0f * std::log(c.rope_base));
      };
      const float low = std::max(std::floor(correction(s.beta_fast)), 0.0f);
      const float high = std::min(std::ceil(correction(s.beta_slow)), dims - 1.0f);
      const float span = high == low ? 0.001f : high - low;
      for (int32_t i = 0; i < half; ++i) {
        const float ramp = std::clamp((static_cast<float>(i) - low) / span, 0.0f, 1.0f);
        const float keep = 1.0f - ramp;  // weight of the original (extrapolated) frequency
        f[i] = f[i] / s.factor * (1.0f - keep) + f[i] * keep;
      }
      break;
    }
  }
  if (!c.rope_freq_factors.empty())
    for (int32_t i = 0; i < half; ++i) f[i] /= c.rope_freq_factors[i];
  return f;
}

float rope_attention_factor(const model_config& c) {
  const rope_scaling& s = c.rope_scale;
  if (s.type != rope_scaling_type::yarn) return 1.0f;
  if (s.attention_factor > 0.0f) return s.attention_factor;
  return s.factor <= 1.0f ? 1.0f : 0.1f * std::log(s.factor) + 1.0f;
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
  if (c.head_dim == 0) {
    if (c.dim % c.num_heads != 0) return bad("num_heads", c.num_heads, "must divide dim (or head_dim be given)");
    c.head_dim = c.dim / c.num_heads;
  }
  if (c.head_dim <= 0 || c.head_dim > 1024 || c.head_dim % 2 != 0)
    return bad("head_dim", c.head_dim, "must be even and in 2..1024");
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
  if (c.sliding_window < 0) return bad("sliding_window", c.sliding_window, "must be 0 (none) or more");
  const rope_scaling& s = c.rope_scale;
  if (s.type != rope_scaling_type::none) {
    const std::string type = rope_scaling_name(s.type);
    if (!(s.factor >= 1.0f) || !std::isfinite(s.factor))
      return "rope scaling (" + type + ") factor = " + std::to_string(s.factor) + " must be a finite number of at least 1";
    if (s.type != rope_scaling_type::linear && (s.original_context <= 0 || s.original_context > max_context))
      return "rope scaling (" + type + ") original context = " + std::to_string(s.original_context) + " is out of range";
    if (s.type == rope_scaling_type::llama3 &&
        !(s.low_freq_factor > 0.0f && s.high_freq_factor > s.low_freq_factor && std::isfinite(s.high_freq_factor)))
      return "rope scaling (llama3) needs 0 < low_freq_factor < high_freq_factor, not " +
             std::to_string(s.low_freq_factor) + " and " + std::to_string(s.high_freq_factor);
    if (s.type == rope_scaling_type::yarn &&
        !(s.beta_fast > 0.0f && s.beta_slow > 0.0f && std::isfinite(s.beta_fast) && std::isfinite(s.beta_slow) &&
          s.attention_factor >= 0.0f && std::isfinite(s.attention_factor)))
      return "rope scaling (yarn) needs positive beta_fast and beta_slow and a non-negative attention_factor";
  }
  if (!c.rope_freq_factors.empty()) {
    if (static_cast<int32_t>(c.rope_freq_factors.size()) != c.rope_dim / 2)
      return "rope frequency factors: " + std::to_string(c.rope_freq_factors.size()) + " of them, rope_dim / 2 = " +
             std::to_string(c.rope_dim / 2) + " needed";
    for (float f : c.rope_freq_factors)
      if (!(f > 0.0f) || !std::isfinite(f)) return "rope frequency factors must be positive and finite";
  }
  return std::nullopt;
}

std::string describe(const model_config& c) {
  std::ostringstream os;
  os << "dim " << c.dim << ", hidden " << c.hidden_dim << ", " << c.num_layers << " layers, "
     << c.num_heads << " heads (" << c.num_kv_heads << " kv), vocab " << c.vocab_size
     << ", context " << c.max_seq_len << ", " << c.num_params() << " parameters";
  if (c.family != model_family::llama) os << ", " << family_name(c.family);
  if (c.qkv_bias) os << ", qkv bias";
  if (c.sliding_window > 0) os << ", sliding window " << c.sliding_window;
  if (c.rope_scale.type != rope_scaling_type::none)
    os << ", rope scaling " << rope_scaling_name(c.rope_scale.type) << " x" << c.rope_scale.factor;
  return os.str();
}

}  // namespace troupe
