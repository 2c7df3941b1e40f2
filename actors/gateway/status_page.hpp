// The status page: GET /status serves one small HTML page, with no external assets, that
// fetches GET /status.json every 2 s and renders it: the deployment (each replica's
// stages), each replica's health, KV use and batch, request and token rates, recent
// failures and restarts. /status.json is behind the API keys, as the API is; the page
// sends the key it is given in its address's fragment (/status#key=KEY: a fragment never
// reaches a server or its logs) or in its form, and keeps it for the browser tab.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "actors/gateway/gateway_metrics.hpp"
#include "actors/gateway/router_calls.hpp"

namespace troupe {

// The page holds nothing of the deployment, not even the model's name: all of it comes
// from /status.json.
std::string status_page_html();

// A replica as the page shows it: its stages' nodes, layers ("0-2") and devices.
struct replica_layout {
  struct stage {
    std::string node, layers;
    std::vector<std::string> devices;
  };
  std::string name;
  std::vector<stage> stages;
};

// The figures: the router's report (render_status's JSON), the gateway's own, and the
// deployment's layout.
std::string status_json(const std::string& model_id, const std::string& router_json, const gateway_figures& g,
                        std::span<const replica_layout> layout);

}  // namespace troupe
