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

const Tensor k2x3 = Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}});

TEST(ReshapeTest, ValuesAndBuildTimeShape) {
  Graph g;
  Output x = ops::Const(g, k2x3);
  Output y = ops::Reshape(g, x, std::vector<int64_t>{3, 2});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.node()->op(), "Reshape");
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  // The vector form adds an int32 Const named after the Reshape node.
  EXPECT_EQ(y.node()->input(1).dtype(), DType::kInt32);
  EXPECT_EQ(y.node()->input(1).node()->op(), "Const");
  EXPECT_EQ(y.node()->input(1).node()->name(), y.node()->name() + "/shape");
  EXPECT_THAT(run_one(g, y),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{1, 2}, {3, 4}, {5, 6}}))));
}

TEST(ReshapeTest, HelperConstantsAreNamedAfterTheirReshape) {
  Graph g;
  Output x = ops::Const(g, k2x3);
  Output a = ops::Reshape(g, x, std::vector<int64_t>{6});
  Output b = ops::Reshape(g, x, std::vector<int64_t>{6});
  Output c = ops::Reshape(g, x, std::vector<int64_t>{6}, "flat");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(a.node()->name(), "Reshape");
  EXPECT_EQ(a.node()->input(1).node()->name(), "Reshape/shape");
  EXPECT_EQ(b.node()->name(), "Reshape_1");
  EXPECT_EQ(b.node()->input(1).node()->name(), "Reshape_1/shape");
  EXPECT_EQ(c.node()->name(), "flat");
  EXPECT_EQ(c.node()->input(1).node()->name(), "flat/shape");
}

TEST(ReshapeTest, MinusOneIsInferred) {
  Graph g;
  Output x = ops::Const(g, k2x3);
  Output y = ops::Reshape(g, x, std::vector<int64_t>{-1, 2});
  Output flat = ops::Reshape(g, x, std::vector<int64_t>{-1});
  Output z = ops::Reshape(g, x, std::vector<int64_t>{1, -1, 1});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(flat.shape(), (Shape{6}));
  EXPECT_EQ(z.shape(), (Shape{1, 6, 1}));
  EXPECT_THAT(run_one(g, flat), IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f})));
  EXPECT_THAT(run_one(g, z),
              IsOkAndHolds(TensorEq(Tensor(Shape{1, 6, 1}, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}))));
}

TEST(ReshapeTest, ToAndFromScalar) {
  Graph g;
  Output s = ops::Reshape(g, ops::Const(g, Tensor{5}), std::vector<int64_t>{});
  Output v = ops::Reshape(g, ops::Const(g, Tensor(7)), std::vector<int64_t>{-1});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_THAT(run_one(g, s), IsOkAndHolds(TensorEq(Tensor(5))));
  EXPECT_THAT(run_one(g, v), IsOkAndHolds(TensorEq(Tensor{7})));
}

TEST(ReshapeTest, SharesTheInputBuffer) {
  Graph g;
  Output x = ops::Const(g, k2x3);
  Output y = ops::Reshape(g, x, std::vector<int64_t>{6});
  ASSERT_TRUE(g.status().is_ok());
  Result<std::vector<Tensor>> out = run_all(g, {x, y});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_TRUE((*out)[1].shares_buffer_with((*out)[0]));
  EXPECT_EQ((*out)[1].shape(), Shape{6});
}

TEST(ReshapeTest, Int64ShapeInputAndEveryDtype) {
  const std::vector<Tensor> values = {
      Tensor{1.0f, 2.0f, 3.0f, 4.0f}, Tensor{1.0, 2.0, 3.0, 4.0}, Tensor{1, 2, 3, 4},
      Tensor{int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}}, Tensor{true, false, false, true}};
  for (const Tensor& value : values) {
    Graph g;
    Output shape = ops::Const(g, Tensor{int64_t{2}, int64_t{-1}});
    Output y = ops::Reshape(g, ops::Const(g, value), shape);
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    EXPECT_EQ(std::get<DType>(*y.node()->find_attr("Tshape")), DType::kInt64);
    EXPECT_EQ(y.shape(), (Shape{2, 2}));
    Result<Tensor> out = run_one(g, y);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(out->shape(), (Shape{2, 2}));
    EXPECT_EQ(out->dtype(), value.dtype());
    EXPECT_THAT(*out->reshaped(Shape{4}), TensorEq(value));
  }
}

TEST(ReshapeTest, MismatchAtBuildTimeNamesBothShapes) {
  Graph g;
  Output y = ops::Reshape(g, ops::Const(g, k2x3), std::vector<int64_t>{4, 2}, "r");
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[2,3]"));
  EXPECT_THAT(g.status().message(), HasSubstr("[4,2]"));
  EXPECT_THAT(g.status().message(), HasSubstr("'r'"));

  Graph g2;
  Output z = ops::Reshape(g2, ops::Const(g2, k2x3), std::vector<int64_t>{4, -1});
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "[4,-1]"));
  EXPECT_THAT(g2.status().message(), HasSubstr("[2,3]"));
}

TEST(ReshapeTest, MismatchAtRunTimeNamesBothShapes) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1}, "x");
  Output y = ops::Reshape(g, x, std::vector<int64_t>{2, -1});
  Output z = ops::Reshape(g, x, std::vector<int64_t>{2, 2});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.shape(), (Shape{2, -1}));
  EXPECT_EQ(z.shape(), (Shape{2, 2}));
  const Tensor five = Tensor{1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  Result<Tensor> bad = run_one(g, y, {{x, five}});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "[5]"));
  EXPECT_THAT(bad.status().message(), HasSubstr("[2,-1]"));
  bad = run_one(g, z, {{x, five}});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "[5]"));
  EXPECT_THAT(bad.status().message(), HasSubstr("[2,2]"));
  // And a good feed.
  EXPECT_THAT(run_one(g, z, {{x, Tensor{1.0f, 2.0f, 3.0f, 4.0f}}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{1, 2}, {3, 4}}))));
}

TEST(ReshapeTest, ShapeFromAPlaceholder) {
  Graph g;
  Output shape = ops::Placeholder(g, DType::kInt32, Shape{2}, "shape");
  Output y = ops::Reshape(g, ops::Const(g, k2x3), shape);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.shape(), (Shape{-1, -1}));  // the rank is known, the dims are not
  EXPECT_THAT(run_one(g, y, {{shape, Tensor{3, -1}}}),
              IsOkAndHolds(TensorEq(Tensor::matrix<float>({{1, 2}, {3, 4}, {5, 6}}))));
  Result<Tensor> bad = run_one(g, y, {{shape, Tensor{5, 1}}});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "[2,3]"));
  EXPECT_THAT(bad.status().message(), HasSubstr("[5,1]"));
  EXPECT_THAT(run_one(g, y, {{shape, Tensor{-1, -1}}}),
              StatusIs(StatusCode::kInvalidArgument, "more than one -1"));
}

TEST(ReshapeTest, UnknownShapeInputGivesUnknownRank) {
  Graph g;
  Output shape = ops::Placeholder(g, DType::kInt64, Shape::unknown());
  Output y = ops::Reshape(g, ops::Const(g, k2x3), shape);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_TRUE(y.shape().is_unknown_rank());
  EXPECT_THAT(run_one(g, y, {{shape, Tensor{int64_t{6}}}}),
              IsOkAndHolds(TensorEq(Tensor{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f})));
  EXPECT_THAT(run_one(g, y, {{shape, Tensor(int64_t{6})}}),
              StatusIs(StatusCode::kInvalidArgument, "vector"));
}

TEST(ReshapeTest, MalformedRequestsAreErrors) {
  struct Case {
    std::vector<int64_t> shape;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{-1, -1}, "more than one -1"},
      {{2, -3}, "negative dimension -3"},
      {{1, 1, 1, 1, 1, 1, 1, 1, 6}, "rank 9"},
  };
  for (const Case& c : cases) {
    Graph g;
    Output y = ops::Reshape(g, ops::Const(g, k2x3), c.shape);
    EXPECT_FALSE(y.is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, c.message));
  }
}

// Dimensions whose product passes int64 are refused wherever a 0 stands
// (the one rule of every shape check): [0, 2^62, 2^62] of an empty tensor
// was accepted where [2^62, 2^62, 0] was refused, and the .npy the CLI
// wrote of it could not be read back.
TEST(ReshapeTest, AnOverflowingShapeIsRefusedWhereverTheZeroStands) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{0, kHuge, kHuge}, std::vector<int64_t>{kHuge, 0, kHuge},
        std::vector<int64_t>{kHuge, kHuge, 0}}) {
    Graph g;
    Output s = ops::Placeholder(g, DType::kInt64, Shape{3}, "s");
    Output y = ops::Reshape(g, ops::Const(g, Tensor(DType::kFloat32, Shape{0})), s);
    ASSERT_TRUE(g.status().is_ok());
    EXPECT_THAT(run_one(g, y, {{s, Tensor::from_span(Shape{3}, std::span<const int64_t>(shape))}}),
                StatusIs(StatusCode::kInvalidArgument, "more elements than int64 can count"));
  }
  // Within bounds, a 0 anywhere makes an empty tensor of that shape.
  constexpr int64_t kBig = int64_t{1} << 40;
  Graph g;
  Output y = ops::Reshape(g, ops::Const(g, Tensor(DType::kFloat32, Shape{0})),
                          std::vector<int64_t>{0, kBig, 3});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{0, kBig, 3}))));
}

TEST(ReshapeTest, ShapeMustBeAnIntVector) {
  Graph g;
  Output y = ops::Reshape(g, ops::Const(g, k2x3), ops::Const(g, Tensor::matrix<int32_t>({{6}})));
  EXPECT_FALSE(y.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "vector"));

  Graph g2;
  Output z = ops::Reshape(g2, ops::Const(g2, k2x3), ops::Const(g2, Tensor{6.0f}));
  EXPECT_FALSE(z.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "Tshape"));
}

TEST(ReshapeTest, EmptyTensors) {
  Graph g;
  Output x = ops::Const(g, Tensor(DType::kInt32, Shape{0, 3}));
  Output y = ops::Reshape(g, x, std::vector<int64_t>{3, 0});
  Output z = ops::Reshape(g, x, std::vector<int64_t>{-1, 3});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(y.shape(), (Shape{3, 0}));
  EXPECT_EQ(z.shape(), (Shape{0, 3}));
  EXPECT_THAT(run_one(g, y), IsOkAndHolds(TensorEq(Tensor(DType::kInt32, Shape{3, 0}))));

  // -1 next to a 0 cannot be inferred.
  Graph g2;
  Output w = ops::Reshape(g2, ops::Const(g2, Tensor(DType::kInt32, Shape{0, 3})),
                          std::vector<int64_t>{-1, 0});
  EXPECT_FALSE(w.is_valid());
  EXPECT_THAT(g2.status(), StatusIs(StatusCode::kInvalidArgument, "cannot be inferred"));
}

}  // namespace
}  // namespace graphrun
