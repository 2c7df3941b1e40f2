#include "actors/gateway/admission.hpp"

#include <vector>

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("admission: each completion counts as one, past the budget a request is refused at once") {
  admission a(4);
  auto three = a.admit(3);
  REQUIRE(three);
  CHECK(a.in_flight() == 3);
  CHECK_FALSE(a.admit(2));  // 3 + 2 > 4
  CHECK(a.in_flight() == 3);  // a refusal takes nothing
  auto one = a.admit(1);
  REQUIRE(one);
  CHECK_FALSE(a.admit(1));
  three.reset();  // a ticket gives its place back when it goes
  CHECK(a.in_flight() == 1);
  CHECK(a.admit(3));
}

TEST_CASE("admission: a request larger than the budget is let in alone, as the whole budget") {
  admission a(4);
  {
    auto big = a.admit(64);
    REQUIRE(big);
    CHECK(big->weight() == 4);
    CHECK_FALSE(a.admit(1));
  }
  auto one = a.admit(1);
  REQUIRE(one);
  CHECK_FALSE(a.admit(64));  // not while anything else is in flight
  CHECK(a.in_flight() == 1);
}

TEST_CASE("admission: a moved ticket gives its place back once") {
  admission a(2);
  std::vector<admission::ticket> held;
  held.push_back(std::move(*a.admit(1)));
  held.push_back(std::move(*a.admit(1)));
  CHECK(a.in_flight() == 2);
  admission::ticket moved = std::move(held[0]);
  held.clear();
  CHECK(a.in_flight() == 1);
  moved.release();
  moved.release();
  CHECK(a.in_flight() == 0);
}

}  // namespace troupe
