#include "actors/caf/system_config.hpp"

#include <caf/io/middleman.hpp>
#include <caf/settings.hpp>

#include <algorithm>
#include <thread>

#include "actors/caf/errors.hpp"
#include "actors/caf/type_ids.hpp"

namespace troupe {

system_config::system_config(const failure_detection& fd) {
  load<caf::io::middleman>();
  add_message_types<caf::id_block::troupe>();
  add_error_category(error_category, [](uint8_t code, caf::atom_value, const caf::message& context) {
    return "troupe: " + reason_of(caf::error(code, error_category, context));
  });
  // The middleman looks for silent peers when it sends its heartbeats: sending them three
  // times a heartbeat interval notices a hung peer within a third of an interval past the
  // timeout rather than a whole one (and leaves a late heartbeat more slack).
  caf::put(content, "middleman.heartbeat-interval", caf::timespan{std::max(fd.heartbeat_interval / 3, std::chrono::milliseconds(5))});
  caf::put(content, "middleman.connection-timeout", caf::timespan{fd.connection_timeout});
  // Idle workers that poll with sleeps add tens of microseconds to every hop; a step
  // crosses several. As many workers as cores, and no sleeping polls (measured: the
  // cross-process round trip drops from ~270 us to under 100 us).
  caf::put(content, "scheduler.max-threads", std::max<size_t>(2, std::thread::hardware_concurrency()));
  caf::put(content, "work-stealing.moderate-poll-attempts", size_t{0});
}

}  // namespace troupe
