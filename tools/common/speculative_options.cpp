#include "tools/common/speculative_options.hpp"

namespace troupe::tools {

expected<speculative_config> speculative_config_of(const speculative_options& o, const model_config& target,
                                                   bool topology) {
  // How the mistakes name each option.
  const std::string method_name = topology ? "[speculative] method" : "--speculative";
  const std::string k_name = topology ? "[speculative] k" : "-k";
  const std::string draft_name = topology ? "[speculative] draft" : "--draft";
  const std::string exit_name = topology ? "[speculative] exit_layer" : "--exit-layer";
  speculative_config c;
  const auto method = parse_spec_method(o.method);
  if (!method) return error{method_name + ": '" + o.method + "' is not ngram, draft, early-exit or none"};
  c.method = *method;
  if (!c.enabled()) {
    if (o.k != -1 || !o.draft.empty() || o.exit_layer != 0)
      return error{k_name + ", " + draft_name + " and " + exit_name + " apply with " + method_name +
                   " ngram, draft or early-exit"};
    return c;
  }
  if (o.k != -1) c.k = o.k;
  c.exit_layer = o.exit_layer;
  if (o.exit_layer != 0 && c.method != spec_method::early_exit) return error{exit_name + " applies to early-exit"};
  if (o.exit_layer < 0) return error{exit_name + " must be 1 or more"};
  if (!o.draft.empty() && c.method != spec_method::draft) return error{draft_name + " applies to draft"};
  if (c.method == spec_method::draft && o.draft.empty())
    return error{method_name + " draft needs " + draft_name + (topology ? " = FILE" : " FILE") +
                 ", a model with this model's vocabulary"};
  if (auto e = validate(c, target)) return error{*e};
  return c;
}

expected<speculative_config> speculative_from(const speculative_options& o, const model& target,
                                              std::optional<model>& draft, bool topology) {
  auto c = speculative_config_of(o, target.config, topology);
  if (!c || c->method != spec_method::draft) return c;
  const std::string draft_name = topology ? "[speculative] draft " : "--draft ";
  auto d = load_model(o.draft);
  if (!d) return error{draft_name + o.draft + ": " + d.err().message};
  if (auto e = check_draft(*d, target)) return error{draft_name + o.draft + ": " + *e};
  draft = std::move(*d);
  return c;
}

}  // namespace troupe::tools
