# KV block claims between a scheduler and its kv manager, version 1. Each step the
# scheduler sends the requests it wants to run, in scheduling order, and the kv manager
# answers with the blocks of those that fit. Ordinals are never reused; new fields go at
# the end.
@0xd554132718f18948;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

# One request's claim on a step.
struct Claim {
  requestId @0 :UInt64;
  admit @1 :Bool;                  # a waiting request: matched against the prefix cache
  computed @2 :Int32;              # a running request: tokens whose KV its blocks hold
  namespace @3 :UInt64;            # prefix-cache isolation key
  tokensFrom @4 :Int32;            # position of tokens[0] in the request's sequence: the kv
                                   # manager already has the tokens before it (0 on admit)
  tokens @5 :List(Int32);          # the rest of the sequence; the request wants it computed
  heldBlocks @6 :UInt32;           # a running request: blocks its table has (the kv manager
                                   # checks it against what it holds)
  speculative @7 :Int32;           # a running request: draft positions wanted after its
                                   # tokens (speculative decoding; never cached)
  evicted @8 :Int32;               # a running request: tokens dropped from its cache (KV
                                   # eviction): its blocks hold computed - evicted slots
  kvBudget @9 :Int32;              # KV eviction: slots its blocks may hold at most (0: no
                                   # limit); such a request's blocks are cached as its
                                   # admission fills them, not later, and it may run past
                                   # the context
  rewriteFrom @10 :Int32 = -1;     # KV eviction: the step's compaction writes its slots from
                                   # here on (-1: none); blocks from there to the step's end
                                   # that it shares are replaced by its own copies (the
                                   # grant drops them and adds the copies)
  tierTokens @11 :Int32;           # KV tiers, an admission: its prefix the tiers hold (whole
                                   # blocks); what the pool lacks of it is loaded
  loadsLanded @12 :Bool;           # KV tiers, a running request: its loads came back whole;
                                   # its blocks are cached from now on
  chunkLimit @13 :Int32;           # KV eviction: positions a step computes for it at most (0:
                                   # no limit); an admission's first chunk ends there, or at
                                   # its budget or prompt, whatever its prefix hit
  hitMargin @14 :Int32;            # KV eviction, an admission: the last tokens of that first
                                   # chunk a prefix hit never covers
}

struct KvStep {
  session @0 :UInt64;              # the scheduler incarnation; others' messages are refused
  reset @1 :Bool;                  # forget every request and cached block first, and serve
                                   # this session from now on
  releases @2 :List(UInt64);       # requests whose blocks go back, before any claim
  claims @3 :List(Claim);          # granted in order until one does not fit
  budget @4 :Int32;                # tokens the step may still compute
}

struct Grant {
  requestId @0 :UInt64;
  first @1 :Int32;                 # first token to compute (an admission: its prefix hit)
  count @2 :Int32;                 # tokens to compute this step
  added @3 :List(UInt32);          # blocks appended to the request's table (an admission:
                                   # the whole table)
  dropped @4 :Int32;               # blocks taken off the end of the table first: those of
                                   # rejected drafts that the step no longer needs, those a
                                   # compaction emptied, and from the first one replaced by
                                   # a copy on (added then holds the table from there)
  loads @5 :Int32;                 # KV tiers, an admission: the last `loads` blocks before
                                   # `first` are filled from the tiers
}

struct KvUsage {
  numBlocks @0 :UInt32;
  used @1 :UInt32;                 # referenced by a request
  free @2 :UInt32;                 # unreferenced, cached or not
  cached @3 :UInt32;               # holding a cached prefix
  queriedTokens @4 :UInt64;        # prompt tokens looked up in the prefix cache
  hitTokens @5 :UInt64;            # of which found cached
}

struct KvGrants {
  session @0 :UInt64;              # echoes the step's
  grants @1 :List(Grant);          # for the first claims, in order
  shortOfBlocks @2 :Bool;          # the claim after the last grant did not fit
  usage @3 :KvUsage;               # after the grants
  error @4 :Text;                  # non-empty: nothing was granted; the scheduler resets
}
