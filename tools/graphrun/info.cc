#include "tools/graphrun/info.h"

#include <fmt/format.h>
#include <graphrun/op_kernel.h>
#include <graphrun/session.h>

#include "tools/graphrun/build_info.h"
#include "tools/graphrun/cli.h"

namespace graphrun::cli {

// The version is written once, in build_info.h (which graphrun-server shares);
// this keeps it equal to CMake's project(VERSION).
static_assert(tools::kVersion == GRAPHRUN_PROJECT_VERSION,
              "tools/graphrun/build_info.h: kVersion differs from project(VERSION) in "
              "CMakeLists.txt");

std::string version_text() { return tools::version_text("graphrun"); }

int info_command(std::FILE* out, std::FILE* err) {
  fmt::print(out, "{}\n", version_text());
  fmt::print(out, "default threads: {}\n", ThreadPool::default_threads());
  fmt::print(out, "max threads: {}\n", ThreadPool::max_threads());
  std::fflush(out);
  const Status& isa = cpu_isa_status();
  if (!isa.is_ok()) {
    fmt::print(err, "graphrun: {}\n", one_line(isa.to_string()));
    return kExitRuntime;
  }
  return kExitOk;
}

}  // namespace graphrun::cli
