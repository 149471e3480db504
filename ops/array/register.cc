#include "ops/internal/families.h"

namespace graphrun::ops_internal {

void register_array_ops(OpRegistry& r) { (void)r; }

}  // namespace graphrun::ops_internal
