// The attribute names an op declares, as error messages list them (the
// graph builder's check and the GraphDef reader's).
#pragma once

#include <graphrun/op_kernel.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace graphrun::internal {

// Its type attributes and other attributes, sorted and joined by ", ";
// "none" when it declares none.
inline std::string declared_attr_names(const OpDef& def) {
  std::vector<std::string> names;
  for (const auto& t : def.type_attrs()) names.push_back(t.name);
  for (const auto& d : def.attrs()) names.push_back(d.name);
  std::sort(names.begin(), names.end());
  return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace graphrun::internal
