// Plan building: which nodes run inline as lightweight flow-graph nodes
// (cheap kernels, bounded runs, partial-run fetch paths), and long chains of
// cheap nodes running without exhausting the stack.
#include "scheduler/plan.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string_view>
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
    const sched::Policy policy = p.costs->current();
    for (std::size_t i = 0; i < p.nodes.size(); ++i) {
      if (p.nodes[i].node == n) return policy.lightweight[i] != 0;
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
  const sched::Policy policy = p->costs->current();
  for (std::size_t i = 0; i < p->nodes.size(); ++i) {
    EXPECT_TRUE(policy.lightweight[i]) << p->nodes[i].node->describe();
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

// Policy::serial: a plan whose expensive nodes form one chain runs its nodes
// in order on the caller, inside the arena; anything that could run two
// expensive nodes at once keeps the flow graph.
class SerialPolicyTest : public PlanTest {
 protected:
  // x [64,256] through `layers` MatMuls with constant [256,256] weights.
  static Output layers(Graph& g, Output x, int layers) {
    for (int i = 0; i < layers; ++i) {
      x = ops::MatMul(g, x, ops::Const(g, Tensor::filled<float>(Shape{256, 256}, 0.01f)));
    }
    return x;
  }
  static sched::Policy policy(const std::shared_ptr<const Plan>& p) { return p->costs->current(); }
};

TEST_F(SerialPolicyTest, AChainOfExpensiveNodesIsSerial) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{64, 256}, "x");
  Output y = ops::Relu(g, layers(g, x, 4));  // Relu of 16384 elements: expensive too
  Output single = layers(g, x, 1);
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.feeds = {x}, .fetches = {y}});
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(policy(p).run_inline);
  EXPECT_TRUE(policy(p).serial);
  // One expensive node is a chain too.
  auto one = plan(g, Signature{.feeds = {x}, .fetches = {single}});
  ASSERT_NE(one, nullptr);
  EXPECT_TRUE(policy(one).serial);
}

TEST_F(SerialPolicyTest, ExpensiveNodesThatCouldRunAtOnceAreNot) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{64, 256}, "x");
  // A fan-out: two products of x, then their sum.
  Output sum = ops::Add(g, layers(g, x, 1), layers(g, x, 2));
  Output left = layers(g, x, 1);
  Output right = layers(g, x, 1);
  ASSERT_THAT(g.status(), IsOk());
  auto p = plan(g, Signature{.feeds = {x}, .fetches = {sum}});
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(policy(p).serial);
  // Two independent products fetched side by side.
  auto q = plan(g, Signature{.feeds = {x}, .fetches = {left, right}});
  ASSERT_NE(q, nullptr);
  EXPECT_FALSE(policy(q).serial);
}

TEST_F(SerialPolicyTest, ManyCheapNodesBesideTheChainKeepTheFlowGraph) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{64, 256}, "x");
  std::vector<Output> fetches = {layers(g, x, 1)};
  // Cheap nodes that could run beside the product: the slack allows
  // kSerialCheapSlack + kSerialCheapPerExpensive (the weight Const counted
  // among them), and no more.
  const std::size_t allowed = sched::kSerialCheapSlack + sched::kSerialCheapPerExpensive;
  for (std::size_t i = 0; i + 1 < allowed; ++i) fetches.push_back(ops::Const(g, Tensor(1.0f)));
  Output one_more = ops::Const(g, Tensor(1.0f));
  ASSERT_THAT(g.status(), IsOk());
  auto at_limit = plan(g, Signature{.feeds = {x}, .fetches = fetches});
  ASSERT_NE(at_limit, nullptr);
  EXPECT_TRUE(policy(at_limit).serial) << at_limit->nodes.size() << " nodes";
  fetches.push_back(one_more);
  auto past = plan(g, Signature{.feeds = {x}, .fetches = fetches});
  ASSERT_NE(past, nullptr);
  EXPECT_FALSE(policy(past).serial) << past->nodes.size() << " nodes";
}

TEST_F(SerialPolicyTest, PartialRunsAndInliningOffAreNeverSerial) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{64, 256}, "x");
  Output y = layers(g, x, 3);
  ASSERT_THAT(g.status(), IsOk());
  auto partial = plan(g, Signature{.feeds = {x}, .fetches = {y}, .partial = true});
  ASSERT_NE(partial, nullptr);
  EXPECT_FALSE(policy(partial).serial);
  auto off = plan(g, Signature{.feeds = {x}, .fetches = {y}, .inline_nodes = false});
  ASSERT_NE(off, nullptr);
  EXPECT_FALSE(policy(off).serial);
}

// The longest chain of consecutive lightweight nodes ending at each node.
std::vector<int32_t> lightweight_runs(const Plan& p) {
  const sched::Policy policy = p.costs->current();
  std::vector<int32_t> run_in(p.nodes.size(), 0);
  std::vector<int32_t> run(p.nodes.size(), 0);
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const sched::NodeItem& item = p.nodes[i];
    run[i] = policy.lightweight[i] != 0 ? run_in[i] + 1 : 0;
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
  const sched::Policy policy = p->costs->current();
  const auto n_default = std::count(policy.lightweight.begin(), policy.lightweight.end(), 0);
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
  EXPECT_TRUE(cheap->costs->run_inline());
  // One expensive node: the step needs the flow graph.
  auto mixed = plan(g, Signature{.feeds = {x}, .fetches = {b, mm}});
  ASSERT_NE(mixed, nullptr);
  EXPECT_FALSE(mixed->costs->run_inline());
  // Partial runs too: the caller runs what each feed makes ready.
  auto partial = plan(g, Signature{.feeds = {x}, .fetches = {a, b}, .partial = true});
  ASSERT_NE(partial, nullptr);
  EXPECT_TRUE(partial->costs->run_inline());
  EXPECT_FALSE(lightweight(*partial, b));  // (its flow-graph policy, unused inline)
  auto partial_mixed = plan(g, Signature{.feeds = {x}, .fetches = {b, mm}, .partial = true});
  ASSERT_NE(partial_mixed, nullptr);
  EXPECT_FALSE(partial_mixed->costs->run_inline());
  // No nesting inline: a chain past kMaxLightweightRun still qualifies.
  Output y = x;
  for (int i = 0; i < kMaxLightweightRun + 1; ++i) y = ops::Neg(g, y);
  auto chain = plan(g, Signature{.feeds = {x}, .fetches = {y}});
  ASSERT_NE(chain, nullptr);
  EXPECT_TRUE(chain->costs->run_inline());
}

// ---- Plan order ----

// The order a 1-thread oneTBB flow graph runs the plan's nodes in: one
// continue_node per plan node, edges registered in plan order and the
// roots put last first, as FlowInstance does.
std::vector<int32_t> order_one_thread_runs(const Plan& p) {
  using ContinueNode = tbb::flow::continue_node<tbb::flow::continue_msg>;
  std::vector<int32_t> ran;
  tbb::task_arena arena(1);
  arena.execute([&] {
    tbb::flow::graph g;
    std::deque<ContinueNode> nodes;
    for (std::size_t i = 0; i < p.nodes.size(); ++i) {
      nodes.emplace_back(g, [&ran, i](const tbb::flow::continue_msg&) {
        ran.push_back(static_cast<int32_t>(i));
        return tbb::flow::continue_msg();
      });
    }
    for (std::size_t i = 0; i < p.nodes.size(); ++i) {
      const sched::NodeItem& item = p.nodes[i];
      for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
        tbb::flow::make_edge(
            nodes[i], nodes[static_cast<std::size_t>(p.successors[static_cast<std::size_t>(k)])]);
      }
    }
    for (std::size_t i = p.nodes.size(); i-- > 0;) {
      if (p.nodes[i].num_preds == 0) nodes[i].try_put(tbb::flow::continue_msg());
    }
    g.wait_for_all();
  });
  return ran;
}

std::vector<int32_t> iota(std::size_t n) {
  std::vector<int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i);
  return v;
}

// Nodes that run one after another sit next to each other in the plan's
// per-node arrays: the plan is in the order oneTBB runs it on one thread.
// A fan-out tree built level by level (node-id order breadth-first) gets a
// depth-first plan; a grid built row by row, and a graph with several
// roots, as well.
TEST_F(PlanTest, PlanOrderIsTheOrderOneTbbThreadRunsTheNodesIn) {
  {
    Graph g;
    std::vector<const Node*> tree{ops::NoOp(g, "t0")};
    for (int i = 1; i < 31; ++i) {
      tree.push_back(
          ops::Group(g, {tree[static_cast<std::size_t>((i - 1) / 2)]}, fmt::format("t{}", i)));
    }
    std::vector<const Node*> leaves(tree.begin() + 15, tree.end());
    const Node* sink = ops::Group(g, leaves, "sink");
    ASSERT_THAT(g.status(), IsOk());
    auto p = plan(g, Signature{.targets = {sink}});
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(p->nodes.size(), 32u);
    EXPECT_EQ(order_one_thread_runs(*p), iota(32));
    // Depth first: t0, then its last child's subtree (t2, t6, t14, t30...).
    EXPECT_EQ(p->nodes[1].node->name(), "t2");
    EXPECT_EQ(p->nodes[2].node->name(), "t6");
    EXPECT_EQ(p->nodes[31].node->name(), "sink");
  }
  {
    Graph g;
    constexpr int kSide = 6;
    std::vector<const Node*> grid;
    for (int i = 0; i < kSide; ++i) {
      for (int j = 0; j < kSide; ++j) {
        std::vector<const Node*> deps;
        if (i > 0) deps.push_back(grid[static_cast<std::size_t>((i - 1) * kSide + j)]);
        if (j > 0) deps.push_back(grid.back());
        grid.push_back(deps.empty() ? ops::NoOp(g, "w0_0")
                                    : ops::Group(g, deps, fmt::format("w{}_{}", i, j)));
      }
    }
    ASSERT_THAT(g.status(), IsOk());
    auto p = plan(g, Signature{.targets = {grid.back()}});
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(order_one_thread_runs(*p), iota(kSide * kSide));
  }
  {
    // a, b roots; c(a,b) d(a) e(b) f(c,d) g(c,e) h(f,g).
    Graph g;
    const Node* a = ops::NoOp(g, "a");
    const Node* b = ops::NoOp(g, "b");
    const Node* c = ops::Group(g, {a, b}, "c");
    const Node* d = ops::Group(g, {a}, "d");
    const Node* e = ops::Group(g, {b}, "e");
    const Node* f = ops::Group(g, {c, d}, "f");
    const Node* h = ops::Group(g, {f, ops::Group(g, {c, e}, "g")}, "h");
    ASSERT_THAT(g.status(), IsOk());
    auto p = plan(g, Signature{.targets = {h}});
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(order_one_thread_runs(*p), iota(8));
  }
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

// ---- Fusion (MatMul + bias Add + activation) ----

// x [64, 256] placeholder, w [256, 256] and b [256] constants:
// act(Add(MatMul(x, w), b)) as the chain's nodes.
struct Dense {
  Output x, w, b, mm, add, act;
};

Dense dense(Graph& g, const char* activation = "Relu", bool bias_first = false,
            Shape bias_shape = Shape{256}) {
  Dense d;
  d.x = ops::Placeholder(g, DType::kFloat32, Shape{64, 256}, "x");
  d.w = ops::Const(g, Tensor::filled<float>(Shape{256, 256}, 0.01f), "w");
  d.b = ops::Const(g, Tensor::filled<float>(bias_shape, 0.5f), "b");
  d.mm = ops::MatMul(g, d.x, d.w, {}, "mm");
  d.add = bias_first ? ops::Add(g, d.b, d.mm, "add") : ops::Add(g, d.mm, d.b, "add");
  if (std::string_view(activation) == "Relu") d.act = ops::Relu(g, d.add, "act");
  if (std::string_view(activation) == "Sigmoid") d.act = ops::Sigmoid(g, d.add, "act");
  if (std::string_view(activation) == "Tanh") d.act = ops::Tanh(g, d.add, "act");
  EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
  return d;
}

bool in_plan(const Plan& p, const Output& o) {
  return std::any_of(p.nodes.begin(), p.nodes.end(),
                     [&](const sched::NodeItem& item) { return item.node == o.node(); });
}

TEST_F(PlanTest, FusesMatMulBiasAddAndActivationIntoTheLastNode) {
  for (const char* activation : {"Relu", "Sigmoid", "Tanh"}) {
    for (bool bias_first : {false, true}) {
      SCOPED_TRACE(::testing::Message() << activation << (bias_first ? " bias first" : ""));
      kernels_.clear();  // a new graph's nodes may reuse a destroyed one's addresses
      Graph g;
      const Dense d = dense(g, activation, bias_first);
      auto p = plan(g, Signature{.feeds = {d.x}, .fetches = {d.act}, .fuse = true});
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p->fused_nodes, 2);
      EXPECT_FALSE(in_plan(*p, d.mm));
      EXPECT_FALSE(in_plan(*p, d.add));
      ASSERT_TRUE(in_plan(*p, d.act));
      ASSERT_EQ(p->fused_kernels.size(), 1u);
      // w and b, then the fused node: its inputs are x, w, b.
      const sched::NodeItem& last = p->nodes.back();
      EXPECT_EQ(last.node, d.act.node());
      EXPECT_EQ(last.input_end - last.input_begin, 3);
      EXPECT_EQ(last.kernel, p->fused_kernels[0].get());
      EXPECT_FALSE(p->unfused.fuse);
      EXPECT_EQ(p->unfused.fetches, std::vector<Output>{d.act});

      // The same signature unfused keeps every node.
      auto unfused = plan(g, Signature{.feeds = {d.x}, .fetches = {d.act}});
      EXPECT_EQ(unfused->fused_nodes, 0);
      EXPECT_TRUE(in_plan(*unfused, d.mm));
      EXPECT_TRUE(in_plan(*unfused, d.add));
    }
  }
}

TEST_F(PlanTest, FusesShorterChainsToo) {
  Graph g;
  const Dense d = dense(g);
  // The Add fetched: MatMul + bias only.
  auto bias_only = plan(g, Signature{.feeds = {d.x}, .fetches = {d.add}, .fuse = true});
  EXPECT_EQ(bias_only->fused_nodes, 1);
  EXPECT_FALSE(in_plan(*bias_only, d.mm));
  // MatMul then Relu, no bias.
  Graph h;
  Output x = ops::Placeholder(h, DType::kFloat64, Shape{8, 4}, "x");
  Output mm = ops::MatMul(h, x, ops::Const(h, Tensor::filled<double>(Shape{4, 3}, 1.0)), {}, "mm");
  Output r = ops::Relu(h, mm, "r");
  auto act_only = plan(h, Signature{.feeds = {x}, .fetches = {r}, .fuse = true});
  EXPECT_EQ(act_only->fused_nodes, 1);
  EXPECT_FALSE(in_plan(*act_only, mm));
}

TEST_F(PlanTest, DoesNotFuseWhatAnythingElseSees) {
  auto fused_nodes = [&](const Graph& g, Signature sig) {
    sig.fuse = true;
    kernels_.clear();  // a new graph's nodes may reuse a destroyed one's addresses
    auto p = plan(g, std::move(sig));
    return p == nullptr ? -1 : p->fused_nodes;
  };
  {  // the product fetched
    Graph g;
    const Dense d = dense(g);
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act, d.mm}}), 0);
  }
  {  // the sum fetched: MatMul + bias only, the activation stays
    Graph g;
    const Dense d = dense(g);
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act, d.add}}), 1);
  }
  {  // the product fed: nothing to fuse with
    Graph g;
    const Dense d = dense(g);
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.mm}, .fetches = {d.act}}), 0);
  }
  {  // the sum fed: the MatMul is pruned, the activation alone
    Graph g;
    const Dense d = dense(g);
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.add}, .fetches = {d.act}}), 0);
  }
  {  // the product read by a second node
    Graph g;
    const Dense d = dense(g);
    Output other = ops::Neg(g, d.mm, "other");
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act, other}}), 0);
  }
  {  // the sum read twice
    Graph g;
    const Dense d = dense(g);
    Output twice = ops::Mul(g, d.add, d.add, "twice");
    // MatMul + bias fuse; the Add's output, read twice, ends the chain.
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act, twice}}), 1);
  }
  {  // the MatMul a target
    Graph g;
    const Dense d = dense(g);
    EXPECT_EQ(
        fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act}, .targets = {d.mm.node()}}), 0);
  }
  {  // a control edge from the product, and one into the Add
    Graph g;
    const Dense d = dense(g);
    const Node* after = nullptr;
    {
      auto scope = g.control_dependencies({d.mm.node()});
      after = ops::NoOp(g, "after");
    }
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act}, .targets = {after}}), 0);
    Graph h;
    Output x = ops::Placeholder(h, DType::kFloat32, Shape{2, 2}, "x");
    Output mm = ops::MatMul(h, x, ops::Const(h, Tensor::filled<float>(Shape{2, 2}, 1.0f)));
    const Node* before = ops::NoOp(h, "before");
    Result<Node*> add =
        h.add_node(NodeSpec{.op = "Add",
                            .name = "add",
                            .inputs = {mm, ops::Const(h, Tensor::filled<float>(Shape{2}, 1.0f))},
                            .control_inputs = {before}});
    ASSERT_TRUE(add.is_ok()) << add.status().to_string();
    EXPECT_EQ(fused_nodes(h, Signature{.feeds = {x}, .fetches = {(*add)->output(0)}}), 0);
  }
  {  // biases that are not one value per column
    for (Shape bias : {Shape{1}, Shape{64, 256}, Shape{}}) {
      Graph g;
      const Dense d = dense(g, "Relu", false, bias);
      // The Add stays, and the Relu cannot fuse across it.
      EXPECT_EQ(fused_nodes(g, Signature{.feeds = {d.x}, .fetches = {d.act}}), 0)
          << bias.to_string();
    }
  }
  {  // integer products, and a partial run's plan
    Graph g;
    Output x = ops::Placeholder(g, DType::kInt32, Shape{2, 2}, "x");
    Output mm = ops::MatMul(g, x, ops::Const(g, Tensor::filled<int32_t>(Shape{2, 2}, 1)));
    Output r = ops::Relu(g, mm);
    EXPECT_EQ(fused_nodes(g, Signature{.feeds = {x}, .fetches = {r}}), 0);
    Graph h;
    const Dense d = dense(h);
    EXPECT_EQ(fused_nodes(h, Signature{.feeds = {d.x}, .fetches = {d.act}, .partial = true}), 0);
  }
}

// ---- the cost model: classes learned from measured cycles ----

// A chain of `n` Call nodes with empty bodies (control edges); the last one.
const Node* call_chain(Graph& g, int n, bool cheap) {
  ops::CallAttrs attrs;
  attrs.cheap = cheap;
  Node* prev = nullptr;
  for (int i = 0; i < n; ++i) {
    ops::Call(
        g, {}, {},
        [](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
          return std::vector<Tensor>();
        },
        attrs, fmt::format("c{}", i));
    Node* node = g.mutable_node(g.num_nodes() - 1);
    if (prev != nullptr) {
      EXPECT_THAT(g.add_control_input(node, prev), IsOk());
    }
    prev = node;
  }
  return prev;
}

// Every node of `p` gets `samples` measurements of `cycles`.
void record_all(const Plan& p, uint64_t cycles, int samples) {
  for (int k = 0; k < samples; ++k) {
    for (std::size_t i = 0; i < p.nodes.size(); ++i) {
      p.costs->record(static_cast<int32_t>(i), cycles);
    }
  }
}

TEST_F(PlanTest, MeasuredCheapCallsRunInline) {
  Graph g;
  const Node* last = call_chain(g, 3, /*cheap=*/false);
  auto p = plan(g, Signature{.targets = {last}});
  ASSERT_NE(p, nullptr);
  sched::CostModel& costs = *p->costs;
  // Before any measurement a Call is expensive unless declared cheap.
  EXPECT_TRUE(costs.learns());
  EXPECT_FALSE(costs.run_inline());
  EXPECT_EQ(costs.epoch(), 0u);
  EXPECT_FALSE(lightweight(*p, last));
  record_all(*p, 100, sched::CostModel::kConfirm - 1);
  EXPECT_FALSE(costs.dirty()) << "one sample short of confirming";
  record_all(*p, 100, 1);
  ASSERT_TRUE(costs.dirty());
  costs.update(*p);
  EXPECT_FALSE(costs.dirty());
  EXPECT_TRUE(costs.run_inline());
  EXPECT_EQ(costs.epoch(), 1u);
  EXPECT_TRUE(lightweight(*p, last));
  // Nothing new to learn: the epoch stays.
  record_all(*p, 100, 5);
  EXPECT_FALSE(costs.dirty());
  costs.update(*p);
  EXPECT_EQ(costs.epoch(), 1u);
}

TEST_F(PlanTest, ANodeChangesClassOnlyOnConfirmedSamplesPastTheGap) {
  Graph g;
  const Node* last = call_chain(g, 3, /*cheap=*/true);
  auto p = plan(g, Signature{.targets = {last}});
  ASSERT_NE(p, nullptr);
  sched::CostModel& costs = *p->costs;
  ASSERT_TRUE(costs.run_inline()) << "the hint is the first estimate";
  const auto middle = static_cast<int32_t>(1);
  // Isolated slow samples (an interrupt, a cold cache) move nothing.
  for (int k = 0; k < 10; ++k) {
    costs.record(middle, 1'000'000);
    costs.record(middle, 100);
  }
  EXPECT_FALSE(costs.dirty());
  // Between the two thresholds a cheap node stays cheap.
  for (int k = 0; k < 10; ++k)
    costs.record(middle, (costs.cheap_cycles() + costs.expensive_cycles()) / 2);
  EXPECT_FALSE(costs.dirty());
  for (int k = 0; k < sched::CostModel::kConfirm; ++k)
    costs.record(middle, 3 * costs.expensive_cycles());
  ASSERT_TRUE(costs.dirty());
  costs.update(*p);
  EXPECT_FALSE(costs.is_cheap(middle));
  EXPECT_TRUE(costs.is_cheap(0));
  EXPECT_FALSE(costs.run_inline()) << "one expensive node: the step needs the flow graph";
  EXPECT_EQ(costs.epoch(), 1u);
  const sched::Policy policy = costs.current();
  EXPECT_EQ(policy.lightweight[static_cast<std::size_t>(middle)], 0);
  EXPECT_EQ(policy.lightweight[0], 1);
  EXPECT_EQ(policy.lightweight[2], 1);
  // ... and an expensive one stays expensive between them.
  for (int k = 0; k < 10; ++k)
    costs.record(middle, (costs.cheap_cycles() + costs.expensive_cycles()) / 2);
  EXPECT_FALSE(costs.dirty());
  for (int k = 0; k < sched::CostModel::kConfirm; ++k)
    costs.record(middle, costs.cheap_cycles() / 2);
  ASSERT_TRUE(costs.dirty());
  costs.update(*p);
  EXPECT_TRUE(costs.is_cheap(middle));
  EXPECT_TRUE(costs.run_inline());
  EXPECT_EQ(costs.epoch(), 2u);
}

TEST_F(PlanTest, PartialPlansAndInliningOffKeepTheirPolicy) {
  Graph g;
  const Node* last = call_chain(g, 3, /*cheap=*/true);
  auto partial = plan(g, Signature{.targets = {last}, .partial = true});
  ASSERT_NE(partial, nullptr);
  EXPECT_FALSE(partial->costs->learns());
  EXPECT_TRUE(partial->costs->run_inline());
  auto tasks = plan(g, Signature{.targets = {last}, .inline_nodes = false});
  ASSERT_NE(tasks, nullptr);
  EXPECT_FALSE(tasks->costs->learns());
  EXPECT_FALSE(tasks->costs->run_inline()) << "every node a task, cheap or not";
  EXPECT_FALSE(lightweight(*tasks, last));
}

}  // namespace
}  // namespace graphrun::testing
