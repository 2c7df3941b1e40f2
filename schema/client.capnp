# troupe's client API, version 1: what a client program (troupe-client, the C++ client
# library) asks the gateway over Cap'n Proto RPC. Ordinals are never reused; new fields
# go at the end.
@0xedb00e0e43e1385e;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

# How a generation request samples; the same meaning as troupe-run's flags.
struct Sampling {
  temperature @0 :Float32 = 1.0;        # 0: greedy
  topK @1 :Int32 = 0;                   # keep the k most likely tokens; 0: all
  topP @2 :Float32 = 1.0;               # nucleus mass, in (0, 1]
  minP @3 :Float32 = 0.0;               # drop tokens below min_p times the top probability
  repetitionPenalty @4 :Float32 = 1.0;  # over prompt and output; 1: off
  frequencyPenalty @5 :Float32 = 0.0;   # per earlier occurrence in the output, in [-2, 2]
  presencePenalty @6 :Float32 = 0.0;    # once if present in the output, in [-2, 2]
  seed @7 :UInt64;                      # the request's random stream
  logprobs @8 :Int32 = -1;              # -1: none; 0: the chosen token's; n: also the top n (<= 20)
  logitBias @9 :List(TokenBias);        # added to the tokens' logits before each choice
}

struct TokenBias {
  token @0 :Int32;
  bias @1 :Float32;                     # in [-100, 100]
}

struct GenerateRequest {
  prompt :union {
    text @0 :Text;                      # tokenized by the gateway, BOS prepended
    tokens @1 :List(Int32);             # token ids as they are (BOS included if wanted)
  }
  maxTokens @2 :Int32 = 256;            # generated tokens at most
  sampling @3 :Sampling;
  stopStrings @4 :List(Text);           # the output ends before the first one
  stopTokens @5 :List(Int32);           # besides EOS and BOS
  priority @6 :Int32 = 0;               # lower runs first under the priority policy
  ignoreEos @7 :Bool = false;           # run to maxTokens (benchmarks)
  stepsIncludePrompt @8 :Bool = false;  # maxTokens counts the prompt's tokens after BOS too
                                        # (llama2.c's and troupe-run's -n)
  delivered @9 :List(Int32);            # output an earlier attempt already streamed: the
                                        # router resubmits a request from a failed replica
                                        # with it, a client one from a lost gateway;
                                        # replayed, never streamed again
  cacheNamespace @10 :UInt64 = 0;       # prefix-cache isolation: cached prompt blocks are
                                        # shared only within one namespace; the gateway sets
                                        # it (from the API key), whatever a client sent
  speculative @11 :Int32 = -1;          # speculative decoding: drafted tokens per step at
                                        # most (1..16), 0 for none, -1 as the server is set
  kvEviction @12 :KvEviction;           # KV eviction: this request's own policy and budget
                                        # (unset: as the server is set)
  sloClass @13 :Text;                   # its SLO class, a [[class]] of the topology (TTFT
                                        # and TPOT targets, priority); empty: the default
  kvTo @14 :Text;                       # router -> a prefill replica only (the gateway clears
                                        # it): compute the prompt, send its whole blocks' KV
                                        # to this decode replica, stream the first token, and
                                        # end there (GenerateResult.handedOff)
  kvFrom @15 :UInt32;                   # router -> a decode replica only: the prompt's first
                                        # kvFrom tokens' KV was sent here by a prefill replica
                                        # (loaded, not computed, where it has landed)
}

# A request's KV eviction (docs/http-api.md): its cache holds `budget` tokens at most.
struct KvEviction {
  policy @0 :KvPolicy;
  budget @1 :Int32;                     # cached tokens at most (2 or more, within the context)
  sinks @2 :Int32 = -1;                 # streaming: first tokens always kept (-1: 4)
  window @3 :Int32 = -1;                # recent tokens always kept (-1: the policy's default)
  history @4 :Int32 = 16;               # scissorhands: steps importance is judged over (1..32)
}

enum KvPolicy {
  none @0;                              # the whole cache
  streaming @1;                         # attention sinks and a recent window; may generate
                                        # past the model's context
  h2o @2;                               # heavy hitters by attention received, and recent tokens
  scissorhands @3;                      # tokens whose importance persists, and recent ones
}

struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

# Part of a streamed output. seq counts chunks of one request from 0 without gaps, so a
# client can tell a lost or repeated chunk (after a failover, say) from a correct stream.
struct TokenChunk {
  requestId @0 :UInt64;
  seq @1 :UInt32;
  tokens @2 :List(Int32);               # new token ids, in order
  text @3 :Text;                        # the text that became final (never half a character)
  logprobs @4 :List(TokenLogprob);      # per token, if asked: the chosen one
  topLogprobs @5 :List(List(TokenLogprob));  # per token, if asked: the most likely ones
}

enum FinishReason {
  stop @0;                              # EOS, a stop token or a stop string
  length @1;                            # maxTokens or the context
  aborted @2;                           # cancelled by the client
  error @3;                             # see GenerateResult.error
}

# Why a request ended with an error: something about the request itself (the client should
# not retry it as it is), no replica able to serve it in time (retry later), or a fault of
# the server's.
enum ErrorKind {
  invalid @0;
  unavailable @1;
  internal @2;
}

struct GenerateResult {
  requestId @0 :UInt64;
  reason @1 :FinishReason;
  promptTokens @2 :UInt32;
  outputTokens @3 :UInt32;
  cachedPromptTokens @4 :UInt32;        # served by the prefix cache
  error @5 :Text;                       # why, when reason is error
  chunks @6 :UInt32;                    # chunks sent, so the last seq is chunks - 1
  last @7 :TokenChunk;                  # scheduler -> router only: the final chunk travels
                                        # inside the result, so a request's end is one
                                        # message (the router forwards it as a chunk)
  hasLast @8 :Bool;                     # last is set
  errorKind @9 :ErrorKind;              # when reason is error
  handedOff @10 :Bool;                  # scheduler -> router only: a prefill replica's end of
                                        # a request (kvTo) that goes on on its decode replica
  kvSent @11 :UInt32;                   # with handedOff: the prompt tokens whose KV it sent
}

struct Health {
  ready @0 :Bool;                       # a replica can serve a request now
  detail @1 :Text;                      # in words, when not ready
  replicas @2 :UInt32;
  replicasReady @3 :UInt32;
  outages @4 :UInt64;                   # times a replica stopped being ready since the
                                        # gateway started (a failure repaired between two
                                        # health calls still counts)
  lastDownMs @5 :UInt64;                # when a replica last stopped being ready, outage or
                                        # not, by the gateway's clock (Unix time in ms; 0:
                                        # never): the moment the gateway noticed, however
                                        # late this answer
}

struct Stats {
  requestsRunning @0 :UInt32;
  requestsWaiting @1 :UInt32;
  kvBlocksUsed @2 :UInt32;
  kvBlocksFree @3 :UInt32;
  kvBlocksCached @4 :UInt32;
  prefixHitTokens @5 :UInt64;
  tokensIn @6 :UInt64;
  tokensOut @7 :UInt64;
  requestsFinished @8 :UInt64;
}

# Where a generation's output goes: the client passes one with each request.
interface TokenSink {
  chunk @0 (chunk :TokenChunk) -> stream;
  done @1 (result :GenerateResult) -> ();
}

# When the topology names an api_keys_file, every call but health must carry one of its
# keys (the same keys as the HTTP API's bearer keys); a call without fails.
interface Gateway {
  generate @0 (request :GenerateRequest, sink :TokenSink, apiKey :Text) -> (requestId :UInt64);
  cancel @1 (requestId :UInt64, apiKey :Text) -> (found :Bool);
  health @2 () -> (health :Health);
  stats @3 (apiKey :Text) -> (stats :Stats);
}
