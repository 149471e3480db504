// A target's node by name, as every session takes it: "node", "^node"
// (TF's control-input spelling) or "node:0" (a tensor naming its node).
#pragma once

#include <graphrun/graph.h>

#include <string_view>

namespace graphrun::internal {

// Null when the graph has no such node.
inline const Node* find_target_node(const Graph& g, std::string_view name) {
  if (!name.empty() && name.front() == '^') name.remove_prefix(1);
  if (const Node* n = g.find_node(name)) return n;
  Result<TensorName> tn = parse_tensor_name(name);
  return tn.is_ok() ? g.find_node(tn->node) : nullptr;
}

}  // namespace graphrun::internal
