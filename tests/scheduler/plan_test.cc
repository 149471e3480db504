// Plan building: which nodes run inline as lightweight flow-graph nodes
// (cheap kernels, bounded runs, partial-run fetch paths), and long chains of
// cheap nodes running without exhausting the stack.
#include "scheduler/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun::testing {
namespace {

using sched::build_plan;
using sched::kMaxLightweightRun;
using sched::Plan;
using sched::Signature;

// Builds plans with kernels made by the nodes' own factories.
class PlanTest : public ::testing::Test {
 protected:
  std::shared_ptr<const Plan> plan(const Graph& g, Signature sig) {
    auto kernels = [this](const Node& n) -> Result<OpKernel*> {
      auto it = kernels_.find(&n);
      if (it != kernels_.end()) return it->second.get();
      OpKernelConstruction construction(n, resources_);
      const KernelFactory& factory =
          n.kernel_override() ? *n.kernel_override() : n.registration().factory;
      GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<OpKernel> k, factory(construction));
      OpKernel* raw = k.get();
      kernels_.emplace(&n, std::move(k));
      return raw;
    };
    Result<std::shared_ptr<const Plan>> p = build_plan(g, sig, kernels);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return p.is_ok() ? *p : nullptr;
  }
  static bool lightweight(const Plan& p, const Node* n) {
    for (const sched::NodeItem& item : p.nodes) {
      if (item.node == n) return item.lightweight;
    }
    ADD_FAILURE() << n->name() << " is not in the plan";
    return false;
  }
  static bool lightweight(const Plan& p, const Output& o) { return lightweight(p, o.node()); }

  ResourceManager resources_;
  std::map<const Node*, std::unique_ptr<OpKernel>> kernels_;
};

TEST_F(PlanTest, SmallScalarMathIsLightweight) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output c = ops::Const(g, Tensor(2.0f), "c");
  Output a = ops::Add(g, x, c, "a");
  Output n = ops::Neg(g, a, "n");
  Output v = ops::Mul(g, ops::Const(g, Tensor::filled<float>(Shape{64, 64}, 1.0f)), n, "v");
  Output s = ops::Sum(g, v, {0, 1}, false, "s");
  Output id = ops::Identity(g, s, "id");
  Output cast = ops::Cast(g, id, DType::kInt32, "cast");
  Output fill = ops::Fill(g, ops::Const(g, Tensor{8, 8}), cast, "fill");
  Output var = ops::Variable(g, Tensor(0.0f), "var");
  Output update = ops::AssignAdd(g, var, x, {}, "update");
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.feeds = {x}, .fetches = {fill, update}});
  ASSERT_NE(p, nullptr);
  for (const sched::NodeItem& item : p->nodes) {
    EXPECT_TRUE(item.lightweight) << item.node->describe();
  }
}

TEST_F(PlanTest, LargeUnknownAndExpensiveNodesKeepTheirTask) {
  Graph g;
  Output big = ops::Placeholder(g, DType::kFloat32, Shape{100, 100}, "big");
  Output unknown = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "unknown");
  Output mid = ops::Placeholder(g, DType::kFloat32, Shape{2048}, "mid");
  Output add_big = ops::Add(g, big, big, "add_big");
  Output add_unknown = ops::Add(g, unknown, unknown, "add_unknown");
  Output neg_mid = ops::Neg(g, mid, "neg_mid");     // cheap per element
  Output tanh_mid = ops::Tanh(g, mid, "tanh_mid");  // dearer per element
  Output sum_big = ops::Sum(g, big, {0}, false, "sum_big");
  Output mm = ops::MatMul(g, ops::Const(g, Tensor::filled<float>(Shape{2, 2}, 1.0f)),
                          ops::Const(g, Tensor::filled<float>(Shape{2, 2}, 1.0f)), {}, "mm");
  Output id_big = ops::Identity(g, add_big, "id_big");  // shares the buffer: cheap at any size
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.feeds = {big, unknown, mid},
                             .fetches = {id_big, add_unknown, neg_mid, tanh_mid, sum_big, mm}});
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(lightweight(*p, add_big));
  EXPECT_FALSE(lightweight(*p, add_unknown));
  EXPECT_TRUE(lightweight(*p, neg_mid));
  EXPECT_FALSE(lightweight(*p, tanh_mid));
  EXPECT_FALSE(lightweight(*p, sum_big));
  EXPECT_FALSE(lightweight(*p, mm));
  EXPECT_TRUE(lightweight(*p, id_big));
}

TEST_F(PlanTest, CustomKernelsKeepTheirTask) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Call(
      g, {x}, {DType::kFloat32},
      [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        return std::vector<Tensor>{in[0]};
      },
      {}, "y")[0];
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.feeds = {x}, .fetches = {y}});
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(lightweight(*p, y));
}

// The longest chain of consecutive lightweight nodes ending at each node.
std::vector<int32_t> lightweight_runs(const Plan& p) {
  std::vector<int32_t> run_in(p.nodes.size(), 0);
  std::vector<int32_t> run(p.nodes.size(), 0);
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const sched::NodeItem& item = p.nodes[i];
    run[i] = item.lightweight ? run_in[i] + 1 : 0;
    for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
      auto& r = run_in[static_cast<std::size_t>(p.successors[static_cast<std::size_t>(k)])];
      r = std::max(r, run[i]);
    }
  }
  return run;
}

TEST_F(PlanTest, LightweightRunsAreBounded) {
  Graph g;
  const Node* prev = ops::NoOp(g, "n0");
  for (int i = 1; i < 1000; ++i) prev = ops::Group(g, {prev}, fmt::format("n{}", i));
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.targets = {prev}});
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->nodes.size(), 1000u);
  std::vector<int32_t> runs = lightweight_runs(*p);
  EXPECT_EQ(*std::max_element(runs.begin(), runs.end()), kMaxLightweightRun);
  const auto n_default =
      std::count_if(p->nodes.begin(), p->nodes.end(), [](auto& n) { return !n.lightweight; });
  EXPECT_EQ(n_default, 1000 / (kMaxLightweightRun + 1));
}

TEST_F(PlanTest, DiamondsCountTheLongestRun) {
  // Two branches of different lengths join: the join continues the longer.
  Graph g;
  const Node* root = ops::NoOp(g, "root");
  const Node* a = root;
  for (int i = 0; i < kMaxLightweightRun - 2; ++i) a = ops::Group(g, {a}, fmt::format("a{}", i));
  const Node* b = ops::Group(g, {root});
  const Node* join = ops::Group(g, {b, a}, "join");  // run 256: still lightweight
  const Node* next = ops::Group(g, {join}, "next");  // 257: default
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.targets = {next}});
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(lightweight(*p, join));
  EXPECT_FALSE(lightweight(*p, next));
  std::vector<int32_t> runs = lightweight_runs(*p);
  EXPECT_LE(*std::max_element(runs.begin(), runs.end()), kMaxLightweightRun);
}

TEST_F(PlanTest, PartialRunFetchedNodesSuccessorsKeepTheirTask) {
  // The fetch sink of `a` must run right after `a`, before `a`'s other
  // successors: those get tasks (a is itself cheap and may run inline).
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = ops::Neg(g, x, "a");
  Output b = ops::Neg(g, a, "b");
  Output c = ops::Neg(g, b, "c");
  ASSERT_THAT(g.status(), IsOk());
  auto partial = plan(g, Signature{.feeds = {x}, .fetches = {a, c}, .partial = true});
  ASSERT_NE(partial, nullptr);
  EXPECT_TRUE(lightweight(*partial, a));
  EXPECT_FALSE(lightweight(*partial, b));
  EXPECT_TRUE(lightweight(*partial, c));  // fetched itself, but follows b, which is not
  auto full = plan(g, Signature{.feeds = {x}, .fetches = {a, c}});
  ASSERT_NE(full, nullptr);
  EXPECT_TRUE(lightweight(*full, b));
}

TEST_F(PlanTest, PlansOfOnlyCheapKernelsRunInline) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = ops::Neg(g, x, "a");
  Output b = ops::Add(g, a, x, "b");
  Output one = ops::Const(g, Tensor::filled<float>(Shape{2, 2}, 1.0f), "one");
  Output mm = ops::MatMul(g, one, one, {}, "mm");  // never cheap
  ASSERT_THAT(g.status(), IsOk());
  auto cheap = plan(g, Signature{.feeds = {x}, .fetches = {b}});
  ASSERT_NE(cheap, nullptr);
  EXPECT_TRUE(cheap->run_inline);
  // One expensive node: the step needs the flow graph.
  auto mixed = plan(g, Signature{.feeds = {x}, .fetches = {b, mm}});
  ASSERT_NE(mixed, nullptr);
  EXPECT_FALSE(mixed->run_inline);
  // Partial runs too: the caller runs what each feed makes ready.
  auto partial = plan(g, Signature{.feeds = {x}, .fetches = {a, b}, .partial = true});
  ASSERT_NE(partial, nullptr);
  EXPECT_TRUE(partial->run_inline);
  EXPECT_FALSE(lightweight(*partial, b));  // (its flow-graph policy, unused inline)
  auto partial_mixed = plan(g, Signature{.feeds = {x}, .fetches = {b, mm}, .partial = true});
  ASSERT_NE(partial_mixed, nullptr);
  EXPECT_FALSE(partial_mixed->run_inline);
  // No nesting inline: a chain past kMaxLightweightRun still qualifies.
  Output y = x;
  for (int i = 0; i < kMaxLightweightRun + 1; ++i) y = ops::Neg(g, y);
  auto chain = plan(g, Signature{.feeds = {x}, .fetches = {y}});
  ASSERT_NE(chain, nullptr);
  EXPECT_TRUE(chain->run_inline);
}

// Every node inline would nest 50k deep: far past a thread's stack.
TEST(LightweightChainTest, LongChainsOfCheapNodesRun) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output v = x;
  const Node* prev = ops::NoOp(g, "n0");
  constexpr int kLength = 50'000;
  for (int i = 1; i < kLength; ++i) {
    prev = ops::Group(g, {prev}, fmt::format("n{}", i));
    if (i % 10 == 0) v = ops::Identity(g, v, fmt::format("v{}", i));
  }
  Output last = ops::Neg(g, v, "last");
  ASSERT_THAT(g.status(), IsOk());
  for (int threads : {1, 2}) {
    SessionOptions o;
    o.inter_op_threads = threads;
    auto s = make_session(g, o);
    EXPECT_THAT(s->run({{x, Tensor(3.0f)}}, {last}, {prev}),
                IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(-3.0f)))));
  }
}

}  // namespace
}  // namespace graphrun::testing
