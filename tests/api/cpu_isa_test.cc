// The instruction-set level: cpu_isa_internal::choose (unset, every name,
// a level above the CPU's, unknown names, case) and, in the processes ctest
// starts with GRAPHRUN_CPU_ISA set (tests/api/CMakeLists.txt), what
// Session::create and the kernels do with it.
#include "api/src/cpu_isa.h"

#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "ops/cpu/kernels.h"
#include "tests/testing/op_harness.h"

namespace graphrun {

// gtest prints the levels with this ("avx2", not "1-byte object <01>").
static void PrintTo(CpuIsa isa, std::ostream* os) { *os << cpu_isa_name(isa); }

namespace {

using ::testing::HasSubstr;
using testing::IsOkAndHolds;
using testing::StatusIs;

using cpu_isa_internal::choose;

constexpr CpuIsa kLevels[] = {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512};

TEST(CpuIsaTest, Names) {
  EXPECT_EQ(cpu_isa_name(CpuIsa::kBaseline), "baseline");
  EXPECT_EQ(cpu_isa_name(CpuIsa::kAvx2), "avx2");
  EXPECT_EQ(cpu_isa_name(CpuIsa::kAvx512), "avx512");
}

TEST(CpuIsaTest, UnsetOrEmptyChoosesSupported) {
  for (CpuIsa supported : kLevels) {
    SCOPED_TRACE(cpu_isa_name(supported));
    EXPECT_THAT(choose(std::nullopt, supported), IsOkAndHolds(supported));
    EXPECT_THAT(choose(std::string_view(), supported), IsOkAndHolds(supported));
  }
}

TEST(CpuIsaTest, LevelAtOrBelowSupportedIsChosen) {
  for (CpuIsa supported : kLevels) {
    for (CpuIsa level : kLevels) {
      if (static_cast<int>(level) > static_cast<int>(supported)) continue;
      SCOPED_TRACE(std::string(cpu_isa_name(level)) + " on " +
                   std::string(cpu_isa_name(supported)));
      EXPECT_THAT(choose(cpu_isa_name(level), supported), IsOkAndHolds(level));
    }
  }
}

TEST(CpuIsaTest, LevelAboveSupportedIsRefused) {
  const Result<CpuIsa> r = choose("avx512", CpuIsa::kAvx2);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "'avx512'"));
  EXPECT_THAT(r.status().message(), HasSubstr("avx2"));  // what the CPU has
  const Result<CpuIsa> on_baseline = choose("avx2", CpuIsa::kBaseline);
  EXPECT_THAT(on_baseline, StatusIs(StatusCode::kInvalidArgument, "'avx2'"));
  EXPECT_THAT(on_baseline.status().message(), HasSubstr("baseline"));
  EXPECT_THAT(choose("avx512", CpuIsa::kBaseline),
              StatusIs(StatusCode::kInvalidArgument, "'avx512'"));
}

TEST(CpuIsaTest, UnknownNameIsRefused) {
  for (CpuIsa supported : kLevels) {
    EXPECT_THAT(choose("sse9", supported), StatusIs(StatusCode::kInvalidArgument, "'sse9'"));
  }
}

TEST(CpuIsaTest, NamesAreExact) {
  for (std::string_view name : {"AVX2", "Baseline", "AVX512", "avx2 ", " avx2", "avx", "avx-512"}) {
    SCOPED_TRACE(name);
    std::string quoted(1, '\'');  // the message quotes the value
    quoted.append(name).push_back('\'');
    EXPECT_THAT(choose(name, CpuIsa::kAvx512), StatusIs(StatusCode::kInvalidArgument, quoted));
  }
}

// This process's own choice, when ctest did not set GRAPHRUN_CPU_ISA.
TEST(CpuIsaTest, ProcessRunsAtTheSupportedLevel) {
  if (std::getenv("GRAPHRUN_CPU_ISA") != nullptr) {  // NOLINT(concurrency-mt-unsafe)
    GTEST_SKIP() << "GRAPHRUN_CPU_ISA is set: the CpuIsaEnvTest cases cover this process";
  }
  EXPECT_TRUE(cpu_isa_status().is_ok()) << cpu_isa_status().to_string();
  EXPECT_EQ(cpu_isa(), cpu_isa_supported());
  EXPECT_EQ(cpu::kernels().isa, cpu_isa());
}

// Whether ctest started this process with GRAPHRUN_CPU_ISA=value.
bool env_is(std::string_view value) {
  const char* env = std::getenv("GRAPHRUN_CPU_ISA");  // NOLINT(concurrency-mt-unsafe)
  return env != nullptr && std::string_view(env) == value;
}

// ctest entry api_test.cpu_isa_env_sse9.
TEST(CpuIsaEnvTest, UnknownLevelFailsSessionCreateOnlyUnderGraphrunCpuIsaSse9) {
  if (!env_is("sse9")) GTEST_SKIP() << "needs GRAPHRUN_CPU_ISA=sse9 (ctest sets it)";
  Graph g;
  ops::Const(g, Tensor::vector<float>({1, 2}), "c");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_THAT(Session::create(g), StatusIs(StatusCode::kInvalidArgument, "'sse9'"));
  EXPECT_THAT(cpu_isa_status(), StatusIs(StatusCode::kInvalidArgument, "'sse9'"));
  // Nothing was forced: the kernels would run at the CPU's level.
  EXPECT_EQ(cpu_isa(), cpu_isa_supported());
  EXPECT_EQ(cpu::kernels().isa, cpu_isa_supported());
}

// ctest entry api_test.cpu_isa_env_baseline.
TEST(CpuIsaEnvTest, BaselineRunsMatMulOnlyUnderGraphrunCpuIsaBaseline) {
  if (!env_is("baseline")) GTEST_SKIP() << "needs GRAPHRUN_CPU_ISA=baseline (ctest sets it)";
  EXPECT_TRUE(cpu_isa_status().is_ok()) << cpu_isa_status().to_string();
  EXPECT_EQ(cpu_isa(), CpuIsa::kBaseline);
  EXPECT_EQ(cpu::kernels().isa, CpuIsa::kBaseline);
  // Small integers in floats: every partial sum is exact, so is the product.
  // [64, 256] x [256, 256] splits into pieces across the session's threads.
  struct Dims {
    int64_t m, k, n;
  };
  for (const auto [m, k, n] : {Dims{3, 2, 2}, Dims{64, 256, 256}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n));
    std::vector<float> a(static_cast<std::size_t>(m * k));
    std::vector<float> b(static_cast<std::size_t>(k * n));
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    std::vector<float> want(static_cast<std::size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0;
        for (int64_t q = 0; q < k; ++q) {
          sum += a[static_cast<std::size_t>(i * k + q)] * b[static_cast<std::size_t>(q * n + j)];
        }
        want[static_cast<std::size_t>(i * n + j)] = sum;
      }
    }
    Graph g;
    Output c = ops::MatMul(g, ops::Const(g, Tensor::from_span<float>(Shape{m, k}, a)),
                           ops::Const(g, Tensor::from_span<float>(Shape{k, n}, b)), {}, "c");
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    Result<std::unique_ptr<Session>> session = Session::create(g);
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    EXPECT_THAT((*session)->run({}, {c}), IsOkAndHolds(::testing::ElementsAre(testing::TensorEq(
                                              Tensor::from_span<float>(Shape{m, n}, want)))));
  }
}

}  // namespace
}  // namespace graphrun
