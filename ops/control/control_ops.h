// Registration functions of the control op family (ops/control);
// register.cc calls each once.
#pragma once

#include <graphrun/op_kernel.h>

namespace graphrun::ops_internal {

void register_no_op(OpRegistry& r);     // NoOp (and the Group builder)
void register_call_ops(OpRegistry& r);  // Call, StatelessCall

}  // namespace graphrun::ops_internal
