// Step plans of speculative decoding with a token tree or a proposer that reads features
// (schema/step.capnp Chunk.draftParents, Chunk.features): a tree reaches the stage as the
// engine loop's batch has it, a verified tree's path moves with its request's next plan,
// features come back with logits and tokens, and what does not fit is refused.
#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/wire/activations_codec.hpp"
#include "actors/wire/frame.hpp"
#include "actors/wire/step_codec.hpp"
#include "schema/step.capnp.h"
#include "tests/actors/wire/step_codec_support.hpp"
#include "tests/support/test_support.hpp"

namespace troupe::wire {

namespace {

// A decoding request's chunk: its known token at position 9 (slot 9), then drafts.
scheduled_chunk tree_chunk(const std::vector<int32_t>& known, const std::vector<int32_t>& drafts,
                           const std::vector<int32_t>& parents, const std::vector<block_id>& table) {
  scheduled_chunk c;
  c.id = request_id{4};
  c.first = 9;
  c.count = static_cast<int32_t>(known.size() + drafts.size());
  c.num_draft = static_cast<int32_t>(drafts.size());
  c.tokens = known;
  c.draft = drafts;
  c.draft_parents = parents;
  c.block_table = table;
  c.sample = true;
  return c;
}

}  // namespace

TEST_CASE("a token tree reaches the stage as the engine loop batches it, and its path moves with the next plan") {
  step_encoder enc;
  step_decoder dec(limits());
  enc.restart(2);
  // The request's first 9 tokens, then a tree of 5 nodes under token 9: two candidates,
  // two under the first, one under the second's.
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto table = test::block_ids({3, 7, 1, 5, 2});  // 20 slots: the tree's too
  step_plan first;
  scheduled_chunk p;
  p.id = request_id{4};
  p.count = 9;
  p.tokens = prompt;
  p.block_table = table;
  first.chunks.push_back(p);
  first.num_tokens = 9;
  REQUIRE(dec.decode(enc.encode(first, {})).has_value());

  const std::vector<int32_t> known{40}, drafts{50, 51, 60, 61, 70}, parents{-1, -1, 0, 0, 1};
  step_plan plan;
  plan.chunks.push_back(tree_chunk(known, drafts, parents, table));
  plan.num_tokens = 6;
  const std::vector<int32_t> features{6};
  auto d = dec.decode(enc.encode(plan, {}, {}, features));
  REQUIRE_MESSAGE(d.has_value(), (d ? "" : d.err().message));
  CHECK(d->batch.tokens == std::vector<int32_t>{40, 50, 51, 60, 61, 70});
  const step_sequence& q = d->batch.sequences[0];
  CHECK(q.logit_rows == 6);
  REQUIRE(q.tree_parents != nullptr);
  CHECK(std::vector<int32_t>(q.tree_parents, q.tree_parents + 6) == std::vector<int32_t>{-1, 0, 0, 1, 1, 2});
  CHECK(d->feature_rows == std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  CHECK(d->choices.empty());  // a tree's verification needs the logits

  // The path 51 -> 70 was kept (nodes 1 and 4): the request's next plan moves slots 11 and
  // 14 to 10 and 11, over the table the stage held for the tree, into the shorter one the
  // scheduler holds now.
  step_plan next;
  planned_compaction move;
  move.id = request_id{4};
  move.kept = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 14};
  next.compactions.push_back(move);
  const std::vector<int32_t> bonus{80};
  const auto shorter = test::block_ids({3, 7, 1, 5});  // the last block only the tree used
  scheduled_chunk c = tree_chunk(bonus, {}, {}, shorter);
  c.first = 12;
  next.chunks.push_back(c);
  next.num_tokens = 1;
  auto n = dec.decode(enc.encode(next, {}));
  REQUIRE_MESSAGE(n.has_value(), (n ? "" : n.err().message));
  REQUIRE(n->batch.compactions.size() == 1);
  const kv_compaction& k = n->batch.compactions[0];
  CHECK(test::block_values(k.block_table) == test::block_values(table));
  CHECK(test::block_values(k.new_table) == test::block_values(shorter));
  CHECK(std::vector<int32_t>(k.kept.begin(), k.kept.end()) == move.kept);
  CHECK(n->batch.sequences[0].tree_parents == nullptr);
  CHECK(n->feature_rows.empty());
}

TEST_CASE("a tree or a feature count that does not fit its chunk is refused") {
  auto with = [](int32_t known, std::vector<int32_t> parents, int32_t features, bool choose) {
    capnp::MallocMessageBuilder msg;
    auto root = msg.initRoot<schema::StepPlan>();
    root.setStepId(1);
    auto c = root.initChunks(1)[0];
    c.setRequestId(7);
    const auto n = static_cast<unsigned>(known) + static_cast<unsigned>(parents.size());
    auto t = c.initTokens(n);
    for (unsigned i = 0; i < n; ++i) t.set(i, 5);
    auto b = c.initNewBlocks(16);
    for (unsigned i = 0; i < 16; ++i) b.set(i, i % 12);
    c.setResetTable(true);
    c.setSample(true);
    c.setDrafts(static_cast<int32_t>(parents.size()));
    auto up = c.initDraftParents(static_cast<unsigned>(parents.size()));
    for (size_t i = 0; i < parents.size(); ++i) up.set(static_cast<unsigned>(i), parents[i]);
    c.setFeatures(features);
    c.setChoose(choose);
    c.setTopP(1.0f);
    return to_bytes(msg);
  };
  auto expect = [](const std::vector<uint8_t>& bytes, const std::string& part) {
    step_limits lim = limits();
    lim.max_step_tokens = 128;
    lim.block_size = 16;
    step_decoder dec(lim);
    auto d = dec.decode(bytes);
    REQUIRE_FALSE(d.has_value());
    CAPTURE(d.err().message);
    CHECK(d.err().message.find(part) != std::string::npos);
  };
  expect(with(1, {-1, 1}, 0, false), "draft 1's parent 1 is not -1 or an earlier draft");
  expect(with(1, {-1, -2}, 0, false), "draft 1's parent -2");
  expect(with(2, {-1, 0}, 0, false), "a token tree follows one known token");
  expect(with(1, {-1, 0}, 0, true), "a token tree's tokens are not chosen on the shard");
  expect(with(1, std::vector<int32_t>(64, -1), 0, false), "64 drafts; 0..63 allowed in a token tree");
  expect(with(1, {-1}, 3, false), "features of 3 tokens; it has 2");
  expect(with(1, {-1}, -1, false), "features of -1 tokens");
  // A chain's drafts stay at 16; a tree's reach 63.
  step_limits lim = limits();
  lim.max_step_tokens = 128;
  lim.block_size = 16;
  step_decoder dec(lim);
  auto wide = dec.decode(with(1, std::vector<int32_t>(40, -1), 41, false));
  REQUIRE_MESSAGE(wide.has_value(), (wide ? "" : wide.err().message));
  CHECK(wide->feature_rows.size() == 41);
}

TEST_CASE("features come back with the logits or the chosen tokens, exactly as many as the plan asked for") {
  const std::vector<float> logits(2 * 16, 0.25f), features{1.0f, -2.0f, 3.5f, 0.0f, 7.0f, 8.0f};
  const auto act = encode_activations(5, 2, 16, logits.data(), {}, {}, features);
  auto a = decode_activations(act, 16, 8, 0, 6);
  REQUIRE_MESSAGE(a.has_value(), (a ? "" : a.err().message));
  CHECK(a->features == features);
  auto short_a = decode_activations(act, 16, 8, 0, 3);
  REQUIRE_FALSE(short_a.has_value());
  CHECK(short_a.err().message.find("6 feature values where 3 are expected") != std::string::npos);
  CHECK_FALSE(decode_activations(encode_activations(5, 2, 16, logits.data()), 16, 8, 0, 6).has_value());

  const std::vector<chosen_token> toks{{request_id{3}, 7}};
  const auto res = encode_step_result(5, toks, {}, {}, features);
  auto r = decode_step_result(res, 512, 8, 0, 6);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.err().message));
  CHECK(r->features == features);
  CHECK_FALSE(decode_step_result(res, 512, 8, 0, 12).has_value());
  CHECK_FALSE(decode_step_result(res, 512, 8).has_value());  // features nobody asked for
}

}  // namespace troupe::wire
