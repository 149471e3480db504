#include "ops/internal/families.h"

namespace graphrun::ops_internal {

void register_random_ops(OpRegistry& r) { (void)r; }

}  // namespace graphrun::ops_internal
