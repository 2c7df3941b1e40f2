#include "actors/caf/errors.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "actors/caf/system_config.hpp"

namespace troupe {

TEST_CASE("errors between actors: callers branch on the code, logs read the reason") {
  const caf::error e = make_error(error_code::unavailable, "replica r0 is recovering");
  REQUIRE(code_of(e).has_value());
  CHECK(*code_of(e) == error_code::unavailable);
  CHECK(reason_of(e) == "replica r0 is recovering");
  CHECK(reason_of(make_error(error_code::disabled, "")) == "disabled");
  // CAF's own errors have no troupe code, and read as words.
  CHECK_FALSE(code_of(caf::make_error(caf::sec::request_timeout)).has_value());
  CHECK_FALSE(code_of(caf::error{}).has_value());
  CHECK(reason_of(caf::make_error(caf::sec::request_timeout)) == "no answer in time");
  CHECK(reason_of(caf::make_error(caf::exit_reason::kill)) == "killed");
  CHECK(reason_of(caf::make_error(caf::sec::runtime_error, "boom")) == "runtime error: boom");
  // The actor system renders them the same way.
  system_config cfg;
  caf::actor_system sys{cfg};
  CHECK(sys.render(e) == "troupe: replica r0 is recovering");
}

TEST_CASE("errors between actors: a troupe error crosses an actor request whole") {
  system_config cfg;
  caf::actor_system sys{cfg};
  auto refuser = sys.spawn([](caf::event_based_actor*, int) -> caf::behavior {
    return {[](int) -> caf::result<int> { return make_error(error_code::not_found, "no such request"); }};
  }, 0);
  caf::scoped_actor self{sys};
  std::optional<error_code> code;
  std::string why;
  self->request(refuser, std::chrono::seconds(30), 1)
      .receive([](int) {}, [&](caf::error& e) {
        code = code_of(e);
        why = reason_of(e);
      });
  CHECK(code == error_code::not_found);
  CHECK(why == "no such request");
  self->send_exit(refuser, caf::exit_reason::user_shutdown);
}

}  // namespace troupe
