#include <graphrun/op_kernel.h>

#include "ops/internal/families.h"

namespace graphrun {

namespace ops_internal {
void must(Status s) { GRAPHRUN_CHECK_MSG(s.is_ok(), s.to_string()); }
}  // namespace ops_internal

void register_builtin_ops(OpRegistry& registry) {
  ops_internal::register_array_ops(registry);
  ops_internal::register_control_ops(registry);
  ops_internal::register_data_ops(registry);
  ops_internal::register_math_ops(registry);
  ops_internal::register_random_ops(registry);
  ops_internal::register_state_ops(registry);
}

OpRegistry& OpRegistry::global() {
  // Built once, on first use (no static registrars).
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();  // never destroyed: kernels may outlive main's statics
    register_builtin_ops(*r);
    return r;
  }();
  return *registry;
}

const OpRegistry& default_op_registry() { return OpRegistry::global(); }

}  // namespace graphrun
