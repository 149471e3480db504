// Sum, Mean, Max: axes, keep_dims, dtypes, shape inference.
#include <graphrun/graphrun.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_one;
using ::graphrun::testing::TensorEq;
using ::graphrun::testing::TensorNear;

using Axes = std::vector<int64_t>;
using ReduceBuilder = Output (*)(Graph&, Output, Axes, bool, std::string_view);

Result<Tensor> reduce(ReduceBuilder op, Tensor x, Axes axes, bool keep_dims = false) {
  Graph g;
  Output y = op(g, ops::Const(g, std::move(x)), std::move(axes), keep_dims, "y");
  if (!g.status().is_ok()) return g.status();
  return run_one(g, y);
}

const ReduceBuilder kSum = ops::Sum;
const ReduceBuilder kMean = ops::Mean;
const ReduceBuilder kMax = ops::Max;

Tensor m23() { return Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}}); }

TEST(ReductionOpsTest, SumFloat32) {
  EXPECT_THAT(reduce(kSum, m23(), Axes{0}), IsOkAndHolds(TensorEq(Tensor{5.0f, 7.0f, 9.0f})));
  EXPECT_THAT(reduce(kSum, m23(), Axes{1}), IsOkAndHolds(TensorEq(Tensor{6.0f, 15.0f})));
  EXPECT_THAT(reduce(kSum, m23(), Axes{0, 1}), IsOkAndHolds(TensorEq(Tensor(21.0f))));
  EXPECT_THAT(reduce(kSum, m23(), Axes{1, 0}), IsOkAndHolds(TensorEq(Tensor(21.0f))));
}

TEST(ReductionOpsTest, SumIntegers) {
  EXPECT_THAT(reduce(kSum, Tensor::matrix<int32_t>({{1, -2}, {3, 4}}), Axes{0}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{4}, int32_t{2}})));
  EXPECT_THAT(reduce(kSum, Tensor{int64_t{1} << 40, int64_t{1} << 40}, Axes{0}),
              IsOkAndHolds(TensorEq(Tensor(int64_t{1} << 41))));
  EXPECT_THAT(reduce(kSum, Tensor{0.5, 0.25}, Axes{0}), IsOkAndHolds(TensorEq(Tensor(0.75))));
}

TEST(ReductionOpsTest, NegativeAndDuplicateAxes) {
  EXPECT_THAT(reduce(kSum, m23(), Axes{-1}), IsOkAndHolds(TensorEq(Tensor{6.0f, 15.0f})));
  EXPECT_THAT(reduce(kSum, m23(), Axes{-2}), IsOkAndHolds(TensorEq(Tensor{5.0f, 7.0f, 9.0f})));
  EXPECT_THAT(reduce(kSum, m23(), Axes{1, 1}), IsOkAndHolds(TensorEq(Tensor{6.0f, 15.0f})));
  EXPECT_THAT(reduce(kSum, m23(), Axes{1, -1}), IsOkAndHolds(TensorEq(Tensor{6.0f, 15.0f})));
  EXPECT_THAT(reduce(kMax, m23(), Axes{-1, 0}), IsOkAndHolds(TensorEq(Tensor(6.0f))));
}

TEST(ReductionOpsTest, KeepDims) {
  EXPECT_THAT(reduce(kSum, m23(), Axes{1}, true),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{6}, {15}}))));
  EXPECT_THAT(reduce(kSum, m23(), Axes{0}, true),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{5, 7, 9}}))));
  EXPECT_THAT(reduce(kMean, m23(), Axes{0, 1}, true),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{3.5f}}))));
  Graph g;
  Output y = ops::Max(g, ops::Const(g, m23()), Axes{1}, true);
  EXPECT_EQ(y.shape(), (Shape{2, 1}));
  ASSERT_NE(y.node()->find_attr("keep_dims"), nullptr);
  EXPECT_TRUE(std::get<bool>(*y.node()->find_attr("keep_dims")));
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{3}, {6}}))));
}

TEST(ReductionOpsTest, EmptyAxesIsIdentity) {
  EXPECT_THAT(reduce(kSum, m23(), Axes{}), IsOkAndHolds(TensorEq(m23())));
  EXPECT_THAT(reduce(kMean, m23(), Axes{}, true), IsOkAndHolds(TensorEq(m23())));
  EXPECT_THAT(reduce(kMax, Tensor(int32_t{7}), Axes{}), IsOkAndHolds(TensorEq(Tensor(int32_t{7}))));
}

TEST(ReductionOpsTest, MeanFloat) {
  EXPECT_THAT(reduce(kMean, m23(), Axes{0}), IsOkAndHolds(TensorEq(Tensor{2.5f, 3.5f, 4.5f})));
  EXPECT_THAT(reduce(kMean, m23(), Axes{1}), IsOkAndHolds(TensorEq(Tensor{2.0f, 5.0f})));
  EXPECT_THAT(reduce(kMean, Tensor{1.0, 2.0, 4.0}, Axes{0}),
              IsOkAndHolds(TensorNear(Tensor(7.0 / 3.0))));
}

TEST(ReductionOpsTest, MeanOfIntegersTruncates) {
  EXPECT_THAT(reduce(kMean, Tensor::matrix<int32_t>({{1, 2}, {4, 4}, {-1, -2}, {5, 8}}), Axes{1}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{1}, int32_t{4}, int32_t{-1}, int32_t{6}})));
  EXPECT_THAT(reduce(kMean, Tensor{int64_t{1}, int64_t{1}, int64_t{2}}, Axes{0}),
              IsOkAndHolds(TensorEq(Tensor(int64_t{1}))));
}

TEST(ReductionOpsTest, Max) {
  EXPECT_THAT(reduce(kMax, m23(), Axes{0}), IsOkAndHolds(TensorEq(Tensor{4.0f, 5.0f, 6.0f})));
  EXPECT_THAT(reduce(kMax, m23(), Axes{1}), IsOkAndHolds(TensorEq(Tensor{3.0f, 6.0f})));
  EXPECT_THAT(reduce(kMax, Tensor::matrix<int64_t>({{-5, -9}, {-7, -3}}), Axes{1}),
              IsOkAndHolds(TensorEq(Tensor{int64_t{-5}, int64_t{-3}})));
  EXPECT_THAT(reduce(kMax, Tensor{int32_t{-5}, int32_t{-9}}, Axes{0}),
              IsOkAndHolds(TensorEq(Tensor(int32_t{-5}))));
}

TEST(ReductionOpsTest, MaxPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Tensor& x : {Tensor{1.0f, nan, 3.0f}, Tensor{nan, 1.0f}, Tensor{1.0f, nan}}) {
    Result<Tensor> r = reduce(kMax, x, Axes{0});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(std::isnan(r->scalar<float>())) << x.to_string();
  }
  // Column reduction path too.
  Result<Tensor> r = reduce(kMax, Tensor::matrix<float>({{1, nan}, {nan, 2}, {3, 4}}), Axes{0});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(std::isnan(r->flat<float>()[0]));
  EXPECT_TRUE(std::isnan(r->flat<float>()[1]));
}

TEST(ReductionOpsTest, Rank3Axes) {
  // x[a][b][c] = a*6 + b*2 + c, shape [2,3,2].
  std::vector<int32_t> v(12);
  for (int i = 0; i < 12; ++i) v[i] = i;
  const Tensor x = Tensor::from_span(Shape{2, 3, 2}, std::span<const int32_t>(v));
  EXPECT_THAT(reduce(kSum, x, Axes{1}),
              IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{6, 9}, {24, 27}}))));
  EXPECT_THAT(reduce(kSum, x, Axes{0, 2}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{14}, int32_t{22}, int32_t{30}})));
  EXPECT_THAT(
      reduce(kSum, x, Axes{0, 2}, true),
      IsOkAndHolds(TensorEq(Tensor(Shape{1, 3, 1}, {int32_t{14}, int32_t{22}, int32_t{30}}))));
  EXPECT_THAT(reduce(kMax, x, Axes{0, 1}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{10}, int32_t{11}})));
  EXPECT_THAT(reduce(kMean, x, Axes{-3}),
              IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{3, 4}, {5, 6}, {7, 8}}))));
  // Size-1 dimensions are skipped: [2,1,3] over axis 2.
  EXPECT_THAT(reduce(kSum, Tensor(Shape{2, 1, 3}, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}), Axes{2}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{6}, {15}}))));
}

TEST(ReductionOpsTest, LargeRowAndColumnReductionsMatchReference) {
  const int rows = 1000, cols = 300;
  std::vector<int64_t> v(rows * cols);
  for (int i = 0; i < rows * cols; ++i) v[i] = (int64_t{i} * 7919) % 1013 - 500;
  std::vector<int64_t> row_sum(rows, 0), col_max(cols, std::numeric_limits<int64_t>::lowest());
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      row_sum[i] += v[i * cols + j];
      col_max[j] = std::max(col_max[j], v[i * cols + j]);
    }
  }
  const Tensor x = Tensor::from_span(Shape{rows, cols}, std::span<const int64_t>(v));
  EXPECT_THAT(
      reduce(kSum, x, Axes{1}),
      IsOkAndHolds(TensorEq(Tensor::from_span(Shape{rows}, std::span<const int64_t>(row_sum)))));
  EXPECT_THAT(
      reduce(kMax, x, Axes{0}),
      IsOkAndHolds(TensorEq(Tensor::from_span(Shape{cols}, std::span<const int64_t>(col_max)))));
}

// float32 sums add in double: after 2^24 a float running total no longer
// grows by 1, so 2^24 followed by a million ones summed to 2^24 (and a
// mean of ones stayed under 1). 2^24 + 10^6 is a float, and so the exact
// answer, along a row (contiguous), down columns (rows accumulate), and
// over the outer and inner axes of a rank-3 input (the general path).
TEST(ReductionOpsTest, Float32SumsAndMeansDoNotLoseSmallAddends) {
  constexpr int64_t kOnes = 1'000'000;
  constexpr float kBig = 16777216.0f;  // 2^24
  constexpr float kExact = kBig + static_cast<float>(kOnes);
  std::vector<float> row(kOnes + 1, 1.0f);
  row[0] = kBig;
  EXPECT_THAT(
      reduce(kSum, Tensor::from_span(Shape{kOnes + 1}, std::span<const float>(row)), Axes{0}),
      IsOkAndHolds(TensorEq(Tensor(kExact))));
  // Two columns: [2^24, 1, 1, ...] and all ones.
  std::vector<float> columns(2 * (kOnes + 1), 1.0f);
  columns[0] = kBig;
  const Tensor m = Tensor::from_span(Shape{kOnes + 1, 2}, std::span<const float>(columns));
  EXPECT_THAT(reduce(kSum, m, Axes{0}),
              IsOkAndHolds(TensorEq(Tensor{kExact, static_cast<float>(kOnes + 1)})));
  EXPECT_THAT(reduce(kMean, m, Axes{0}),
              IsOkAndHolds(TensorEq(Tensor{kExact / static_cast<float>(kOnes + 1), 1.0f})));
  // [2, kOnes + 1, 1... ]: rank 3 [2, n, 2] over axes 0 and 1 (outer and
  // middle reduced, inner kept) and over axes 1 and 2 (a middle kept).
  std::vector<float> cube(2 * (kOnes + 1) * 2, 1.0f);
  cube[0] = kBig;
  const Tensor c = Tensor::from_span(Shape{2, kOnes + 1, 2}, std::span<const float>(cube));
  EXPECT_THAT(reduce(kSum, c, Axes{0, 1}),
              IsOkAndHolds(TensorEq(Tensor{kExact + static_cast<float>(kOnes + 1),
                                           static_cast<float>(2 * (kOnes + 1))})));
  EXPECT_THAT(reduce(kSum, c, Axes{1, 2}),
              IsOkAndHolds(TensorEq(Tensor{kExact + static_cast<float>(kOnes + 1),
                                           static_cast<float>(2 * (kOnes + 1))})));
}

TEST(ReductionOpsTest, EmptyInputs) {
  EXPECT_THAT(reduce(kSum, Tensor(DType::kFloat32, Shape{0, 3}), Axes{0}),
              IsOkAndHolds(TensorEq(Tensor{0.0f, 0.0f, 0.0f})));
  EXPECT_THAT(reduce(kSum, Tensor(DType::kFloat32, Shape{0, 3}), Axes{1}),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{0}))));
  Result<Tensor> mean = reduce(kMean, Tensor(DType::kFloat32, Shape{0}), Axes{0});
  ASSERT_TRUE(mean.is_ok()) << mean.status().to_string();
  EXPECT_TRUE(std::isnan(mean->scalar<float>()));
}

TEST(ReductionOpsTest, AxesAsTensorInt64AndInt32) {
  Graph g;
  Output x = ops::Const(g, m23());
  Output s = ops::Sum(g, x, ops::Const(g, Tensor{int64_t{1}}), false, "s");
  Output m = ops::Mean(g, x, ops::Const(g, Tensor(int32_t{0})), true, "m");  // scalar axis
  Output mx = ops::Max(g, x, ops::Const(g, Tensor{int32_t{-1}}), false, "mx");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(std::get<DType>(*s.node()->find_attr("Tidx")), DType::kInt64);
  EXPECT_EQ(std::get<DType>(*m.node()->find_attr("Tidx")), DType::kInt32);
  EXPECT_EQ(s.shape(), (Shape{2}));
  EXPECT_EQ(m.shape(), (Shape{1, 3}));
  EXPECT_THAT(run_one(g, s), IsOkAndHolds(TensorEq(Tensor{6.0f, 15.0f})));
  EXPECT_THAT(run_one(g, m), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{2.5f, 3.5f, 4.5f}}))));
  EXPECT_THAT(run_one(g, mx), IsOkAndHolds(TensorEq(Tensor{3.0f, 6.0f})));
}

TEST(ReductionOpsTest, AxesFedAtRunTime) {
  Graph g;
  Output x = ops::Const(g, m23());
  Output axes = ops::Placeholder(g, DType::kInt32, Shape{-1}, "axes");
  Output s = ops::Sum(g, x, axes, false);
  Output k = ops::Sum(g, x, axes, true);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_TRUE(s.shape().is_unknown_rank());
  EXPECT_EQ(k.shape(), (Shape{-1, -1}));
  EXPECT_THAT(run_one(g, s, {{axes, Tensor{int32_t{1}}}}),
              IsOkAndHolds(TensorEq(Tensor{6.0f, 15.0f})));
  EXPECT_THAT(run_one(g, k, {{axes, Tensor{int32_t{0}, int32_t{1}}}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{21}}))));
}

TEST(ReductionOpsTest, BraceListAxes) {
  Graph g;
  Output x = ops::Const(g, m23());
  Output all = ops::Sum(g, x, {0, 1});
  Output rows = ops::Max(g, x, {1}, true);
  Output cols = ops::Mean(g, x, {0, -2});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_THAT(run_one(g, all), IsOkAndHolds(TensorEq(Tensor(21.0f))));
  EXPECT_THAT(run_one(g, rows), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{3}, {6}}))));
  EXPECT_THAT(run_one(g, cols), IsOkAndHolds(TensorEq(Tensor{2.5f, 3.5f, 4.5f})));
}

TEST(ReductionOpsTest, BuildTimeShapes) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 4, 5}, "x");
  EXPECT_EQ(ops::Sum(g, x, Axes{1}).shape(), (Shape{-1, 5}));
  EXPECT_EQ(ops::Mean(g, x, Axes{0, -1}, true).shape(), (Shape{1, 4, 1}));
  EXPECT_EQ(ops::Max(g, x, Axes{0, 1, 2}).shape(), (Shape{}));
  EXPECT_EQ(ops::Sum(g, x, Axes{}).shape(), (Shape{-1, 4, 5}));
  Output u = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "u");
  EXPECT_TRUE(ops::Sum(g, u, Axes{7}).shape().is_unknown_rank());  // rank unknown: no check yet
  EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
}

TEST(ReductionOpsTest, AxesConstIsNamedAfterTheNode) {
  Graph g;
  Output y = ops::Sum(g, ops::Const(g, m23()), Axes{1}, false, "total");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.node()->name(), "total");
  const Node* axes = y.node()->input(1).node();
  EXPECT_EQ(axes->op(), "Const");
  EXPECT_EQ(axes->name(), "total/reduction_indices");
  EXPECT_EQ(axes->output_dtype(0), DType::kInt32);
  Output unnamed = ops::Mean(g, y, Axes{0});
  EXPECT_EQ(unnamed.node()->name(), "Mean");
  EXPECT_EQ(unnamed.node()->input(1).node()->name(), "Mean/reduction_indices");
}

}  // namespace
}  // namespace graphrun
