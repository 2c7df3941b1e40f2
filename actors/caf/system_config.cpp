#include "actors/caf/system_config.hpp"

#include <caf/io/middleman.hpp>
#include <caf/settings.hpp>

#include "actors/caf/type_ids.hpp"

namespace troupe {

system_config::system_config(const failure_detection& fd) {
  load<caf::io::middleman>();
  add_message_types<caf::id_block::troupe>();
  caf::put(content, "middleman.heartbeat-interval", caf::timespan{fd.heartbeat_interval});
  caf::put(content, "middleman.connection-timeout", caf::timespan{fd.connection_timeout});
}

}  // namespace troupe
