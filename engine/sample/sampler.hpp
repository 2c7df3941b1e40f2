// sampler: one request's token choice, step after step. Owns the request's random stream
// and the token counts its penalties need, so a seeded request draws the same tokens
// alone or in any batch.
//
// Order of operations on the logits of a step:
//   1. penalties: repetition (over prompt and output: positive logits divided by it,
//      negative multiplied), frequency and presence (over the output only, as OpenAI's);
//      then each logit_bias entry added to its token's logit;
//   2. log-probabilities, if asked, from these logits (before temperature and truncation);
//   3. temperature 0: argmax. Otherwise softmax(logits / temperature), then top-k, top-p
//      and min-p truncation, and a draw from what is left.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/sample/rng.hpp"
#include "engine/sample/sampling_params.hpp"
#include "kernels/cpu/sample.hpp"

namespace troupe {

struct token_logprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct sample_result {
  int32_t token = 0;
  float logprob = 0.0f;             // of the chosen token, if logprobs >= 0
  std::vector<token_logprob> top;   // the most likely tokens, if logprobs > 0
};

class sampler {
 public:
  sampler(const sampling_params& p, std::span<const int32_t> prompt);

  // Chooses the next token from logits [vocab] (penalties and biases are applied in place) and
  // records it.
  sample_result sample(float* logits, int32_t vocab);
  // Records `token` as if sample() had chosen it: the counts its penalties need, and one
  // draw from the random stream when sampling is random. A request resumed elsewhere with
  // its output so far replays it and then samples as it would have.
  void replay(int32_t token);

  const sampling_params& params() const { return p_; }

  // Whether the next choice needs nothing but the logits (no penalties, biases or
  // log-probabilities), so that whoever holds them can make it: then next_choice() says
  // how, with the uniform sample() would draw (not drawn yet; replay(token) draws it when
  // the token comes back, so a step that is lost and recomputed draws the same).
  bool needs_only_logits() const;
  token_choice next_choice() const;

 private:
  truncation how() const { return {p_.temperature, p_.top_k, p_.top_p, p_.min_p}; }
  void adjust_logits(float* logits, int32_t vocab) const;
  int32_t draw(const float* logits, int32_t vocab);

  sampling_params p_;
  rng rng_;
  std::unordered_map<int32_t, int32_t> seen_;    // prompt + output, for repetition
  std::unordered_map<int32_t, int32_t> output_;  // output only, for frequency/presence
  sample_scratch scratch_;  // the draw's buffers, and the top log-probabilities' before it
};

}  // namespace troupe
