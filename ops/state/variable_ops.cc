// Variable and ReadVariable: snapshot reads of a variable's value, with the
// Variable, ReadVariable and GlobalVariablesInitializer builders.
//
// A "Variable" node outputs a snapshot of the variable named after the node
// (its state lives in the session's ResourceManager, see
// ops/internal/variable.h). ops::Variable also adds the initializer, an
// Assign node "<name>/Assign", to the "variable_initializers" collection.
#include <graphrun/ops.h>

#include <memory>
#include <string>
#include <utility>

#include "ops/internal/families.h"
#include "ops/internal/names.h"
#include "ops/internal/variable.h"
#include "ops/state/state_ops.h"

namespace graphrun {
namespace {

using ops_internal::VariableState;

// Outputs a snapshot of the variable's value (its buffer is shared, never
// written in place while shared). Thread safety: thread-safe.
class ReadVariableOp final : public OpKernel {
 public:
  explicit ReadVariableOp(VariableState* var) : var_(var) {}

  Status compute(OpKernelContext& ctx) override {
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor value, var_->read());
    return ctx.set_output(0, std::move(value));
  }
  bool is_cheap() const override { return true; }

 private:
  VariableState* const var_;  // Not owned: the session's ResourceManager owns it.
};

Status variable_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, c.attr<Shape>("shape"));
  if (!shape.is_fully_defined()) {
    return invalid_argument("a variable's shape must be fully defined, got {}", shape);
  }
  c.set_output(0, shape);
  return Status::ok();
}

Status read_variable_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, c.attr<Shape>("shape"));
  c.set_output(0, shape);
  return Status::ok();
}

Result<std::unique_ptr<OpKernel>> make_variable_kernel(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(VariableState * var,
                            ops_internal::lookup_variable(ctx, ctx.node().name()));
  return std::make_unique<ReadVariableOp>(var);
}

Result<std::unique_ptr<OpKernel>> make_read_variable_kernel(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::string name, ctx.attr<std::string>("var"));
  GRAPHRUN_ASSIGN_OR_RETURN(DType dtype, ctx.attr<DType>("dtype"));
  GRAPHRUN_ASSIGN_OR_RETURN(VariableState * var, ops_internal::lookup_variable(ctx, name));
  if (var->dtype() != dtype) {
    return invalid_argument("dtype is {} but variable '{}' is {}", dtype, name, var->dtype());
  }
  return std::make_unique<ReadVariableOp>(var);
}

Output first_output(const Result<Node*>& node) {
  return node.is_ok() ? (*node)->output(0) : Output{};
}

// Adds the Variable node, then "<name>/initial_value" (when `initial` is a
// tensor, made by `make_initial`) and the initializer "<name>/Assign".
template <typename MakeInitial>
Output add_variable(Graph& g, DType dtype, const Shape& shape, std::string_view name,
                    MakeInitial make_initial) {
  const std::string base(name.empty() ? "Variable" : name);
  if (!shape.is_fully_defined()) {
    g.record_error(invalid_argument(
        "node '{}' (Variable): the initial value's shape must be fully defined, got {}",
        g.unique_name(base), shape));
    return Output{};
  }
  Result<Node*> var = g.add_node(NodeSpec{
      .op = "Variable",
      .name = base,
      .attrs = {{"dtype", dtype}, {"shape", shape}},
  });
  if (!var.is_ok()) return Output{};
  const std::string relative = ops_internal::relative_name(g, **var);
  Output initial = make_initial(relative + "/initial_value");
  Result<Node*> assign = g.add_node(NodeSpec{
      .op = "Assign",
      .name = relative + "/Assign",
      .inputs = {initial},
      .attrs = {{"var", (*var)->name()}, {"use_locking", true}, {"validate_shape", true}},
  });
  if (!assign.is_ok()) return Output{};
  g.add_to_collection(ops_internal::kVariableInitializers, *assign);
  return (*var)->output(0);
}

}  // namespace

namespace ops_internal {

void register_variable_ops(OpRegistry& r) {
  must(r.add(OpDef("Variable")
                 .output("value", "dtype")
                 .type_attr("dtype", all_dtypes())
                 .required_attr("shape", Shape{})
                 .stateful()
                 .shape_fn(variable_shape)
                 .doc("A snapshot of the variable named after this node; FailedPrecondition "
                      "until an Assign initializes it."),
             make_variable_kernel));
  must(r.add(OpDef("ReadVariable")
                 .output("value", "dtype")
                 .type_attr("dtype", all_dtypes())
                 .required_attr("var", std::string())
                 .attr("shape", Shape::unknown())
                 .stateful()
                 .shape_fn(read_variable_shape)
                 .doc("A snapshot of the value of the Variable node named by `var`."),
             make_read_variable_kernel));
}

}  // namespace ops_internal

namespace ops {

Output Variable(Graph& g, Tensor initial_value, std::string_view name) {
  if (!initial_value.is_initialized()) {
    g.record_error(invalid_argument("node '{}' (Variable): the initial value holds no tensor",
                                    g.unique_name(name.empty() ? "Variable" : name)));
    return Output{};
  }
  const DType dtype = initial_value.dtype();
  const Shape shape = initial_value.shape();
  return add_variable(g, dtype, shape, name, [&](const std::string& const_name) {
    return ops::Const(g, std::move(initial_value), const_name);
  });
}

Output Variable(Graph& g, Output initial_value, std::string_view name) {
  if (!initial_value.is_valid()) {
    g.record_error(invalid_argument("node '{}' (Variable): the initial value is invalid",
                                    g.unique_name(name.empty() ? "Variable" : name)));
    return Output{};
  }
  return add_variable(g, initial_value.dtype(), initial_value.shape(), name,
                      [&](const std::string&) { return initial_value; });
}

Output ReadVariable(Graph& g, Output var, std::string_view name) {
  const std::string base(name.empty() ? "ReadVariable" : name);
  if (!var.is_valid()) {
    g.record_error(
        invalid_argument("node '{}' (ReadVariable): the variable is invalid", g.unique_name(base)));
    return Output{};
  }
  if (var.node()->op() != "Variable") {
    g.record_error(invalid_argument("node '{}' (ReadVariable): {} is not a Variable",
                                    g.unique_name(base), var.node()->describe()));
    return Output{};
  }
  return first_output(g.add_node(NodeSpec{
      .op = "ReadVariable",
      .name = base,
      .attrs = {{"var", var.node()->name()}, {"dtype", var.dtype()}, {"shape", var.shape()}},
  }));
}

const Node* GlobalVariablesInitializer(Graph& g, std::string_view name) {
  std::span<const Node* const> initializers = g.collection(ops_internal::kVariableInitializers);
  Result<Node*> init = g.add_node(NodeSpec{
      .op = "NoOp",
      .name = std::string(name.empty() ? "init" : name),
      .control_inputs = {initializers.begin(), initializers.end()},
  });
  return init.is_ok() ? *init : nullptr;
}

}  // namespace ops
}  // namespace graphrun
