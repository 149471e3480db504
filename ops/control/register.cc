#include "ops/control/control_ops.h"
#include "ops/internal/families.h"

namespace graphrun::ops_internal {

void register_control_ops(OpRegistry& r) {
  register_no_op(r);
  register_call_ops(r);
}

}  // namespace graphrun::ops_internal
