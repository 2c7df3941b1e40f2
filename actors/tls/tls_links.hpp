// tls_links: troupe's own links between nodes (step links, the KV channel) over TLS 1.3,
// with the same context as the node's middleman links (node_links.hpp): both ends show a
// certificate of the cluster's CA, and a peer that does not is refused with the reason.
//
// A stream is one SSL object over a non-blocking socket: every OpenSSL call on it is made
// under the stream's lock, and waits for the socket happen outside it, so one thread can
// read while another writes, as the links do.
#pragma once

#include <memory>

#include "actors/tls/tls_context.hpp"
#include "engine/util/link_stream.hpp"

namespace troupe::tls {

std::shared_ptr<const link_guard> link_guard_of(std::shared_ptr<context> ctx);

}  // namespace troupe::tls
