# Speculative drafts between a scheduler and its replica's draft actor, version 1. Each
# step with draft slots, the scheduler sends one DraftOrder and the draft actor answers
# with Drafts (engine/speculative/draft_exchange.hpp). A request's tokens travel once, then only
# what was added. Ordinals are never reused; new fields go at the end.
@0xb3c1f4e8a2d95e07;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

using Client = import "client.capnp";

# One request's draft slots.
struct DraftSlot {
  requestId @0 :UInt64;
  maxTokens @1 :Int32;             # drafts wanted, 1..16
  tokensFrom @2 :Int32;            # position of tokens[0]: the draft actor has the ones before
  tokens @3 :List(Int32);          # the rest of the request's sequence
  blocks @4 :List(UInt32);         # its block table, covering its tokens and the drafts
  uniforms @5 :List(Float32);      # random drafts: maxTokens uniforms in [0, 1); greedy: none
  sampling @6 :Client.Sampling;    # with tokensFrom 0: how the request samples
  promptTokens @7 :Int32;          # with tokensFrom 0: how many of tokens are its prompt
  # KV eviction: tokens gone from the request's cache (its computed tokens, all but its
  # last, take that many fewer slots); the position each slot holds, sent when the cache
  # was compacted since the last order (later slots hold the positions after, in order);
  # whether RoPE positions are slots.
  evicted @8 :Int32;
  slotPositions @9 :List(Int32);
  ropeInCache @10 :Bool;
}

struct DraftOrder {
  session @0 :UInt64;              # a new one: forget every request first
  forget @1 :List(UInt64);         # requests that ended or lost their blocks, before any slot
  slots @2 :List(DraftSlot);
  # A token tree's widths by depth (1..16 each): every slot drafts one position per depth
  # (maxTokens), and answers each position's candidates, most likely first; no uniforms.
  # Empty: chains.
  tree @3 :List(Int32);
  # KV eviction: requests' caches compacted since the last order, in order; the draft
  # actor's cache moves the same way (after forget, before any slot).
  compactions @4 :List(DraftCompaction);
}

# Slot kept[i] of a request's cache moved to slot i, within blockTable (its table then),
# into newTable (empty: the same); keys turned back by the distance moved with rotate.
struct DraftCompaction {
  requestId @0 :UInt64;
  kept @1 :List(Int32);
  rotate @2 :Bool;
  blockTable @3 :List(UInt32);
  newTable @4 :List(UInt32);
}

# A drafted token's distribution: every token's probability, or, where few are possible
# (top-k, top-p, min-p), only theirs.
struct DraftRow {
  dense @0 :List(Float32);         # [vocab]; empty when sparse
  tokens @1 :List(Int32);          # the tokens with mass, ascending
  probs @2 :List(Float32);         # their probabilities
}

struct Drafted {
  requestId @0 :UInt64;
  tokens @1 :List(Int32);
  rows @2 :List(DraftRow);         # one per token when drawn at random; none when greedy
  unknown @3 :Bool;                # the draft actor lacked the tokens before tokensFrom
  levels @4 :List(List(Int32));    # a tree's order: per drafted position, its candidates
}

struct Drafts {
  session @0 :UInt64;
  slots @1 :List(Drafted);         # one per order slot, in order
  error @2 :Text;                  # the order was refused, and why
}
