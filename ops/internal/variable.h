// The session-side state of a variable: its current value, behind a mutex,
// in the session's ResourceManager under "var:<Variable node name>".
//
// The value is a Tensor handle. Readers copy the handle under the lock (a
// refcount bump) and compute without it. Writers either replace the handle
// (Assign) or, for read-modify-write updates, write in place only while the
// state holds the sole reference to the buffer and otherwise copy on write:
// so a snapshot a reader holds never changes under it.
//
//   GRAPHRUN_ASSIGN_OR_RETURN(VariableState* var, lookup_variable(ctx, "v"));
//   GRAPHRUN_ASSIGN_OR_RETURN(Tensor snapshot, var->read());
//
// Thread safety: thread-safe. name/dtype/shape are immutable; `value` is
// guarded by `mu`. Lives as long as the session that owns it.
#pragma once

#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace graphrun::ops_internal {

class VariableState final : public Resource {
 public:
  VariableState(std::string name, DType dtype, Shape shape)
      : name_(std::move(name)), dtype_(dtype), shape_(shape) {}

  // The Variable node's name.
  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  // The declared shape (Assign with validate_shape=false may store another).
  const Shape& shape() const { return shape_; }

  // A snapshot of the value: FailedPrecondition when uninitialized.
  Result<Tensor> read() const {
    Tensor snapshot;
    {
      std::lock_guard lock(mu);
      snapshot = value;
    }
    if (!snapshot.is_initialized()) return uninitialized_error();
    return snapshot;
  }

  // TF's wording: "Attempting to use uninitialized value <name>".
  Status uninitialized_error() const {
    return failed_precondition("Attempting to use uninitialized value {}", name_);
  }

  mutable std::mutex mu;
  // Uninitialized (dtype kInvalid) until the first Assign. Guarded by `mu`:
  // the handle is only read or replaced under it; its buffer is written in
  // place only under it and only while the handle is its sole owner.
  Tensor value;

 private:
  const std::string name_;
  const DType dtype_;
  const Shape shape_;
};

inline std::string variable_resource_key(std::string_view variable_node) {
  return "var:" + std::string(variable_node);
}

// The state of the Variable node named `variable_node` in the graph of the
// kernel being constructed, created uninitialized on first use.
// InvalidArgument when there is no such node or it is not a "Variable".
inline Result<VariableState*> lookup_variable(const OpKernelConstruction& ctx,
                                              std::string_view variable_node) {
  const Node* var = ctx.node().graph().find_node(variable_node);
  if (var == nullptr) {
    return invalid_argument("attribute 'var' names '{}', which is not a node of the graph",
                            variable_node);
  }
  if (var->op() != "Variable") {
    return invalid_argument("attribute 'var' names {}, which is not a Variable", var->describe());
  }
  GRAPHRUN_ASSIGN_OR_RETURN(DType dtype, var->attr<DType>("dtype"));
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, var->attr<Shape>("shape"));
  std::string name = var->name();
  return ctx.resources().lookup_or_create<VariableState>(
      variable_resource_key(name), [&]() -> Result<std::unique_ptr<VariableState>> {
        return std::make_unique<VariableState>(std::move(name), dtype, shape);
      });
}

}  // namespace graphrun::ops_internal
