// Registration functions of the data op family (ops/data). register.cc
// calls each once.
#pragma once

#include <graphrun/op_kernel.h>

namespace graphrun::ops_internal {

void register_iterator_ops(OpRegistry& r);  // IteratorGetNext, IteratorReset

}  // namespace graphrun::ops_internal
