#include "ops/array/array_ops.h"
#include "ops/internal/families.h"

namespace graphrun::ops_internal {

void register_array_ops(OpRegistry& r) {
  register_placeholder_ops(r);
  register_const_op(r);
  register_identity_op(r);
  register_reshape_op(r);
  register_cast_op(r);
  register_fill_op(r);
}

}  // namespace graphrun::ops_internal
