#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::run_all;
using ::graphrun::testing::run_one;
using ::graphrun::testing::TensorEq;

TEST(IdentityTest, EveryDtypePassesThrough) {
  const std::vector<Tensor> values = {Tensor{1.5f}, Tensor::matrix<double>({{1, 2}, {3, 4}}),
                                      Tensor(7), Tensor{int64_t{-1}, int64_t{5}},
                                      Tensor{false, true}};
  for (const Tensor& value : values) {
    Graph g;
    Output y = ops::Identity(g, ops::Const(g, value), "y");
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    EXPECT_EQ(y.node()->op(), "Identity");
    EXPECT_EQ(y.dtype(), value.dtype());
    EXPECT_EQ(y.shape(), value.shape());
    EXPECT_EQ(std::get<DType>(*y.node()->find_attr("T")), value.dtype());
    EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(value)));
  }
}

TEST(IdentityTest, SharesTheInputBuffer) {
  Graph g;
  Output c = ops::Const(g, Tensor{1, 2, 3});
  Output y = ops::Identity(g, ops::Identity(g, c));
  ASSERT_TRUE(g.status().is_ok());
  Result<std::vector<Tensor>> out = run_all(g, {c, y});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_TRUE((*out)[1].shares_buffer_with((*out)[0]));
}

TEST(IdentityTest, SharesAFedBuffer) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1});
  Output y = ops::Identity(g, x);
  ASSERT_TRUE(g.status().is_ok());
  Tensor fed = Tensor{1.0f, 2.0f};
  Result<Tensor> out = run_one(g, y, {{x, fed}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_THAT(*out, TensorEq(fed));
  EXPECT_TRUE(out->shares_buffer_with(fed));
}

TEST(IdentityTest, UnknownShapePropagates) {
  Graph g;
  Output y = ops::Identity(g, ops::Placeholder(g, DType::kBool, Shape{-1, 4}));
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_EQ(y.shape(), (Shape{-1, 4}));
}

TEST(IdentityTest, InvalidInputDoesNothing) {
  Graph g;
  Output bad = ops::Placeholder(g, DType::kInvalid);
  const Status first = g.status();
  ASSERT_FALSE(first.is_ok());
  Output y = ops::Identity(g, bad);
  EXPECT_FALSE(y.is_valid());
  EXPECT_EQ(g.status(), first);  // the first error is kept
}

}  // namespace
}  // namespace graphrun
