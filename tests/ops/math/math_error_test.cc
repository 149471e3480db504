// Error paths of the math ops: at build time (known dtypes and shapes) and
// at run time (shapes only known once fed).
#include <graphrun/graphrun.h>

#include <cstdint>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

using Axes = std::vector<int64_t>;

// The message of `s`, for matching several substrings.
std::string message(const Status& s) { return s.message(); }

// ---- Build time ----

TEST(MathBuildErrorTest, BinaryDTypeMismatchNamesNodeAndBothDTypes) {
  Graph g;
  Output z = ops::Add(g, ops::Const(g, Tensor{1.0f}), ops::Const(g, Tensor{int32_t{1}}), "add");
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'add' (Add)"));
  EXPECT_THAT(message(g.status()), AllOf(HasSubstr("int32"), HasSubstr("float32")));
}

TEST(MathBuildErrorTest, EveryBinaryOpChecksDTypes) {
  for (auto op : {ops::Add, ops::Sub, ops::Mul, ops::Div}) {
    Graph g;
    Output z = op(g, ops::Const(g, Tensor{int64_t{1}}), ops::Const(g, Tensor{1.0}), "z");
    EXPECT_FALSE(z.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'z'"));
    EXPECT_THAT(message(g.status()), AllOf(HasSubstr("int64"), HasSubstr("float64")));
  }
}

TEST(MathBuildErrorTest, BinaryIncompatibleShapesNamesBothShapes) {
  Graph g;
  Output z = ops::Mul(g, ops::Const(g, Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}})),
                      ops::Const(g, Tensor{1.0f, 2.0f, 3.0f, 4.0f}), "mul");
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'mul' (Mul)"));
  EXPECT_THAT(message(g.status()), AllOf(HasSubstr("[2,3]"), HasSubstr("[4]")));
}

TEST(MathBuildErrorTest, BoolIsNotNumeric) {
  Graph g;
  Output b = ops::Placeholder(g, DType::kBool, Shape{2}, "b");
  EXPECT_FALSE(ops::Add(g, b, b, "add").is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'add' (Add)"));
  EXPECT_THAT(message(g.status()), HasSubstr("bool"));
}

TEST(MathBuildErrorTest, FloatOnlyUnaryOpsRejectIntegers) {
  for (auto op : {ops::Sqrt, ops::Exp, ops::Log, ops::Tanh, ops::Sigmoid}) {
    Graph g;
    Output y = op(g, ops::Const(g, Tensor{int32_t{4}}), "y");
    EXPECT_FALSE(y.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'y'"));
    EXPECT_THAT(message(g.status()), AllOf(HasSubstr("int32"), HasSubstr("float32")));
  }
  Graph g;  // Neg, Square, Relu take integers.
  EXPECT_TRUE(ops::Neg(g, ops::Const(g, Tensor{int32_t{4}})).is_valid());
  EXPECT_TRUE(ops::Square(g, ops::Const(g, Tensor{int64_t{4}})).is_valid());
  EXPECT_TRUE(ops::Relu(g, ops::Const(g, Tensor{int32_t{4}})).is_valid());
  EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
}

TEST(MathBuildErrorTest, InvalidInputPropagates) {
  Graph g;
  Output bad = ops::Add(g, ops::Const(g, Tensor{1.0f}), ops::Const(g, Tensor{2.0}), "bad");
  ASSERT_FALSE(bad.is_valid());
  const Status first = g.status();
  EXPECT_FALSE(ops::Relu(g, bad).is_valid());
  EXPECT_FALSE(ops::MatMul(g, bad, bad).is_valid());
  EXPECT_FALSE(ops::Sum(g, bad, Axes{0}).is_valid());
  EXPECT_EQ(g.status(), first);  // the first error is kept
}

TEST(MathBuildErrorTest, MatMulRankMustBe2) {
  Graph g;
  Output c = ops::MatMul(g, ops::Const(g, Tensor{1.0f, 2.0f}),
                         ops::Const(g, Tensor::matrix<float>({{1}, {2}})), {}, "mm");
  EXPECT_FALSE(c.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 'mm' (MatMul)"));
  EXPECT_THAT(message(g.status()),
              AllOf(HasSubstr("rank-2"), HasSubstr("[2]"), HasSubstr("[2,1]")));
}

TEST(MathBuildErrorTest, MatMulInnerDimensionsDiffer) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{2, 3});
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{4, 5});
  EXPECT_FALSE(ops::MatMul(g, a, b, {}, "mm").is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument,
                                   "node 'mm' (MatMul): inner dimensions differ: [2,3] x [4,5]"));
}

TEST(MathBuildErrorTest, MatMulTransposeFlagsDecideInnerDimensions) {
  {
    // a [3,2] transposed is [2,3]; b [4,5]: 3 vs 4.
    Graph g;
    Output a = ops::Placeholder(g, DType::kFloat32, Shape{3, 2});
    Output b = ops::Placeholder(g, DType::kFloat32, Shape{4, 5});
    EXPECT_FALSE(ops::MatMul(g, a, b, {.transpose_a = true}, "mm").is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "inner dimensions differ"));
    EXPECT_THAT(message(g.status()), AllOf(HasSubstr("[3,2] x [4,5]"), HasSubstr("3 vs 4"),
                                           HasSubstr("transpose_a=true")));
  }
  {
    // Without the flag [2,3] x [2,3] differs; with transpose_b it is fine.
    Graph g;
    Output a = ops::Placeholder(g, DType::kFloat32, Shape{2, 3});
    EXPECT_FALSE(ops::MatMul(g, a, a).is_valid());
    Graph h;
    Output ha = ops::Placeholder(h, DType::kFloat32, Shape{2, 3});
    Output ok = ops::MatMul(h, ha, ha, {.transpose_b = true});
    EXPECT_TRUE(h.status().is_ok()) << h.status().to_string();
    EXPECT_EQ(ok.shape(), (Shape{2, 2}));
  }
}

TEST(MathBuildErrorTest, MatMulDTypes) {
  Graph g;
  Output c = ops::MatMul(g, ops::Const(g, Tensor::matrix<float>({{1}})),
                         ops::Const(g, Tensor::matrix<double>({{1}})), {}, "mm");
  EXPECT_FALSE(c.is_valid());
  EXPECT_THAT(message(g.status()),
              AllOf(HasSubstr("node 'mm'"), HasSubstr("float32"), HasSubstr("float64")));
  Graph h;
  Output b = ops::Placeholder(h, DType::kBool, Shape{1, 1});
  EXPECT_FALSE(ops::MatMul(h, b, b).is_valid());
  EXPECT_THAT(h.status(), StatusIs(StatusCode::kInvalidArgument, "bool"));
}

TEST(MathBuildErrorTest, ReductionAxisOutOfRange) {
  Graph g;
  Output x = ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}}));
  EXPECT_FALSE(ops::Sum(g, x, Axes{2}, false, "s").is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 's' (Sum)"));
  EXPECT_THAT(message(g.status()), AllOf(HasSubstr("axis 2"), HasSubstr("rank 2")));

  Graph h;
  Output y = ops::Const(h, Tensor::matrix<float>({{1, 2}, {3, 4}}));
  EXPECT_FALSE(ops::Mean(h, y, Axes{-3}).is_valid());
  EXPECT_THAT(message(h.status()), AllOf(HasSubstr("axis -3"), HasSubstr("rank 2")));

  Graph k;  // a scalar has no axes at all
  EXPECT_FALSE(ops::Max(k, ops::Const(k, Tensor(1.0f)), Axes{0}).is_valid());
  EXPECT_THAT(message(k.status()), AllOf(HasSubstr("axis 0"), HasSubstr("rank 0")));
}

TEST(MathBuildErrorTest, ReductionAxesDTypeAndRank) {
  Graph g;
  Output x = ops::Const(g, Tensor{1.0f, 2.0f});
  EXPECT_FALSE(ops::Sum(g, x, ops::Const(g, Tensor{0.0f}), false, "s").is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "node 's' (Sum)"));
  EXPECT_THAT(message(g.status()), HasSubstr("float32"));

  Graph h;
  Output y = ops::Const(h, Tensor{1.0f, 2.0f});
  EXPECT_FALSE(
      ops::Sum(h, y, ops::Const(h, Tensor::matrix<int32_t>({{0}})), false, "s").is_valid());
  EXPECT_THAT(h.status(), StatusIs(StatusCode::kInvalidArgument, "scalar or a vector"));
}

// ---- Run time (shapes unknown when building) ----

TEST(MathRunErrorTest, BinaryIncompatibleShapesNamesBothShapes) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "y");
  Output z = ops::Add(g, x, y, "z");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  Result<Tensor> r = run_one(
      g, z,
      {{x, Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}})}, {y, Tensor{1.0f, 2.0f, 3.0f, 4.0f}}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'z' (Add)"));
  EXPECT_THAT(message(r.status()), AllOf(HasSubstr("[2,3]"), HasSubstr("[4]")));
}

TEST(MathRunErrorTest, PartiallyKnownShapesCheckedAtRunTime) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt32, Shape{-1, 3}, "x");
  Output y = ops::Placeholder(g, DType::kInt32, Shape{-1, 3}, "y");
  Output z = ops::Sub(g, x, y, "z");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(z.shape(), (Shape{-1, 3}));
  Result<Tensor> r = run_one(
      g, z, {{x, Tensor(DType::kInt32, Shape{2, 3})}, {y, Tensor(DType::kInt32, Shape{3, 3})}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "[2,3]"));
  EXPECT_THAT(message(r.status()), HasSubstr("[3,3]"));
}

TEST(MathRunErrorTest, IntegerDivisionByZero) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt64, Shape::unknown(), "x");
  Output y = ops::Placeholder(g, DType::kInt64, Shape::unknown(), "y");
  Output z = ops::Div(g, x, y, "div");
  EXPECT_THAT(run_one(g, z,
                      {{x, Tensor::matrix<int64_t>({{1, 2}, {3, 4}})},
                       {y, Tensor{int64_t{1}, int64_t{0}}}}),
              StatusIs(StatusCode::kInvalidArgument, "node 'div' (Div): integer division by zero"));
}

TEST(MathRunErrorTest, MatMulRankAtRunTime) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "b");
  Output c = ops::MatMul(g, a, b, {}, "mm");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  Result<Tensor> r =
      run_one(g, c, {{a, Tensor{1.0f, 2.0f}}, {b, Tensor::matrix<float>({{1}, {2}})}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'mm' (MatMul)"));
  EXPECT_THAT(message(r.status()),
              AllOf(HasSubstr("rank-2"), HasSubstr("[2]"), HasSubstr("[2,1]")));
  Tensor rank3(DType::kFloat32, Shape{1, 1, 1});
  EXPECT_THAT(run_one(g, c, {{a, rank3}, {b, rank3}}),
              StatusIs(StatusCode::kInvalidArgument, "rank-2"));
}

TEST(MathRunErrorTest, MatMulInnerDimensionsAtRunTime) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{-1, -1}, "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{-1, -1}, "b");
  Output c = ops::MatMul(g, a, b, {}, "mm");
  Output ct = ops::MatMul(g, a, b, {.transpose_a = true}, "mmt");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  const Tensor av(DType::kFloat32, Shape{2, 3});
  const Tensor bv(DType::kFloat32, Shape{4, 5});
  EXPECT_THAT(run_one(g, c, {{a, av}, {b, bv}}),
              StatusIs(StatusCode::kInvalidArgument,
                       "node 'mm' (MatMul): inner dimensions differ: [2,3] x [4,5]"));
  Result<Tensor> r = run_one(g, ct, {{a, av}, {b, bv}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "inner dimensions differ: [2,3] x [4,5]"));
  EXPECT_THAT(message(r.status()), AllOf(HasSubstr("2 vs 4"), HasSubstr("transpose_a=true")));
  // The same feeds fit once transposed: [2,3]^T x [2,5].
  EXPECT_TRUE(run_one(g, ct, {{a, av}, {b, Tensor(DType::kFloat32, Shape{2, 5})}}).is_ok());
}

TEST(MathRunErrorTest, ReductionAxisOutOfRangeAtRunTime) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  Output axes = ops::Placeholder(g, DType::kInt32, Shape::unknown(), "axes");
  Output s = ops::Sum(g, x, axes, false, "s");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  const Tensor xv = Tensor::matrix<float>({{1, 2}, {3, 4}});
  Result<Tensor> r = run_one(g, s, {{x, xv}, {axes, Tensor{int32_t{0}, int32_t{-3}}}});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 's' (Sum)"));
  EXPECT_THAT(message(r.status()), AllOf(HasSubstr("axis -3"), HasSubstr("rank 2")));
  EXPECT_THAT(run_one(g, s, {{x, xv}, {axes, Tensor{int32_t{2}}}}),
              StatusIs(StatusCode::kInvalidArgument, "axis 2"));
  EXPECT_THAT(run_one(g, s, {{x, xv}, {axes, Tensor::matrix<int32_t>({{0}})}}),
              StatusIs(StatusCode::kInvalidArgument, "scalar or a vector"));
  // Rank only known at run time: an unknown-rank input passed the build.
  Output u = ops::Max(g, x, Axes{3}, false, "u");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_THAT(run_one(g, u, {{x, xv}}), StatusIs(StatusCode::kInvalidArgument, "axis 3"));
}

}  // namespace
}  // namespace graphrun
