// Registration functions of the random op family (ops/random). register.cc
// calls each once.
#pragma once

#include <graphrun/op_kernel.h>

namespace graphrun::ops_internal {

// RandomUniform, RandomStandardNormal.
void register_random_sampling_ops(OpRegistry& r);

// TensorFlow's DEFAULT_GRAPH_SEED: the graph seed used when only an op seed
// is given.
inline constexpr int64_t kDefaultGraphSeed = 87654321;

}  // namespace graphrun::ops_internal
