/// @file graphrun/attr_value.h
/// Node attributes: the compile-time parameters of a node (a MatMul's
/// transpose flags, a Const's value, a Placeholder's dtype and shape).
///
/// Thread safety: values; thread-compatible.
#pragma once

#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace graphrun {

/// One attribute value, of one of TensorFlow's attribute kinds: bool, int,
/// float, string, type, shape, tensor, list(int), list(type).
using AttrValue = std::variant<bool, int64_t, double, std::string, DType, Shape, Tensor,
                               std::vector<int64_t>, std::vector<DType>>;

/// Sorted by name; lookups accept string_view.
using AttrMap = std::map<std::string, AttrValue, std::less<>>;

/// "bool", "int", "float", "string", "type", "shape", "tensor", "list(int)",
/// "list(type)" — TF's attribute type names.
std::string_view attr_kind_name(const AttrValue& v);
/// The same for the AttrValue alternative at `variant_index`.
std::string_view attr_kind_name(std::size_t variant_index);
/// Short human form for messages and DOT labels.
std::string attr_to_string(const AttrValue& v);

/// Typed lookup: NotFound when missing, InvalidArgument when of another kind.
/// `owner` names the node in messages.
template <typename T>
Result<T> get_attr(const AttrMap& attrs, std::string_view name, std::string_view owner) {
  auto it = attrs.find(name);
  if (it == attrs.end()) return not_found("{}: no attribute '{}'", owner, name);
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  return invalid_argument("{}: attribute '{}' is a {}, not a {}", owner, name,
                          attr_kind_name(it->second), attr_kind_name(AttrValue(T{}).index()));
}

}  // namespace graphrun
