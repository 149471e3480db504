#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;

TEST(FillTest, ValuesAndShape) {
  Graph g;
  Output y = ops::Fill(g, ops::Const(g, Tensor{2, 3}), ops::Const(g, Tensor(7.5f)));
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.node()->op(), "Fill");
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor::filled(Shape{2, 3}, 7.5f))));
}

TEST(FillTest, EveryDtypeAndInt64Dims) {
  const std::vector<Tensor> values = {Tensor(1.5f), Tensor(-2.0), Tensor(3),
                                      Tensor(int64_t{1} << 40), Tensor(true)};
  for (const Tensor& value : values) {
    Graph g;
    Output y = ops::Fill(g, ops::Const(g, Tensor{int64_t{3}, int64_t{1}}), ops::Const(g, value));
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    EXPECT_EQ(std::get<DType>(*y.node()->find_attr("index_type")), DType::kInt64);
    EXPECT_EQ(std::get<DType>(*y.node()->find_attr("T")), value.dtype());
    Result<Tensor> out = run_one(g, y);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(out->dtype(), value.dtype());
    EXPECT_EQ(out->shape(), (Shape{3, 1}));
    visit_dtype(value.dtype(), [&](auto zero) {
      using T = decltype(zero);
      for (T v : out->flat<T>()) EXPECT_EQ(v, value.scalar<T>());
    });
  }
}

TEST(FillTest, ScalarAndEmptyResults) {
  Graph g;
  Output s = ops::Fill(g, ops::Const(g, Tensor::vector<int32_t>({})), ops::Const(g, Tensor(4)));
  Output e = ops::Fill(g, ops::Const(g, Tensor{0, 5}), ops::Const(g, Tensor(4)));
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_THAT(run_one(g, s), IsOkAndHolds(TensorEq(Tensor(4))));
  EXPECT_THAT(run_one(g, e), IsOkAndHolds(TensorEq(Tensor(DType::kInt32, Shape{0, 5}))));
}

TEST(FillTest, LargeFill) {
  Graph g;
  Output y = ops::Fill(g, ops::Const(g, Tensor{300, 1000}), ops::Const(g, Tensor(2.0)));
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor::filled(Shape{300, 1000}, 2.0))));
}

TEST(FillTest, DimsFromAPlaceholder) {
  Graph g;
  Output dims = ops::Placeholder(g, DType::kInt32, Shape{2}, "dims");
  Output y = ops::Fill(g, dims, ops::Const(g, Tensor(1)));
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_EQ(y.shape(), (Shape{-1, -1}));
  EXPECT_THAT(run_one(g, y, {{dims, Tensor{1, 2}}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{1, 1}}))));
  Result<Tensor> bad = run_one(g, y, {{dims, Tensor{2, -1}}});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "[2,-1]"));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "negative"));
}

TEST(FillTest, NegativeDimsAtBuildTime) {
  Graph g;
  Output y = ops::Fill(g, ops::Const(g, Tensor{2, -3}), ops::Const(g, Tensor(1.0f)), "f");
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "negative dimension -3"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "'f'"));
}

TEST(FillTest, ValueMustBeAScalar) {
  Graph g;
  Output y = ops::Fill(g, ops::Const(g, Tensor{2}), ops::Const(g, Tensor{1.0f}));
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "scalar"));

  // Not known until run time.
  Graph g2;
  Output v = ops::Placeholder(g2, DType::kFloat32, Shape::unknown(), "v");
  Output z = ops::Fill(g2, ops::Const(g2, Tensor{2}), v);
  ASSERT_TRUE(g2.status().is_ok());
  EXPECT_THAT(run_one(g2, z, {{v, Tensor(3.0f)}}), IsOkAndHolds(TensorEq(Tensor{3.0f, 3.0f})));
  EXPECT_THAT(run_one(g2, z, {{v, Tensor{3.0f}}}),
              StatusIs(StatusCode::kInvalidArgument, "scalar"));
}

TEST(FillTest, DimsMustBeAnIntVector) {
  Graph g;
  Output y = ops::Fill(g, ops::Const(g, Tensor(2)), ops::Const(g, Tensor(1.0f)));
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "vector"));

  Graph g2;
  Output z = ops::Fill(g2, ops::Const(g2, Tensor{2.0f}), ops::Const(g2, Tensor(1.0f)));
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "index_type"));

  Graph g3;
  Output dims = ops::Placeholder(g3, DType::kInt64, Shape::unknown(), "dims");
  Output w = ops::Fill(g3, dims, ops::Const(g3, Tensor(1.0f)));
  ASSERT_TRUE(g3.status().is_ok());
  EXPECT_TRUE(w.shape().is_unknown_rank());
  EXPECT_THAT(run_one(g3, w, {{dims, Tensor::matrix<int64_t>({{1}})}}),
              StatusIs(StatusCode::kInvalidArgument, "vector"));
}

}  // namespace
}  // namespace graphrun
