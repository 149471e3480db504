#include "ops/internal/families.h"

namespace graphrun::ops_internal {

void register_control_ops(OpRegistry& r) { (void)r; }

}  // namespace graphrun::ops_internal
