// Naming helpers for builders that add several nodes under one name, e.g. a
// Variable "v" with "v/Assign" and "v/initial_value". Graph::add_node
// prefixes the current name scope itself, so these work with names relative
// to that scope.
#pragma once

#include <graphrun/graph.h>

#include <string>
#include <string_view>

namespace graphrun::ops_internal {

// The current name-scope prefix of `g`: "" or "outer/inner/".
inline std::string scope_prefix(const Graph& g) {
  const std::string probe = g.unique_name("");
  return probe.substr(0, probe.rfind('/') + 1);  // npos + 1 == 0: no scope
}

// `node`'s name relative to the current scope, so that add_node with name
// "<relative>/x" lands under it. (A node built in the current scope.)
inline std::string relative_name(const Graph& g, const Node& node) {
  const std::string prefix = scope_prefix(g);
  const std::string& full = node.name();
  if (full.compare(0, prefix.size(), prefix) == 0) return full.substr(prefix.size());
  return full;
}

// The name, relative to the current scope, that add_node(base) would give a
// new node now (not yet taken). Reserve it by adding that node before any
// other node of the same base.
inline std::string unique_relative_name(const Graph& g, std::string_view base) {
  const std::string full = g.unique_name(base);
  const std::string prefix = scope_prefix(g);
  return full.substr(prefix.size());
}

}  // namespace graphrun::ops_internal
