// The NCCL invitation a stage sends its GPU shards (and a neighbouring stage, for a device
// link): what it carries, and what a frame that is not one gets.
#include "actors/wire/control_codec.hpp"

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "actors/wire/frame.hpp"
#include "schema/control.capnp.h"

namespace troupe::wire {

namespace {

// A NcclInvite frame with any values, the encoder's checks bypassed.
std::vector<uint8_t> raw_invite(size_t id_bytes, uint32_t size, uint32_t rank) {
  capnp::MallocMessageBuilder msg;
  auto r = msg.initRoot<schema::NcclInvite>();
  r.initNcclId(static_cast<unsigned>(id_bytes));
  r.setSize(size);
  r.setRank(rank);
  return to_bytes(msg);
}

}  // namespace

TEST_CASE("an NCCL invitation carries the id's 128 bytes, the size, the rank and the node") {
  nccl_invite in;
  for (size_t i = 0; i < in.id.bytes.size(); ++i) in.id.bytes[i] = static_cast<char>(i * 7 + 1);
  in.size = 4;
  in.rank = 3;
  auto out = decode_nccl_invite(encode_nccl_invite(in));
  REQUIRE(out.has_value());
  CHECK(out->id.bytes == in.id.bytes);
  CHECK(out->size == 4);
  CHECK(out->rank == 3);
  CHECK(out->node.empty());
  in.node = "gpu-node-7";  // a device link's, naming the host it was drawn on
  auto linked = decode_nccl_invite(encode_nccl_invite(in));
  REQUIRE(linked.has_value());
  CHECK(linked->node == "gpu-node-7");
  in.node = std::string(256, 'x');
  auto long_name = decode_nccl_invite(encode_nccl_invite(in));
  REQUIRE_FALSE(long_name.has_value());
  CHECK(long_name.err().message.find("node name of 256 bytes") != std::string::npos);
}

TEST_CASE("invitations that name no place in a group are refused with the reason") {
  struct bad_case {
    std::vector<uint8_t> bytes;
    const char* why;
  };
  const bad_case cases[] = {
      {raw_invite(127, 2, 0), "127 bytes, not 128"},
      {raw_invite(0, 2, 0), "0 bytes, not 128"},
      {raw_invite(128, 0, 0), "0 ranks"},
      {raw_invite(128, 257, 0), "257 ranks"},
      {raw_invite(128, 2, 2), "rank 2 of 2"},
      {raw_invite(128, 2, 0xffffffffu), "rank 4294967295 of 2"},
      {{1, 2, 3}, ""},
      {std::vector<uint8_t>(64, 0xff), ""},
  };
  for (const auto& c : cases) {
    auto out = decode_nccl_invite(c.bytes);
    REQUIRE_FALSE(out.has_value());
    CHECK_MESSAGE(out.err().message.find(c.why) != std::string::npos, out.err().message);
  }
}

}  // namespace troupe::wire
