#include "ops/data/data_ops.h"
#include "ops/internal/families.h"

namespace graphrun::ops_internal {

void register_data_ops(OpRegistry& r) { register_iterator_ops(r); }

}  // namespace graphrun::ops_internal
