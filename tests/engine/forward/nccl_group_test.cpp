// The NCCL group's host side, which needs no GPU: loading NCCL, unique ids, joining from
// an id, abort. (Connecting ranks and all-reducing are in the GPU suite.)
#include "engine/forward/nccl_group.hpp"

#include <doctest/doctest.h>

namespace troupe {

#if defined(TROUPE_HAVE_NCCL)

TEST_CASE("NCCL groups: each has a fresh unique id, ranks joining from the id share the group, abort sticks") {
  const status usable = nccl_usable();
  REQUIRE_MESSAGE(usable.has_value(), (usable ? "" : usable.err().message));
  auto a = nccl_group::create(2);
  auto b = nccl_group::create(2);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK((*a)->size() == 2);
  CHECK((*a)->id().bytes != (*b)->id().bytes);
  CHECK((*a)->id().bytes != nccl_unique_id{}.bytes);

  // A rank of this process joins the object the stage holds: one abort reaches every rank.
  auto joined = nccl_group::join(2, (*a)->id());
  REQUIRE(joined.has_value());
  CHECK(joined->get() == a->get());
  CHECK_FALSE((*a)->aborted());
  (*joined)->abort();
  CHECK((*a)->aborted());
  CHECK_FALSE((*b)->aborted());

  auto wrong = nccl_group::join(3, (*b)->id());
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.err().message.find("2 ranks, not 3") != std::string::npos);
  auto none = nccl_group::join(0, (*b)->id());
  REQUIRE_FALSE(none.has_value());
  CHECK(none.err().message.find("at least one rank") != std::string::npos);

  // Once no rank here holds it, the id names a group of another process: a new object.
  const nccl_unique_id id = (*a)->id();
  a->reset();
  joined->reset();
  auto elsewhere = nccl_group::join(2, id);
  REQUIRE(elsewhere.has_value());
  CHECK((*elsewhere)->id().bytes == id.bytes);
  CHECK_FALSE((*elsewhere)->aborted());
}

#else

TEST_CASE("without NCCL, GPU tensor-parallel groups are refused with the reason") {
  auto g = nccl_group::create(2);
  REQUIRE_FALSE(g.has_value());
  CHECK(g.err().message.find("NCCL") != std::string::npos);
  CHECK_FALSE(nccl_usable().has_value());
}

#endif

}  // namespace troupe
