#include "ops/internal/families.h"
#include "ops/state/state_ops.h"

namespace graphrun::ops_internal {

void register_state_ops(OpRegistry& r) {
  register_variable_ops(r);
  register_assign_ops(r);
}

}  // namespace graphrun::ops_internal
