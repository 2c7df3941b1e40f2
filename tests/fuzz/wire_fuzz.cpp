// Every decoder of frames that arrive from another process, given any bytes: the first
// byte picks the decoder, the rest is the frame. The decoders that keep state between
// frames (a stage's step decoder, the KV claims' two ends) start fresh for each input, so
// an input that fails fails alone.
#include <string>
#include <vector>

#include "actors/wire/activations_codec.hpp"
#include "actors/wire/client_codec.hpp"
#include "actors/wire/control_codec.hpp"
#include "actors/wire/draft_codec.hpp"
#include "actors/wire/kv_codec.hpp"
#include "actors/wire/step_codec.hpp"
#include "engine/tokenizer/tokenizer.hpp"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/wire_setup.hpp"

namespace {

const troupe::tokenizer& small_tokenizer() {
  static const troupe::tokenizer tok(troupe::fuzz::small_vocabulary());
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using fuzz::context, fuzz::dim, fuzz::vocab;
  fuzz::input in;
  if (!fuzz::split(data, size, 18, in)) return 0;
  const auto bytes = in.rest;
  wire::request_limits rl;
  rl.context = context;
  wire::step_decoder steps(fuzz::step_limits());
  wire::kv_claim_receiver claims(fuzz::kv_limits());
  wire::kv_claim_sender sender(fuzz::kv_limits());
  const wire::draft_limits dl = fuzz::draft_limits();
  switch (in.selector) {
    case 0: (void)wire::decode_activations(bytes, dim, 64, 4); break;
    case 1: (void)wire::decode_linked_activations(bytes, dim, 64, 4); break;
    case 2: (void)wire::decode_generate_request(bytes, small_tokenizer(), rl); break;
    case 3: (void)wire::peek_route(bytes, &small_tokenizer(), rl); break;
    case 4: (void)wire::decode_token_chunk(bytes); break;
    case 5: (void)wire::peek_token_chunk(bytes); break;
    case 6: (void)wire::decode_generate_result(bytes); break;
    case 7: {
      const std::vector<int32_t> delivered = {5, 6, 7};
      (void)wire::with_route(bytes, wire::route_rewrite{delivered, "decode-0", 3});
      break;
    }
    case 8: (void)wire::renumber_chunk(bytes, 7, 3); break;
    case 9: (void)wire::split_final_result(bytes, 7, 3); break;
    case 10: (void)wire::decode_node_health(bytes); break;
    case 11: (void)wire::decode_nccl_invite(bytes); break;
    case 12: (void)wire::decode_draft_order(bytes, dl); break;
    case 13: (void)wire::decode_drafts(bytes, dl); break;
    case 14: (void)claims.decode(bytes); break;
    case 15: (void)sender.decode(bytes); break;
    case 16: (void)steps.decode(bytes); break;
    case 17: (void)wire::decode_step_result(bytes, vocab, 64, 4); break;
  }
  return 0;
}
