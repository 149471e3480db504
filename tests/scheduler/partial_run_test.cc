// Partial runs: one execution spread over several calls
// (docs/partial-runs.md, test list items 1-12). Every test runs
// twice: with the stages' kernels expensive (the plan runs on the flow
// graph) and cheap (a plan of only cheap kernels runs inline on the caller,
// Plan::run_inline). Delayed stages are never cheap.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>

#include "scheduler/flow_graph.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::testing::ElementsAre;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::make_session;
using testing::StatusIs;
using testing::TensorEq;

// Whether stage() makes cheap kernels (set by the test parameter).
bool g_cheap_stages = false;

// y = f(x) with a counter and an optional delay; float32 in, float32 out.
Output stage(Graph& g, Output x, std::atomic<int>* count, float scale, std::string_view name,
             std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
  return ops::Call(
      g, {x}, {DType::kFloat32},
      [count, scale, delay](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        if (delay.count() > 0) std::this_thread::sleep_for(delay);
        count->fetch_add(1);
        Tensor out = in[0].deep_copy();
        for (float& v : out.flat<float>()) v *= scale;
        return std::vector<Tensor>{out};
      },
      {.cheap = g_cheap_stages && delay.count() == 0}, name)[0];
}

class PartialRunTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { g_cheap_stages = GetParam(); }
  void TearDown() override { g_cheap_stages = false; }
};
using PartialRunStressTest = PartialRunTest;

// The seed example: r1 = expensive(x), r2 = another_expensive(r1).
struct Seed {
  Graph g;
  std::atomic<int> expensive{0};
  std::atomic<int> another{0};
  Output x, r1, r2;
  Seed() {
    x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
    r1 = stage(g, x, &expensive, 2.0f, "expensive");
    r2 = stage(g, r1, &another, 10.0f, "another_expensive");
  }
};

TEST_P(PartialRunTest, SeedExampleRunsTheExpensiveStageOnce) {
  Seed m;
  auto s = make_session(m.g);
  Tensor x{1.0f, 2.0f};
  // Two runs: expensive runs twice.
  ASSERT_THAT(s->run({{m.x, x}}, {m.r1}), IsOk());
  ASSERT_THAT(s->run({{m.x, x}}, {m.r2}), IsOk());
  EXPECT_EQ(m.expensive.load(), 2);
  // One partial run: once.
  m.expensive = 0;
  m.another = 0;
  auto h = s->partial_run_setup({m.r1, m.r2}, {m.x});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(s->partial_run(*h, {{m.x, x}}, {m.r1}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor{2.0f, 4.0f}))));
  EXPECT_FALSE(h->is_done());
  EXPECT_THAT(s->partial_run(*h, {}, {m.r2}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor{20.0f, 40.0f}))));
  EXPECT_EQ(m.expensive.load(), 1);
  EXPECT_EQ(m.another.load(), 1);
  EXPECT_TRUE(h->is_done());
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  EXPECT_EQ(h->id().rfind("pr-", 0), 0u);
  EXPECT_EQ(h->id().size(), 35u);
}

TEST_P(PartialRunTest, FetchingAValueComputedEarlierRunsNothing) {
  Seed m;
  auto s = make_session(m.g);
  auto h = s->partial_run_setup({m.r1, m.r2}, {m.x});
  ASSERT_THAT(h, IsOk());
  // Fetching r2 computes r1 on the way.
  ASSERT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r2}), IsOk());
  RunOptions o;
  o.trace = true;
  RunMetadata md;
  EXPECT_THAT(s->partial_run(*h, {}, {m.r1}, {}, o, &md),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor{2.0f, 2.0f}))));
  EXPECT_TRUE(md.step_stats.empty());
  EXPECT_EQ(m.expensive.load(), 1);
  EXPECT_EQ(m.another.load(), 1);
}

TEST_P(PartialRunTest, LaterInputComputedOutsideTheGraphFromAnEarlierOutput) {
  Graph g;
  std::atomic<int> n{0};
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{}, "b");
  Output first = stage(g, a, &n, 3.0f, "first");
  Output second = ops::Add(g, first, b, "second");
  auto s = make_session(g);
  auto h = s->partial_run_setup({first, second}, {a, b});
  ASSERT_THAT(h, IsOk());
  auto r1 = s->partial_run(*h, {{a, Tensor(2.0f)}}, {first});
  ASSERT_THAT(r1, IsOk());
  const float next_input = (*r1)[0].scalar<float>() + 1;  // computed outside the graph
  EXPECT_THAT(s->partial_run(*h, {{b, Tensor(next_input)}}, {second}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(13.0f)))));
  EXPECT_EQ(n.load(), 1);
}

TEST_P(PartialRunTest, SetupStartsWorkThatNeedsNoFeedAndReturnsAtOnce) {
  Graph g;
  std::atomic<int> started{0};
  Output c = ops::Const(g, Tensor(1.0f), "c");
  Output slow = stage(g, c, &started, 1.0f, "slow", std::chrono::milliseconds(100));
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output sum = ops::Add(g, slow, x, "sum");
  SessionOptions o;
  o.inter_op_threads = 2;
  auto s = make_session(g, o);
  const auto t0 = std::chrono::steady_clock::now();
  auto h = s->partial_run_setup({sum}, {x});
  ASSERT_THAT(h, IsOk());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(80));
  EXPECT_THAT(s->partial_run(*h, {{x, Tensor(5.0f)}}, {sum}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
  EXPECT_EQ(started.load(), 1);
}

TEST_P(PartialRunTest, CallReturnsWhenItsFetchIsReadyWithoutWaitingForOtherWork) {
  Graph g;
  std::atomic<int> quick_n{0};
  std::atomic<int> slow_n{0};
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output quick = stage(g, x, &quick_n, 2.0f, "quick");
  Output slow = stage(g, quick, &slow_n, 1.0f, "slow", std::chrono::milliseconds(300));
  // One thread: the caller runs `quick`, its sink (the bypassed last
  // successor) releases the wait, and `slow` stays queued. With a second
  // thread that runs `quick` and spawns `slow`, the waiting caller may steal
  // `slow` before it sees the release (a helping wait returns only at a task
  // boundary; docs/architecture.md), which makes the timing nondeterministic.
  SessionOptions one_thread;
  one_thread.inter_op_threads = 1;
  auto s = make_session(g, one_thread);
  auto h = s->partial_run_setup({quick, slow}, {x});
  ASSERT_THAT(h, IsOk());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(s->partial_run(*h, {{x, Tensor(1.0f)}}, {quick}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f)))));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
  EXPECT_THAT(s->partial_run(*h, {}, {slow}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f)))));
  EXPECT_EQ(slow_n.load(), 1);
}

TEST_P(PartialRunTest, StatefulOpsActOncePerPartialRun) {
  Graph g;
  g.set_seed(3);
  Output r = ops::RandomUniform(g, Shape{3}, DType::kFloat32, {}, "r");
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{3}, "x");
  Output derived = ops::Add(g, r, x, "derived");
  Output v = ops::Variable(g, Tensor(0), "v");
  Output inc = ops::AssignAdd(g, v, ops::Const(g, Tensor(1)), {}, "inc");
  ops::Iterator it = ops::RangeIterator(g, 0, 100, 1, "it");
  const Node* init = ops::GlobalVariablesInitializer(g);
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  auto h = s->partial_run_setup({r, derived, inc, it.next}, {x});
  ASSERT_THAT(h, IsOk());
  auto first = s->partial_run(*h, {}, {r, inc, it.next});
  ASSERT_THAT(first, IsOk());
  auto second = s->partial_run(*h, {{x, Tensor{0.0f, 0.0f, 0.0f}}}, {derived});
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE((*second)[0].equals((*first)[0])) << "derived uses the same draw as r";
  EXPECT_EQ((*first)[1].scalar<int32_t>(), 1);
  EXPECT_EQ((*first)[2].scalar<int64_t>(), 0);
  // Separate runs draw twice and advance twice.
  auto a = s->run({}, {r, it.next});
  auto b = s->run({}, {r, it.next});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_FALSE((*a)[0].equals((*b)[0]));
  EXPECT_EQ((*a)[1].scalar<int64_t>(), 1);
  EXPECT_EQ((*b)[1].scalar<int64_t>(), 2);
  EXPECT_THAT(s->run({}, {v}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(1)))));
}

TEST_P(PartialRunTest, TargetsRunAndCanBeAwaited) {
  Graph g;
  Output v = ops::Variable(g, Tensor(0), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output x = ops::Placeholder(g, DType::kInt32, Shape{}, "x");
  Output bump = ops::AssignAdd(g, v, x, {}, "bump");
  Output y = ops::Identity(g, x, "y");
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  auto h = s->partial_run_setup({y}, {x}, {bump.node()});
  ASSERT_THAT(h, IsOk());
  ASSERT_THAT(s->partial_run(*h, {{x, Tensor(5)}}, {}, {bump.node()}), IsOk());
  EXPECT_THAT(s->run({}, {v}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(5)))));
  ASSERT_THAT(s->partial_run(*h, {}, {y}), IsOk());
  EXPECT_TRUE(h->is_done());
}

TEST_P(PartialRunTest, MisuseErrorsLeaveTheHandleUsable) {
  Seed m;
  auto s = make_session(m.g);
  auto h = s->partial_run_setup({m.r1, m.r2}, {m.x});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(
      s->partial_run(*h, {}, {m.r1}),
      StatusIs(StatusCode::kInvalidArgument,
               "Fetch 'expensive:0' can't be computed from the feeds that have been fed so far: "
               "'x:0' still missing"));
  EXPECT_THAT(s->partial_run(*h, {{"expensive:0", Tensor{1.0f, 1.0f}}}, {}),
              StatusIs(StatusCode::kInvalidArgument, "The feed 'expensive:0' was not specified"));
  EXPECT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {"x:0"}),
              StatusIs(StatusCode::kInvalidArgument, "The fetch 'x:0' was not specified"));
  EXPECT_THAT(
      s->partial_run(*h, {{m.x, Tensor{1, 1}}}, {m.r1}),
      StatusIs(StatusCode::kInvalidArgument, "feed 'x:0' expects float32[2], got int32[2]"));
  EXPECT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor{2.0f, 2.0f}))));
  EXPECT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {}),
              StatusIs(StatusCode::kInvalidArgument, "The feed 'x:0' has already been fed."));
  EXPECT_THAT(
      s->partial_run(*h, {}, {m.r1}),
      StatusIs(StatusCode::kInvalidArgument, "The fetch 'expensive:0' has already been fetched."));
  EXPECT_THAT(s->partial_run(*h, {}, {m.r2}), IsOk());
  EXPECT_THAT(s->partial_run(*h, {}, {m.r2}),
              StatusIs(StatusCode::kInvalidArgument, "is complete"));
}

TEST_P(PartialRunTest, SetupErrors) {
  Seed m;
  Output unfed = ops::Placeholder(m.g, DType::kFloat32, Shape{}, "unfed");
  Output needs_unfed = ops::Neg(m.g, unfed, "needs_unfed");
  auto s = make_session(m.g);
  EXPECT_THAT(s->partial_run_setup({needs_unfed}, {m.x}),
              StatusIs(StatusCode::kInvalidArgument, "placeholder tensor 'unfed'"));
  EXPECT_THAT(s->partial_run_setup({}, {m.x}),
              StatusIs(StatusCode::kInvalidArgument, "at least one"));
  EXPECT_THAT(s->partial_run_setup({"nope:0"}, {}), StatusIs(StatusCode::kNotFound, "nope"));
  PartialRunHandle empty;
  EXPECT_THAT(s->partial_run(empty, {}, {m.r1}), StatusIs(StatusCode::kInvalidArgument, "setup"));
  // A handle of another session is unknown here.
  auto other = make_session(m.g);
  auto foreign = other->partial_run_setup({m.r1}, {m.x});
  ASSERT_THAT(foreign, IsOk());
  EXPECT_THAT(s->partial_run(*foreign, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              StatusIs(StatusCode::kInvalidArgument, "does not belong to this session"));
  EXPECT_THAT(s->cancel_partial_run(*foreign),
              StatusIs(StatusCode::kInvalidArgument, "does not belong to this session"));
  EXPECT_THAT(other->partial_run(*foreign, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}), IsOk());
}

TEST_P(PartialRunTest, KernelErrorEndsTheRun) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt32, Shape{}, "x");
  Output zero = ops::Const(g, Tensor(0), "zero");
  Output bad = ops::Div(g, x, zero, "bad");
  Output ok = ops::Identity(g, x, "ok");
  auto s = make_session(g);
  auto h = s->partial_run_setup({ok, bad}, {x});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(s->partial_run(*h, {{x, Tensor(1)}}, {bad}),
              StatusIs(StatusCode::kInvalidArgument, "node 'bad' (Div)"));
  EXPECT_THAT(s->partial_run(*h, {}, {ok}),
              StatusIs(StatusCode::kInvalidArgument, "node 'bad' (Div)"));
  EXPECT_TRUE(h->is_done());
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
}

TEST_P(PartialRunTest, CancelAndClose) {
  Seed m;
  auto s = make_session(m.g);
  auto h = s->partial_run_setup({m.r1, m.r2}, {m.x});
  ASSERT_THAT(h, IsOk());
  ASSERT_TRUE(s->cancel_partial_run(*h).is_ok());
  EXPECT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              StatusIs(StatusCode::kCancelled, "cancelled"));
  auto h2 = s->partial_run_setup({m.r1, m.r2}, {m.x});
  ASSERT_THAT(h2, IsOk());
  EXPECT_EQ(s->num_open_partial_runs(), 1u);
  ASSERT_TRUE(s->close().is_ok());
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  EXPECT_THAT(s->partial_run(*h2, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              StatusIs(StatusCode::kCancelled, "Session has been closed."));
  EXPECT_THAT(s->partial_run_setup({m.r1}, {m.x}), StatusIs(StatusCode::kCancelled, "closed"));
}

TEST_P(PartialRunTest, DeadlineEndsTheRun) {
  Graph g;
  std::atomic<int> n{0};
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output slow = stage(g, x, &n, 1.0f, "slow", std::chrono::milliseconds(200));
  auto s = make_session(g);
  auto h = s->partial_run_setup({slow}, {x});
  ASSERT_THAT(h, IsOk());
  RunOptions o;
  o.timeout = std::chrono::milliseconds(20);
  EXPECT_THAT(s->partial_run(*h, {{x, Tensor(1.0f)}}, {slow}, {}, o),
              StatusIs(StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_TRUE(h->is_done());
}

TEST_P(PartialRunTest, StopTokenOfACallCancelsTheRun) {
  Graph g;
  std::atomic<int> n{0};
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output slow = stage(g, x, &n, 1.0f, "slow", std::chrono::milliseconds(200));
  Output after = stage(g, slow, &n, 1.0f, "after");
  auto s = make_session(g);
  auto h = s->partial_run_setup({after}, {x});
  ASSERT_THAT(h, IsOk());
  std::stop_source stop;
  RunOptions o;
  o.stop_token = stop.get_token();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stop.request_stop();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(s->partial_run(*h, {{x, Tensor(1.0f)}}, {after}, {}, o),
              StatusIs(StatusCode::kCancelled, "the call was cancelled by its caller"));
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(h->is_done());
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  EXPECT_EQ(n.load(), 1);  // 'slow' finished; 'after' never started
}

TEST_P(PartialRunTest, StopTokenOfTheSetupCancelsTheRunBetweenCalls) {
  Seed m;
  auto s = make_session(m.g);
  std::stop_source stop;
  RunOptions o;
  o.stop_token = stop.get_token();
  auto h = s->partial_run_setup({m.r1, m.r2}, {m.x}, {}, o);
  ASSERT_THAT(h, IsOk());
  stop.request_stop();  // no call in progress: the next call reports it
  EXPECT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              StatusIs(StatusCode::kCancelled, "was cancelled by its caller"));
  EXPECT_TRUE(h->is_done());
  EXPECT_EQ(m.expensive.load(), 0);
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  // Stopped before the setup: the same.
  auto h2 = s->partial_run_setup({m.r1}, {m.x}, {}, o);
  ASSERT_THAT(h2, IsOk());
  EXPECT_THAT(s->partial_run(*h2, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              StatusIs(StatusCode::kCancelled, "cancelled by its caller"));
  EXPECT_EQ(m.expensive.load(), 0);
  // An unstopped token changes nothing.
  std::stop_source unused;
  o.stop_token = unused.get_token();
  auto h3 = s->partial_run_setup({m.r1}, {m.x}, {}, o);
  ASSERT_THAT(h3, IsOk());
  EXPECT_THAT(s->partial_run(*h3, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}, {}, o),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor{2.0f, 2.0f}))));
}

TEST_P(PartialRunTest, LimitAndIdleTimeout) {
  Seed m;
  SessionOptions o;
  o.max_open_partial_runs = 2;
  o.partial_run_idle_timeout = std::chrono::milliseconds(30);
  auto s = make_session(m.g, o);
  auto a = s->partial_run_setup({m.r1}, {m.x});
  auto b = s->partial_run_setup({m.r1}, {m.x});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_THAT(s->partial_run_setup({m.r1}, {m.x}),
              StatusIs(StatusCode::kResourceExhausted, "too many open partial runs"));
  for (int i = 0; i < 100 && s->num_open_partial_runs() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  EXPECT_THAT(s->partial_run(*a, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}),
              StatusIs(StatusCode::kCancelled, "idle"));
}

TEST_P(PartialRunTest, TracingReportsTheWorkOfEachCall) {
  Graph g;
  std::atomic<int> n1{0};
  std::atomic<int> n2{0};
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  Output r1 = stage(g, x, &n1, 2.0f, "expensive");
  // Needs y, so it cannot run before the second call.
  Output r2 = stage(g, ops::Add(g, r1, y), &n2, 10.0f, "another_expensive");
  auto s = make_session(g);
  auto h = s->partial_run_setup({r1, r2}, {x, y});
  ASSERT_THAT(h, IsOk());
  RunOptions o;
  o.trace = true;
  RunMetadata md1, md2;
  ASSERT_THAT(s->partial_run(*h, {{x, Tensor(1.0f)}}, {r1}, {}, o, &md1), IsOk());
  ASSERT_THAT(s->partial_run(*h, {{y, Tensor(1.0f)}}, {r2}, {}, o, &md2), IsOk());
  auto names = [](const RunMetadata& md) {
    std::vector<std::string> n;
    for (const auto& st : md.step_stats) n.push_back(st.node);
    return n;
  };
  EXPECT_THAT(names(md1), ::testing::Contains("expensive"));
  EXPECT_THAT(names(md1), ::testing::Not(::testing::Contains("another_expensive")));
  EXPECT_THAT(names(md2), ::testing::Not(::testing::Contains("expensive")));
  EXPECT_THAT(names(md2), ::testing::Contains("another_expensive"));
}

// The call that fetches the last fetch also awaits every target; a target
// named in that call as well is awaited once, and still awaited.
TEST_P(PartialRunTest, LastCallWaitsForATargetItAlsoNames) {
  Graph g;
  std::atomic<int> n{0};
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output d = ops::Neg(g, x, "d");
  Output later = stage(g, d, &n, 1.0f, "later", std::chrono::milliseconds(50));
  const Node* done = ops::Group(g, {later.node()}, "done");
  auto s = make_session(g);
  auto h = s->partial_run_setup({d}, {x}, {done});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(s->partial_run(*h, {{x, Tensor(2.0f)}}, {d}, {done}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(-2.0f)))));
  EXPECT_EQ(n.load(), 1);
  EXPECT_TRUE(h->is_done());
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
}

// Scalar math: cheap kernels, run inline as lightweight nodes, on both sides
// of the calls (the plan keeps a fetched node's successors default-policy).
TEST_P(PartialRunTest, CheapNodesRunOncePerCallAndTraceWhereTheyRan) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  Output c = ops::Const(g, Tensor(1.0f), "c");
  Output a = ops::Neg(g, ops::Add(g, x, c, "xc"), "a");     // -(x + 1)
  Output b = ops::Mul(g, ops::Square(g, a, "a2"), y, "b");  // (x + 1)^2 * y
  Output d = ops::Sub(g, b, a, "d");
  const Node* done = ops::Group(g, {d.node()}, "done");
  ASSERT_THAT(g.status(), IsOk());
  auto s = make_session(g);
  RunOptions o;
  o.trace = true;
  for (int i = 0; i < 3; ++i) {
    auto h = s->partial_run_setup({a, d}, {x, y}, {done});
    ASSERT_THAT(h, IsOk());
    RunMetadata md1, md2;
    EXPECT_THAT(s->partial_run(*h, {{x, Tensor(2.0f)}}, {a}, {}, o, &md1),
                IsOkAndHolds(ElementsAre(TensorEq(Tensor(-3.0f)))));
    EXPECT_THAT(s->partial_run(*h, {{y, Tensor(2.0f)}}, {d}, {done}, o, &md2),
                IsOkAndHolds(ElementsAre(TensorEq(Tensor(21.0f)))));
    EXPECT_TRUE(h->is_done());
    std::multiset<std::string> ran;
    for (const RunMetadata* md : {&md1, &md2}) {
      for (const auto& st : md->step_stats) ran.insert(st.node);
    }
    // Every node exactly once over the two calls (c may have run at setup).
    for (const char* n : {"xc", "a", "a2", "b", "d", "done"}) EXPECT_EQ(ran.count(n), 1u) << n;
    for (const auto& st : md2.step_stats) EXPECT_NE(st.node, "a") << "ran in call 1";
  }
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
}

TEST_P(PartialRunTest, SameHandleFromTwoThreadsIsSerializedOrRefused) {
  Graph g;
  std::atomic<int> n{0};
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output slow = stage(g, x, &n, 1.0f, "slow", std::chrono::milliseconds(100));
  auto s = make_session(g);
  auto h = s->partial_run_setup({slow}, {x});
  ASSERT_THAT(h, IsOk());
  std::thread t([&] { EXPECT_THAT(s->partial_run(*h, {{x, Tensor(1.0f)}}, {slow}), IsOk()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto second = s->partial_run(*h, {}, {slow});
  t.join();
  EXPECT_FALSE(second.is_ok());
  EXPECT_TRUE(second.status().code() == StatusCode::kFailedPrecondition ||
              second.status().code() == StatusCode::kInvalidArgument)
      << second.status().to_string();
}

// Ids are 128 random bits: distinct across handles, threads and sessions
// (each thread draws from its own buffer of kernel randomness).
TEST_P(PartialRunStressTest, HandleIdsAreDistinctAcrossThreadsAndSessions) {
  Seed m;
  auto s1 = make_session(m.g);
  auto s2 = make_session(m.g);
  std::mutex mu;
  std::set<std::string> ids;
  std::vector<std::thread> threads;
  constexpr int kPerThread = 200;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Session& s = t % 2 == 0 ? *s1 : *s2;
      for (int i = 0; i < kPerThread; ++i) {
        auto h = s.partial_run_setup({m.r1}, {m.x});
        ASSERT_THAT(h, IsOk());
        std::lock_guard lock(mu);
        ids.insert(h->id());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ids.size(), 4u * kPerThread);
}

TEST_P(PartialRunStressTest, AbandonedHandlesLeakNothing) {
  Seed m;
  auto s = make_session(m.g);
  ASSERT_THAT(s->run({{m.x, Tensor{1.0f, 1.0f}}}, {m.r2}), IsOk());  // warm the plan cache
  const int64_t live_before = sched::FlowInstance::live_count();
  for (int i = 0; i < 3000; ++i) {
    auto h = s->partial_run_setup({m.r1, m.r2}, {m.x});
    ASSERT_THAT(h, IsOk());
    if (i % 3 == 1) {
      ASSERT_THAT(s->partial_run(*h, {{m.x, Tensor{1.0f, 1.0f}}}, {m.r1}), IsOk());
    }
    // destroyed unfinished
  }
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  // Only the plan's bounded pool of idle instances remains.
  EXPECT_LE(sched::FlowInstance::live_count() - live_before,
            static_cast<int64_t>(sched::InstancePool::kMaxIdle));
}

TEST_P(PartialRunStressTest, ManyPartialRunsAndRunsFromManyThreads) {
  Graph g;
  Output v = ops::Variable(g, Tensor(0), "v");
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output x = ops::Placeholder(g, DType::kInt32, Shape{}, "x");
  Output bump = ops::AssignAdd(g, v, ops::Const(g, Tensor(1)), {}, "bump");
  Output y = ops::Add(g, x, x, "y");
  auto s = make_session(g);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  constexpr int kThreads = 4;
  constexpr int kIters = 150;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        if ((i + t) % 3 == 0) {
          if (!s->run({}, {}, {bump.node()}).is_ok()) ++wrong;
          continue;
        }
        auto h = s->partial_run_setup({bump, y}, {x});
        if (!h.is_ok()) {
          ++wrong;
          continue;
        }
        if (!s->partial_run(*h, {}, {bump}).is_ok()) ++wrong;
        if ((i + t) % 3 == 2) continue;  // abandoned after the bump
        auto r = s->partial_run(*h, {{x, Tensor(i)}}, {y});
        if (!r.is_ok() || (*r)[0].scalar<int32_t>() != 2 * i) ++wrong;
      }
    });
  }
  // A second signature, open at the same time as the others.
  threads.emplace_back([&] {
    for (int i = 0; i < kIters; ++i) {
      auto h = s->partial_run_setup({y}, {x});
      if (!h.is_ok()) {
        ++wrong;
        continue;
      }
      auto r = s->partial_run(*h, {{x, Tensor(-i)}}, {y});
      if (!r.is_ok() || (*r)[0].scalar<int32_t>() != -2 * i) ++wrong;
    }
  });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_THAT(s->run({}, {v}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(kThreads * kIters)))));
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
}

std::string path_name(const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "Inline" : "FlowGraph";
}
INSTANTIATE_TEST_SUITE_P(Paths, PartialRunTest, ::testing::Bool(), path_name);
INSTANTIATE_TEST_SUITE_P(Paths, PartialRunStressTest, ::testing::Bool(), path_name);

}  // namespace
}  // namespace graphrun
