// A stage split over GPUs with NCCL invites its shards into the group with a message
// carrying the group's id. On devices that do not exist (cuda:998, cuda:999, on any
// machine) the shards take the invitation, fail to build, and abort the group; before that,
// a shard refuses steps and invitations that are not its own. A CPU stage refuses device
// links. (Connecting, summing and linking on real devices are in the GPU suite.)
#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"
#include "actors/caf/type_ids.hpp"
#include "actors/shard_actor.hpp"
#include "actors/stage_actor.hpp"
#include "actors/wire/control_codec.hpp"
#include "tests/support/test_support.hpp"

namespace troupe {

namespace {

// stories260K and an actor system to spawn stages and shards of it in.
struct stories_actors {
  const test::loaded l = test::load(test::models_dir() + "/stories260K.bin", test::models_dir() + "/tok512.bin");
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
};

}  // namespace

#if defined(TROUPE_HAVE_NCCL)

namespace {

// The error `msg` gets from `shard` ("" when it is answered without one).
std::string answer_to(caf::scoped_actor& self, const caf::actor& shard, const wire_message& msg) {
  std::string out = "no answer";
  self->request(shard, std::chrono::seconds(30), connect_atom_v, msg)
      .receive([&] { out.clear(); }, [&](caf::error& e) { out = self->system().render(e); });
  return out;
}

wire_message invite(const nccl_group& g, int32_t size, int32_t rank) {
  return wire_message(wire_kind::nccl_invite, wire::encode_nccl_invite({g.id(), size, rank, ""}));
}

// Waits (up to 30 s) for the down message of the monitored `who`.
bool ended(caf::scoped_actor& self, const caf::actor& who) {
  bool down = false;
  self->receive([&](const caf::down_msg& d) { down = d.source == who.address(); },
                caf::after(std::chrono::seconds(30)) >> [] {});
  return down;
}

}  // namespace

TEST_CASE_FIXTURE(stories_actors, "a GPU shard of an NCCL stage builds on its own invitation and refuses others") {
  REQUIRE(nccl_usable().has_value());
  auto group = nccl_group::create(2);
  REQUIRE(group.has_value());

  shard_setup s;
  s.m = &l.m;
  s.spec = shard_spec{0, l.m.config.num_layers, tp_slice{1, 2}};
  s.kv.num_blocks = 16;
  s.device = "cuda:999";
  caf::actor shard = spawn_shard(sys, s);
  self->monitor(shard);

  // Not built yet: steps wait for the group.
  std::string step_error;
  self->request(shard, std::chrono::seconds(30), step_atom_v, wire_message{}, wire_message{})
      .receive([&](const wire_message&) { step_error = "answered"; },
               [&](caf::error& e) { step_error = sys.render(e); });
  CHECK(step_error.find("not yet connected to its tensor-parallel group") != std::string::npos);

  // Invitations that are not this shard's: refused, and the shard stays.
  CHECK(answer_to(self, shard, invite(**group, 2, 0)).find("invited as rank 0 of 2, but this shard is rank 1 of 2") !=
        std::string::npos);
  CHECK(answer_to(self, shard, invite(**group, 4, 1)).find("rank 1 of 4") != std::string::npos);
  CHECK(answer_to(self, shard, wire_message(wire_kind::step_plan, {1, 2, 3})).find("expected an NCCL invitation") !=
        std::string::npos);
  CHECK(answer_to(self, shard, wire_message(wire_kind::nccl_invite, std::vector<uint8_t>(40, 0xff))) != "");
  CHECK_FALSE((*group)->aborted());

  // Its own: it joins the group, cannot build on a device that is not there, and aborts
  // the group (its peers would wait for it) as it ends.
  const std::string built = answer_to(self, shard, invite(**group, 2, 1));
  CHECK(built.find("could not be built") != std::string::npos);
  CHECK(ended(self, shard));
  CHECK((*group)->aborted());
}

TEST_CASE_FIXTURE(stories_actors, "an NCCL stage invites each shard as its rank: shards that cannot build abort the group and end the stage") {
  REQUIRE(nccl_usable().has_value());
  stage_layout layout;
  layout.first_layer = 0;
  layout.end_layer = l.m.config.num_layers;
  layout.tp = 2;
  layout.devices = {"cuda:998", "cuda:999"};
  layout.kv.num_blocks = 16;
  layout.max_step_tokens = 64;
  stage_group g = spawn_stage_group(sys, l.m, layout);
  REQUIRE(g.gpu_group);
  CHECK_FALSE(g.group);
  self->monitor(g.stage);
  CHECK(ended(self, g.stage));
  CHECK(g.gpu_group->aborted());
}

#endif

TEST_CASE_FIXTURE(stories_actors, "a CPU stage has no device links: asked for one, it says so, and goes on serving") {
  stage_layout layout;
  layout.first_layer = 1;
  layout.end_layer = l.m.config.num_layers;
  layout.kv.num_blocks = 16;
  layout.max_step_tokens = 64;
  stage_group g = spawn_stage_group(sys, l.m, layout);
  const auto t = std::chrono::seconds(30);
  std::string drawn = "answered", joined = "answered", connected = "answered", link = "answered";
  self->request(g.stage, t, link_in_atom_v).receive([](const wire_message&) {}, [&](caf::error& e) { drawn = sys.render(e); });
  const wire_message invite(wire_kind::nccl_invite, wire::encode_nccl_invite({nccl_unique_id{}, 2, 0, "here"}));
  self->request(g.stage, t, link_out_atom_v, invite).receive([] {}, [&](caf::error& e) { joined = sys.render(e); });
  self->request(g.stage, t, link_in_atom_v, invite).receive([] {}, [&](caf::error& e) { connected = sys.render(e); });
  CHECK(drawn.find("a CPU stage has no device links") != std::string::npos);
  CHECK(joined.find("a CPU stage has no device links") != std::string::npos);
  CHECK(connected.find("not this stage's input link") != std::string::npos);
  self->send(g.stage, unlink_atom_v);
  // Still there: a lone CPU shard without a node host has no step link, and says so.
  self->request(g.stage, t, link_atom_v).receive([](uint16_t) {}, [&](caf::error& e) { link = sys.render(e); });
  CHECK(link.find("no step link") != std::string::npos);
}

}  // namespace troupe
