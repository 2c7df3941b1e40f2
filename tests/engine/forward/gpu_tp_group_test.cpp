// The NCCL group's host side, which needs no GPU: loading NCCL, unique ids, joining from
// an id, abort. (Connecting ranks and all-reducing are in the GPU suite.)
#include "engine/forward/gpu_tp_group.hpp"

#include <doctest/doctest.h>

namespace troupe {

#if defined(TROUPE_HAVE_NCCL)

TEST_CASE("NCCL groups: each has a fresh unique id, another process's joins from the id, abort sticks") {
  const status usable = nccl_usable();
  REQUIRE_MESSAGE(usable.has_value(), (usable ? "" : usable.err().message));
  auto a = gpu_tp_group::create(2);
  auto b = gpu_tp_group::create(2);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK((*a)->size() == 2);
  CHECK((*a)->id().bytes != (*b)->id().bytes);
  CHECK((*a)->id().bytes != nccl_unique_id{}.bytes);
  auto joined = gpu_tp_group::join(2, (*a)->id());
  REQUIRE(joined.has_value());
  CHECK((*joined)->id().bytes == (*a)->id().bytes);
  CHECK_FALSE((*joined)->aborted());
  (*joined)->abort();
  CHECK((*joined)->aborted());
  CHECK_FALSE((*a)->aborted());  // a joined copy is its own group object
  auto none = gpu_tp_group::join(0, (*a)->id());
  REQUIRE_FALSE(none.has_value());
  CHECK(none.err().message.find("at least one rank") != std::string::npos);
}

#else

TEST_CASE("without NCCL, GPU tensor-parallel groups are refused with the reason") {
  auto g = gpu_tp_group::create(2);
  REQUIRE_FALSE(g.has_value());
  CHECK(g.err().message.find("NCCL") != std::string::npos);
  CHECK_FALSE(nccl_usable().has_value());
}

#endif

}  // namespace troupe
