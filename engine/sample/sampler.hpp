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

  // The distribution sample() would draw the next token from, as probabilities (the
  // penalties and biases applied to logits in place, as sample() does): probs[vocab], 0
  // outside what truncation keeps; greedy: 1 at the argmax. Records nothing.
  void distribution(float* logits, int32_t vocab, float* probs);

  // Speculative decoding: checks tokens `draft` proposed to follow the sequence against the
  // target's logits, rows [draft.size() + 1][vocab], row j following the sequence and
  // draft[0 .. j) (penalties and biases applied in place). q: [draft.size()][vocab], the
  // distribution each drafted token was drawn from, or empty when the proposer chose them
  // without one (as certain). Returns the tokens that follow, 1 to draft.size() + 1 of
  // them, recorded as sample() records: the accepted drafts, then one more.
  //   greedy: drafts while they equal the argmax, then the argmax;
  //   random: draft j is accepted with probability min(1, p(d) / q(d)), p the distribution
  //           sample() would draw from; at the first rejection, a token from the normalized
  //           max(0, p - q); after every draft accepted, a draw from the last row. The
  //           tokens are distributed exactly as sample() step by step would give them.
  std::vector<sample_result> verify(float* rows, int32_t vocab, std::span<const int32_t> draft,
                                    std::span<const float> q);

  // Token trees: the drafts are a tree's nodes, draft i's parent parent[i] < i (-1: a child
  // of the sequence's end; siblings' tokens distinct); rows [draft.size() + 1][vocab], row 0
  // following the sequence, row i + 1 following the sequence and draft i's path (its
  // ancestors, then itself). Walks down from the sequence's end and returns the tokens
  // that follow, recorded as sample() records them: the accepted path's drafts, then one
  // more; `path` gets the accepted drafts' indices.
  //   greedy: the child whose token is the argmax, while there is one; then the argmax;
  //   random: the children in order, each accepted with its probability under the
  //           distribution left when the siblings before it are taken out (their
  //           probabilities zeroed, the rest renormalized); when none is, a draw from
  //           what is left. Each token is distributed exactly as sample() gives it.
  std::vector<sample_result> verify_tree(float* rows, int32_t vocab, std::span<const int32_t> draft,
                                         std::span<const int32_t> parent, std::vector<int32_t>& path);

  // The k most likely next tokens as sample() would weigh them (penalties and biases
  // applied to logits in place), most likely first. Records nothing.
  std::vector<int32_t> ranked(float* logits, int32_t vocab, int32_t k) const;

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
  // The chosen token's log-probability (and the top ones) from adjusted logits, as asked.
  void add_logprobs(const float* logits, int32_t vocab, sample_result& r);
  void record(int32_t token) {
    ++seen_[token];
    ++output_[token];
  }

  sampling_params p_;
  rng rng_;
  std::unordered_map<int32_t, int32_t> seen_;    // prompt + output, for repetition
  std::unordered_map<int32_t, int32_t> output_;  // output only, for frequency/presence
  sample_scratch scratch_;  // the draw's buffers, and the top log-probabilities' before it
  std::vector<float> p_row_, residual_;  // verify()'s and verify_tree()'s
  std::vector<int32_t> children_;        // verify_tree()'s: a node's
};

}  // namespace troupe
