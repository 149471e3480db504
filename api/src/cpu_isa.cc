#include "cpu_isa.h"

#include <cstdlib>
#include <string>

namespace graphrun {
namespace cpu_isa_internal {

Result<CpuIsa> choose(std::optional<std::string_view> requested, CpuIsa supported) {
  if (!requested.has_value() || requested->empty()) return supported;
  std::optional<CpuIsa> level;
  for (CpuIsa l : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (*requested == cpu_isa_name(l)) level = l;
  }
  if (!level.has_value()) {
    return invalid_argument(
        "GRAPHRUN_CPU_ISA='{}' names no instruction-set level (expected baseline, avx2 or avx512; "
        "this CPU supports up to {})",
        *requested, cpu_isa_name(supported));
  }
  if (static_cast<int>(*level) > static_cast<int>(supported)) {
    return invalid_argument(
        "GRAPHRUN_CPU_ISA='{}' asks for a level this CPU lacks (it supports up to {})", *requested,
        cpu_isa_name(supported));
  }
  return *level;
}

CpuIsa detect() {
#if defined(__x86_64__) && defined(GRAPHRUN_CPU_DISPATCH)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

namespace {

struct Choice {
  CpuIsa supported;
  CpuIsa isa;
  Status status;
};

const Choice& choice() {
  static const Choice c = [] {
    const CpuIsa supported = detect();
    const char* env = std::getenv("GRAPHRUN_CPU_ISA");  // NOLINT(concurrency-mt-unsafe): once
    std::optional<std::string_view> requested;
    if (env != nullptr) requested = std::string_view(env);
    Result<CpuIsa> r = choose(requested, supported);
    if (!r.is_ok()) return Choice{supported, supported, r.status()};
    return Choice{supported, *r, Status::ok()};
  }();
  return c;
}

}  // namespace
}  // namespace cpu_isa_internal

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "baseline";
}

CpuIsa cpu_isa() { return cpu_isa_internal::choice().isa; }
CpuIsa cpu_isa_supported() { return cpu_isa_internal::choice().supported; }
const Status& cpu_isa_status() { return cpu_isa_internal::choice().status; }

}  // namespace graphrun
