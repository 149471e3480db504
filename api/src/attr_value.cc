#include <graphrun/attr_value.h>

#include <fmt/ranges.h>

namespace graphrun {

std::string_view attr_kind_name(std::size_t variant_index) {
  switch (variant_index) {
    case 0: return "bool";
    case 1: return "int";
    case 2: return "float";
    case 3: return "string";
    case 4: return "type";
    case 5: return "shape";
    case 6: return "tensor";
    case 7: return "list(int)";
    case 8: return "list(type)";
    default: return "unknown";
  }
}

std::string_view attr_kind_name(const AttrValue& v) { return attr_kind_name(v.index()); }

std::string attr_to_string(const AttrValue& v) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(const std::string& s) const { return fmt::format("\"{}\"", s); }
    std::string operator()(DType d) const { return std::string(dtype_name(d)); }
    std::string operator()(const Shape& s) const { return s.to_string(); }
    std::string operator()(const Tensor& t) const { return t.to_string(8); }
    std::string operator()(const std::vector<int64_t>& l) const {
      return fmt::format("[{}]", fmt::join(l, ","));
    }
    std::string operator()(const std::vector<DType>& l) const {
      std::string s = "[";
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (i > 0) s += ',';
        s += dtype_name(l[i]);
      }
      return s + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

}  // namespace graphrun
