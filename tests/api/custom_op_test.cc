// The README's custom-op examples, verbatim in spirit: a registered op with a
// parallel kernel, and a node from a C++ callable.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::IsOkAndHolds;
using testing::TensorEq;

class TimesTwoOp final : public OpKernel {
 public:
  Status compute(OpKernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * y, ctx.allocate_output_uninitialized(0, x.shape()));
    auto in = x.flat<float>();
    auto out = y->flat<float>();
    ctx.parallel_for(static_cast<int64_t>(in.size()), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        out[static_cast<std::size_t>(i)] = 2 * in[static_cast<std::size_t>(i)];
    });
    return Status::ok();
  }
};

TEST(CustomOpTest, RegisteredOpRunsAndIsCheckedAtBuildTime) {
  OpRegistry& r = OpRegistry::global();
  if (r.find("TimesTwo") == nullptr) {
    ASSERT_TRUE(r.add(OpDef("TimesTwo")
                          .input("x", DType::kFloat32)
                          .output("y", DType::kFloat32)
                          .shape_fn(shape_fns::unchanged),
                      [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
                        return std::make_unique<TimesTwoOp>();
                      })
                    .is_ok());
  }
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1}, "x");
  auto node = g.add_node(NodeSpec{.op = "TimesTwo", .name = "t", .inputs = {x}});
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  EXPECT_EQ((*node)->output_shape(0), Shape{-1});
  // 100k elements: the parallel_for really splits.
  Tensor big = Tensor::filled<float>(Shape{100000}, 1.5f);
  EXPECT_THAT(testing::run_one(g, (*node)->output(0), {{x, big}}),
              IsOkAndHolds(TensorEq(Tensor::filled<float>(Shape{100000}, 3.0f))));
  // Wrong input dtype at build time names the node and both dtypes.
  Output i = ops::Const(g, Tensor(1), "i");
  EXPECT_THAT(g.add_node(NodeSpec{.op = "TimesTwo", .name = "bad", .inputs = {i}}),
              testing::StatusIs(StatusCode::kInvalidArgument, "must be float32, got int32"));
}

TEST(CustomOpTest, CallableNode) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{3}, "x");
  std::vector<Output> scaled = ops::Call(
      g, {x}, {DType::kFloat32}, [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        Tensor out = in[0].deep_copy();
        for (float& v : out.flat<float>()) v *= 2;
        return std::vector<Tensor>{out};
      });
  ASSERT_EQ(scaled.size(), 1u);
  EXPECT_THAT(testing::run_one(g, scaled[0], {{x, Tensor{1.0f, 2.0f, 3.0f}}}),
              IsOkAndHolds(TensorEq(Tensor{2.0f, 4.0f, 6.0f})));
}

}  // namespace
}  // namespace graphrun
