#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_all;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::HasSubstr;

// Runs the node's registered kernel once, outside any session (for the
// placeholder's own error, which the scheduler normally preempts).
Status run_kernel_directly(const Node& node) {
  ResourceManager resources;
  OpKernelConstruction construction(node, resources);
  Result<std::unique_ptr<OpKernel>> kernel = node.registration().factory(construction);
  if (!kernel.is_ok()) return kernel.status();
  std::vector<Tensor> outputs(static_cast<std::size_t>(node.num_outputs()));
  KernelRuntime runtime;
  OpKernelContext ctx(node, nullptr, {}, outputs.data(), runtime, nullptr, 1);
  return (*kernel)->compute(ctx);
}

TEST(PlaceholderTest, BuildTimeDtypeAndShape) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 3}, "x");
  Output y = ops::Placeholder(g, DType::kInt64);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(x.node()->op(), "Placeholder");
  EXPECT_EQ(x.node()->name(), "x");
  EXPECT_EQ(x.dtype(), DType::kFloat32);
  EXPECT_EQ(x.shape(), (Shape{-1, 3}));
  EXPECT_EQ(y.node()->name(), "Placeholder");
  EXPECT_EQ(y.dtype(), DType::kInt64);
  EXPECT_TRUE(y.shape().is_unknown_rank());
  EXPECT_FALSE(x.node()->is_stateful());
}

TEST(PlaceholderTest, FedValueFlowsThrough) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 2}, "x");
  Output y = ops::Identity(g, x);
  ASSERT_TRUE(g.status().is_ok());
  Tensor fed = Tensor::matrix<float>({{1, 2}, {3, 4}, {5, 6}});
  EXPECT_THAT(run_one(g, y, {{x, fed}}), IsOkAndHolds(TensorEq(fed)));
  EXPECT_THAT(run_one(g, "x:0", {{"x", fed}}), IsOkAndHolds(TensorEq(fed)));
}

TEST(PlaceholderTest, EveryDtypeCanBeFed) {
  const std::vector<Tensor> values = {Tensor{1.5f, -2.0f}, Tensor{2.25, 3.0}, Tensor{1, 2, 3},
                                      Tensor{int64_t{1} << 40}, Tensor{true, false}};
  for (const Tensor& value : values) {
    Graph g;
    Output x = ops::Placeholder(g, value.dtype(), value.shape(), "x");
    Output y = ops::Identity(g, x);
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    EXPECT_THAT(run_one(g, y, {{x, value}}), IsOkAndHolds(TensorEq(value))) << value.debug_type();
  }
}

TEST(PlaceholderTest, UnfedPlaceholderIsInvalidArgumentNamingIt) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "my_input");
  Output y = ops::Identity(g, x);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, y), StatusIs(StatusCode::kInvalidArgument, "my_input"));
  EXPECT_THAT(run_one(g, x), StatusIs(StatusCode::kInvalidArgument, "my_input"));
}

TEST(PlaceholderTest, KernelErrorNamesDtypeAndShape) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 3}, "x");
  Output y = ops::Placeholder(g, DType::kInt32, Shape::unknown(), "y");
  Output z = ops::Placeholder(g, DType::kBool, Shape{}, "z");
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_EQ(run_kernel_directly(*x.node()),
            invalid_argument("You must feed a value for placeholder tensor 'x' with dtype float32 "
                             "and shape [?,3]"));
  EXPECT_EQ(run_kernel_directly(*y.node()),
            invalid_argument("You must feed a value for placeholder tensor 'y' with dtype int32"));
  EXPECT_EQ(run_kernel_directly(*z.node()),
            invalid_argument("You must feed a value for placeholder tensor 'z' with dtype bool "
                             "and shape []"));
}

TEST(PlaceholderTest, InvalidDtypeIsABuildError) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInvalid, Shape{2}, "x");
  EXPECT_FALSE(x.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "dtype"));
}

TEST(PlaceholderWithDefaultTest, DefaultWhenNotFed) {
  Graph g;
  Tensor def = Tensor{1.0f, 2.0f, 3.0f};
  Output x = ops::PlaceholderWithDefault(g, ops::Const(g, def), Shape{-1}, "x");
  Output y = ops::Identity(g, x);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(x.node()->op(), "PlaceholderWithDefault");
  EXPECT_EQ(x.dtype(), DType::kFloat32);
  EXPECT_EQ(x.shape(), (Shape{-1}));  // the declared, less specific shape
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(def)));
}

TEST(PlaceholderWithDefaultTest, FeedReplacesTheDefault) {
  Graph g;
  Output x = ops::PlaceholderWithDefault(g, ops::Const(g, Tensor{1, 2}), Shape{-1}, "x");
  Output y = ops::Identity(g, x);
  ASSERT_TRUE(g.status().is_ok());
  Tensor fed = Tensor{7, 8, 9, 10, 11};
  EXPECT_THAT(run_one(g, y, {{x, fed}}), IsOkAndHolds(TensorEq(fed)));
  // And the default again in the next run.
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor{1, 2})));
}

TEST(PlaceholderWithDefaultTest, DefaultSharesItsBuffer) {
  Graph g;
  Tensor def = Tensor{1.0, 2.0};
  Output c = ops::Const(g, def);
  Output x = ops::PlaceholderWithDefault(g, c, Shape{2});
  ASSERT_TRUE(g.status().is_ok());
  Result<std::vector<Tensor>> out = run_all(g, {c, x});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_TRUE((*out)[1].shares_buffer_with((*out)[0]));
}

TEST(PlaceholderWithDefaultTest, UnknownRankShapeAcceptsAnyDefault) {
  Graph g;
  Output x = ops::PlaceholderWithDefault(g, ops::Const(g, Tensor::matrix<int64_t>({{1}, {2}})),
                                         Shape::unknown());
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_TRUE(x.shape().is_unknown_rank());
  EXPECT_THAT(run_one(g, x), IsOkAndHolds(TensorEq(Tensor::matrix<int64_t>({{1}, {2}}))));
}

TEST(PlaceholderWithDefaultTest, IncompatibleShapeIsABuildError) {
  Graph g;
  Output x = ops::PlaceholderWithDefault(g, ops::Const(g, Tensor{1.0f, 2.0f}), Shape{3}, "x");
  EXPECT_FALSE(x.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[2]"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[3]"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "'x'"));

  Graph g2;
  Output y = ops::PlaceholderWithDefault(g2, ops::Const(g2, Tensor{1.0f, 2.0f}), Shape{2, 1});
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "[2,1]"));
}

TEST(PlaceholderWithDefaultTest, DefaultFromAPlaceholderWithUnknownShapeIsCheckedAtRunTime) {
  Graph g;
  Output p = ops::Placeholder(g, DType::kInt32, Shape::unknown(), "p");
  Output x = ops::PlaceholderWithDefault(g, p, Shape{2}, "x");
  Output y = ops::Identity(g, x);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, y, {{p, Tensor{1, 2}}}), IsOkAndHolds(TensorEq(Tensor{1, 2})));
  Result<Tensor> bad = run_one(g, y, {{p, Tensor{1, 2, 3}}});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "[3]"));
  EXPECT_THAT(bad.status().message(), HasSubstr("[2]"));
}

}  // namespace
}  // namespace graphrun
