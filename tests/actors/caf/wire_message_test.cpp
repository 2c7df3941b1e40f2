#include "actors/caf/wire_message.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"

namespace troupe {

namespace {

// (An argument beyond self: CAF 0.17 binds a reference to a null pointer starting an actor
// whose function takes none.)
caf::behavior echo(caf::event_based_actor*, int) {
  return {[](const wire_message& m) { return m; }};
}

}  // namespace

TEST_CASE("inside a process a wire_message is shared, not copied") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto a = sys.spawn(echo, 0);
  wire_message sent(wire_kind::step_plan, std::vector<uint8_t>(1 << 20, 7));
  caf::scoped_actor self{sys};
  const void* got = nullptr;
  size_t got_size = 0;
  self->request(a, std::chrono::seconds(5), sent)
      .receive([&](const wire_message& m) {
                 got = m.bytes.get();
                 got_size = m.size();
               },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(got == sent.bytes.get());
  CHECK(got_size == size_t{1} << 20);
  self->send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("across processes it serializes, and bad input is refused on load") {
  system_config cfg;
  caf::actor_system sys{cfg};
  wire_message m(wire_kind::activations, {1, 2, 3, 4, 5});
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(m));
  wire_message back;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(back));
  CHECK(back.kind == wire_kind::activations);
  REQUIRE(back.bytes);
  CHECK(*back.bytes == *m.bytes);

  // Truncated: an error, no crash.
  for (size_t n = 0; n < buf.size(); ++n) {
    std::vector<char> cut(buf.begin(), buf.begin() + n);
    wire_message x;
    caf::binary_deserializer s{sys, cut};
    CHECK(s(x));
  }
  // An unknown kind is refused.
  auto bad = buf;
  bad[0] = 0x7f;
  wire_message y;
  caf::binary_deserializer s2{sys, bad};
  CHECK(s2(y));
}

}  // namespace troupe
