#include "actors/gateway/status_page.hpp"

#include <nlohmann/json.hpp>

namespace troupe {

namespace {

// The page: markup, style and script, all here. Rates come from the difference between
// two successive reports.
constexpr const char* page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>troupe status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d1d1f; background: #fafafa; }
  h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
  table { border-collapse: collapse; background: #fff; } td, th { padding: .3em .8em; border-bottom: 1px solid #e3e3e3; text-align: left; }
  th { font-weight: 600; color: #555; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
  .ok { color: #1a7f37; font-weight: 600; } .bad { color: #cf222e; font-weight: 600; } .muted { color: #777; }
  .bar { display: inline-block; width: 8em; height: .7em; background: #e3e3e3; vertical-align: middle; }
  .bar > span { display: block; height: 100%; background: #3b82f6; }
  #figures span { display: inline-block; margin-right: 2em; } #figures b { font-size: 1.2em; }
  form { margin: 1em 0; } #error { color: #cf222e; }
</style>
</head>
<body>
<h1>troupe: <span id="model"></span></h1>
<div class="muted">status <span id="health">loading</span> &middot; up <span id="uptime">-</span> &middot; refreshed every 2 s</div>
<form id="keyform" hidden><label>API key <input id="key" type="password" autocomplete="off"></label> <button>Show</button></form>
<div id="error"></div>
<h2>Traffic</h2>
<div id="figures"></div>
<h2>Replicas</h2>
<table><thead><tr><th>replica</th><th>state</th><th>stages</th><th>KV blocks in use</th><th>running</th><th>waiting</th><th>in flight</th><th>detail</th></tr></thead><tbody id="replicas"></tbody></table>
<h2>Nodes</h2>
<table><thead><tr><th>node</th><th>agent</th><th>actor restarts</th></tr></thead><tbody id="nodes"></tbody></table>
<h2>Recent failures and recoveries</h2>
<table><thead><tr><th>when</th><th>what</th></tr></thead><tbody id="events"></tbody></table>
<script>
"use strict";
const $ = id => document.getElementById(id);
let key = new URLSearchParams(location.hash.slice(1)).get("key") || sessionStorage.getItem("troupe-key") || "";
if (key) sessionStorage.setItem("troupe-key", key);
let last = null;
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }
function rows(body, items, fill) { body.replaceChildren(...items.map(x => { const tr = document.createElement("tr"); fill(tr, x); return tr; })); }
function duration(s) { s = Math.max(0, Math.round(s)); const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60; return (h ? h + "h " : "") + (h || m ? m + "m " : "") + (s % 60) + "s"; }
function render(r) {
  const ready = r.replicas.filter(x => x.ready).length;
  $("model").textContent = r.model;
  $("health").textContent = ready === r.replicas.length ? "ok" : ready ? "degraded" : "unavailable";
  $("health").className = ready === r.replicas.length ? "ok" : "bad";
  $("uptime").textContent = duration(r.now - r.started);
  const served = (r.requests.stop || 0) + (r.requests.length || 0);
  const failed = (r.requests.error || 0) + (r.requests.unavailable || 0);
  let rates = "";
  if (last && r.now > last.now) {
    const dt = r.now - last.now;
    const lastServed = (last.requests.stop || 0) + (last.requests.length || 0);
    rates = `<span>requests/s <b>${((served - lastServed) / dt).toFixed(2)}</b></span>` +
            `<span>output tokens/s <b>${((r.output_tokens - last.output_tokens) / dt).toFixed(1)}</b></span>`;
  }
  $("figures").innerHTML = rates +
    `<span>served <b id="served">${served}</b></span><span>failed <b id="failed">${failed}</b></span>` +
    `<span>refused <b>${(r.requests.invalid || 0) + (r.requests.rejected || 0)}</b></span>` +
    `<span>output tokens <b id="tokens">${r.output_tokens}</b></span>` +
    `<span>mean TTFT <b>${(r.ttft_mean_s * 1000).toFixed(1)} ms</b></span><span>mean TPOT <b>${(r.tpot_mean_s * 1000).toFixed(2)} ms</b></span>` +
    `<span>connections <b>${r.connections.http + r.connections.capnp}</b></span>` +
    `<span>failovers <b>${r.failovers}</b></span><span>outages <b>${r.outages}</b></span>`;
  const layout = Object.fromEntries((r.layout || []).map(x => [x.name, x.stages]));
  rows($("replicas"), r.replicas, (tr, x) => {
    tr.id = "replica-" + x.name;
    cell(tr, x.role && x.role !== "both" ? `${x.name} (${x.role})` : x.name);
    cell(tr, x.ready ? "ready" : x.found ? "recovering" : "down", x.ready ? "ok" : "bad");
    cell(tr, (layout[x.name] || []).map(s => `${s.node}: layers ${s.layers} on ${s.devices.join(", ")}`).join("; "));
    const total = x.kv_used + x.kv_free, td = cell(tr, "");
    td.innerHTML = `<span class="bar"><span style="width:${total ? 100 * x.kv_used / total : 0}%"></span></span> ${x.kv_used} / ${total}`;
    cell(tr, x.running, "n"); cell(tr, x.waiting, "n"); cell(tr, x.active, "n"); cell(tr, x.detail, "muted");
  });
  rows($("nodes"), r.nodes, (tr, x) => { cell(tr, x.name); cell(tr, x.answered ? "answers" : "silent", x.answered ? "ok" : "bad"); cell(tr, x.restarts, "n"); });
  rows($("events"), r.events.slice().reverse(), (tr, x) => { cell(tr, new Date(x.at * 1000).toLocaleTimeString()); cell(tr, x.what); });
  last = r;
}
async function refresh() {
  try {
    const res = await fetch("/status.json", { headers: key ? { Authorization: "Bearer " + key } : {} });
    if (res.status === 401) { $("keyform").hidden = false; $("error").textContent = "This server wants an API key."; return; }
    if (!res.ok) throw new Error("status " + res.status);
    $("error").textContent = ""; $("keyform").hidden = true;
    render(await res.json());
  } catch (e) { $("error").textContent = "The gateway does not answer: " + e.message; }
}
$("keyform").addEventListener("submit", e => { e.preventDefault(); key = $("key").value; sessionStorage.setItem("troupe-key", key); refresh(); });
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)HTML";

}  // namespace

std::string status_page_html() { return page; }

std::string status_json(const std::string& model_id, const std::string& router_json, const gateway_figures& g,
                        std::span<const replica_layout> layout) {
  nlohmann::json j = nlohmann::json::parse(router_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    j = nlohmann::json::object();
    j["replicas"] = nlohmann::json::array();
    j["nodes"] = nlohmann::json::array();
    j["events"] = nlohmann::json::array();
    j["error"] = "the router does not answer";
  }
  j["model"] = model_id;
  j["requests"] = g.outcomes;
  j["prompt_tokens"] = g.prompt_tokens;
  j["output_tokens"] = g.output_tokens;
  j["ttft_mean_s"] = g.ttft_mean_s;
  j["tpot_mean_s"] = g.tpot_mean_s;
  j["connections"] = {{"http", g.http_open}, {"capnp", g.capnp_open}};
  j["layout"] = nlohmann::json::array();
  for (const replica_layout& r : layout) {
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& s : r.stages) stages.push_back({{"node", s.node}, {"layers", s.layers}, {"devices", s.devices}});
    j["layout"].push_back({{"name", r.name}, {"stages", stages}});
  }
  return j.dump();
}

}  // namespace troupe
