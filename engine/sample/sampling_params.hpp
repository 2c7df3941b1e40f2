// sampling_params: how one request turns logits into tokens. Defaults sample the model's
// distribution unchanged; temperature 0 means greedy (argmax).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

// A fixed amount added to one token's logit before every choice (OpenAI's logit_bias).
struct token_bias {
  int32_t token = 0;
  float bias = 0.0f;  // in [-100, 100]: -100 in effect bans the token, 100 all but forces it
  bool operator==(const token_bias&) const = default;
};

struct sampling_params {
  float temperature = 1.0f;         // 0: greedy; otherwise logits are divided by it
  int32_t top_k = 0;                // keep the k most likely tokens; 0: all
  float top_p = 1.0f;               // keep the smallest set whose mass reaches p; 1: all
  float min_p = 0.0f;               // drop tokens below min_p times the top probability
  float repetition_penalty = 1.0f;  // >1 discourages every token already in the sequence
  float frequency_penalty = 0.0f;   // subtracted once per earlier occurrence in the output
  float presence_penalty = 0.0f;    // subtracted once if the token occurred in the output
  uint64_t seed = 0;                // the request's own random stream
  int32_t logprobs = -1;            // -1: none; 0: the chosen token's; n: also the top n
  std::vector<token_bias> logit_bias;  // each token at most once
};

inline constexpr size_t max_logit_bias = 1024;  // entries of logit_bias

// Checks ranges (not token ids against a vocabulary); returns the first problem in words.
std::optional<std::string> validate(const sampling_params& p);

}  // namespace troupe
