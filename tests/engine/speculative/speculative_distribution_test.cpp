// Sampled output with speculative decoding is distributed as without it, in the engine
// loop: for every proposer, drafting chains and token trees, thousands of seeded draws of
// a request's first four tokens against as many draws with speculation off, the joint
// distribution of the first two, three and four tokens compared by a chi-square test of
// homogeneity (cells of expectation under 5 merged; the 1e-4 critical value). The
// bonus token is among them: with k 2, the third and fourth tokens include what the
// target drew after the drafts it accepted.
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "engine/serve/llm_engine.hpp"
#include "engine/speculative/heads.hpp"
#include "tests/engine/speculative/spec_test_support.hpp"
#include "tests/support/chi_square.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

constexpr int32_t draws = 2000;
constexpr int32_t tokens_drawn = 4;

// `draws` requests for the prompt with seeds from `first_seed`: each one's tokens.
std::vector<std::vector<int32_t>> draw_all(llm_engine& e, const std::vector<int32_t>& prompt, const sampling_params& s,
                                           uint64_t first_seed) {
  std::vector<request_params> reqs(draws);
  for (int32_t i = 0; i < draws; ++i) {
    reqs[static_cast<size_t>(i)].prompt = prompt;
    reqs[static_cast<size_t>(i)].max_tokens = tokens_drawn;
    reqs[static_cast<size_t>(i)].ignore_eos = true;
    reqs[static_cast<size_t>(i)].sampling = s;
    reqs[static_cast<size_t>(i)].sampling.seed = first_seed + static_cast<uint64_t>(i);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& [id, o] : spec_test::run_all(e, reqs)) {
    REQUIRE(o.tokens.size() == static_cast<size_t>(tokens_drawn));
    out.push_back(o.tokens);
  }
  return out;
}

// The two samples' joint distributions of their first `length` tokens, compared.
test::chi_square_result compare(const std::vector<std::vector<int32_t>>& a, const std::vector<std::vector<int32_t>>& b,
                                size_t length) {
  std::map<std::vector<int32_t>, std::pair<int64_t, int64_t>> cells;
  for (const auto& t : a) ++cells[{t.begin(), t.begin() + static_cast<ptrdiff_t>(length)}].first;
  for (const auto& t : b) ++cells[{t.begin(), t.begin() + static_cast<ptrdiff_t>(length)}].second;
  std::vector<int64_t> ca, cb;
  for (const auto& [key, c] : cells) {
    ca.push_back(c.first);
    cb.push_back(c.second);
  }
  return test::homogeneity(ca, cb);
}

}  // namespace

TEST_CASE("sampled output with speculation is distributed as without it: every proposer, chains and trees") {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  const model draft = spec_test::truncated_draft(l.m, 2);
  auto medusa = load_heads(test::data_path("stories260K-medusa.gguf"), l.m, &l.tok.vocab());
  auto eagle = load_heads(test::data_path("stories260K-eagle.gguf"), l.m, &l.tok.vocab());
  REQUIRE(medusa.has_value());
  REQUIRE(eagle.has_value());
  // A repeated phrase, so that n-gram lookup finds its drafts too.
  const std::vector<int32_t> prompt = l.tok.encode("Lily saw a cat. Lily saw a cat. Lily saw a", true);
  std::vector<sampling_params> settings(2);
  settings[0].temperature = 1.0f;
  settings[0].top_p = 1.0f;
  settings[1].temperature = 0.7f;
  settings[1].top_p = 0.9f;
  engine_config base;
  base.num_threads = 2;
  base.sched.kv.num_blocks = 2048;
  base.sched.max_running = 256;
  std::vector<std::vector<std::vector<int32_t>>> plain;
  for (const sampling_params& s : settings) {
    llm_engine e(l.m, l.tok, base);
    plain.push_back(draw_all(e, prompt, s, 1));
  }
  int config = 0;
  for (spec_method method :
       {spec_method::draft, spec_method::ngram, spec_method::early_exit, spec_method::medusa, spec_method::eagle}) {
    for (const std::vector<int32_t>& tree : {std::vector<int32_t>{}, std::vector<int32_t>{2, 2, 1}}) {
      const size_t si = static_cast<size_t>(config++ % 2);
      CAPTURE(spec_method_name(method));
      CAPTURE(tree.size());
      CAPTURE(si);
      engine_config cfg = base;
      cfg.spec.method = method;
      cfg.spec.k = tree.empty() ? 2 : 3;
      cfg.spec.tree = tree;
      cfg.spec.max_step_tokens = 512;
      cfg.spec.exit_layer = 4;  // early exit: drafts from 4 of the 5 layers, accepted often enough to count
      cfg.draft = &draft;
      cfg.heads = method == spec_method::medusa ? medusa->get() : eagle->get();
      llm_engine e(l.m, l.tok, cfg);
      const auto got = draw_all(e, prompt, settings[si], 100000);  // draws independent of the plain ones
      CHECK(e.stats().spec.verifies > 0);
      CHECK(e.stats().spec.accepted > 0);
      for (size_t length = 2; length <= static_cast<size_t>(tokens_drawn); ++length) {
        const auto r = compare(got, plain[si], length);
        CAPTURE(length);
        CAPTURE(r.chi);
        CAPTURE(r.dof);
        CAPTURE(r.critical);
        CHECK(r.dof >= 3);  // enough cells for the test to see a difference
        CHECK(r.passes());
      }
    }
  }
}

}  // namespace troupe
