#include "tools/common/speculative_options.hpp"

#include <algorithm>
#include <charconv>

#include "kernels/cpu/paged_attention.hpp"

namespace troupe::tools {

expected<speculative_config> speculative_config_of(const speculative_options& o, const model_config& target,
                                                   bool topology) {
  // How the mistakes name each option.
  const std::string method_name = topology ? "[speculative] method" : "--speculative";
  const std::string k_name = topology ? "[speculative] k" : "-k";
  const std::string draft_name = topology ? "[speculative] draft" : "--draft";
  const std::string exit_name = topology ? "[speculative] exit_layer" : "--exit-layer";
  const std::string heads_name = topology ? "[speculative] heads" : "--heads";
  speculative_config c;
  const auto method = parse_spec_method(o.method);
  if (!method) return error{method_name + ": '" + o.method + "' is not ngram, draft, early-exit, medusa, eagle or none"};
  c.method = *method;
  if (!c.enabled()) {
    if (o.k != -1 || !o.draft.empty() || o.exit_layer != 0 || !o.heads.empty() || !o.tree.empty() || o.max_step_tokens != 0)
      return error{k_name + ", " + draft_name + ", " + heads_name + " and " + exit_name + " apply with " + method_name +
                   " ngram, draft, early-exit, medusa or eagle"};
    return c;
  }
  if (!o.tree.empty()) {
    const std::string tree_name = topology ? "[speculative] tree" : "--tree";
    if (o.k != -1) return error{k_name + " and " + tree_name + ": a tree sets how many drafts a step verifies"};
    auto number = [](const std::string& w, int32_t& v) {
      const auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
      return !w.empty() && ec == std::errc() && p == w.data() + w.size();
    };
    if (o.tree.rfind("auto", 0) == 0) {  // auto, or auto:NODES
      c.tree_auto = 15;
      if (o.tree.size() > 4 && (o.tree[4] != ':' || !number(o.tree.substr(5), c.tree_auto)))
        return error{tree_name + ": '" + o.tree + "' is not auto or auto:NODES"};
      if (c.tree_auto < 1)  // (0 would read as no auto at all)
        return error{tree_name + ": a tree's node budget must be in 1.." + std::to_string(max_tree_tokens - 1) + "; got " +
                     std::to_string(c.tree_auto)};
      c.tree = {1, 1, 1, 1};  // the first shape, until acceptance is measured
    } else {
      size_t at = 0;
      while (at <= o.tree.size()) {
        const size_t end = std::min(o.tree.find(',', at), o.tree.size());
        int32_t v = 0;
        if (!number(o.tree.substr(at, end - at), v))
          return error{tree_name + ": '" + o.tree + "' is not widths by depth, as 4,2,2, or auto[:NODES]"};
        c.tree.push_back(v);
        at = end + 1;
      }
    }
    c.max_step_tokens = std::max({c.max_step_tokens, c.tree_nodes() + 1, c.tree_auto + 1});
  }
  if (o.k != -1) c.k = o.k;
  if (o.max_step_tokens != 0) {
    const int32_t least = c.tree.empty() ? 1 : std::max(c.tree_nodes() + 1, c.tree_auto + 1);
    if (o.max_step_tokens < least)
      return error{std::string(topology ? "[speculative] max_step_tokens" : "max_step_tokens") + " must be at least " +
                   std::to_string(least) + (c.tree.empty() ? "" : " (the tree's nodes and its root)")};
    c.max_step_tokens = o.max_step_tokens;
  }
  c.exit_layer = o.exit_layer;
  if (o.exit_layer != 0 && c.method != spec_method::early_exit) return error{exit_name + " applies to early-exit"};
  if (o.exit_layer < 0) return error{exit_name + " must be 1 or more"};
  if (!o.draft.empty() && c.method != spec_method::draft) return error{draft_name + " applies to draft"};
  if (!o.heads.empty() && !c.uses_heads()) return error{heads_name + " applies to medusa and eagle"};
  if (c.uses_heads() && o.heads.empty())
    return error{method_name + " " + o.method + " needs " + heads_name + (topology ? " = FILE" : " FILE") +
                 ", a head file troupe-train made for this model"};
  if (c.method == spec_method::draft && o.draft.empty())
    return error{method_name + " draft needs " + draft_name + (topology ? " = FILE" : " FILE") +
                 ", a model with this model's vocabulary"};
  if (auto e = validate(c, target)) return error{*e};
  return c;
}

expected<speculative_config> speculative_from(const speculative_options& o, const model& target,
                                              const vocabulary* target_vocab, speculative_models& loaded,
                                              bool topology) {
  auto c = speculative_config_of(o, target.config, topology);
  if (!c) return c;
  if (c->uses_heads()) {
    const std::string heads_name = topology ? "[speculative] heads " : "--heads ";
    auto h = load_heads(o.heads, target, target_vocab);
    if (!h) return error{heads_name + h.err().message};
    if (o.k == -1) c->k = std::min(c->k, (*h)->depth());
    if (c->tree_auto > 0 && static_cast<int32_t>(c->tree.size()) > (*h)->depth()) c->tree.resize((*h)->depth());
    if (auto e = check_heads(*c, **h)) return error{*e};
    loaded.heads = std::move(*h);
    return c;
  }
  if (c->method != spec_method::draft) return c;
  const std::string draft_name = topology ? "[speculative] draft " : "--draft ";
  auto d = load_model(o.draft);
  if (!d) return error{draft_name + o.draft + ": " + d.err().message};
  if (auto e = check_draft(*d, target)) return error{draft_name + o.draft + ": " + *e};
  loaded.draft = std::move(*d);
  return c;
}

}  // namespace troupe::tools
