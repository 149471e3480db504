// The choice of instruction-set level, as a pure function for tests
// (api/src/cpu_isa.cc applies it to this CPU and GRAPHRUN_CPU_ISA once).
#pragma once

#include <graphrun/op_kernel.h>
#include <graphrun/status.h>

#include <optional>
#include <string_view>

namespace graphrun::cpu_isa_internal {

// The level for `requested` (GRAPHRUN_CPU_ISA's value; nullopt when unset
// or empty) on a CPU whose best level is `supported`: `supported` when
// unset; the requested level when it is at or below it; InvalidArgument
// naming the value and the CPU's level otherwise (an unknown name, or a
// level the CPU lacks).
Result<CpuIsa> choose(std::optional<std::string_view> requested, CpuIsa supported);

// The best level the CPU and the OS support (cpuid, and the OS saving the
// vector registers, as __builtin_cpu_supports checks).
CpuIsa detect();

}  // namespace graphrun::cpu_isa_internal
