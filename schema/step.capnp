# Step plans between a scheduler and its pipeline stages, and what comes back, version 1.
# A plan carries a request's tokens once, when it is new to the stages (or after it was
# preempted), and deltas afterwards: the tokens computed this step and the blocks added
# to its table. Ordinals are never reused; new fields go at the end.
@0xd92c4e26a7f7a8c4;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

# One request's part of a step.
struct Chunk {
  requestId @0 :UInt64;
  first @1 :Int32;                 # position of the first token computed
  tokens @2 :List(Int32);          # the tokens computed this step (first .. first + n - 1)
  newBlocks @3 :List(UInt32);      # blocks appended to the request's table this step
  resetTable @4 :Bool;             # the table starts anew (new or resumed request)
  sample @5 :Bool;                 # the last token's logits are wanted
  # With sample: the last stage chooses the token itself (kernels/cpu/sample.hpp's draw,
  # or the argmax at temperature 0) and returns it in a StepResult instead of logits.
  choose @6 :Bool;
  temperature @7 :Float32;
  topK @8 :Int32;
  topP @9 :Float32;
  minP @10 :Float32;
  u @11 :Float32;                  # the draw's uniform, from the request's random stream
  # Speculative decoding: the last `drafts` tokens are drafts to verify. With sample, the
  # last drafts + 1 tokens each want a row of logits (with choose, greedy only: each row's
  # argmax comes back).
  drafts @12 :Int32;
  # KV eviction: tokens gone from the request's cache before `first`, so the chunk's first
  # token goes to slot first - evicted; with ropeInCache its RoPE positions are its slots
  # (streaming), otherwise its tokens' own positions.
  evicted @13 :Int32;
  ropeInCache @14 :Bool;
  # KV eviction: the attention this chunk's slots receive from its last 32 tokens (all of a
  # shorter chunk's), summed over every head and layer, comes back with the step (its
  # policy ranks tokens by it).
  attention @15 :Bool;
  # Speculative decoding with a proposer that reads the model's features (Medusa, EAGLE):
  # the last stage returns the last layer's output (before the final norm) of the chunk's
  # last `features` tokens with the step's result.
  features @16 :Int32;
  # A token tree: the drafts' parents, one per draft (-1: the chunk's last known token, the
  # root; otherwise an earlier draft's index). Each draft sees the slots before the root
  # and its own ancestors, at the RoPE position of the root plus its depth; the drafts
  # number up to 63. Empty: the drafts are a chain.
  draftParents @17 :List(Int32);
  # KV eviction on a sliding-window model: each token's first slot within its window (by
  # position, among the slots the request kept), nondecreasing, none past the token's own
  # slot. Empty: each token's slot minus the window.
  windowFirst @18 :List(Int32);
}

# KV eviction before a step: the request keeps slots `kept` (ascending) of its cache, slot
# kept[i] moved to slot i within its table as the stages held it before this plan; with
# rotate, each moved key turns back by the distance it moved.
struct Compaction {
  requestId @0 :UInt64;
  kept @1 :List(Int32);
  rotate @2 :Bool;
}

# KV tiers: a block of a request's table and its content address (the chained hash of the
# request's tokens up to the block's end, 128 bits), which the stages' shards fill from
# their tiers, or copy down into them (engine/kv/kv_tiers.hpp).
struct TierMove {
  requestId @0 :UInt64;
  block @1 :UInt32;
  keyHi @2 :UInt64;
  keyLo @3 :UInt64;
  to @4 :Text;                     # kvPushes: the replica the block goes to
}

struct TierKey {
  hi @0 :UInt64;
  lo @1 :UInt64;
}

struct StepPlan {
  stepId @0 :UInt64;               # increases by one per plan of a scheduler
  chunks @1 :List(Chunk);          # in batch order
  released @2 :List(UInt64);       # requests whose tables the stages can forget
  resetAll @3 :Bool;               # forget every table first: a scheduler (re)starts or
                                   # recovers from a lost stage; stepId may start anew
  session @4 :UInt64;              # the scheduler incarnation that sent the plan; after a
                                   # resetAll, plans from any other session are refused
  compactions @5 :List(Compaction);  # applied before the chunks
  tierLoads @6 :List(TierMove);    # KV tiers: filled before anything else, each of a
                                   # request with a chunk here
  tierSaves @7 :List(TierMove);    # KV tiers: copied down after the step, unless their
                                   # request's loads failed
  tierPrefetch @8 :List(TierKey);  # KV tiers: blocks of waiting requests, read up into the
                                   # first tier in the background
  kvPushes @9 :List(TierMove);     # disaggregation: prompt blocks sent to the decode replica
                                   # each names (its shard of the same layers and slice)
                                   # after the step, unless their request's loads failed
}

# Hidden states handed from one stage to the next: [numTokens][dim] float32,
# little-endian, in batch order. Between GPU stages joined by a device link the data goes
# over NCCL, and the frame that follows the step carries none.
struct Activations {
  stepId @0 :UInt64;
  numTokens @1 :UInt32;
  dim @2 :UInt32;
  data @3 :Data;                   # numTokens * dim * 4 bytes
  # The attention sums of the plan's chunks that ask for them (Chunk.attention), float32
  # little-endian, chunk after chunk in batch order, one per slot the chunk's last token
  # sees (first - evicted + its tokens); each stage adds its layers' to what it received.
  attention @4 :Data;
  # KV tiers: the requests whose loads failed in this stage or an earlier one (a block no
  # tier held intact): their outputs of this step are garbage and are dropped.
  failedLoads @5 :List(UInt64);
  # From the last stage: the features the plan's chunks asked for (Chunk.features),
  # float32 little-endian, [rows][dim], chunk after chunk in batch order.
  features @6 :Data;
}

# The tokens the last stage chose, when every sampled chunk of the plan asked it to choose
# (otherwise the logits of the sampled rows come back as Activations).
struct Sample {
  requestId @0 :UInt64;
  token @1 :Int32;
  logprob @2 :Float32;
}

struct StepResult {
  stepId @0 :UInt64;
  samples @1 :List(Sample);        # one per chunk with sample set, in batch order
  error @2 :Text;                  # non-empty: the step failed and must be recomputed
  attention @3 :Data;              # as Activations.attention, summed over every stage
  failedLoads @4 :List(UInt64);    # as Activations.failedLoads, over every stage
  features @5 :Data;               # as Activations.features
}
