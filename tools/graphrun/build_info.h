// File: tools/graphrun/build_info.h
// What the programs say about themselves: the version and the level the
// built-in kernels run at (cpu_isa() in <graphrun/op_kernel.h>), for
// `graphrun --version`, `graphrun info`, `graphrun-server --version` and the
// server's startup line.
//
// Header-only (needs only the public API and fmt): graphrun-server includes
// it without linking the CLI's libraries.
//
// Thread safety: stateless functions; thread-safe.
#pragma once

#include <fmt/format.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace graphrun::tools {

// The project's version. tools/graphrun/info.cc checks it against CMake's
// PROJECT_VERSION at compile time.
inline constexpr std::string_view kVersion = "0.1.0";

// The instruction-set extensions a level means, for people:
// "AVX-512 F/BW/DQ/VL", "AVX2 + FMA", "SSE2" (x86-64's baseline).
inline std::string_view cpu_isa_features(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "AVX-512 F/BW/DQ/VL";
    case CpuIsa::kAvx2: return "AVX2 + FMA";
    case CpuIsa::kBaseline: break;
  }
#if defined(__x86_64__)
  return "SSE2";
#else
  return "the target's default";
#endif
}

// The level the kernels run at and why, without the "kernels: " label:
//   "avx512 (this CPU supports up to avx512)"
//   "baseline (GRAPHRUN_CPU_ISA=baseline; this CPU supports up to avx512)"
//   "error: GRAPHRUN_CPU_ISA='sse9' names no instruction-set level (...)"
// The last when cpu_isa_status() is an error: then no session can be
// created (Session::create returns that error).
inline std::string kernels_description() {
  const Status& status = cpu_isa_status();
  if (!status.is_ok()) return fmt::format("error: {}", status.message());
  // NOLINTNEXTLINE(concurrency-mt-unsafe): nothing sets the environment
  const char* requested = std::getenv("GRAPHRUN_CPU_ISA");
  std::string why;
  if (requested != nullptr && *requested != '\0') {
    why = fmt::format("GRAPHRUN_CPU_ISA={}; ", requested);
  }
  return fmt::format("{} ({}this CPU supports up to {})", cpu_isa_name(cpu_isa()), why,
                     cpu_isa_name(cpu_isa_supported()));
}

// "<program> 0.1.0\nkernels: <kernels_description()>" (no final newline).
inline std::string version_text(std::string_view program) {
  return fmt::format("{} {}\nkernels: {}", program, kVersion, kernels_description());
}

}  // namespace graphrun::tools
