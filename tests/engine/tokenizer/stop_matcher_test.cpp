#include "engine/tokenizer/stop_matcher.hpp"

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("text is held back while it may begin a stop string, and cut before it") {
  stop_matcher m({"END", "\n\n"});
  CHECK(m.push("hello E") == "hello ");
  CHECK(m.push("N") == "");
  CHECK(m.push("x") == "ENx");  // not a stop after all
  CHECK(m.push(" and EN") == " and ");
  CHECK(m.push("D more") == "");
  CHECK(m.stopped());
  CHECK(m.push("later") == "");
  CHECK(m.flush() == "");
}

TEST_CASE("the earliest stop string wins, and flush releases a held tail") {
  stop_matcher m({"cd", "b"});
  CHECK(m.push("abcd") == "a");
  CHECK(m.stopped());
  stop_matcher n({"xyz"});
  CHECK(n.push("abxy") == "ab");
  CHECK(n.flush() == "xy");
  stop_matcher none({});
  CHECK(none.push("anything") == "anything");
}

}  // namespace troupe
