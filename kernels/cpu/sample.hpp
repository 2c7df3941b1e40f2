// sample: one random draw from logits[vocab], the definition the engine's sampler uses
// (engine/sample/sampler.hpp) and the reference of the GPU's sampling kernel
// (kernels/cuda/sample.hpp).
//
// Probabilities are exp((logit - top logit) / temperature), so the most likely token has
// 1. Without truncation the draw walks them in index order. With it, the candidates are
// the tokens of probability >= min_p (min-p), sorted by probability (ties: lower index
// first); the first top_k of them are kept (top-k, 0: all), then the shortest prefix whose
// mass reaches top_p times the whole distribution's (top-p, 1: all); the draw walks those
// in that order. u in [0, 1) picks the point of the kept mass the draw lands on.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace troupe {

struct truncation {
  float temperature = 1.0f;  // > 0
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// Buffers a caller keeps between draws, so that drawing allocates nothing.
struct sample_scratch {
  std::vector<float> probs;
  std::vector<std::pair<float, int32_t>> candidates;
};

int32_t sample(const float* logits, int32_t vocab, const truncation& t, float u, sample_scratch& scratch);

// The distribution sample() draws from, as probabilities: probs[vocab] sums to 1 over the
// tokens truncation keeps and is 0 elsewhere. Temperature 0: 1 at the first largest logit.
void distribution(const float* logits, int32_t vocab, const truncation& t, float* probs, sample_scratch& scratch);

// A draw from weights probs[vocab] (>= 0, not all 0; they need not sum to 1), walking them
// in index order: the token where u in [0, 1) times their sum falls.
int32_t draw(const float* probs, int32_t vocab, float u);

// How one row's token is chosen where its logits are (a GPU shard's device): temperature 0
// takes the first largest logit (kernels/cpu/argmax.hpp), anything else sample() with u.
struct token_choice {
  truncation how;
  float u = 0.0f;  // the row's draw from its request's random stream

  static token_choice greedy() { return {{0.0f, 0, 1.0f, 0.0f}, 0.0f}; }
};

// The token `c` chooses from logits[vocab], on the CPU.
int32_t choose(const float* logits, int32_t vocab, const token_choice& c, sample_scratch& scratch);

}  // namespace troupe
