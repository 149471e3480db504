// Registration functions of the state op family (ops/state). register.cc
// calls each once.
#pragma once

#include <graphrun/op_kernel.h>

namespace graphrun::ops_internal {

void register_variable_ops(OpRegistry& r);  // Variable, ReadVariable
void register_assign_ops(OpRegistry& r);    // Assign, AssignAdd, AssignSub

// The collection ops::Variable adds its initializer to.
inline constexpr char kVariableInitializers[] = "variable_initializers";

}  // namespace graphrun::ops_internal
