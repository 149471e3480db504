// Graph <-> GraphDef.
//
// Import runs in four passes, so that the first error reported is the
// first problem in the GraphDef's own order:
//   1. names: each node's name is valid (TensorFlow's rule) and unique;
//   2. per node: the op is known (after translation), inputs parse and name
//      nodes of the graph, TensorFlow's ref-variable forms are translated,
//      attributes are converted against the op's definition;
//   3. order: a topological order of data inputs, control inputs and the
//      variable an assign names (ties keep the GraphDef's order); a cycle is
//      an error naming the nodes on it;
//   4. build: Graph::add_node in that order (input indices checked against
//      the producer's outputs first; add_node checks dtypes and shapes).
// docs/graph-files.md describes the rules and the attribute table.
#include <graphrun/graph_def.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/src/op_def_attrs.h"
#include "graphdef/src/convert.h"

namespace graphrun {
namespace {

using graphdef_internal::dtype_from_proto;
using graphdef_internal::dtype_to_proto;
using graphdef_internal::shape_from_proto;
using graphdef_internal::shape_to_proto;

// TensorFlow ops imported as a graphrun op of another name. (AddV2 and
// RealDiv need no entry: graphrun registers them as aliases of Add and Div.)
const std::map<std::string_view, std::string_view>& op_aliases() {
  static const std::map<std::string_view, std::string_view> aliases{
      // TF's resource-less ref variable (VariableV2); see translate_variable.
      {"VariableV2", "Variable"},
  };
  return aliases;
}

// Attributes TensorFlow sets that graphrun's op of that name does not
// declare, accepted and dropped (keyed by graphrun op name). The variable
// attributes container/shared_name are handled by translate_variable.
const std::map<std::string_view, std::vector<std::string_view>>& ignored_attrs() {
  static const std::map<std::string_view, std::vector<std::string_view>> table{
      // Hints TF's gradient code sets on MatMuls it creates for backprop;
      // they do not change the product.
      {"MatMul", {"grad_a", "grad_b"}},
  };
  return table;
}

bool is_ignored_attr(std::string_view op, std::string_view attr) {
  auto it = ignored_attrs().find(op);
  if (it == ignored_attrs().end()) return false;
  return std::find(it->second.begin(), it->second.end(), attr) != it->second.end();
}

bool is_variable_op(std::string_view tf_op) { return tf_op == "VariableV2" || tf_op == "Variable"; }
bool is_assign_op(std::string_view op) {
  return op == "Assign" || op == "AssignAdd" || op == "AssignSub";
}

std::string describe(const v1::NodeDef& n) {
  return fmt::format("node '{}' ({})", n.name(), n.op());
}

struct InputRef {
  std::string node;
  int index = 0;
  bool control = false;
};

// "name", "name:k" or "^name".
Result<InputRef> parse_input(std::string_view text) {
  InputRef ref;
  if (!text.empty() && text[0] == '^') {
    ref.control = true;
    text.remove_prefix(1);
  } else if (auto colon = text.rfind(':'); colon != std::string_view::npos) {
    std::string_view digits = text.substr(colon + 1);
    int index = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0 ||
        digits[0] == '+') {
      return invalid_argument("input '{}' has a bad output index", text);
    }
    ref.index = index;
    text = text.substr(0, colon);
  }
  if (!is_valid_node_name(text))
    return invalid_argument("input '{}' is not a valid node name", text);
  ref.node = std::string(text);
  return ref;
}

// The proto's kind of value, as TF names attribute types.
std::string_view proto_kind(const v1::AttrValue& v) {
  switch (v.value_case()) {
    case v1::AttrValue::kList: return "list";
    case v1::AttrValue::kS: return "string";
    case v1::AttrValue::kI: return "int";
    case v1::AttrValue::kF: return "float";
    case v1::AttrValue::kB: return "bool";
    case v1::AttrValue::kType: return "type";
    case v1::AttrValue::kShape: return "shape";
    case v1::AttrValue::kTensor: return "tensor";
    case v1::AttrValue::kPlaceholder: return "placeholder";
    case v1::AttrValue::kFunc: return "func";
    case v1::AttrValue::VALUE_NOT_SET: break;
  }
  return "value of no kind (unset)";
}

// Which fields of a list are used, for messages.
std::string_view list_kind(const v1::AttrValue::ListValue& l) {
  if (l.s_size() > 0) return "list(string)";
  if (l.i_size() > 0) return "list(int)";
  if (l.f_size() > 0) return "list(float)";
  if (l.b_size() > 0) return "list(bool)";
  if (l.type_size() > 0) return "list(type)";
  if (l.shape_size() > 0) return "list(shape)";
  if (l.tensor_size() > 0) return "list(tensor)";
  if (l.func_size() > 0) return "list(func)";
  return "list(empty)";
}

// True when `l` uses no field but `used` (an empty list fits any kind).
bool list_only(const v1::AttrValue::ListValue& l, int used_count) {
  const int total = l.s_size() + l.i_size() + l.f_size() + l.b_size() + l.type_size() +
                    l.shape_size() + l.tensor_size() + l.func_size();
  return total == used_count;
}

// `v` converted to the graphrun kind `expected` (an AttrValue variant
// index); messages are bare (the caller prefixes node and attribute).
Result<AttrValue> attr_from_proto(const v1::AttrValue& v, std::size_t expected) {
  auto wrong_kind = [&]() -> Status {
    std::string_view got =
        v.value_case() == v1::AttrValue::kList ? list_kind(v.list()) : proto_kind(v);
    return invalid_argument("must be a {}, got a {}", attr_kind_name(expected), got);
  };
  switch (expected) {
    case 0:  // bool
      if (v.value_case() != v1::AttrValue::kB) return wrong_kind();
      return AttrValue(v.b());
    case 1:  // int
      if (v.value_case() != v1::AttrValue::kI) return wrong_kind();
      return AttrValue(static_cast<int64_t>(v.i()));
    case 2:  // float (single precision on the wire)
      if (v.value_case() != v1::AttrValue::kF) return wrong_kind();
      return AttrValue(static_cast<double>(v.f()));
    case 3:  // string
      if (v.value_case() != v1::AttrValue::kS) return wrong_kind();
      return AttrValue(v.s());
    case 4: {  // type
      if (v.value_case() != v1::AttrValue::kType) return wrong_kind();
      GRAPHRUN_ASSIGN_OR_RETURN(DType d, dtype_from_proto(v.type()));
      return AttrValue(d);
    }
    case 5: {  // shape
      if (v.value_case() != v1::AttrValue::kShape) return wrong_kind();
      GRAPHRUN_ASSIGN_OR_RETURN(Shape s, shape_from_proto(v.shape()));
      return AttrValue(s);
    }
    case 6: {  // tensor
      if (v.value_case() != v1::AttrValue::kTensor) return wrong_kind();
      GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(v.tensor()));
      return AttrValue(std::move(t));
    }
    case 7: {  // list(int)
      if (v.value_case() != v1::AttrValue::kList || !list_only(v.list(), v.list().i_size())) {
        return wrong_kind();
      }
      return AttrValue(std::vector<int64_t>(v.list().i().begin(), v.list().i().end()));
    }
    case 8: {  // list(type)
      if (v.value_case() != v1::AttrValue::kList || !list_only(v.list(), v.list().type_size())) {
        return wrong_kind();
      }
      std::vector<DType> types;
      for (int t : v.list().type()) {
        GRAPHRUN_ASSIGN_OR_RETURN(DType d, dtype_from_proto(t));
        types.push_back(d);
      }
      return AttrValue(std::move(types));
    }
    default: break;
  }
  return internal_error("attribute kind {} has no proto form", expected);
}

void attr_to_proto(const AttrValue& value, v1::AttrValue* out) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          out->set_b(v);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          out->set_i(v);
        } else if constexpr (std::is_same_v<T, double>) {
          out->set_f(static_cast<float>(v));
        } else if constexpr (std::is_same_v<T, std::string>) {
          out->set_s(v);
        } else if constexpr (std::is_same_v<T, DType>) {
          out->set_type(dtype_to_proto(v));
        } else if constexpr (std::is_same_v<T, Shape>) {
          shape_to_proto(v, out->mutable_shape());
        } else if constexpr (std::is_same_v<T, Tensor>) {
          *out->mutable_tensor() = tensor_to_proto(v);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          auto* list = out->mutable_list();
          for (int64_t i : v) list->add_i(i);
        } else if constexpr (std::is_same_v<T, std::vector<DType>>) {
          auto* list = out->mutable_list();
          for (DType d : v) list->add_type(dtype_to_proto(d));
        } else {
          static_assert(sizeof(T) == 0, "every AttrValue kind needs a proto form");
        }
      },
      value);
}

// The variant index an op's attribute `name` takes; -1 when the op does not
// declare it.
int expected_attr_kind(const OpDef& def, std::string_view name) {
  for (const auto& ta : def.type_attrs()) {
    if (ta.name == name) return static_cast<int>(AttrValue(DType{}).index());
  }
  for (const auto& ad : def.attrs()) {
    if (ad.name == name) return static_cast<int>(ad.value.index());
  }
  return -1;
}

// One NodeDef on its way into the graph.
struct PendingNode {
  const v1::NodeDef* def = nullptr;
  const OpRegistration* reg = nullptr;
  std::vector<InputRef> inputs;  // data inputs, after translation
  std::vector<std::string> control_inputs;
  AttrMap attrs;
  std::vector<int> deps;  // indices of nodes that must be added first
};

class Importer {
 public:
  Importer(const v1::GraphDef& def, const OpRegistry& registry) : def_(def), registry_(registry) {}

  Result<Graph> run() {
    GRAPHRUN_RETURN_IF_ERROR(index_names());
    nodes_.resize(static_cast<std::size_t>(def_.node_size()));
    for (int i = 0; i < def_.node_size(); ++i) {
      Status s = prepare(i);
      if (!s.is_ok()) return s.with_prefix(describe(def_.node(i)));
    }
    GRAPHRUN_ASSIGN_OR_RETURN(std::vector<int> order, topological_order());
    Graph graph(registry_);
    for (int i : order) GRAPHRUN_RETURN_IF_ERROR(add(graph, i));
    return graph;
  }

 private:
  Status index_names() {
    for (int i = 0; i < def_.node_size(); ++i) {
      const v1::NodeDef& n = def_.node(i);
      if (!is_valid_node_name(n.name())) {
        return invalid_argument(
            "{}: invalid node name (node #{}; names match [A-Za-z0-9.][A-Za-z0-9_./>-]*)",
            describe(n), i);
      }
      auto [it, inserted] = index_.emplace(n.name(), i);
      if (!inserted) {
        return invalid_argument("{}: duplicate node name (node #{} and node #{})", describe(n),
                                it->second, i);
      }
    }
    return Status::ok();
  }

  // Messages are bare; run() prefixes the node.
  Status prepare(int i) {
    const v1::NodeDef& n = def_.node(i);
    PendingNode& p = nodes_[static_cast<std::size_t>(i)];
    p.def = &n;
    std::string_view op = n.op();
    if (auto alias = op_aliases().find(op); alias != op_aliases().end()) op = alias->second;
    p.reg = registry_.find(op);
    if (p.reg == nullptr) {
      return invalid_argument("op '{}' is not supported (graphrun has no such op)", n.op());
    }
    if (op == "Call" || op == "StatelessCall") {
      return invalid_argument("op '{}' wraps a C++ callable and cannot be loaded from a GraphDef",
                              n.op());
    }
    // Inputs.
    for (int k = 0; k < n.input_size(); ++k) {
      GRAPHRUN_ASSIGN_OR_RETURN(InputRef ref, parse_input(n.input(k)));
      auto it = index_.find(ref.node);
      if (it == index_.end()) {
        return invalid_argument("input {} '{}' names no node of the graph", k, n.input(k));
      }
      if (ref.control) {
        p.control_inputs.push_back(ref.node);
      } else {
        if (!p.control_inputs.empty()) {
          return invalid_argument("data input {} '{}' follows a control input", k, n.input(k));
        }
        p.inputs.push_back(std::move(ref));
      }
      p.deps.push_back(it->second);
    }
    // Attributes, in name order (a proto map has none).
    std::vector<std::string_view> names;
    for (const auto& [name, value] : n.attr()) names.push_back(name);
    std::sort(names.begin(), names.end());
    const OpDef& def = p.reg->def;
    const bool tf_variable =
        is_variable_op(n.op()) && (n.op() == "VariableV2" || n.attr().contains("container") ||
                                   n.attr().contains("shared_name"));
    for (std::string_view name : names) {
      if (name.starts_with('_')) continue;  // annotations (_class, _output_shapes, ...)
      const v1::AttrValue& value = n.attr().at(std::string(name));
      if (tf_variable && (name == "container" || name == "shared_name")) {
        GRAPHRUN_RETURN_IF_ERROR(check_variable_attr(name, value));
        continue;
      }
      const int kind = expected_attr_kind(def, name);
      if (kind < 0) {
        if (is_ignored_attr(def.name(), name)) continue;
        return invalid_argument("unknown attribute '{}' (graphrun's {} declares: {})", name,
                                def.name(), internal::declared_attr_names(def));
      }
      Result<AttrValue> converted = attr_from_proto(value, static_cast<std::size_t>(kind));
      if (!converted.is_ok()) {
        return converted.status().with_prefix(fmt::format("attribute '{}'", name));
      }
      p.attrs.emplace(std::string(name), std::move(converted).value());
    }
    if (is_assign_op(def.name())) GRAPHRUN_RETURN_IF_ERROR(translate_assign(p));
    if (def.name() == "ReadVariable" || is_assign_op(def.name())) {
      GRAPHRUN_RETURN_IF_ERROR(check_var_attr(p));
    }
    return Status::ok();
  }

  // container and shared_name of a TF variable: graphrun variables belong to
  // their session and are named after their node, so only the defaults
  // (empty) are accepted.
  static Status check_variable_attr(std::string_view name, const v1::AttrValue& value) {
    if (value.value_case() != v1::AttrValue::kS) {
      return invalid_argument("attribute '{}' must be a string, got a {}", name, proto_kind(value));
    }
    if (!value.s().empty()) {
      return unimplemented(
          "attribute '{}' is '{}': graphrun variables are per session and named after their "
          "node, so only an empty {} is supported",
          name, value.s(), name);
    }
    return Status::ok();
  }

  // TF's Assign(ref, value) -> graphrun's Assign(value) with var=<ref node>.
  Status translate_assign(PendingNode& p) {
    if (p.inputs.size() != 2) return Status::ok();  // graphrun's own form (or wrong: add_node says)
    const InputRef& ref = p.inputs[0];
    const v1::NodeDef& target = def_.node(index_.at(ref.node));
    if (!is_variable_op(target.op()) || ref.index != 0) {
      return invalid_argument(
          "input 0 '{}' must be a variable (VariableV2 or Variable) for a two-input {}",
          p.def->input(0), p.def->op());
    }
    if (p.attrs.contains("var")) {
      return invalid_argument("has both a variable input '{}' and attribute 'var'",
                              p.def->input(0));
    }
    p.attrs.emplace("var", ref.node);
    p.inputs.erase(p.inputs.begin());
    return Status::ok();
  }

  // The variable an assign or ReadVariable names must be a variable node of
  // the graph; it is also added before the node.
  Status check_var_attr(PendingNode& p) {
    auto it = p.attrs.find("var");
    if (it == p.attrs.end()) return Status::ok();  // add_node reports the missing attr
    const std::string* var = std::get_if<std::string>(&it->second);
    if (var == nullptr) return Status::ok();
    auto target = index_.find(*var);
    if (target == index_.end() || !is_variable_op(def_.node(target->second).op())) {
      return invalid_argument("attribute 'var' names '{}', which is not a variable node", *var);
    }
    p.deps.push_back(target->second);
    return Status::ok();
  }

  // Kahn's algorithm, smallest GraphDef index first among the ready nodes.
  Result<std::vector<int>> topological_order() const {
    const std::size_t n = nodes_.size();
    std::vector<int> pending(n, 0);
    std::vector<std::vector<int>> users(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<int> deps = nodes_[i].deps;
      std::sort(deps.begin(), deps.end());
      deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
      pending[i] = static_cast<int>(deps.size());
      for (int d : deps) users[static_cast<std::size_t>(d)].push_back(static_cast<int>(i));
    }
    std::priority_queue<int, std::vector<int>, std::greater<>> ready;
    for (std::size_t i = 0; i < n; ++i) {
      if (pending[i] == 0) ready.push(static_cast<int>(i));
    }
    std::vector<int> order;
    order.reserve(n);
    while (!ready.empty()) {
      const int i = ready.top();
      ready.pop();
      order.push_back(i);
      for (int u : users[static_cast<std::size_t>(i)]) {
        if (--pending[static_cast<std::size_t>(u)] == 0) ready.push(u);
      }
    }
    if (order.size() == n) return order;
    return cycle_error(pending);
  }

  // Every node left pending waits for another pending node, so walking
  // pending dependencies from any of them must come back to a node seen:
  // the nodes from there on form a cycle.
  Status cycle_error(const std::vector<int>& pending) const {
    int start = 0;
    while (pending[static_cast<std::size_t>(start)] == 0) ++start;
    std::vector<int> path;
    std::vector<int> position(nodes_.size(), -1);
    int at = start;
    while (position[static_cast<std::size_t>(at)] < 0) {
      position[static_cast<std::size_t>(at)] = static_cast<int>(path.size());
      path.push_back(at);
      for (int d : nodes_[static_cast<std::size_t>(at)].deps) {
        if (pending[static_cast<std::size_t>(d)] > 0) {
          at = d;
          break;
        }
      }
    }
    // A long cycle is named by its first and last kCycleShown nodes and a
    // count between them, so that the message stays short (a cycle of
    // 200,000 nodes made a 2.5 MB message).
    constexpr std::size_t kCycleShown = 8;
    const auto first = static_cast<std::size_t>(position[static_cast<std::size_t>(at)]);
    const std::size_t length = path.size() - first;
    std::vector<std::string> names;
    for (std::size_t k = first; k < path.size(); ++k) {
      if (length > 2 * kCycleShown && k == first + kCycleShown) {
        names.push_back(fmt::format("... {} more ...", length - 2 * kCycleShown));
        k = path.size() - kCycleShown;
      }
      names.push_back(fmt::format("'{}'", def_.node(path[k]).name()));
    }
    names.push_back(fmt::format("'{}'", def_.node(at).name()));
    return invalid_argument("{}: is on a cycle of inputs{}: {} (a <- b: a waits for b)",
                            describe(def_.node(at)),
                            length > 2 * kCycleShown ? fmt::format(" of {} nodes", length) : "",
                            fmt::join(names, " <- "));
  }

  Status add(Graph& graph, int i) {
    const PendingNode& p = nodes_[static_cast<std::size_t>(i)];
    NodeSpec spec{.op = p.reg->def.name(),
                  .name = p.def->name(),
                  .attrs = p.attrs,
                  .device = p.def->device()};
    for (std::size_t k = 0; k < p.inputs.size(); ++k) {
      const InputRef& ref = p.inputs[k];
      const Node* producer = graph.find_node(ref.node);
      GRAPHRUN_CHECK(producer != nullptr);  // added first: topological order
      if (ref.index >= producer->num_outputs()) {
        return invalid_argument("{}: input {} '{}:{}' is out of range: {} has {} output(s)",
                                describe(*p.def), k, ref.node, ref.index, producer->describe(),
                                producer->num_outputs());
      }
      spec.inputs.push_back(producer->output(ref.index));
    }
    for (const std::string& name : p.control_inputs) {
      const Node* dep = graph.find_node(name);
      GRAPHRUN_CHECK(dep != nullptr);
      if (std::find(spec.control_inputs.begin(), spec.control_inputs.end(), dep) ==
          spec.control_inputs.end()) {
        spec.control_inputs.push_back(dep);
      }
    }
    Result<Node*> node = graph.add_node(std::move(spec));
    if (!node.is_ok()) {
      // add_node names the node with graphrun's op; keep its message, and
      // name the GraphDef's op when it differs (VariableV2).
      if (p.def->op() != p.reg->def.name()) {
        return Status(node.status().code(),
                      fmt::format("{} (GraphDef op '{}')", node.status().message(), p.def->op()));
      }
      return node.status();
    }
    GRAPHRUN_CHECK((*node)->name() == p.def->name());  // names were checked unique
    return Status::ok();
  }

  const v1::GraphDef& def_;
  const OpRegistry& registry_;
  std::unordered_map<std::string, int> index_;
  std::vector<PendingNode> nodes_;
};

}  // namespace

Result<Graph> graph_from_graph_def(const v1::GraphDef& def, const OpRegistry& registry) {
  return Importer(def, registry).run();
}

Result<v1::GraphDef> graph_to_graph_def(const Graph& graph) {
  v1::GraphDef out;
  for (int id = 0; id < graph.num_nodes(); ++id) {
    const Node& node = *graph.node(id);
    if (node.op() == "Call" || node.op() == "StatelessCall" || node.kernel_override() != nullptr) {
      return invalid_argument("{}: runs a C++ callable, which cannot be written to a GraphDef",
                              node.describe());
    }
    v1::NodeDef* n = out.add_node();
    n->set_name(node.name());
    n->set_op(node.op());
    if (!node.device().empty()) n->set_device(node.device());
    for (const Output& in : node.inputs()) {
      n->add_input(in.index() == 0 ? in.node()->name()
                                   : fmt::format("{}:{}", in.node()->name(), in.index()));
    }
    for (const Node* dep : node.control_inputs()) n->add_input("^" + dep->name());
    auto* attrs = n->mutable_attr();
    for (const auto& [name, value] : node.attrs()) {
      // An unset tensor is only ever a default (IteratorGetNext's `data` for
      // a range): leave it out and let import fill the default again.
      if (const Tensor* t = std::get_if<Tensor>(&value); t != nullptr && !t->is_initialized()) {
        continue;
      }
      attr_to_proto(value, &(*attrs)[name]);
    }
  }
  return out;
}

int64_t graph_def_tensor_bytes(const v1::GraphDef& def) {
  constexpr int64_t kCap = kMaxTensorProtoBytes + 1;
  int64_t total = 0;
  const auto add = [&](const v1::TensorProto& t) {
    total = std::min(total + tensor_proto_bytes(t), kCap);
  };
  for (const v1::NodeDef& node : def.node()) {
    for (const auto& [name, value] : node.attr()) {
      if (value.has_tensor()) add(value.tensor());
      if (value.has_list()) {
        for (const v1::TensorProto& t : value.list().tensor()) add(t);
      }
    }
  }
  return total;
}

}  // namespace graphrun
