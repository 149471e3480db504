// Neg, Square, Sqrt, Exp, Log, Tanh, Sigmoid, Relu: values and dtypes.
#include <graphrun/graphrun.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_one;
using ::graphrun::testing::TensorEq;
using ::graphrun::testing::TensorNear;

using UnaryBuilder = std::function<Output(Graph&, Output, std::string_view)>;

Result<Tensor> run_unary(const UnaryBuilder& op, Tensor x) {
  Graph g;
  Output y = op(g, ops::Const(g, std::move(x)), "y");
  if (!g.status().is_ok()) return g.status();
  return run_one(g, y);
}

TEST(UnaryOpsTest, NodeNamesOpsAndShapes) {
  Graph g;
  Output x = ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}}));
  const std::vector<std::pair<UnaryBuilder, const char*>> builders = {
      {ops::Neg, "Neg"}, {ops::Square, "Square"}, {ops::Sqrt, "Sqrt"},       {ops::Exp, "Exp"},
      {ops::Log, "Log"}, {ops::Tanh, "Tanh"},     {ops::Sigmoid, "Sigmoid"}, {ops::Relu, "Relu"}};
  for (const auto& [build, op] : builders) {
    Output y = build(g, x, {});
    ASSERT_TRUE(y.is_valid()) << op << ": " << g.status().to_string();
    EXPECT_EQ(y.node()->op(), op);
    EXPECT_EQ(y.node()->name(), op);
    EXPECT_EQ(y.dtype(), DType::kFloat32);
    EXPECT_EQ(y.shape(), (Shape{2, 2}));
  }
}

TEST(UnaryOpsTest, Neg) {
  EXPECT_THAT(run_unary(ops::Neg, Tensor::matrix<float>({{1, -2}, {0, 3.5f}})),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{-1, 2}, {0, -3.5f}}))));
  EXPECT_THAT(run_unary(ops::Neg, Tensor{int32_t{5}, int32_t{-6}}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{-5}, int32_t{6}})));
  EXPECT_THAT(run_unary(ops::Neg, Tensor(int64_t{7})), IsOkAndHolds(TensorEq(Tensor(int64_t{-7}))));
  EXPECT_THAT(run_unary(ops::Neg, Tensor{2.0}), IsOkAndHolds(TensorEq(Tensor{-2.0})));
}

TEST(UnaryOpsTest, Square) {
  EXPECT_THAT(run_unary(ops::Square, Tensor{1.5f, -3.0f}),
              IsOkAndHolds(TensorEq(Tensor{2.25f, 9.0f})));
  EXPECT_THAT(run_unary(ops::Square, Tensor{int32_t{-4}, int32_t{11}}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{16}, int32_t{121}})));
  EXPECT_THAT(run_unary(ops::Square, Tensor{int64_t{3000000000}}),
              IsOkAndHolds(TensorEq(Tensor{int64_t{9000000000000000000}})));
}

TEST(UnaryOpsTest, Sqrt) {
  EXPECT_THAT(run_unary(ops::Sqrt, Tensor{4.0f, 9.0f, 0.0f, 2.25f}),
              IsOkAndHolds(TensorEq(Tensor{2.0f, 3.0f, 0.0f, 1.5f})));
  EXPECT_THAT(run_unary(ops::Sqrt, Tensor{16.0}), IsOkAndHolds(TensorEq(Tensor{4.0})));
  Result<Tensor> r = run_unary(ops::Sqrt, Tensor{-1.0f});
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(std::isnan(r->flat<float>()[0]));
}

TEST(UnaryOpsTest, Exp) {
  EXPECT_THAT(run_unary(ops::Exp, Tensor{0.0f, 1.0f, -1.0f}),
              IsOkAndHolds(TensorNear(Tensor{1.0f, 2.7182817f, 0.36787945f})));
  EXPECT_THAT(run_unary(ops::Exp, Tensor{2.0}), IsOkAndHolds(TensorNear(Tensor{7.38905609893065})));
}

TEST(UnaryOpsTest, Log) {
  EXPECT_THAT(run_unary(ops::Log, Tensor{1.0f, 2.7182817f, 0.5f}),
              IsOkAndHolds(TensorNear(Tensor{0.0f, 1.0f, -0.6931472f})));
  EXPECT_THAT(run_unary(ops::Log, Tensor{100.0}),
              IsOkAndHolds(TensorNear(Tensor{4.605170185988092})));
  Result<Tensor> r = run_unary(ops::Log, Tensor{0.0f});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->flat<float>()[0], -std::numeric_limits<float>::infinity());
}

TEST(UnaryOpsTest, Tanh) {
  EXPECT_THAT(run_unary(ops::Tanh, Tensor{0.0f, 1.0f, -2.0f, 20.0f}),
              IsOkAndHolds(TensorNear(Tensor{0.0f, 0.7615942f, -0.9640276f, 1.0f})));
  EXPECT_THAT(run_unary(ops::Tanh, Tensor{0.5}),
              IsOkAndHolds(TensorNear(Tensor{0.46211715726000974})));
}

TEST(UnaryOpsTest, Sigmoid) {
  EXPECT_THAT(run_unary(ops::Sigmoid, Tensor{0.0f, 2.0f, -2.0f, 100.0f, -100.0f}),
              IsOkAndHolds(TensorNear(Tensor{0.5f, 0.8807971f, 0.11920292f, 1.0f, 0.0f})));
  EXPECT_THAT(run_unary(ops::Sigmoid, Tensor{1.0}),
              IsOkAndHolds(TensorNear(Tensor{0.7310585786300049})));
}

TEST(UnaryOpsTest, Relu) {
  EXPECT_THAT(run_unary(ops::Relu, Tensor::matrix<float>({{-1, 2}, {0, -3.5f}})),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{0, 2}, {0, 0}}))));
  EXPECT_THAT(run_unary(ops::Relu, Tensor{int32_t{-5}, int32_t{6}}),
              IsOkAndHolds(TensorEq(Tensor{int32_t{0}, int32_t{6}})));
  EXPECT_THAT(run_unary(ops::Relu, Tensor{int64_t{-5}, int64_t{6}}),
              IsOkAndHolds(TensorEq(Tensor{int64_t{0}, int64_t{6}})));
}

TEST(UnaryOpsTest, LargeInputsMatchReference) {
  // Many parallel chunks.
  const int n = 100000;
  std::vector<float> x(n), relu(n), sig(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 201 - 100) / 10.0f;
    relu[i] = x[i] > 0 ? x[i] : 0.0f;
    sig[i] = 1.0f / (1.0f + std::exp(-x[i]));
  }
  Tensor xt = Tensor::from_span(Shape{n}, std::span<const float>(x));
  EXPECT_THAT(run_unary(ops::Relu, xt),
              IsOkAndHolds(TensorEq(Tensor::from_span(Shape{n}, std::span<const float>(relu)))));
  EXPECT_THAT(run_unary(ops::Sigmoid, xt),
              IsOkAndHolds(TensorNear(Tensor::from_span(Shape{n}, std::span<const float>(sig)))));
}

TEST(UnaryOpsTest, EmptyAndScalarInputs) {
  EXPECT_THAT(run_unary(ops::Exp, Tensor(DType::kFloat32, Shape{0, 4})),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{0, 4}))));
  EXPECT_THAT(run_unary(ops::Square, Tensor(3.0f)), IsOkAndHolds(TensorEq(Tensor(9.0f))));
}

}  // namespace
}  // namespace graphrun
