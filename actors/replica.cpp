#include "actors/replica.hpp"

#include <caf/all.hpp>

namespace troupe {

std::string stage_name(const std::string& replica, size_t index) { return replica + "/stage" + std::to_string(index); }
std::string scheduler_name(const std::string& replica) { return replica + "/scheduler"; }
std::string kv_manager_name(const std::string& replica) { return replica + "/kv"; }
std::string draft_name(const std::string& replica) { return replica + "/draft"; }

unit_spec draft_unit(const std::string& replica, const draft_setup& setup) {
  const std::string name = draft_name(replica);
  return unit_spec{name, [name, setup](caf::actor agent) {
                     unit_instance u;
                     u.members.push_back({name, wire::actor_kind::draft, spawn_draft(agent.home_system(), setup)});
                     return u;
                   }};
}

unit_spec kv_manager_unit(const std::string& replica, const kv_manager_setup& setup) {
  const std::string name = kv_manager_name(replica);
  return unit_spec{name, [name, setup](caf::actor agent) {
                     unit_instance u;
                     u.members.push_back({name, wire::actor_kind::kv_manager, spawn_kv_manager(agent.home_system(), setup)});
                     return u;
                   }};
}

unit_spec stage_unit(const model& m, const std::string& replica, size_t index, const stage_layout& layout) {
  const std::string name = stage_name(replica, index);
  return unit_spec{name, [&m, name, layout](caf::actor agent) {
                     auto g = spawn_stage_group(agent.home_system(), m, layout);
                     unit_instance u;
                     u.members.push_back({name, wire::actor_kind::stage, g.stage});
                     for (size_t r = 0; r < g.shards.size(); ++r)
                       u.members.push_back({name + "/shard" + std::to_string(r), wire::actor_kind::shard, g.shards[r]});
                     if (g.group) u.abort = [group = g.group] { group->abort(); };
                     if (g.gpu_group) u.abort = [group = g.gpu_group] { group->abort(); };
                     return u;
                   }};
}

unit_spec scheduler_unit(const std::string& replica, scheduler_setup setup) {
  const std::string name = scheduler_name(replica);
  return unit_spec{name, [name, setup](caf::actor agent) {
                     scheduler_setup s = setup;
                     s.agent = agent;
                     unit_instance u;
                     u.members.push_back({name, wire::actor_kind::scheduler, spawn_scheduler(agent.home_system(), s)});
                     return u;
                   }};
}

local_replica spawn_replica(caf::actor_system& sys, const model& m, const std::vector<stage_layout>& stages,
                            const std::string& name, draft_setup draft) {
  local_replica out;
  std::vector<unit_spec> units;
  for (size_t i = 0; i < stages.size(); ++i) {
    units.push_back(stage_unit(m, name, i, stages[i]));
    out.stages.push_back(stage_address{stage_name(name, i), "", 0});
  }
  kv_manager_setup kv;
  kv.kv = stages.empty() ? kv_config{} : stages[0].kv;
  kv.context = m.config.max_seq_len;
  units.push_back(kv_manager_unit(name, kv));
  out.kv_manager = kv_manager_name(name);
  if (draft.m) {
    draft.kv = kv.kv;
    draft.context = kv.context;
    units.push_back(draft_unit(name, draft));
    out.draft = stage_address{draft_name(name), "", 0};
  }
  out.agent = spawn_node_agent(sys, "local", std::move(units));
  return out;
}

}  // namespace troupe
