#include "ops/internal/families.h"
#include "ops/math/math_util.h"

namespace graphrun::ops_internal {

void register_math_ops(OpRegistry& r) {
  register_binary_ops(r);
  register_unary_ops(r);
  register_matmul_op(r);
  register_conv2d_op(r);
  register_reduction_ops(r);
}

}  // namespace graphrun::ops_internal
