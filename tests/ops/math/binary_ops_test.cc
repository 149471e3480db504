// Add/AddV2, Sub, Mul, Div/RealDiv: values, dtypes and broadcasting.
#include <graphrun/graphrun.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::graphrun::testing::TensorNear;

// Builds op(x, y) on two Consts, checks the graph, runs it.
Result<Tensor> run_binary(std::string_view op, Tensor x, Tensor y) {
  Graph g;
  Output a = ops::Const(g, std::move(x), "x");
  Output b = ops::Const(g, std::move(y), "y");
  Result<Node*> n = g.add_node(NodeSpec{.op = std::string(op), .name = "z", .inputs = {a, b}});
  if (!n.is_ok()) return n.status();
  return run_one(g, (*n)->output(0));
}

TEST(BinaryOpsTest, AddFloat32SameShape) {
  Graph g;
  Output z = ops::Add(g, ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}})),
                      ops::Const(g, Tensor::matrix<float>({{10, 20}, {30, 40}})), "z");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(z.node()->name(), "z");
  EXPECT_EQ(z.node()->op(), "Add");
  EXPECT_EQ(z.dtype(), DType::kFloat32);
  EXPECT_EQ(z.shape(), (Shape{2, 2}));
  EXPECT_THAT(run_one(g, z), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{11, 22}, {33, 44}}))));
}

TEST(BinaryOpsTest, AddEveryNumericDType) {
  EXPECT_THAT(run_binary("Add", Tensor{1.5, -2.0}, Tensor{0.25, 2.0}),
              IsOkAndHolds(TensorEq(Tensor{1.75, 0.0})));
  EXPECT_THAT(run_binary("Add", Tensor{int32_t{1}, int32_t{-7}}, Tensor{int32_t{2}, int32_t{3}}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{3}, int32_t{-4}})));
  EXPECT_THAT(
      run_binary("Add", Tensor{int64_t{1} << 40, int64_t{5}}, Tensor{int64_t{1}, int64_t{-5}}),
      IsOkAndHolds(TensorEq(Tensor{(int64_t{1} << 40) + 1, int64_t{0}})));
}

TEST(BinaryOpsTest, IntegerOverflowWraps) {
  const int32_t max = std::numeric_limits<int32_t>::max();
  const int32_t min = std::numeric_limits<int32_t>::min();
  EXPECT_THAT(run_binary("Add", Tensor{max}, Tensor{int32_t{1}}),
              IsOkAndHolds(TensorEq(Tensor{min})));
  EXPECT_THAT(run_binary("Sub", Tensor{min}, Tensor{int32_t{1}}),
              IsOkAndHolds(TensorEq(Tensor{max})));
  EXPECT_THAT(run_binary("Mul", Tensor{max}, Tensor{int32_t{2}}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{-2}})));
}

TEST(BinaryOpsTest, TFAliasesShareKernels) {
  EXPECT_THAT(run_binary("AddV2", Tensor{1.0f, 2.0f}, Tensor{3.0f, 4.0f}),
              IsOkAndHolds(TensorEq(Tensor{4.0f, 6.0f})));
  EXPECT_THAT(run_binary("RealDiv", Tensor{1.0f, 3.0f}, Tensor{4.0f, 2.0f}),
              IsOkAndHolds(TensorEq(Tensor{0.25f, 1.5f})));
}

TEST(BinaryOpsTest, Sub) {
  Graph g;
  Output z = ops::Sub(g, ops::Const(g, Tensor{5.0f, 1.0f}), ops::Const(g, Tensor{2.0f, 4.0f}));
  EXPECT_EQ(z.node()->op(), "Sub");
  EXPECT_THAT(run_one(g, z), IsOkAndHolds(TensorEq(Tensor{3.0f, -3.0f})));
  EXPECT_THAT(run_binary("Sub", Tensor{int64_t{5}, int64_t{1}}, Tensor{int64_t{2}, int64_t{4}}),
              IsOkAndHolds(TensorEq(Tensor{int64_t{3}, int64_t{-3}})));
}

TEST(BinaryOpsTest, Mul) {
  Graph g;
  Output z = ops::Mul(g, ops::Const(g, Tensor{1.5f, -2.0f}), ops::Const(g, Tensor{2.0f, 3.0f}));
  EXPECT_EQ(z.node()->op(), "Mul");
  EXPECT_THAT(run_one(g, z), IsOkAndHolds(TensorEq(Tensor{3.0f, -6.0f})));
  EXPECT_THAT(run_binary("Mul", Tensor{int32_t{-3}, int32_t{7}}, Tensor{int32_t{4}, int32_t{6}}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{-12}, int32_t{42}})));
}

TEST(BinaryOpsTest, DivFloat) {
  Graph g;
  Output z = ops::Div(g, ops::Const(g, Tensor{1.0f, 2.0f, 3.0f, 1.0f}),
                      ops::Const(g, Tensor{2.0f, 4.0f, 8.0f, 0.0f}));
  EXPECT_EQ(z.node()->op(), "Div");
  Result<Tensor> r = run_one(g, z);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto v = r->flat<float>();
  EXPECT_FLOAT_EQ(v[0], 0.5f);
  EXPECT_FLOAT_EQ(v[1], 0.5f);
  EXPECT_FLOAT_EQ(v[2], 0.375f);
  EXPECT_EQ(v[3], std::numeric_limits<float>::infinity());  // floats: IEEE, no error
  EXPECT_THAT(run_binary("Div", Tensor{1.0, 9.0}, Tensor{4.0, -3.0}),
              IsOkAndHolds(TensorEq(Tensor{0.25, -3.0})));
}

TEST(BinaryOpsTest, IntegerDivTruncatesTowardZero) {
  EXPECT_THAT(
      run_binary("Div", Tensor{int32_t{7}, int32_t{-7}, int32_t{7}, int32_t{-7}, int32_t{6}},
                 Tensor{int32_t{2}, int32_t{2}, int32_t{-2}, int32_t{-2}, int32_t{3}}),
      IsOkAndHolds(TensorEq(Tensor{int32_t{3}, int32_t{-3}, int32_t{-3}, int32_t{3}, int32_t{2}})));
  EXPECT_THAT(run_binary("Div", Tensor{int64_t{-9}, int64_t{1}}, Tensor{int64_t{4}, int64_t{3}}),
              IsOkAndHolds(TensorEq(Tensor{int64_t{-2}, int64_t{0}})));
  // INT_MIN / -1 wraps instead of trapping.
  const int32_t min = std::numeric_limits<int32_t>::min();
  EXPECT_THAT(run_binary("Div", Tensor{min}, Tensor{int32_t{-1}}),
              IsOkAndHolds(TensorEq(Tensor{min})));
}

TEST(BinaryOpsTest, IntegerDivisionByZeroIsInvalidArgument) {
  EXPECT_THAT(run_binary("Div", Tensor{int32_t{1}, int32_t{2}}, Tensor{int32_t{1}, int32_t{0}}),
              StatusIs(StatusCode::kInvalidArgument, "integer division by zero"));
  EXPECT_THAT(run_binary("Div", Tensor{int64_t{1}, int64_t{2}}, Tensor(int64_t{0})),
              StatusIs(StatusCode::kInvalidArgument, "integer division by zero"));
  Result<Tensor> r = run_binary("Div", Tensor{int32_t{1}}, Tensor{int32_t{0}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'z' (Div)"));
}

TEST(BinaryOpsTest, BroadcastMatrixPlusVector) {
  Graph g;
  Output z = ops::Add(g, ops::Const(g, Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}})),
                      ops::Const(g, Tensor{10.0f, 20.0f, 30.0f}));
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_THAT(run_one(g, z),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{11, 22, 33}, {14, 25, 36}}))));
  // The vector on the left.
  EXPECT_THAT(
      run_binary("Sub", Tensor{10, 20, 30}, Tensor::matrix<int32_t>({{1, 2, 3}, {4, 5, 6}})),
      IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{9, 18, 27}, {6, 15, 24}}))));
}

TEST(BinaryOpsTest, BroadcastColumnTimesRow) {
  Graph g;
  Output z = ops::Add(g, ops::Const(g, Tensor::matrix<float>({{1}, {2}})),
                      ops::Const(g, Tensor::matrix<float>({{10, 20, 30}})));
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_THAT(run_one(g, z),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{11, 21, 31}, {12, 22, 32}}))));
  EXPECT_THAT(run_binary("Mul", Tensor::matrix<int64_t>({{1}, {2}, {3}}),
                         Tensor::matrix<int64_t>({{1, 10, 100, 1000}})),
              IsOkAndHolds(TensorEq(Tensor::matrix<int64_t>(
                  {{1, 10, 100, 1000}, {2, 20, 200, 2000}, {3, 30, 300, 3000}}))));
}

TEST(BinaryOpsTest, BroadcastScalarAndMatrix) {
  Graph g;
  Output five = ops::Const(g, Tensor(5.0f));
  Output m = ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}}));
  Output a = ops::Add(g, five, m);
  Output b = ops::Sub(g, m, five);
  Output c = ops::Div(g, ops::Const(g, Tensor(12.0f)), m);
  EXPECT_EQ(a.shape(), (Shape{2, 2}));
  EXPECT_THAT(run_one(g, a), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{6, 7}, {8, 9}}))));
  EXPECT_THAT(run_one(g, b), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{-4, -3}, {-2, -1}}))));
  EXPECT_THAT(run_one(g, c), IsOkAndHolds(TensorEq(Tensor::matrix<float>({{12, 6}, {4, 3}}))));
  // Integer scalar on the right.
  EXPECT_THAT(run_binary("Div", Tensor::matrix<int32_t>({{7, -7}}), Tensor(int32_t{2})),
              IsOkAndHolds(TensorEq(Tensor::matrix<int32_t>({{3, -3}}))));
}

TEST(BinaryOpsTest, BroadcastRank4WithOnes) {
  // x [2,1,3,1] + y [1,2,1,2] -> [2,2,3,2].
  std::vector<float> xv(6), yv(4);
  for (int i = 0; i < 6; ++i) xv[i] = static_cast<float>(i);
  for (int i = 0; i < 4; ++i) yv[i] = static_cast<float>(100 * (i + 1));
  Graph g;
  Output z =
      ops::Add(g, ops::Const(g, Tensor::from_span(Shape{2, 1, 3, 1}, std::span<const float>(xv))),
               ops::Const(g, Tensor::from_span(Shape{1, 2, 1, 2}, std::span<const float>(yv))));
  EXPECT_EQ(z.shape(), (Shape{2, 2, 3, 2}));
  std::vector<float> expected;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c)
        for (int d = 0; d < 2; ++d) expected.push_back(xv[a * 3 + c] + yv[b * 2 + d]);
  EXPECT_THAT(run_one(g, z), IsOkAndHolds(TensorEq(Tensor::from_span(
                                 Shape{2, 2, 3, 2}, std::span<const float>(expected)))));
  // Spot check by hand: z[1,0,2,1] = x[1,0,2,0] + y[0,0,0,1] = 5 + 200.
  EXPECT_EQ(expected[((1 * 2 + 0) * 3 + 2) * 2 + 1], 205.0f);
}

TEST(BinaryOpsTest, BroadcastRank4AgainstLowerRank) {
  // [2,3,1,4] - [3,1] -> [2,3,3,4]; int32.
  std::vector<int32_t> xv(24), yv{1000, 2000, 3000};
  for (int i = 0; i < 24; ++i) xv[i] = i;
  std::vector<int32_t> expected;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 3; ++c)
        for (int d = 0; d < 4; ++d) expected.push_back(xv[(a * 3 + b) * 4 + d] - yv[c]);
  EXPECT_THAT(run_binary("Sub", Tensor::from_span(Shape{2, 3, 1, 4}, std::span<const int32_t>(xv)),
                         Tensor::from_span(Shape{3, 1}, std::span<const int32_t>(yv))),
              IsOkAndHolds(TensorEq(
                  Tensor::from_span(Shape{2, 3, 3, 4}, std::span<const int32_t>(expected)))));
}

TEST(BinaryOpsTest, LargeBroadcastsMatchReference) {
  // Big enough to be split into several parallel chunks.
  const int rows = 2000, cols = 70;
  std::vector<int64_t> m(rows * cols), row(cols), col(rows);
  for (int i = 0; i < rows * cols; ++i) m[i] = i % 977;
  for (int j = 0; j < cols; ++j) row[j] = 3 * j + 1;
  for (int i = 0; i < rows; ++i) col[i] = i;
  std::vector<int64_t> plus_row(rows * cols), times_col(rows * cols), same(rows * cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      plus_row[i * cols + j] = m[i * cols + j] + row[j];
      times_col[i * cols + j] = m[i * cols + j] * col[i];
      same[i * cols + j] = m[i * cols + j] * m[i * cols + j];
    }
  }
  const Shape mat{rows, cols};
  Tensor mt = Tensor::from_span(mat, std::span<const int64_t>(m));
  EXPECT_THAT(run_binary("Add", mt, Tensor::from_span(Shape{cols}, std::span<const int64_t>(row))),
              IsOkAndHolds(TensorEq(Tensor::from_span(mat, std::span<const int64_t>(plus_row)))));
  EXPECT_THAT(
      run_binary("Mul", mt, Tensor::from_span(Shape{rows, 1}, std::span<const int64_t>(col))),
      IsOkAndHolds(TensorEq(Tensor::from_span(mat, std::span<const int64_t>(times_col)))));
  EXPECT_THAT(run_binary("Mul", mt, mt),
              IsOkAndHolds(TensorEq(Tensor::from_span(mat, std::span<const int64_t>(same)))));
}

TEST(BinaryOpsTest, EmptyBroadcast) {
  EXPECT_THAT(run_binary("Add", Tensor(DType::kFloat32, Shape{0, 3}), Tensor{1.0f, 2.0f, 3.0f}),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{0, 3}))));
  // Nothing is divided, so an integer zero divisor is fine.
  EXPECT_THAT(run_binary("Div", Tensor(DType::kInt32, Shape{0}), Tensor(int32_t{0})),
              IsOkAndHolds(TensorEq(Tensor(DType::kInt32, Shape{0}))));
}

TEST(BinaryOpsTest, UnknownShapesResolvedAtRunTime) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{-1, 1}, "y");
  Output z = ops::Mul(g, x, y);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_TRUE(z.shape().is_unknown_rank());
  EXPECT_THAT(run_one(g, z, {{x, Tensor{1.0f, 2.0f}}, {y, Tensor::matrix<float>({{3}, {4}})}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{3, 6}, {4, 8}}))));
}

}  // namespace
}  // namespace graphrun
