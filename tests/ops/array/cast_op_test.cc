#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_all;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;

// A vector of `dtype` holding `values` converted by static_cast.
Tensor vector_of(DType dtype, std::initializer_list<int> values) {
  return visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> converted;
    for (int v : values) converted.push_back(static_cast<T>(v));
    if constexpr (std::is_same_v<T, bool>) {
      // std::vector<bool> is not contiguous.
      auto data = std::make_unique<bool[]>(converted.size());
      for (std::size_t i = 0; i < converted.size(); ++i) data[i] = converted[i];
      return Tensor::from_span(Shape{static_cast<int64_t>(converted.size())},
                               std::span<const bool>(data.get(), converted.size()));
    } else {
      return Tensor::vector<T>(std::span<const T>(converted));
    }
  });
}

// Every one of the 25 (source, destination) pairs on values every dtype
// holds exactly.
TEST(CastTest, EveryPairOfDtypes) {
  for (DType src : all_dtypes()) {
    for (DType dst : all_dtypes()) {
      const Tensor in =
          src == DType::kBool ? vector_of(src, {0, 1, 1, 0}) : vector_of(src, {0, 1, 3, -2});
      const Tensor expected = src == DType::kBool   ? vector_of(dst, {0, 1, 1, 0})
                              : dst == DType::kBool ? vector_of(dst, {0, 1, 1, 1})
                                                    : vector_of(dst, {0, 1, 3, -2});
      Graph g;
      Output y = ops::Cast(g, ops::Const(g, in), dst);
      ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
      EXPECT_EQ(y.node()->op(), "Cast");
      EXPECT_EQ(y.dtype(), dst);
      EXPECT_EQ(y.shape(), Shape{4});
      EXPECT_EQ(std::get<DType>(*y.node()->find_attr("SrcT")), src);
      EXPECT_EQ(std::get<DType>(*y.node()->find_attr("DstT")), dst);
      EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(expected)))
          << dtype_name(src) << " -> " << dtype_name(dst);
    }
  }
}

TEST(CastTest, FloatToIntTruncatesTowardZero) {
  Graph g;
  Output x = ops::Const(g, Tensor{1.7f, -1.7f, 0.4f, -0.4f, 2.5f, 100.99f});
  Output i32 = ops::Cast(g, x, DType::kInt32);
  Output i64 = ops::Cast(g, ops::Cast(g, x, DType::kFloat64), DType::kInt64);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, i32), IsOkAndHolds(TensorEq(Tensor{1, -1, 0, 0, 2, 100})));
  EXPECT_THAT(run_one(g, i64),
              IsOkAndHolds(TensorEq(Tensor{int64_t{1}, int64_t{-1}, int64_t{0}, int64_t{0},
                                           int64_t{2}, int64_t{100}})));
}

TEST(CastTest, NonzeroIsTrue) {
  Graph g;
  Output f = ops::Cast(g, ops::Const(g, Tensor{0.0f, -0.0f, 0.5f, -3.0f, 1e-30f}), DType::kBool);
  Output i = ops::Cast(g, ops::Const(g, Tensor{int64_t{0}, int64_t{1} << 40}), DType::kBool);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, f), IsOkAndHolds(TensorEq(Tensor{false, false, true, true, true})));
  EXPECT_THAT(run_one(g, i), IsOkAndHolds(TensorEq(Tensor{false, true})));
}

TEST(CastTest, FloatToIntSaturatesAndNanIsZero) {
  const float inf = std::numeric_limits<float>::infinity();
  Graph g;
  Output y =
      ops::Cast(g, ops::Const(g, Tensor{std::nanf(""), inf, -inf, 3e9f, -3e9f, 2147483520.0f}),
                DType::kInt32);
  ASSERT_TRUE(g.status().is_ok());
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor{0, kMax, kMin, kMax, kMin, 2147483520})));
}

TEST(CastTest, WideningAndNarrowing) {
  Graph g;
  Output big = ops::Const(g, Tensor{int64_t{1} << 40, int64_t{-5}});
  Output d = ops::Cast(g, big, DType::kFloat64);
  Output f = ops::Cast(g, ops::Const(g, Tensor{0.1}), DType::kFloat32);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, d), IsOkAndHolds(TensorEq(Tensor{1099511627776.0, -5.0})));
  EXPECT_THAT(run_one(g, f), IsOkAndHolds(TensorEq(Tensor{0.1f})));
}

TEST(CastTest, KeepsShapes) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt32, Shape{-1, 2}, "x");
  Output y = ops::Cast(g, x, DType::kFloat32);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_EQ(y.shape(), (Shape{-1, 2}));
  EXPECT_THAT(run_one(g, y, {{x, Tensor::matrix<int32_t>({{1, 2}, {3, 4}, {5, 6}})}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{1, 2}, {3, 4}, {5, 6}}))));
  EXPECT_THAT(run_one(g, y, {{x, Tensor(DType::kInt32, Shape{0, 2})}}),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{0, 2}))));
}

TEST(CastTest, LargeTensorCastsEveryElement) {
  const int64_t n = (1 << 17) + 3;  // several parallel_for chunks
  std::vector<int32_t> values(static_cast<std::size_t>(n));
  std::vector<double> expected(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<int32_t>(i) - 1000;
    expected[i] = static_cast<double>(values[i]);
  }
  Graph g;
  Output y = ops::Cast(g, ops::Const(g, Tensor::vector<int32_t>(std::span<const int32_t>(values))),
                       DType::kFloat64);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, y),
              IsOkAndHolds(TensorEq(Tensor::vector<double>(std::span<const double>(expected)))));
}

TEST(CastTest, SameDtypeSharesTheBuffer) {
  Graph g;
  Output x = ops::Const(g, Tensor{1, 2});
  Output y = ops::Cast(g, x, DType::kInt32);
  ASSERT_TRUE(g.status().is_ok());
  Result<std::vector<Tensor>> out = run_all(g, {x, y});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_TRUE((*out)[1].shares_buffer_with((*out)[0]));
}

TEST(CastTest, InvalidDestinationIsABuildError) {
  Graph g;
  Output y = ops::Cast(g, ops::Const(g, Tensor{1}), DType::kInvalid, "c");
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "DstT"));
}

}  // namespace
}  // namespace graphrun
