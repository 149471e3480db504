// Epilogue fusion through a Session: fused plans compute what the unfused
// nodes compute (within float rounding), traced runs show every node, the
// switch turns fusion off, and errors of a fused kernel name its nodes.
// (Which chains fuse, and which must not: plan_test.cc.)
#include <gtest/gtest.h>

#include <graphrun/graphrun.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun::testing {
namespace {

template <typename T>
Tensor random_tensor(Shape shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Tensor t(dtype_of<T>(), shape);
  for (T& v : t.flat<T>()) v = static_cast<T>(dist(gen));
  return t;
}

// x [m, k] fed; layers of act(x W + b) with random W, b; returns the last.
struct Mlp {
  Graph g;
  Output x;
  Output y;
  std::vector<std::string> ops_in_order;
};

template <typename T>
void build_mlp(Mlp& mlp, int64_t m, int64_t k, const std::vector<const char*>& activations,
               bool transpose_b = false) {
  Graph& g = mlp.g;
  mlp.x = ops::Placeholder(g, dtype_of<T>(), Shape{m, k}, "x");
  Output h = mlp.x;
  uint32_t seed = 1;
  for (const char* act : activations) {
    const Tensor w = random_tensor<T>(transpose_b ? Shape{k, k} : Shape{k, k}, seed++);
    Output mm = ops::MatMul(g, h, ops::Const(g, w), {.transpose_b = transpose_b});
    Output sum = ops::Add(g, mm, ops::Const(g, random_tensor<T>(Shape{k}, seed++)));
    const std::string a = act;
    h = a == "Relu" ? ops::Relu(g, sum) : a == "Sigmoid" ? ops::Sigmoid(g, sum) : ops::Tanh(g, sum);
  }
  mlp.y = h;
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
}

std::unique_ptr<Session> session_for(const Graph& g, bool fuse, int threads = 1) {
  SessionOptions options;
  options.inter_op_threads = threads;
  options.fuse_kernels = fuse;
  return std::move(Session::create(g, options).value());
}

std::set<std::string> ops_traced(Session& s, const Mlp& mlp, const Tensor& x) {
  RunOptions traced;
  traced.trace = true;
  RunMetadata md;
  auto out = s.run({{mlp.x, x}}, {mlp.y}, {}, traced, &md);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  std::set<std::string> ops;
  for (const NodeExecStats& st : md.step_stats) ops.insert(st.op);
  EXPECT_EQ(md.cpu_isa, cpu_isa_name(cpu_isa()));
  return ops;
}

TEST(FusionTest, FusedResultsEqualUnfusedForEveryActivationAndType) {
  Mlp f32;
  build_mlp<float>(f32, 64, 256, {"Relu", "Sigmoid", "Tanh", "Relu"});
  const Tensor x = random_tensor<float>(Shape{64, 256}, 99);
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    auto fused = session_for(f32.g, true, threads);
    auto unfused = session_for(f32.g, false, threads);
    auto a = fused->run({{f32.x, x}}, {f32.y});
    auto b = unfused->run({{f32.x, x}}, {f32.y});
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    EXPECT_TRUE((*a)[0].all_close((*b)[0], 1e-5, 1e-5));
  }
  Mlp f64;
  build_mlp<double>(f64, 33, 17, {"Tanh", "Sigmoid"}, /*transpose_b=*/true);
  const Tensor x64 = random_tensor<double>(Shape{33, 17}, 5);
  auto a = session_for(f64.g, true)->run({{f64.x, x64}}, {f64.y});
  auto b = session_for(f64.g, false)->run({{f64.x, x64}}, {f64.y});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_TRUE((*a)[0].all_close((*b)[0], 1e-12, 1e-12));
}

TEST(FusionTest, TracedRunsAndTheSwitchKeepEveryNode) {
  Mlp mlp;
  build_mlp<float>(mlp, 8, 16, {"Relu"});
  const Tensor x = random_tensor<float>(Shape{8, 16}, 3);
  auto fused = session_for(mlp.g, true);
  // An untraced run first: the signature's plan is the fused one.
  auto plain = fused->run({{mlp.x, x}}, {mlp.y});
  ASSERT_TRUE(plain.is_ok());
  const std::set<std::string> expected{"Const", "MatMul", "Add", "Relu"};
  EXPECT_EQ(ops_traced(*fused, mlp, x), expected);
  auto unfused = session_for(mlp.g, false);
  EXPECT_EQ(ops_traced(*unfused, mlp, x), expected);
  // A Callable traced runs unfused as well, with the same values.
  Callable c = fused->make_callable({mlp.x}, {mlp.y}).value();
  RunOptions traced;
  traced.trace = true;
  RunMetadata md;
  Tensor out[1];
  const Tensor feeds[] = {x};
  ASSERT_TRUE(c.run(feeds, out, traced, &md).is_ok());
  EXPECT_EQ(md.step_stats.size(), 5u);  // w, b, MatMul, Add, Relu
  EXPECT_TRUE(out[0].all_close((*plain)[0], 1e-6, 1e-6));
  ASSERT_TRUE(c.run(feeds, out).is_ok());
  EXPECT_TRUE(out[0].all_close((*plain)[0], 1e-6, 1e-6));
}

TEST(FusionTest, FusedErrorsNameTheMatMulAndItsChain) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, -1}, "x");
  Output mm = ops::MatMul(g, x, ops::Const(g, Tensor::filled<float>(Shape{4, 3}, 1.0f)), {}, "mm");
  Output y = ops::Relu(
      g, ops::Add(g, mm, ops::Const(g, Tensor::filled<float>(Shape{3}, 1.0f)), "bias"), "relu");
  auto s = session_for(g, true);
  auto bad = s->run({{x, Tensor::filled<float>(Shape{2, 5}, 1.0f)}}, {y});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  const std::string msg = bad.status().message();
  EXPECT_NE(msg.find("MatMul 'mm' + Add 'bias' + Relu 'relu' (fused)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inner dimensions differ"), std::string::npos) << msg;
  // A good feed after the bad one: 5 ones times ones, + 1, Relu.
  auto good = s->run({{x, Tensor::filled<float>(Shape{2, 4}, 1.0f)}}, {y});
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_TRUE((*good)[0].all_close(Tensor::filled<float>(Shape{2, 3}, 5.0f), 0, 0));
}

TEST(FusionTest, EmptyInnerDimensionStillAddsTheBiasAndActivates) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{2, 0}, "x");
  Output w = ops::Placeholder(g, DType::kFloat32, Shape{0, 3}, "w");
  Tensor bias = Tensor::from_span(Shape{3}, std::span<const float>(std::vector<float>{-1, 0, 2}));
  Output y = ops::Sigmoid(g, ops::Add(g, ops::MatMul(g, x, w), ops::Const(g, bias)));
  const FeedList feeds{{x, Tensor(DType::kFloat32, Shape{2, 0})},
                       {w, Tensor(DType::kFloat32, Shape{0, 3})}};
  auto a = session_for(g, true)->run(feeds, {y});
  auto b = session_for(g, false)->run(feeds, {y});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_TRUE((*a)[0].all_close((*b)[0], 1e-6, 1e-6));
}

}  // namespace
}  // namespace graphrun::testing
