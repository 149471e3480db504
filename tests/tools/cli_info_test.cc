// `graphrun --version` and `graphrun info` through the real binary: the
// version, the kernels' instruction-set level (as this process sees it, and
// as GRAPHRUN_CPU_ISA in the child's environment sets it), the thread
// counts; and an invalid GRAPHRUN_CPU_ISA named by info, --version and run.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <graphrun/op_kernel.h>
#include <graphrun/session.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/tools/cli_runner.h"

namespace graphrun {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using testing_cli::CliTest;
using testing_cli::kData;
using testing_cli::kTf;

// "GRAPHRUN_CPU_ISA=" in front of the child: unset for it, whatever this
// process was started with (the level is then the CPU's best).
const std::string kUnset = "GRAPHRUN_CPU_ISA=";
const std::string kSupported(cpu_isa_name(cpu_isa_supported()));

std::string version_line() { return fmt::format("graphrun {}\n", GRAPHRUN_PROJECT_VERSION); }

TEST_F(CliTest, VersionNamesTheLevelThisProcessRunsAt) {
  if (!cpu_isa_status().is_ok()) GTEST_SKIP() << cpu_isa_status().to_string();
  const auto o = run({"--version"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  ASSERT_THAT(o.out, StartsWith(version_line()));
  // The child inherits this process's environment, GRAPHRUN_CPU_ISA too.
  EXPECT_THAT(o.out, HasSubstr(fmt::format("\nkernels: {} (", cpu_isa_name(cpu_isa()))));
  EXPECT_THAT(o.out, HasSubstr(fmt::format("this CPU supports up to {})\n", kSupported)));
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 2) << o.out;
}

TEST_F(CliTest, VersionWithoutTheVariableIsTheCpusBest) {
  const auto o = run_with_env(kUnset, {"--version"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, fmt::format("{}kernels: {} (this CPU supports up to {})\n", version_line(),
                               kSupported, kSupported));
}

TEST_F(CliTest, VersionWithBaselineRequested) {
  const auto o = run_with_env("GRAPHRUN_CPU_ISA=baseline", {"--version"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out,
            fmt::format("{}kernels: baseline (GRAPHRUN_CPU_ISA=baseline; this CPU supports up to "
                        "{})\n",
                        version_line(), kSupported));
  EXPECT_EQ(o.err, "");
}

TEST_F(CliTest, VersionWithAnInvalidLevelNamesItAndExits0) {
  const auto o = run_with_env("GRAPHRUN_CPU_ISA=sse9", {"--version"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  EXPECT_THAT(o.out, StartsWith(version_line() + "kernels: error: GRAPHRUN_CPU_ISA='sse9'"));
  EXPECT_THAT(o.out, HasSubstr("names no instruction-set level"));
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 2) << o.out;
}

TEST_F(CliTest, InfoPrintsVersionLevelAndThreads) {
  const auto o = run_with_env(kUnset, {"info"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  EXPECT_EQ(o.out, fmt::format("{}kernels: {} (this CPU supports up to {})\n"
                               "default threads: {}\nmax threads: {}\n",
                               version_line(), kSupported, kSupported,
                               ThreadPool::default_threads(), ThreadPool::max_threads()));
}

TEST_F(CliTest, InfoWithAnInvalidLevelPrintsAndExits1NamingIt) {
  const auto o = run_with_env("GRAPHRUN_CPU_ISA=sse9", {"info"});
  EXPECT_EQ(o.signal, 0);
  EXPECT_EQ(o.code, 1);
  EXPECT_THAT(o.out, StartsWith(version_line() + "kernels: error: GRAPHRUN_CPU_ISA='sse9'"));
  EXPECT_THAT(o.out,
              HasSubstr(fmt::format("\ndefault threads: {}\n", ThreadPool::default_threads())));
  EXPECT_THAT(o.err, StartsWith("graphrun: "));
  EXPECT_THAT(o.err, HasSubstr("GRAPHRUN_CPU_ISA='sse9' names no instruction-set level"));
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
}

TEST_F(CliTest, RunWithAnInvalidLevelExits1NamingIt) {
  const auto o = run_with_env("GRAPHRUN_CPU_ISA=sse9", {"run", kData + "/two_stages.pbtxt",
                                                        "--feed", "x=1,2", "--fetch", "r1"});
  expect_error(o, 1, "GRAPHRUN_CPU_ISA='sse9'");
  EXPECT_THAT(o.err, HasSubstr("session: "));
}

TEST_F(CliTest, RunAtALevelAboveTheCpuExits1SkippedOnAnAvx512Cpu) {
  if (cpu_isa_supported() == CpuIsa::kAvx512) GTEST_SKIP() << "this CPU has every level";
  const auto o = run_with_env("GRAPHRUN_CPU_ISA=avx512",
                              {"run", kTf + "/const_sum_axis1.pbtxt", "--fetch", "Sum"});
  expect_error(o, 1, "GRAPHRUN_CPU_ISA='avx512' asks for a level this CPU lacks");
}

TEST_F(CliTest, RunAtBaselineComputesTheSame) {
  // Sum's reduction is one of the kernels the level selects.
  for (const std::string& env : {kUnset, std::string("GRAPHRUN_CPU_ISA=baseline")}) {
    const auto o = run_with_env(env, {"run", kTf + "/const_sum_axis1.pbtxt", "--fetch", "Sum"});
    EXPECT_EQ(o.code, 0) << env << ": " << o.err;
    EXPECT_EQ(o.out, "Sum: float32[3] [3, 3, 3]\n") << env;
    EXPECT_THAT(o.err, Not(HasSubstr("GRAPHRUN_CPU_ISA"))) << env;
  }
}

}  // namespace
}  // namespace graphrun
