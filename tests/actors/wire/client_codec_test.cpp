// The end of a request as the client API carries it: an error's kind (the request's own
// fault, no replica in time, the server's fault) survives the router's rewriting, and an
// unknown kind reads as the request's own fault (not worth a retry).
#include "actors/wire/client_codec.hpp"

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/wire/frame.hpp"
#include "schema/client.capnp.h"

namespace troupe::wire {

TEST_CASE("a failed request's error kind travels with its text, through the router's split too") {
  step_output out;
  out.id = request_id{7};
  out.finished = true;
  for (const error_kind k : {error_kind::invalid, error_kind::unavailable, error_kind::internal}) {
    const auto bytes = encode_generate_result(7, out, 0, "why", k);
    auto v = decode_generate_result(bytes);
    REQUIRE(v.has_value());
    CHECK(v->error == "why");
    CHECK(v->error_type == k);
    auto split = split_final_result(bytes, 99, 3);
    REQUIRE(split.has_value());
    auto w = decode_generate_result(split->result);
    REQUIRE(w.has_value());
    CHECK(w->request == 99);
    CHECK(w->error_type == k);
  }
  // Without an error the kind is not set; an unknown kind reads as invalid.
  auto fine = decode_generate_result(encode_generate_result(7, out, 0));
  REQUIRE(fine.has_value());
  CHECK(fine->error.empty());
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::GenerateResult>();
  r.setReason(schema::FinishReason::ERROR);
  r.setError("from a newer server");
  r.setErrorKind(static_cast<schema::ErrorKind>(9));
  auto unknown = decode_generate_result(to_bytes(msg));
  REQUIRE(unknown.has_value());
  CHECK(unknown->error_type == error_kind::invalid);
}

}  // namespace troupe::wire
