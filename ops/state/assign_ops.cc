// Assign, AssignAdd and AssignSub: writes to a variable (attr "var" names
// its Variable node), each outputting the new value (a snapshot).
//
// Assign replaces the variable's handle with a copy of the value.
// AssignAdd/AssignSub update in place only while the variable's buffer is
// not shared (no reader holds a snapshot of it), else copy on write. With
// use_locking the whole read-modify-write holds the variable's mutex, so no
// update is lost; without it the new value is computed outside the lock from
// a snapshot (concurrent updates may be lost, as in TF, but no buffer a
// reader holds is ever written).
#include <graphrun/eigen.h>
#include <graphrun/ops.h>

#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "ops/internal/families.h"
#include "ops/internal/variable.h"
#include "ops/state/state_ops.h"

namespace graphrun {
namespace {

using ops_internal::VariableState;

enum class UpdateKind { kAdd, kSub };

// Cheap when the value's shape is small and known at build.
// Thread safety: thread-safe (the variable's mutex guards its value).
class AssignOp final : public OpKernel {
 public:
  AssignOp(VariableState* var, bool validate_shape, bool cheap)
      : var_(var), validate_shape_(validate_shape), cheap_(cheap) {}

  bool is_cheap() const override { return cheap_; }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& value = ctx.input(0);
    if (validate_shape_ && value.shape() != var_->shape()) {
      return invalid_argument(
          "Assign requires shapes of both tensors to match: variable '{}' has shape {}, the "
          "value has shape {}",
          var_->name(), var_->shape(), value.shape());
    }
    // A private copy: the variable never aliases a Const's or a fed tensor.
    Tensor stored = value.deep_copy();
    Tensor old;  // released outside the lock
    {
      std::lock_guard lock(var_->mu);
      old = std::exchange(var_->value, stored);
    }
    return ctx.set_output(0, std::move(stored));
  }

 private:
  VariableState* const var_;  // Not owned: the session's ResourceManager owns it.
  const bool validate_shape_;
  const bool cheap_;
};

// out = x + delta (or x - delta); `out` may be `x`.
template <UpdateKind kKind>
void apply_update(const Tensor& x, const Tensor& delta, Tensor& out) {
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, bool>) {
      GRAPHRUN_CHECK_MSG(false, "AssignAdd/AssignSub on a bool variable");
    } else if constexpr (kKind == UpdateKind::kAdd) {
      flat<T>(out) = flat<T>(x) + flat<T>(delta);
    } else {
      flat<T>(out) = flat<T>(x) - flat<T>(delta);
    }
  });
}

// AssignAddOp and AssignSubOp. The update runs on the calling thread: no
// parallel_for while the variable's mutex is held (a thread waiting in a
// parallel_for may pick up another update of the same variable and
// deadlock on that mutex). Cheap when the variable is small (its shape is
// always fully defined).
// Thread safety: thread-safe (the variable's mutex guards its value).
template <UpdateKind kKind>
class AssignUpdateOp final : public OpKernel {
 public:
  AssignUpdateOp(VariableState* var, bool use_locking) : var_(var), use_locking_(use_locking) {}

  bool is_cheap() const override {
    const int64_t n = var_->shape().num_elements();  // -1 when not fully defined
    return n >= 0 && n <= kCheapElements;
  }

  Status compute(OpKernelContext& ctx) override {
    const Tensor& delta = ctx.input(0);
    Tensor result;
    Tensor old;  // a replaced value, released outside the lock
    if (use_locking_) {
      std::lock_guard lock(var_->mu);
      Tensor& value = var_->value;
      GRAPHRUN_RETURN_IF_ERROR(check(value, delta));
      if (value.is_sole_owner()) {
        apply_update<kKind>(value, delta, value);  // no snapshot of this buffer exists
      } else {
        GRAPHRUN_ASSIGN_OR_RETURN(Tensor fresh,
                                  Tensor::allocate_uninitialized(value.dtype(), value.shape()));
        apply_update<kKind>(value, delta, fresh);
        old = std::exchange(value, std::move(fresh));
      }
      result = value;
    } else {
      Tensor current;
      {
        std::lock_guard lock(var_->mu);
        current = var_->value;
      }
      GRAPHRUN_RETURN_IF_ERROR(check(current, delta));
      GRAPHRUN_ASSIGN_OR_RETURN(result,
                                Tensor::allocate_uninitialized(current.dtype(), current.shape()));
      apply_update<kKind>(current, delta, result);
      std::lock_guard lock(var_->mu);  // released before `old`
      old = std::exchange(var_->value, result);
    }
    return ctx.set_output(0, std::move(result));
  }

 private:
  Status check(const Tensor& value, const Tensor& delta) const {
    if (!value.is_initialized()) return var_->uninitialized_error();
    if (value.shape() != delta.shape()) {
      return invalid_argument(
          "{} requires shapes of both tensors to match: variable '{}' has shape {}, the value "
          "has shape {}",
          kKind == UpdateKind::kAdd ? "AssignAdd" : "AssignSub", var_->name(), value.shape(),
          delta.shape());
    }
    return Status::ok();
  }

  VariableState* const var_;  // Not owned: the session's ResourceManager owns it.
  const bool use_locking_;
};

using AssignAddOp = AssignUpdateOp<UpdateKind::kAdd>;
using AssignSubOp = AssignUpdateOp<UpdateKind::kSub>;

// The variable named by attr "var", checked against attr "T".
Result<VariableState*> variable_of(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::string name, ctx.attr<std::string>("var"));
  GRAPHRUN_ASSIGN_OR_RETURN(DType dtype, ctx.attr<DType>("T"));
  GRAPHRUN_ASSIGN_OR_RETURN(VariableState * var, ops_internal::lookup_variable(ctx, name));
  if (var->dtype() != dtype) {
    return invalid_argument("the value is {} but variable '{}' is {}", dtype, name, var->dtype());
  }
  return var;
}

template <typename Kernel>
Result<std::unique_ptr<OpKernel>> make_update_kernel(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(VariableState * var, variable_of(ctx));
  GRAPHRUN_ASSIGN_OR_RETURN(bool use_locking, ctx.attr<bool>("use_locking"));
  return std::make_unique<Kernel>(var, use_locking);
}

Result<std::unique_ptr<OpKernel>> make_assign_kernel(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(VariableState * var, variable_of(ctx));
  GRAPHRUN_ASSIGN_OR_RETURN(bool validate_shape, ctx.attr<bool>("validate_shape"));
  return std::make_unique<AssignOp>(var, validate_shape, small_static_shapes(ctx.node()));
}

OpDef update_def(std::string name, const DTypeSet& types, bool use_locking, std::string doc) {
  OpDef def(std::move(name));
  def.input("value", "T")
      .output("output", "T")
      .type_attr("T", types)
      .required_attr("var", std::string())
      .attr("use_locking", use_locking)
      .stateful()
      .shape_fn(shape_fns::unchanged)
      .doc(std::move(doc));
  return def;
}

Output first_output(const Result<Node*>& node) {
  return node.is_ok() ? (*node)->output(0) : Output{};
}

// The builders' shared checks: `var` is a Variable of this graph and
// `value` matches its dtype and (as far as known) its shape.
Output add_update(Graph& g, std::string_view op, Output var, Output value, ops::AssignAttrs attrs,
                  std::string_view name) {
  const std::string base(name.empty() ? op : name);
  auto fail = [&](Status s) {
    g.record_error(std::move(s));
    return Output{};
  };
  if (!var.is_valid() || !value.is_valid()) {
    return fail(invalid_argument("node '{}' ({}): an input is invalid", g.unique_name(base), op));
  }
  const Node* var_node = var.node();
  if (var_node->op() != "Variable" || &var_node->graph() != &g) {
    return fail(invalid_argument("node '{}' ({}): {} is not a Variable of this graph",
                                 g.unique_name(base), op, var_node->describe()));
  }
  if (value.dtype() != var.dtype()) {
    return fail(invalid_argument("node '{}' ({}): the value '{}' is {} but variable '{}' is {}",
                                 g.unique_name(base), op, value.name(), value.dtype(),
                                 var_node->name(), var.dtype()));
  }
  if (!value.shape().is_compatible_with(var.shape())) {
    return fail(invalid_argument(
        "node '{}' ({}): the value '{}' has shape {} but variable '{}' has shape {}",
        g.unique_name(base), op, value.name(), value.shape(), var_node->name(), var.shape()));
  }
  AttrMap node_attrs{{"var", var_node->name()}, {"use_locking", attrs.use_locking}};
  if (op == "Assign") node_attrs.emplace("validate_shape", true);
  return first_output(g.add_node(NodeSpec{
      .op = std::string(op),
      .name = base,
      .inputs = {value},
      .attrs = std::move(node_attrs),
  }));
}

}  // namespace

namespace ops_internal {

void register_assign_ops(OpRegistry& r) {
  OpDef assign = update_def("Assign", all_dtypes(), /*use_locking=*/true,
                            "Sets the variable named by `var` to `value`; outputs the new value.");
  assign.attr("validate_shape", true);
  must(r.add(std::move(assign), make_assign_kernel));
  must(r.add(update_def("AssignAdd", numeric_dtypes(), /*use_locking=*/false,
                        "Adds `value` to the variable named by `var`; outputs the new value."),
             make_update_kernel<AssignAddOp>));
  must(r.add(update_def("AssignSub", numeric_dtypes(), /*use_locking=*/false,
                        "Subtracts `value` from the variable named by `var`; outputs the new "
                        "value."),
             make_update_kernel<AssignSubOp>));
}

}  // namespace ops_internal

namespace ops {

Output Assign(Graph& g, Output var, Output value, AssignAttrs attrs, std::string_view name) {
  return add_update(g, "Assign", var, value, attrs, name);
}

Output AssignAdd(Graph& g, Output var, Output value, AssignAttrs attrs, std::string_view name) {
  return add_update(g, "AssignAdd", var, value, attrs, name);
}

Output AssignSub(Graph& g, Output var, Output value, AssignAttrs attrs, std::string_view name) {
  return add_update(g, "AssignSub", var, value, attrs, name);
}

}  // namespace ops
}  // namespace graphrun
