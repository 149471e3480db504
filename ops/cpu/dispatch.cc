// Which level's table the kernels call (compiled once, for the baseline).
#include "ops/cpu/kernels.h"

namespace graphrun::cpu {

const KernelTable* kernels_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline: return &kernel_table_baseline();
#if defined(GRAPHRUN_CPU_DISPATCH)
    case CpuIsa::kAvx2: return &kernel_table_avx2();
    case CpuIsa::kAvx512: return &kernel_table_avx512();
#endif
    default: return nullptr;
  }
}

const KernelTable& kernels() {
  static const KernelTable* const table = [] {
    const KernelTable* t = kernels_for(cpu_isa());
    return t != nullptr ? t : &kernel_table_baseline();
  }();
  return *table;
}

}  // namespace graphrun::cpu
