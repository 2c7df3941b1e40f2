#include "tools/common/speculative_cli.hpp"

namespace troupe::tools {

expected<speculative_config> speculative_from(const speculative_cli& o, const model& target, std::optional<model>& draft) {
  speculative_config c;
  const auto method = parse_spec_method(o.method);
  if (!method) return error{"--speculative: '" + o.method + "' is not ngram, draft, early-exit or none"};
  c.method = *method;
  if (!c.enabled()) {
    if (o.k != -1 || !o.draft.empty() || o.exit_layer != 0)
      return error{"-k, --draft and --exit-layer apply with --speculative ngram, draft or early-exit"};
    return c;
  }
  if (o.k != -1) c.k = o.k;
  c.exit_layer = o.exit_layer;
  if (o.exit_layer != 0 && c.method != spec_method::early_exit) return error{"--exit-layer applies to --speculative early-exit"};
  if (o.exit_layer < 0) return error{"--exit-layer must be 1 or more"};
  if (!o.draft.empty() && c.method != spec_method::draft) return error{"--draft applies to --speculative draft"};
  if (auto e = validate(c, target.config)) return error{*e};
  if (c.method == spec_method::draft) {
    if (o.draft.empty()) return error{"--speculative draft needs --draft FILE, a model with this model's vocabulary"};
    auto d = load_model(o.draft);
    if (!d) return error{"--draft " + o.draft + ": " + d.err().message};
    if (auto e = check_draft(*d, target)) return error{"--draft " + o.draft + ": " + *e};
    draft = std::move(*d);
  }
  return c;
}

}  // namespace troupe::tools
