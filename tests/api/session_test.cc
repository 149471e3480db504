// Session::run semantics with the built-in ops, case by case against TF1's
// documented behaviour (see docs/core.md for the list).
#include <fmt/format.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <limits>
#include <thread>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::testing::ElementsAre;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::make_session;
using testing::StatusIs;
using testing::TensorEq;

// A float32 op that counts its executions.
Output counted(Graph& g, Output x, std::atomic<int>* count, std::string_view name) {
  return ops::Call(
      g, {x}, {DType::kFloat32},
      [count](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        count->fetch_add(1);
        return std::vector<Tensor>{in[0]};
      },
      {}, name)[0];
}

TEST(SessionTest, ReadmeExample) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{2, 2}, "x");
  Output w = ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}}), "w");
  Output y = ops::Relu(g, ops::MatMul(g, x, w), "y");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  auto s = make_session(g);
  EXPECT_THAT(
      s->run({{x, Tensor::matrix<float>({{1, 0}, {0, -1}})}}, {y}),
      IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor::matrix<float>({{1, 2}, {0, 0}})))));
}

TEST(SessionTest, AnyTensorMayBeFedAndItsProducerIsSkipped) {
  Graph g;
  std::atomic<int> producer_runs{0};
  Output c = ops::Const(g, Tensor(2.0f), "c");
  Output mid = counted(g, c, &producer_runs, "mid");
  Output out = ops::Mul(g, mid, ops::Const(g, Tensor(10.0f)), "out");
  auto s = make_session(g);
  EXPECT_THAT(s->run({{mid, Tensor(5.0f)}}, {out}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(50.0f)))));
  EXPECT_EQ(producer_runs.load(), 0);
  // Feeding a Const works too.
  EXPECT_THAT(s->run({{"c", Tensor(3.0f)}}, {out}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(30.0f)))));
  EXPECT_EQ(producer_runs.load(), 1);
}

TEST(SessionTest, FedTensorStillComputedWhenAnotherPathNeedsItsProducer) {
  Graph g;
  std::atomic<int> runs{0};
  Output p = ops::Placeholder(g, DType::kFloat32, Shape{}, "p");
  // `two` has two outputs: feeding output 0 must not stop output 1 being computed.
  std::vector<Output> two = ops::Call(
      g, {p}, {DType::kFloat32, DType::kFloat32},
      [&runs](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        runs.fetch_add(1);
        return std::vector<Tensor>{in[0], Tensor(in[0].scalar<float>() + 1)};
      },
      {}, "two");
  auto s = make_session(g);
  auto out = s->run({{p, Tensor(1.0f)}, {two[0], Tensor(100.0f)}}, {two[0], two[1]});
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ((*out)[0].scalar<float>(), 100.0f);
  EXPECT_EQ((*out)[1].scalar<float>(), 2.0f);
  EXPECT_EQ(runs.load(), 1);
}

TEST(SessionTest, DuplicateFetchesRepeatTheValue) {
  Graph g;
  Output a = ops::Const(g, Tensor(7), "a");
  auto s = make_session(g);
  EXPECT_THAT(s->run({}, {a, "a:0", a}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(7)), TensorEq(Tensor(7)),
                                                  TensorEq(Tensor(7)))));
}

// The step's end moves a fetched value out of its slot, copying it for every
// fetch but the last of that tensor: repeated fetches of a computed and of a
// fed tensor keep their values over the steps of one Callable, and a fetch
// never shares the caller's feed's storage with a later step.
TEST(SessionTest, DuplicateFetchesOfAPreparedCallableKeepTheirValuesEveryStep) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt32, Shape{}, "x");
  Output y = ops::Mul(g, x, ops::Const(g, Tensor(3)), "y");
  auto s = make_session(g);
  auto callable = s->make_callable({x}, {y, x, y, x, y}).value();
  std::vector<Tensor> out(5);
  for (int step = 1; step <= 3; ++step) {
    const Tensor feed(step);
    ASSERT_THAT(callable.run({&feed, 1}, out), IsOk());
    for (const std::size_t k : {0u, 2u, 4u}) {
      EXPECT_EQ(out[k].scalar<int32_t>(), 3 * step) << "fetch " << k << ", step " << step;
    }
    for (const std::size_t k : {1u, 3u}) {
      EXPECT_EQ(out[k].scalar<int32_t>(), step) << "fetch " << k << ", step " << step;
    }
    EXPECT_EQ(feed.scalar<int32_t>(), step);
  }
}

TEST(SessionTest, TargetsRunWithoutFetching) {
  Graph g;
  Output v = ops::Variable(g, Tensor(0), "v");
  Output inc = ops::AssignAdd(g, v, ops::Const(g, Tensor(1)), {}, "inc");
  const Node* init = ops::GlobalVariablesInitializer(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  ASSERT_THAT(s->run({}, {}, {inc}), IsOk());
  ASSERT_THAT(s->run({}, {}, {"inc"}), IsOk());
  EXPECT_THAT(s->run({}, {v}), IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(2)))));
}

TEST(SessionTest, ErrorsNameTheCulprit) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 3}, "x");
  Output y = ops::Square(g, x, "y");
  const Node* noop = ops::NoOp(g, "noop");
  auto s = make_session(g);
  EXPECT_THAT(s->run({}, {"missing:0"}), StatusIs(StatusCode::kNotFound, "missing"));
  EXPECT_THAT(s->run({}, {"y:1"}), StatusIs(StatusCode::kInvalidArgument, "y:1"));
  EXPECT_THAT(s->run({{x, Tensor::filled<float>(Shape{1, 3}, 1)},
                      {"x:0", Tensor::filled<float>(Shape{1, 3}, 1)}},
                     {y}),
              StatusIs(StatusCode::kInvalidArgument, "'x:0' is fed more than once"));
  EXPECT_THAT(s->run({}, {}), StatusIs(StatusCode::kInvalidArgument,
                                       "Must specify at least one target to fetch or execute."));
  EXPECT_THAT(
      s->run({}, {y}),
      StatusIs(
          StatusCode::kInvalidArgument,
          "You must feed a value for placeholder tensor 'x' with dtype float32 and shape [?,3]"));
  EXPECT_THAT(
      s->run({{x, Tensor::filled<double>(Shape{1, 3}, 1)}}, {y}),
      StatusIs(StatusCode::kInvalidArgument, "feed 'x:0' expects float32[?,3], got float64[1,3]"));
  EXPECT_THAT(
      s->run({{x, Tensor::filled<float>(Shape{1, 4}, 1)}}, {y}),
      StatusIs(StatusCode::kInvalidArgument, "feed 'x:0' expects float32[?,3], got float32[1,4]"));
  EXPECT_THAT(s->run({}, {"noop"}),
              StatusIs(StatusCode::kInvalidArgument,
                       "Tried to fetch data for 'noop', which produces no output"));
  EXPECT_THAT(s->run({}, {}, {"nowhere"}), StatusIs(StatusCode::kNotFound, "nowhere"));
  (void)noop;
}

// Output(node, index) is public, so its index may be anything: a feed or a
// fetch past the node's outputs, or below 0, is InvalidArgument naming the
// node, for run, make_callable and partial_run_setup alike (it once read
// past the node's outputs, and a negative fetch freed memory twice).
TEST(SessionTest, OutputIndicesOutOfRangeAreInvalidArgumentEverywhere) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  Output y = ops::Neg(g, a, "y");
  auto s = make_session(g);
  const Tensor one(1.0f);
  for (int index : {7, 1, -1, std::numeric_limits<int>::min()}) {
    SCOPED_TRACE(index);
    const Output bad(a.node(), index);
    const auto out_of_range =
        StatusIs(StatusCode::kInvalidArgument,
                 fmt::format("node 'a' (Const) has 1 output(s); index {} is out of range", index));
    EXPECT_THAT(s->run({{bad, one}}, {y}), out_of_range);
    EXPECT_THAT(s->run({}, {bad}), out_of_range);
    EXPECT_THAT(s->make_callable({bad}, {y}).status(), out_of_range);
    EXPECT_THAT(s->make_callable({}, {bad}).status(), out_of_range);
    // (fetches first, then feeds: TF's order)
    EXPECT_THAT(s->partial_run_setup({y}, {bad}).status(), out_of_range);
    EXPECT_THAT(s->partial_run_setup({bad}, {}).status(), out_of_range);
  }
  // The session still serves good calls.
  EXPECT_THAT(s->run({}, {y}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(-1.0f)))));
}

TEST(SessionTest, KernelFailureNamesNodeOpAndShapes) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "b");
  Output mm = ops::MatMul(g, a, b, {}, "mm1");
  auto s = make_session(g);
  auto r = s->run(
      {{a, Tensor::filled<float>(Shape{2, 3}, 1)}, {b, Tensor::filled<float>(Shape{4, 5}, 1)}},
      {mm});
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "node 'mm1' (MatMul)"));
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "float32[2,3], float32[4,5]"));
  // The session stays usable.
  EXPECT_THAT(
      s->run(
          {{a, Tensor::filled<float>(Shape{1, 1}, 2)}, {b, Tensor::filled<float>(Shape{1, 1}, 3)}},
          {mm}),
      IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor::filled<float>(Shape{1, 1}, 6)))));
}

TEST(SessionTest, UninitializedVariableIsNamed) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 2.0f}, "weights");
  auto s = make_session(g);
  EXPECT_THAT(s->run({}, {v}), StatusIs(StatusCode::kFailedPrecondition, "weights"));
}

TEST(SessionTest, CycleIsAnError) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  Output b = ops::Neg(g, a, "b");
  ASSERT_TRUE(g.add_control_input(g.mutable_node(a.node()->id()), b.node()).is_ok());
  auto s = make_session(g);
  EXPECT_THAT(s->run({}, {b}), StatusIs(StatusCode::kInvalidArgument, "cycle"));
}

TEST(SessionTest, StatePersistsAcrossRunsAndIsPerSession) {
  Graph g;
  Output v = ops::Variable(g, Tensor(10), "v");
  Output inc = ops::AssignAdd(g, v, ops::Const(g, Tensor(5)));
  const Node* init = ops::GlobalVariablesInitializer(g);
  auto s1 = make_session(g);
  auto s2 = make_session(g);
  ASSERT_THAT(s1->run({}, {}, {init}), IsOk());
  ASSERT_THAT(s1->run({}, {inc}), IsOk());
  ASSERT_THAT(s1->run({}, {inc}), IsOk());
  EXPECT_THAT(s1->run({}, {v}), IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(20)))));
  EXPECT_THAT(s2->run({}, {v}), StatusIs(StatusCode::kFailedPrecondition, "v"));
}

TEST(SessionTest, RandomOpsDrawNewValuesEachRunAndRepeatPerSeed) {
  Graph g;
  g.set_seed(7);
  Output r = ops::RandomUniform(g, Shape{4}, DType::kFloat32, {}, "r");
  auto s1 = make_session(g);
  auto s2 = make_session(g);
  auto a1 = s1->run({}, {r});
  auto a2 = s1->run({}, {r});
  auto b1 = s2->run({}, {r});
  ASSERT_THAT(a1, IsOk());
  ASSERT_THAT(a2, IsOk());
  ASSERT_THAT(b1, IsOk());
  EXPECT_FALSE((*a1)[0].equals((*a2)[0])) << "each run draws anew";
  EXPECT_TRUE((*a1)[0].equals((*b1)[0])) << "same seeds and run order repeat the sequence";
}

TEST(SessionTest, IteratorAdvancesOncePerRun) {
  Graph g;
  ops::Iterator it = ops::RangeIterator(g, 0, 3, 1, "it");
  Output twice = ops::Add(g, it.next, it.next, "twice");
  auto s = make_session(g);
  EXPECT_THAT(s->run({}, {it.next, twice}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(int64_t{0})),
                                                  TensorEq(Tensor(int64_t{0})))));
  EXPECT_THAT(s->run({}, {it.next}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(int64_t{1})))));
  EXPECT_THAT(s->run({}, {it.next}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(int64_t{2})))));
  EXPECT_THAT(s->run({}, {it.next}), StatusIs(StatusCode::kOutOfRange, "it"));
  ASSERT_THAT(s->run({}, {}, {it.initializer}), IsOk());
  EXPECT_THAT(s->run({}, {it.next}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(int64_t{0})))));
}

TEST(SessionTest, ControlDependenciesOrderAReadAfterAWrite) {
  Graph g;
  Output v = ops::Variable(g, Tensor(1), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output write = ops::Assign(g, v, ops::Const(g, Tensor(42)), {}, "write");
  Output read;
  {
    auto deps = g.control_dependencies({write.node()});
    read = ops::ReadVariable(g, v, "read");
  }
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  EXPECT_THAT(s->run({}, {read}), IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(42)))));
}

TEST(SessionTest, SessionCopiesTheGraph) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  auto s = make_session(g);
  ops::Neg(g, a, "added_later");
  EXPECT_THAT(s->run({}, {"added_later:0"}), StatusIs(StatusCode::kNotFound, "added_later"));
  Output later = g.find_output("added_later:0").value();
  EXPECT_THAT(s->run({}, {later}), StatusIs(StatusCode::kNotFound, "added_later"));
}

TEST(SessionTest, DeadlineExpiringWhileAKernelRunsFailsTheRunAfterThatKernel) {
  Graph g;
  std::atomic<int> second_ran{0};
  Output a = ops::Const(g, Tensor(1.0f), "a");
  Output slow = ops::Call(
      g, {a}, {DType::kFloat32},
      [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return std::vector<Tensor>{in[0]};
      },
      {}, "slow")[0];
  Output after = counted(g, slow, &second_ran, "after");
  auto s = make_session(g);
  // Compile the signature first, and leave 'slow' 100 ms to start: on a
  // sanitized or loaded machine, a 5 ms window passed before it started.
  ASSERT_THAT(s->make_callable({}, {after}), IsOk());
  RunOptions opts;
  opts.timeout = std::chrono::milliseconds(100);
  // The kernel does not poll: the run stops when it returns, naming it.
  EXPECT_THAT(s->run({}, {after}, {}, opts),
              StatusIs(StatusCode::kDeadlineExceeded, "expired while node 'slow'"));
  EXPECT_EQ(second_ran.load(), 0);
  // Without a deadline the same signature runs to the end.
  EXPECT_THAT(s->run({}, {after}), IsOk());
  EXPECT_EQ(second_ran.load(), 1);
}

// A kernel that polls is_cancelled() until told to stop (10 s at most).
Output polling_kernel(Graph& g, std::atomic<int>* polls) {
  return ops::Call(
      g, {}, {DType::kFloat32},
      [polls](OpKernelContext& ctx) -> Status {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!ctx.is_cancelled()) {
          if (std::chrono::steady_clock::now() > give_up) return internal_error("never cancelled");
          polls->fetch_add(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return cancelled("stopped polling");
      },
      {}, "poller")[0];
}

TEST(SessionTest, DeadlineInterruptsAKernelThatPolls) {
  Graph g;
  std::atomic<int> polls{0};
  Output p = polling_kernel(g, &polls);
  auto s = make_session(g);
  RunOptions opts;
  opts.timeout = std::chrono::milliseconds(20);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(s->run({}, {p}, {}, opts),
              StatusIs(StatusCode::kDeadlineExceeded, "expired while node 'poller'"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_GT(polls.load(), 0);
}

TEST(SessionTest, CloseInterruptsARunWhoseKernelPolls) {
  Graph g;
  std::atomic<int> polls{0};
  Output p = polling_kernel(g, &polls);
  auto s = make_session(g);
  auto run = std::async(std::launch::async, [&] { return s->run({}, {p}); });
  while (polls.load() == 0) std::this_thread::yield();  // the kernel is running
  EXPECT_THAT(s->close(), IsOk());
  ASSERT_EQ(run.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_THAT(run.get(), StatusIs(StatusCode::kCancelled, "Session has been closed."));
}

TEST(SessionTest, ExtendAddsNodesThatNewRunsCanUse) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape(), "x");
  Output y = ops::Mul(g, x, ops::Const(g, Tensor(2.0f)), "y");
  auto s = make_session(g);
  ASSERT_THAT(s->run({{x, Tensor(3.0f)}}, {y}), IsOk());  // a plan compiled before
  // Grow the same Graph object, then extend the session with it.
  Output z = ops::Add(g, y, ops::Const(g, Tensor(1.0f)), "z");
  EXPECT_THAT(s->run({{x, Tensor(3.0f)}}, {"z"}), StatusIs(StatusCode::kNotFound, "'z'"));
  ASSERT_THAT(s->extend(g), IsOk());
  EXPECT_EQ(s->graph().num_nodes(), g.num_nodes());
  EXPECT_THAT(s->run({{x, Tensor(3.0f)}}, {z}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(7.0f)))));
  EXPECT_THAT(s->run({{"x", Tensor(1.0f)}}, {"z", "y"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(3.0f)), TensorEq(Tensor(2.0f)))));
  // Extending again with nothing new is a no-op.
  EXPECT_THAT(s->extend(g), IsOk());
}

TEST(SessionTest, ExtendAddsVariablesAndTheirInitializers) {
  Graph g;
  Output a = ops::Variable(g, Tensor(1.0f), "a");
  const Node* init_a = ops::GlobalVariablesInitializer(g, "init_a");
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init_a}), IsOk());
  Output b = ops::Variable(g, Tensor(5.0f), "b");
  const Node* init_all = ops::GlobalVariablesInitializer(g, "init_all");
  Output sum = ops::Add(g, a, b, "sum");
  ASSERT_THAT(s->extend(g), IsOk());
  ASSERT_THAT(s->run({}, {}, {init_all}), IsOk());
  EXPECT_THAT(s->run({}, {sum}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
}

TEST(SessionTest, ExtendRejectsAGraphThatIsNotAGrownCopy) {
  Graph g;
  ops::Placeholder(g, DType::kFloat32, Shape(), "x");
  auto s = make_session(g);
  Graph other;
  ops::Const(other, Tensor(1.0f), "c");
  ops::Const(other, Tensor(1.0f), "d");
  EXPECT_THAT(s->extend(other), StatusIs(StatusCode::kInvalidArgument, "node 'c' (Const)"));
  Graph smaller;
  EXPECT_THAT(s->extend(smaller), StatusIs(StatusCode::kInvalidArgument, "fewer"));
  Graph broken;
  ops::Const(broken, Tensor(1.0f), "c");
  ops::Add(broken, ops::Const(broken, Tensor(1.0f)), ops::Const(broken, Tensor(1)), "bad");
  EXPECT_THAT(s->extend(broken), StatusIs(StatusCode::kInvalidArgument, "build error"));
  // Nothing was added by the failed calls.
  EXPECT_EQ(s->graph().num_nodes(), 1);
}

TEST(SessionTest, ExtendRejectsAChangedNode) {
  Graph g;
  Output x = ops::Const(g, Tensor(1.0f), "x");
  Output y = ops::Identity(g, x, "y");
  auto s = make_session(g);
  Node* yn = g.mutable_node(y.node()->id());
  ASSERT_THAT(g.add_control_input(yn, ops::NoOp(g, "later")), IsOk());
  EXPECT_THAT(s->extend(g), StatusIs(StatusCode::kInvalidArgument, "node 'y' (Identity)"));
}

TEST(SessionTest, ExtendAfterCloseIsCancelled) {
  Graph g;
  ops::Const(g, Tensor(1.0f), "c");
  auto s = make_session(g);
  ASSERT_THAT(s->close(), IsOk());
  ops::Const(g, Tensor(2.0f), "d");
  EXPECT_THAT(s->extend(g), StatusIs(StatusCode::kCancelled, "closed"));
}

// A kernel's output past SessionOptions::max_tensor_bytes fails its node
// before anything is allocated (a Fill whose dims are fed asks for any size).
TEST(SessionTest, OutputsPastMaxTensorBytesAreResourceExhausted) {
  Graph g;
  Output dims = ops::Placeholder(g, DType::kInt32, Shape{2}, "dims");
  ops::Fill(g, dims, ops::Const(g, Tensor(1.0f)), "made");
  SessionOptions options;
  options.max_tensor_bytes = int64_t{1} << 20;  // 1 MiB
  auto s = Session::create(g, options).value();
  EXPECT_THAT(s->run({{"dims", Tensor::vector<int32_t>({512, 512})}}, {"made"}), IsOk());  // 1 MiB
  EXPECT_THAT(s->run({{"dims", Tensor::vector<int32_t>({4096, 921600})}}, {"made"}),
              StatusIs(StatusCode::kResourceExhausted,
                       "node 'made' (Fill): output 0 (float32[4096,921600]) would take "
                       "15099494400 bytes (limit SessionOptions::max_tensor_bytes = 1048576)"));
  EXPECT_THAT(s->run({{"dims", Tensor::vector<int32_t>({513, 512})}}, {"made"}),
              StatusIs(StatusCode::kResourceExhausted, "max_tensor_bytes"));
  // Past what int64 counts: "more than" the largest count, not that count
  // as if it were the size; and so wherever a 0 stands.
  Graph big;
  Output dims64 = ops::Placeholder(big, DType::kInt64, Shape{3}, "dims");
  ops::Fill(big, dims64, ops::Const(big, Tensor(1.0f)), "made");
  auto s64 = Session::create(big, options).value();
  constexpr int64_t k31 = int64_t{1} << 31;
  for (const auto& d : {std::vector<int64_t>{k31, k31, 1}, std::vector<int64_t>{0, k31, k31}}) {
    EXPECT_THAT(
        s64->run({{"dims", Tensor::from_span(Shape{3}, std::span<const int64_t>(d))}}, {"made"}),
        StatusIs(StatusCode::kResourceExhausted, "would take more than 9223372036854775807 bytes"));
  }
  // Within it, a 0 makes an empty tensor, whatever the other dimensions.
  const std::vector<int64_t> empty{0, int64_t{1} << 40, 3};
  EXPECT_THAT(
      s64->run({{"dims", Tensor::from_span(Shape{3}, std::span<const int64_t>(empty))}}, {"made"}),
      IsOk());
}

TEST(SessionTest, InvalidOptions) {
  Graph g;
  SessionOptions o;
  o.inter_op_threads = -1;
  EXPECT_THAT(Session::create(g, o), StatusIs(StatusCode::kInvalidArgument, "inter_op_threads"));
}

}  // namespace
}  // namespace graphrun
