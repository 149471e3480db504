#include "ops/internal/families.h"
#include "ops/random/random_ops.h"

namespace graphrun::ops_internal {

void register_random_ops(OpRegistry& r) { register_random_sampling_ops(r); }

}  // namespace graphrun::ops_internal
