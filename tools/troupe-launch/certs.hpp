// troupe-launch certs: the files a topology's [tls] names. A cluster CA (kept if it exists),
// and a certificate and key for every node and for troupe-launch itself, each signed by
// that CA; existing ones are kept while they still check out, unless renewed.
#pragma once

#include "tools/common/topology.hpp"

namespace troupe::tools {

int make_certs(const topology& topo, bool renew);

}  // namespace troupe::tools
