#include <fmt/format.h>
#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::make_session;
using ::graphrun::testing::run_all;
using ::graphrun::testing::run_one;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Tensors = Result<std::vector<Tensor>>;

// The `cheap` hint reaches the kernel of either overload, and each kernel
// calls its own node's callable.
TEST(CallTest, KernelsCarryTheCheapHintAndTheirOwnCallable) {
  Graph g;
  std::mutex mu;  // the nodes may run on two threads at once
  std::vector<int> called;
  for (const bool cheap : {false, true}) {
    const int tag = cheap ? 1 : 0;
    ops::Call(g, {}, {},
              [&mu, &called, tag](std::span<const Tensor>) -> Tensors {
                const std::lock_guard lock(mu);
                called.push_back(tag);
                return std::vector<Tensor>();
              },
              {.cheap = cheap});
    ops::Call(g, {}, {},
              [&mu, &called, tag](OpKernelContext&) {
                const std::lock_guard lock(mu);
                called.push_back(10 + tag);
                return Status::ok();
              },
              {.cheap = cheap});
  }
  ASSERT_THAT(g.status(), IsOk());
  ResourceManager resources;
  std::vector<int> expected_calls;
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node& node = *g.node(id);
    OpKernelConstruction construction(node, resources);
    ASSERT_NE(node.kernel_override(), nullptr);
    Result<std::unique_ptr<OpKernel>> kernel = (*node.kernel_override())(construction);
    ASSERT_THAT(kernel.status(), IsOk());
    EXPECT_EQ((*kernel)->is_cheap(), id >= 2) << node.describe();
    expected_calls.push_back((id % 2 == 0 ? 0 : 10) + (id >= 2 ? 1 : 0));
  }
  std::unique_ptr<Session> session = make_session(g);
  std::vector<TargetRef> targets;
  for (int id = 0; id < g.num_nodes(); ++id) targets.emplace_back(g.node(id));
  ASSERT_THAT(session->run({}, {}, targets).status(), IsOk());
  std::sort(called.begin(), called.end());
  std::sort(expected_calls.begin(), expected_calls.end());
  EXPECT_EQ(called, expected_calls);
}

// Past the first few thousand, Call nodes keep their callables and kernels
// in slabs (api/src/huge_pages.h): two sessions over 40,000 nodes each call
// every node's own callable once a run, and are destroyed cleanly.
TEST(CallTest, ManyNodesEachCallTheirOwnCallableInEverySession) {
  constexpr int kNodes = 40'000;
  Graph g;
  std::vector<int> calls(kNodes, 0);  // one node, one slot: no race
  std::vector<TargetRef> nodes;
  for (int i = 0; i < kNodes; ++i) {
    ops::Call(g, {}, {}, [&calls, i](std::span<const Tensor>) -> Tensors {
      ++calls[static_cast<std::size_t>(i)];
      return std::vector<Tensor>();
    });
    nodes.push_back(g.node(g.num_nodes() - 1));
  }
  ASSERT_THAT(g.status(), IsOk());
  for (int s = 0; s < 2; ++s) {
    auto session = Session::create(g);
    ASSERT_THAT(session.status(), IsOk());
    ASSERT_THAT((*session)->run({}, {}, nodes).status(), IsOk());
    ASSERT_THAT((*session)->run({}, {}, nodes).status(), IsOk());
  }
  EXPECT_EQ(std::count(calls.begin(), calls.end(), 4), kNodes);
}

TEST(CallTest, ComputesFromItsInputs) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1}, "x");
  std::vector<Output> out = ops::Call(
      g, {x}, {DType::kFloat32},
      [](std::span<const Tensor> in) -> Tensors {
        Tensor y = in[0].deep_copy();
        for (float& v : y.flat<float>()) v = v * 2 + 1;
        return std::vector<Tensor>{y};
      },
      {}, "double_plus_one");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].node()->op(), "Call");
  EXPECT_EQ(out[0].node()->name(), "double_plus_one");
  EXPECT_TRUE(out[0].node()->is_stateful());
  EXPECT_EQ(out[0].dtype(), DType::kFloat32);
  EXPECT_TRUE(out[0].shape().is_unknown_rank());
  EXPECT_THAT(run_one(g, out[0], {{x, Tensor{1.0f, -2.0f}}}),
              IsOkAndHolds(TensorEq(Tensor{3.0f, -3.0f})));
}

TEST(CallTest, ManyInputsAndOutputsOfMixedDtypes) {
  Graph g;
  Output a = ops::Const(g, Tensor{1, 2, 3});
  Output b = ops::Const(g, Tensor(true));
  std::vector<Output> out = ops::Call(
      g, {a, b}, {DType::kInt64, DType::kBool, DType::kFloat64},
      [](std::span<const Tensor> in) -> Tensors {
        if (in.size() != 2) return invalid_argument("expected 2 inputs");
        int64_t sum = 0;
        for (int32_t v : in[0].flat<int32_t>()) sum += v;
        return std::vector<Tensor>{Tensor(sum), Tensor(!in[1].scalar<bool>()), Tensor{0.5, 1.5}};
      });
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].index(), 1);
  EXPECT_EQ(out[2].dtype(), DType::kFloat64);
  EXPECT_EQ(std::get<std::vector<DType>>(*out[0].node()->find_attr("Tin")),
            (std::vector<DType>{DType::kInt32, DType::kBool}));
  Result<std::vector<Tensor>> values = run_all(g, {out[2], out[0], out[1]});
  ASSERT_THAT(values, IsOk());
  EXPECT_THAT(*values, ElementsAre(TensorEq(Tensor{0.5, 1.5}), TensorEq(Tensor(int64_t{6})),
                                   TensorEq(Tensor(false))));
}

// The callable sees every input in order, whatever their number (a few are
// passed from the stack, more from the heap), and the inputs it was handed
// stay valid while it runs even when they are the graph's only reference.
TEST(CallTest, SeesEveryInputInOrderForAnyInputCount) {
  for (int n = 0; n <= 7; ++n) {
    Graph g;
    std::vector<Output> inputs;
    for (int i = 0; i < n; ++i) {
      inputs.push_back(ops::Call(g, {}, {DType::kInt64}, [i](std::span<const Tensor>) -> Tensors {
        return std::vector<Tensor>{Tensor(int64_t{10 + i})};
      })[0]);
    }
    std::vector<Output> out =
        ops::Call(g, inputs, {DType::kInt64}, [n](std::span<const Tensor> in) -> Tensors {
          if (static_cast<int>(in.size()) != n) return invalid_argument("saw {} inputs", in.size());
          int64_t digits = 0;  // the inputs' values as digits, first input first
          for (const Tensor& t : in) digits = digits * 100 + t.scalar<int64_t>();
          return std::vector<Tensor>{Tensor(digits)};
        });
    ASSERT_THAT(g.status(), IsOk());
    int64_t expected = 0;
    for (int i = 0; i < n; ++i) expected = expected * 100 + 10 + i;
    EXPECT_THAT(run_one(g, out[0], {}), IsOkAndHolds(TensorEq(Tensor(expected)))) << n << " inputs";
  }
}

// Call builders keep the last signature's attributes per thread: nodes of
// alternating signatures, and graphs built on two threads at once, each get
// their own dtypes and shapes.
TEST(CallTest, NodesOfAlternatingSignaturesEachKeepTheirOwnAttributes) {
  auto build = [](Graph& g, int n) {
    ops::CallAttrs shaped;
    shaped.output_shapes = {Shape{2}};
    for (int i = 0; i < n; ++i) {
      const Output f = ops::Call(
          g, {}, {DType::kFloat32},
          [](std::span<const Tensor>) -> Tensors {
            return std::vector<Tensor>{Tensor{1.0f, 2.0f}};
          },
          shaped)[0];
      const Output k =
          ops::Call(g, {f}, {DType::kInt32}, [](std::span<const Tensor> in) -> Tensors {
            return std::vector<Tensor>{Tensor(static_cast<int32_t>(in[0].num_elements()))};
          })[0];
      EXPECT_EQ(f.shape(), (Shape{2}));
      EXPECT_EQ(k.dtype(), DType::kInt32);
      EXPECT_TRUE(k.shape().is_unknown_rank());
      EXPECT_EQ(std::get<std::vector<DType>>(*k.node()->find_attr("Tin")),
                std::vector<DType>{DType::kFloat32});
      EXPECT_TRUE(std::get<std::vector<DType>>(*f.node()->find_attr("Tin")).empty());
    }
  };
  Graph g1;
  Graph g2;
  std::thread other([&] { build(g2, 200); });
  build(g1, 200);
  other.join();
  for (Graph* g : {&g1, &g2}) {
    ASSERT_TRUE(g->status().is_ok()) << g->status().to_string();
    ASSERT_EQ(g->num_nodes(), 400);
    EXPECT_THAT(run_one(*g, g->node(399)->output(0)), IsOkAndHolds(TensorEq(Tensor(2))));
  }
}

TEST(CallTest, DeclaredOutputShapesAreInferredAndChecked) {
  Graph g;
  ops::CallAttrs attrs;
  attrs.output_shapes = {Shape{2, -1}, Shape::unknown()};
  Output n = ops::Placeholder(g, DType::kInt32, Shape{}, "n");
  std::vector<Output> out = ops::Call(
      g, {n}, {DType::kFloat32, DType::kInt32},
      [](std::span<const Tensor> in) -> Tensors {
        const int cols = in[0].scalar<int32_t>();
        return std::vector<Tensor>{Tensor(DType::kFloat32, Shape{2, cols}), Tensor(cols)};
      },
      attrs);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(out[0].shape(), (Shape{2, -1}));
  EXPECT_TRUE(out[1].shape().is_unknown_rank());
  // Downstream shape inference uses the declared shape.
  EXPECT_EQ(ops::Identity(g, out[0]).shape(), (Shape{2, -1}));
  EXPECT_THAT(run_one(g, out[0], {{n, Tensor(3)}}),
              IsOkAndHolds(TensorEq(Tensor(DType::kFloat32, Shape{2, 3}))));

  // A result that contradicts the declaration is an error naming both.
  Graph g2;
  ops::CallAttrs attrs2;
  attrs2.output_shapes = {Shape{2}};
  std::vector<Output> bad = ops::Call(
      g2, {}, {DType::kFloat32},
      [](std::span<const Tensor>) -> Tensors { return std::vector<Tensor>{Tensor{1.0f}}; }, attrs2);
  ASSERT_TRUE(g2.status().is_ok());
  Result<Tensor> r = run_one(g2, bad[0]);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "output 0"));
  EXPECT_THAT(r.status().message(), HasSubstr("[1]"));
  EXPECT_THAT(r.status().message(), HasSubstr("[2]"));
}

TEST(CallTest, WrongOutputDtypeNamesIndexAndBothDtypes) {
  Graph g;
  std::vector<Output> out = ops::Call(
      g, {}, {DType::kFloat32, DType::kInt64},
      [](std::span<const Tensor>) -> Tensors {
        return std::vector<Tensor>{Tensor(1.0f), Tensor(1)};  // int32, not int64
      },
      {}, "typed");
  ASSERT_TRUE(g.status().is_ok());
  Result<Tensor> r = run_one(g, out[0]);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "output 1"));
  EXPECT_THAT(r.status().message(), HasSubstr("int64"));
  EXPECT_THAT(r.status().message(), HasSubstr("int32"));
  EXPECT_THAT(r.status().message(), HasSubstr("typed"));
}

TEST(CallTest, WrongOutputCountIsAnError) {
  Graph g;
  std::vector<Output> out = ops::Call(
      g, {}, {DType::kFloat32, DType::kFloat32},
      [](std::span<const Tensor>) -> Tensors { return std::vector<Tensor>{Tensor(1.0f)}; });
  ASSERT_TRUE(g.status().is_ok());
  Result<Tensor> r = run_one(g, out[0]);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "returned 1 tensor(s)"));
  EXPECT_THAT(r.status().message(), HasSubstr("2 output(s)"));
}

// A kernel's allocate_output / allocate_output_uninitialized with an index
// past its outputs (or below 0) returns Internal, as set_output does; it
// once wrote past the step's output slots (a crash, or a silent OK).
TEST(CallTest, AllocatingAnOutputOutOfRangeIsAnError) {
  for (const bool zeroed : {true, false}) {
    for (const int index : {1, 5, -1, 100000000}) {
      SCOPED_TRACE(::testing::Message() << "zeroed " << zeroed << ", index " << index);
      Graph g;
      Output out = ops::Call(
          g, {}, {DType::kFloat32},
          [zeroed, index](OpKernelContext& ctx) -> Status {
            Result<Tensor*> t = zeroed ? ctx.allocate_output(index, Shape{2})
                                       : ctx.allocate_output_uninitialized(index, Shape{2});
            if (!t.is_ok()) return t.status();
            return ctx.set_output(0, Tensor(1.0f));
          },
          {.output_shapes = {Shape()}}, "alloc")[0];
      ASSERT_TRUE(g.status().is_ok());
      EXPECT_THAT(run_one(g, out),
                  StatusIs(StatusCode::kInternal,
                           fmt::format("output index {} out of range (1 outputs)", index)));
    }
  }
}

TEST(CallTest, CallableStatusPassesThrough) {
  Graph g;
  std::vector<Output> out = ops::Call(
      g, {}, {DType::kFloat32},
      [](std::span<const Tensor>) -> Tensors { return not_found("the thing is missing"); });
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, out[0]), StatusIs(StatusCode::kNotFound, "the thing is missing"));
}

TEST(CallTest, ExceptionBecomesInternal) {
  Graph g;
  std::vector<Output> out =
      ops::Call(g, {}, {DType::kFloat32},
                [](std::span<const Tensor>) -> Tensors { throw std::runtime_error("kaboom"); });
  std::vector<Output> out2 =
      ops::Call(g, {}, {DType::kFloat32}, [](std::span<const Tensor>) -> Tensors { throw 42; });
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, out[0]), StatusIs(StatusCode::kInternal, "kaboom"));
  EXPECT_THAT(run_one(g, out2[0]), StatusIs(StatusCode::kInternal, "exception"));
}

TEST(CallTest, RunsExactlyOncePerRun) {
  Graph g;
  std::atomic<int> calls{0};
  std::vector<Output> out =
      ops::Call(g, {}, {DType::kInt32, DType::kInt32}, [&](std::span<const Tensor>) -> Tensors {
        const int n = ++calls;
        return std::vector<Tensor>{Tensor(n), Tensor(-n)};
      });
  // Several consumers of both outputs.
  Output i0 = ops::Identity(g, out[0]);
  Output i1 = ops::Identity(g, out[1]);
  Output i2 = ops::Identity(g, i0);
  ASSERT_TRUE(g.status().is_ok());
  auto session = make_session(g);
  ASSERT_NE(session, nullptr);
  for (int run = 1; run <= 5; ++run) {
    Result<std::vector<Tensor>> r = session->run({}, {out[0], out[1], i0, i1, i2, out[0]});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(calls.load(), run);
    EXPECT_THAT(*r,
                ElementsAre(TensorEq(Tensor(run)), TensorEq(Tensor(-run)), TensorEq(Tensor(run)),
                            TensorEq(Tensor(-run)), TensorEq(Tensor(run)), TensorEq(Tensor(run))));
  }
}

TEST(CallTest, ConcurrentRunsEachCallOnce) {
  Graph g;
  std::atomic<int> calls{0};
  Output x = ops::Placeholder(g, DType::kInt32, Shape{}, "x");
  std::vector<Output> out =
      ops::Call(g, {x}, {DType::kInt32}, [&](std::span<const Tensor> in) -> Tensors {
        ++calls;
        return std::vector<Tensor>{Tensor(in[0].scalar<int32_t>() * 10)};
      });
  ASSERT_TRUE(g.status().is_ok());
  auto session = make_session(g);
  ASSERT_NE(session, nullptr);
  constexpr int kThreads = 4;
  constexpr int kRunsPerThread = 25;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRunsPerThread; ++i) {
        const int v = t * 1000 + i;
        Result<std::vector<Tensor>> r = session->run({{x, Tensor(v)}}, {out[0]});
        if (!r.is_ok() || !(*r)[0].equals(Tensor(v * 10))) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(calls.load(), kThreads * kRunsPerThread);
}

TEST(CallTest, KernelContextOverloadCanUseParallelFor) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt64, Shape{-1}, "x");
  std::vector<Output> out = ops::Call(
      g, {x}, {DType::kInt64, DType::kInt64},
      [](OpKernelContext& ctx) -> Status {
        const Tensor& in = ctx.input(0);
        GRAPHRUN_ASSIGN_OR_RETURN(Tensor * squares, ctx.allocate_output(0, in.shape()));
        std::span<const int64_t> src = in.flat<int64_t>();
        std::span<int64_t> dst = squares->flat<int64_t>();
        std::atomic<int64_t> sum{0};
        ctx.parallel_for(in.num_elements(), 1000, [&](int64_t begin, int64_t end) {
          int64_t local = 0;
          for (int64_t i = begin; i < end; ++i) {
            dst[static_cast<std::size_t>(i)] =
                src[static_cast<std::size_t>(i)] * src[static_cast<std::size_t>(i)];
            local += src[static_cast<std::size_t>(i)];
          }
          sum += local;
        });
        return ctx.set_output(1, Tensor(sum.load()));
      },
      {}, "squares");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(out[0].node()->op(), "Call");
  const int64_t n = 100000;
  std::vector<int64_t> values(static_cast<std::size_t>(n));
  std::vector<int64_t> squares(values.size());
  for (int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = i;
    squares[static_cast<std::size_t>(i)] = i * i;
  }
  Result<std::vector<Tensor>> r = run_all(
      g, {out[0], out[1]}, {{x, Tensor::vector<int64_t>(std::span<const int64_t>(values))}});
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT((*r)[0], TensorEq(Tensor::vector<int64_t>(std::span<const int64_t>(squares))));
  EXPECT_THAT((*r)[1], TensorEq(Tensor(n * (n - 1) / 2)));
}

TEST(CallTest, KernelContextOverloadErrors) {
  Graph g;
  std::vector<Output> unset =
      ops::Call(g, {}, {DType::kFloat32}, [](OpKernelContext&) -> Status { return Status::ok(); });
  std::vector<Output> failing = ops::Call(g, {}, {DType::kFloat32}, [](OpKernelContext&) -> Status {
    return failed_precondition("not ready");
  });
  std::vector<Output> throwing =
      ops::Call(g, {}, {DType::kFloat32},
                [](OpKernelContext&) -> Status { throw std::logic_error("broken invariant"); });
  std::vector<Output> wrong_type =
      ops::Call(g, {}, {DType::kFloat32},
                [](OpKernelContext& ctx) -> Status { return ctx.set_output(0, Tensor(1)); });
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_THAT(run_one(g, unset[0]), StatusIs(StatusCode::kInvalidArgument, "output 0"));
  EXPECT_THAT(run_one(g, failing[0]), StatusIs(StatusCode::kFailedPrecondition, "not ready"));
  EXPECT_THAT(run_one(g, throwing[0]), StatusIs(StatusCode::kInternal, "broken invariant"));
  Result<Tensor> r = run_one(g, wrong_type[0]);
  EXPECT_FALSE(r.is_ok());
  EXPECT_THAT(r.status().message(), HasSubstr("int32"));
}

TEST(CallTest, StatelessCallIsAnotherOp) {
  Graph g;
  ops::CallAttrs attrs;
  attrs.stateful = false;
  std::vector<Output> out = ops::Call(
      g, {}, {DType::kInt32},
      [](std::span<const Tensor>) -> Tensors { return std::vector<Tensor>{Tensor(5)}; }, attrs);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_EQ(out[0].node()->op(), "StatelessCall");
  EXPECT_EQ(out[0].node()->name(), "StatelessCall");
  EXPECT_FALSE(out[0].node()->is_stateful());
  EXPECT_THAT(run_one(g, out[0]), IsOkAndHolds(TensorEq(Tensor(5))));
}

TEST(CallTest, ZeroOutputsAsATarget) {
  Graph g;
  std::atomic<int> calls{0};
  std::vector<Output> out = ops::Call(
      g, {}, {},
      [&](std::span<const Tensor>) -> Tensors {
        ++calls;
        return std::vector<Tensor>{};
      },
      {}, "side_effect");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_TRUE(out.empty());
  const Node* node = g.find_node("side_effect");
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->num_outputs(), 0);
  EXPECT_THAT(run_all(g, {}, {}, {node}), IsOk());
  EXPECT_EQ(calls.load(), 1);
}

TEST(CallTest, BuildErrors) {
  {
    Graph g;
    std::vector<Output> out =
        ops::Call(g, {}, {DType::kFloat32, DType::kInt32}, ops::CallableFn{}, {}, "empty");
    EXPECT_EQ(out.size(), 2u);
    EXPECT_FALSE(out[0].is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "empty"));
  }
  {
    Graph g;
    ops::CallAttrs attrs;
    attrs.output_shapes = {Shape{1}, Shape{2}};
    std::vector<Output> out = ops::Call(
        g, {}, {DType::kFloat32},
        [](std::span<const Tensor>) -> Tensors { return std::vector<Tensor>{}; }, attrs);
    EXPECT_FALSE(out[0].is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "2 output shape(s)"));
  }
  {
    Graph g;
    std::vector<Output> out = ops::Call(
        g, {}, {DType::kInvalid},
        [](std::span<const Tensor>) -> Tensors { return std::vector<Tensor>{}; }, {}, "c");
    EXPECT_FALSE(out[0].is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "invalid dtype"));
  }
  {
    // An invalid input (from a failed builder) keeps the first error.
    Graph g;
    Output bad = ops::Placeholder(g, DType::kInvalid);
    const Status first = g.status();
    std::vector<Output> out =
        ops::Call(g, {bad}, {DType::kFloat32},
                  [](std::span<const Tensor>) -> Tensors { return std::vector<Tensor>{}; });
    EXPECT_FALSE(out[0].is_valid());
    EXPECT_EQ(g.status(), first);
  }
}

TEST(CallTest, RegisteredFactoryRefusesWithoutACallable) {
  // A Call node added without its C++ kernel (as when loaded from a file).
  for (const char* op : {"Call", "StatelessCall"}) {
    Graph g;
    Result<Node*> n = g.add_node(NodeSpec{
        .op = op, .name = "loaded", .attrs = {{"Tout", std::vector<DType>{DType::kFloat32}}}});
    ASSERT_THAT(n, IsOk());
    ResourceManager resources;
    OpKernelConstruction construction(**n, resources);
    Result<std::unique_ptr<OpKernel>> kernel = (*n)->registration().factory(construction);
    EXPECT_THAT(kernel, StatusIs(StatusCode::kUnimplemented, "C++ callable"));
    EXPECT_THAT(kernel.status().message(), HasSubstr("loaded"));
    // And through a session.
    EXPECT_THAT(run_one(g, (*n)->output(0)), StatusIs(StatusCode::kUnimplemented, "loaded"));
  }
}

}  // namespace
}  // namespace graphrun
