// The built-in op families; registry.cc calls each once.
#pragma once

#include <graphrun/op_kernel.h>

namespace graphrun::ops_internal {

void register_array_ops(OpRegistry& r);    // ops/array
void register_control_ops(OpRegistry& r);  // ops/control
void register_data_ops(OpRegistry& r);     // ops/data
void register_math_ops(OpRegistry& r);     // ops/math
void register_random_ops(OpRegistry& r);   // ops/random
void register_state_ops(OpRegistry& r);    // ops/state

// Aborts with the op's name when a built-in registration fails (a bug).
void must(Status s);

}  // namespace graphrun::ops_internal
