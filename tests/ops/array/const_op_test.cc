#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::make_session;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;

TEST(ConstTest, EveryDtypeAndShape) {
  const std::vector<Tensor> values = {
      Tensor(2.5f),
      Tensor{1.0, -2.0, 3.5},
      Tensor::matrix<int32_t>({{1, 2, 3}, {4, 5, 6}}),
      Tensor(Shape{2, 1, 2}, {int64_t{1}, int64_t{-2}, int64_t{3}, int64_t{1} << 50}),
      Tensor{true, false, true},
      Tensor(DType::kFloat32, Shape{0, 3}),
  };
  for (const Tensor& value : values) {
    Graph g;
    Output c = ops::Const(g, value, "c");
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    EXPECT_EQ(c.node()->op(), "Const");
    EXPECT_EQ(c.dtype(), value.dtype());
    EXPECT_EQ(c.shape(), value.shape());
    EXPECT_EQ(std::get<DType>(*c.node()->find_attr("dtype")), value.dtype());
    EXPECT_THAT(run_one(g, c), IsOkAndHolds(TensorEq(value))) << value.debug_type();
  }
}

TEST(ConstTest, OutputSharesTheAttrBufferInEveryRun) {
  Graph g;
  Tensor value = Tensor{1.0f, 2.0f, 3.0f, 4.0f};
  Output c = ops::Const(g, value);
  ASSERT_TRUE(g.status().is_ok());
  auto session = make_session(g);
  ASSERT_NE(session, nullptr);
  Result<std::vector<Tensor>> a = session->run({}, {c});
  Result<std::vector<Tensor>> b = session->run({}, {c});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_TRUE((*a)[0].shares_buffer_with((*b)[0]));
  EXPECT_TRUE((*a)[0].shares_buffer_with(value));
  EXPECT_THAT((*a)[0], TensorEq(value));
}

TEST(ConstTest, KernelIsCheap) {
  Graph g;
  Output c = ops::Const(g, Tensor(1));
  ASSERT_TRUE(g.status().is_ok());
  ResourceManager resources;
  OpKernelConstruction construction(*c.node(), resources);
  Result<std::unique_ptr<OpKernel>> kernel = c.node()->registration().factory(construction);
  ASSERT_TRUE(kernel.is_ok()) << kernel.status().to_string();
  EXPECT_TRUE((*kernel)->is_cheap());
}

TEST(ConstTest, EmptyTensorIsABuildError) {
  Graph g;
  Output c = ops::Const(g, Tensor(), "c");
  EXPECT_FALSE(c.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "'c'"));
}

TEST(ConstTest, MissingValueAttrIsABuildError) {
  Graph g;
  Result<Node*> n = g.add_node(NodeSpec{.op = "Const", .attrs = {{"dtype", DType::kFloat32}}});
  EXPECT_THAT(n, StatusIs(StatusCode::kInvalidArgument, "value"));
}

TEST(ConstTest, DtypeAttrMustMatchTheValue) {
  Graph g;
  Result<Node*> n = g.add_node(
      NodeSpec{.op = "Const", .attrs = {{"dtype", DType::kInt32}, {"value", Tensor(1.0f)}}});
  EXPECT_THAT(n, StatusIs(StatusCode::kInvalidArgument, "float32"));
}

TEST(ZerosOnesTest, Values) {
  Graph g;
  Output z = ops::Zeros(g, Shape{2, 3});
  Output o = ops::Ones(g, Shape{2}, DType::kInt64);
  Output zb = ops::Zeros(g, Shape{3}, DType::kBool);
  Output ob = ops::Ones(g, Shape{}, DType::kBool);
  Output od = ops::Ones(g, Shape{1, 2}, DType::kFloat64, "my_ones");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(z.dtype(), DType::kFloat32);
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(od.node()->name(), "my_ones");
  EXPECT_THAT(run_one(g, z), IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{2, 3}))));
  EXPECT_THAT(run_one(g, o), IsOkAndHolds(TensorEq(Tensor{int64_t{1}, int64_t{1}})));
  EXPECT_THAT(run_one(g, zb), IsOkAndHolds(TensorEq(Tensor{false, false, false})));
  EXPECT_THAT(run_one(g, ob), IsOkAndHolds(TensorEq(Tensor(true))));
  EXPECT_THAT(run_one(g, od), IsOkAndHolds(TensorEq(Tensor::matrix<double>({{1.0, 1.0}}))));
}

TEST(ZerosOnesTest, ShapeMustBeFullyDefined) {
  Graph g;
  Output z = ops::Zeros(g, Shape{-1, 3});
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[?,3]"));

  Graph g2;
  Output o = ops::Ones(g2, Shape::unknown(), DType::kInt32, "o");
  EXPECT_FALSE(o.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "<unknown>"));
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "'o'"));
}

TEST(ZerosOnesTest, HugeShapeIsAnErrorNotAnAbort) {
  Graph g;
  Output z = ops::Zeros(g, Shape{int64_t{1} << 31, int64_t{1} << 31});
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kResourceExhausted, "Zeros"));

  Graph g2;
  Output o = ops::Ones(g2, Shape{int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_FALSE(o.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "int64"));
}

}  // namespace
}  // namespace graphrun
