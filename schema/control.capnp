# Control and health between node agents and the launcher, version 1. Ordinals are never
# reused; new fields go at the end.
@0xbbee1b5726af699a;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct Heartbeat {
  node @0 :Text;
  sentAtMicros @1 :UInt64;         # the sender's monotonic clock
}

enum ActorKind {
  gateway @0;
  scheduler @1;
  kvManager @2;
  stage @3;
  shard @4;
  nodeAgent @5;
  draft @6;                        # a replica's draft actor (speculative decoding)
}

struct ActorStatus {
  name @0 :Text;
  kind @1 :ActorKind;
  alive @2 :Bool;
  restarts @3 :UInt32;
}

# A process's KV tiers of one kind (engine/kv/kv_tiers.hpp), summed over its shards since
# it started.
struct TierFigures {
  kind @0 :Text;                   # "host", "disk" or "redis"
  hits @1 :UInt64;
  misses @2 :UInt64;
  corrupt @3 :UInt64;
  errors @4 :UInt64;
  stored @5 :UInt64;
  dropped @6 :UInt64;
  bytesIn @7 :UInt64;
  bytesOut @8 :UInt64;
  loadSeconds @9 :Float64;
  lookups @10 :UInt64;
}

# What a process's own listeners of one kind (engine/util/link_meter.hpp) saw of their
# peers since it started.
struct LinkFigures {
  kind @0 :Text;                   # "step" (step links) or "kv" (KV channels)
  refused @1 :UInt64;              # connections closed: a failed handshake, a broken frame
  stalled @2 :UInt64;              # connections closed: a frame not whole by its deadline
  crowded @3 :UInt64;              # handshakes cut short for newcomers
  lastStallMs @4 :Int64;           # when the latest stall was noticed (Unix ms; 0: never)
}

struct NodeHealth {
  node @0 :Text;
  pid @1 :UInt32;
  actors @2 :List(ActorStatus);
  ready @3 :Bool;
  tiers @4 :List(TierFigures);
  links @5 :List(LinkFigures);
}

# A request to stop one named actor (failure injection, or a drain).
struct KillActor {
  name @0 :Text;
  reason @1 :Text;
}

# What GPU shards connect to each other with over NCCL: a tensor-parallel stage's ranks,
# or a device link between neighbouring stages (the earlier stage's rank 0 and the later
# stage's ranks): the group's unique id (128 bytes), its size and the receiver's rank in it.
struct NcclInvite {
  ncclId @0 :Data;
  size @1 :UInt32;
  rank @2 :UInt32;
  node @3 :Text;                   # device links: the host the group was drawn on
}
