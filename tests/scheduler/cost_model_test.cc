// Inlining by measured cost, through a Session: a user's Call node with an
// empty body ends up running on the calling thread without the flow graph;
// one that turns expensive gets a task again; a fan-out of expensive nodes
// is never serialized, whatever their hint; long chains with an expensive
// node in the middle run exactly once per node per step.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <graphrun/graphrun.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <oneapi/tbb/task.h>

#include "scheduler/thread_pool.h"
#include "tests/testing/op_harness.h"

namespace graphrun::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Busy for `us` microseconds (a kernel's work, measured in cycles).
void spin_for(int64_t us) {
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

// Probe sessions' size, and their threshold: high, so that an empty
// body counts as cheap also in sanitizer builds (whose instrumented kernel
// path takes far more than the default 8000 cycles); the expensive phase
// spins well above it.
int probe_threads() { return 2; }
constexpr int64_t kProbeCycles = 2'000'000;
constexpr int64_t kExpensiveUs = 5000;

// Whether the running kernel runs inside a oneTBB arena: as a flow-graph
// step's task (on the caller or a worker), or called in order by a serial
// step's caller inside the pool's arena, not by a caller running an inline
// step's nodes itself outside it.
bool in_some_arena() {
  return ThreadPool::Impl::marks.in_arena != nullptr || tbb::task::current_context() != nullptr;
}

// A session of `threads` with the default threshold.
std::unique_ptr<Session> session_of(const Graph& g, int threads) {
  SessionOptions options;
  options.inter_op_threads = threads;
  Result<std::unique_ptr<Session>> s = Session::create(g, options);
  EXPECT_THAT(s.status(), IsOk());
  return s.is_ok() ? std::move(*s) : nullptr;
}

// A chain of `n` Call nodes n0 -> n1 -> ... (control edges), node i running
// body(i); returns the last (null if the graph refused a node: g.status()).
const Node* call_chain(Graph& g, int n, std::function<void(int)> body) {
  auto shared = std::make_shared<std::function<void(int)>>(std::move(body));
  Node* prev = nullptr;
  for (int i = 0; i < n; ++i) {
    ops::Call(
        g, {}, {},
        [shared, i](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
          (*shared)(i);
          return std::vector<Tensor>();
        },
        {}, fmt::format("n{}", i));
    if (!g.status().is_ok()) return nullptr;
    Node* node = g.mutable_node(g.num_nodes() - 1);
    if (prev != nullptr && !g.add_control_input(node, prev).is_ok()) return nullptr;
    prev = node;
  }
  return prev;
}

// One Call node whose body reports where it ran and spins `*work_us`.
struct Probe {
  std::atomic<int64_t> work_us{0};
  std::atomic<bool> in_arena{false};
  const Node* node = nullptr;

  void add(Graph& g) {
    ops::Call(
        g, {}, {},
        [this](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
          in_arena.store(in_some_arena());
          spin_for(work_us.load());
          return std::vector<Tensor>();
        },
        {}, "probe");
    node = g.node(g.num_nodes() - 1);
  }
};

// A session running the probe as its only target, prepared.
class ProbeTest : public ::testing::Test {
 protected:
  void prepare(bool inline_nodes = true) {
    probe_.add(g_);
    ASSERT_THAT(g_.status(), IsOk());
    SessionOptions options;
    options.inter_op_threads = probe_threads();
    options.inline_cheap_nodes = inline_nodes;
    options.inline_below_cycles = kProbeCycles;
    Result<std::unique_ptr<Session>> s = Session::create(g_, options);
    ASSERT_THAT(s.status(), IsOk());
    session_ = std::move(*s);
    Result<Callable> c = session_->make_callable({}, {}, {probe_.node});
    ASSERT_THAT(c.status(), IsOk());
    callable_.emplace(std::move(*c));
  }
  // One step; whether the probe ran in the pool's arena (expensive) rather
  // than on the caller outside it (cheap, an inline step).
  bool step() {
    EXPECT_THAT(callable_->run({}, {}), IsOk());
    return probe_.in_arena.load();
  }
  // Steps until the probe runs in a task (`in_task`) or inline; false if it
  // does not within kMaxSteps (sampled steps come 1 in 16).
  static constexpr int kMaxSteps = 400;
  bool steps_until(bool in_task) {
    for (int i = 0; i < kMaxSteps; ++i) {
      if (step() == in_task) return true;
    }
    return false;
  }

  Graph g_;
  Probe probe_;
  std::unique_ptr<Session> session_;
  std::optional<Callable> callable_;
};

TEST_F(ProbeTest, ACheapCallEndsUpOnTheCallingThread) {
  ASSERT_NO_FATAL_FAILURE(prepare());
  // Not declared cheap: the first step gives it a task in the pool.
  EXPECT_TRUE(step());
  // Measured cheap over the first steps (the fastest of 3 decides): from
  // then on the caller runs it.
  EXPECT_TRUE(steps_until(false)) << "still a task after " << kMaxSteps << " steps";
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(step()) << "step " << i;
}

// Its first samples decide by the fastest: a slow first step (cold caches,
// page faults) does not keep a cheap node off the calling thread, so a
// large plan settles in one policy change.
TEST_F(ProbeTest, ASlowFirstSampleDoesNotDelayInlining) {
  ASSERT_NO_FATAL_FAILURE(prepare());
  probe_.work_us.store(kExpensiveUs);
  EXPECT_TRUE(step());  // slow, and a task
  probe_.work_us.store(0);
  EXPECT_TRUE(step());
  EXPECT_TRUE(step());  // the last learning sample: the policy changes after it
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(step()) << "step " << i;
}

// And a node that is slow in every learning sample stays a task.
TEST_F(ProbeTest, ACallSlowInEveryFirstSampleKeepsItsTask) {
  ASSERT_NO_FATAL_FAILURE(prepare());
  probe_.work_us.store(kExpensiveUs);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(step()) << "step " << i;
}

TEST_F(ProbeTest, ACallThatTurnsExpensiveGetsATaskAgain) {
  ASSERT_NO_FATAL_FAILURE(prepare());
  ASSERT_TRUE(steps_until(false)) << "never inline";
  // Far above the inline threshold: sampled steps notice.
  probe_.work_us.store(kExpensiveUs);
  EXPECT_TRUE(steps_until(true)) << "still inline after " << kMaxSteps << " steps";
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(step());
  // And back when it is cheap again.
  probe_.work_us.store(0);
  EXPECT_TRUE(steps_until(false)) << "still a task after " << kMaxSteps << " steps";
}

// Two expensive Calls that each wait for the other to start (up to
// `patience`): they overlap only if the step runs them in parallel.
class FanOutTest : public ::testing::TestWithParam<bool> {};

TEST_P(FanOutTest, ExpensiveCallsOfAFanOutRunInParallel) {
  const bool cheap_hint = GetParam();
  Graph g;
  std::atomic<int> arrived{0};
  std::atomic<int> alone{0};  // bodies that gave up waiting
  // A wrong cheap hint serializes the first steps, so while it is being
  // corrected each body waits only 20 ms. The steps checked wait up to 5 s:
  // on a loaded machine (the sanitizer suites run two test processes on
  // two cores) the thread that takes the second node may not run for
  // tens of milliseconds, which is not serialization.
  std::atomic<int> patience_ms{cheap_hint ? 20 : 5000};
  ops::CallAttrs attrs;
  attrs.cheap = cheap_hint;
  auto body = [&](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
    spin_for(100);
    arrived.fetch_add(1);
    const auto until = Clock::now() + std::chrono::milliseconds(patience_ms.load());
    while (arrived.load() < 2 && Clock::now() < until) std::this_thread::yield();
    if (arrived.load() < 2) alone.fetch_add(1);
    return std::vector<Tensor>();
  };
  ops::Call(g, {}, {}, body, attrs, "left");
  const Node* left = g.node(g.num_nodes() - 1);
  ops::Call(g, {}, {}, body, attrs, "right");
  const Node* right = g.node(g.num_nodes() - 1);
  const Node* join = ops::Group(g, {left, right}, "join");
  ASSERT_THAT(g.status(), IsOk());
  auto session = session_of(g, 2);
  ASSERT_NE(session, nullptr);
  Result<Callable> callable = session->make_callable({}, {}, {join});
  ASSERT_THAT(callable.status(), IsOk());
  // A wrong hint is corrected by the first measured steps.
  if (cheap_hint) {
    for (int i = 0; i < 8; ++i) {
      arrived.store(0);
      ASSERT_THAT(callable->run({}, {}), IsOk());
    }
    alone.store(0);
    patience_ms.store(5000);
  }
  for (int i = 0; i < 40; ++i) {
    arrived.store(0);
    ASSERT_THAT(callable->run({}, {}), IsOk());
  }
  EXPECT_EQ(alone.load(), 0) << "the two expensive nodes ran one after the other";
}

INSTANTIATE_TEST_SUITE_P(Hints, FanOutTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "DeclaredCheap" : "Default";
                         });

TEST(CostModelTest, LongChainsAroundAnExpensiveNodeRunEveryNodeOnce) {
  // Cheap nodes around one expensive node: lightweight runs, bounded, on
  // both sides of a task.
  constexpr int kNodes = 20000;
  Graph g;
  std::atomic<int64_t> runs{0};
  const Node* prev = call_chain(g, kNodes, [&runs](int i) {
    if (i == kNodes / 2) spin_for(100);
    runs.fetch_add(1, std::memory_order_relaxed);
  });
  ASSERT_THAT(g.status(), IsOk());
  ASSERT_NE(prev, nullptr);
  auto session = session_of(g, 2);
  ASSERT_NE(session, nullptr);
  Result<Callable> callable = session->make_callable({}, {}, {prev});
  ASSERT_THAT(callable.status(), IsOk());
  constexpr int kSteps = 24;
  for (int i = 0; i < kSteps; ++i) ASSERT_THAT(callable->run({}, {}), IsOk());
  EXPECT_EQ(runs.load(), int64_t{kSteps} * kNodes);
}

TEST(CostModelTest, AChainOfExpensiveCallsRunsOnTheCallingThread) {
  // No two of them could run at once: the caller runs the chain itself (a
  // serial policy), never a worker, at 1 and 2 threads; each node once.
  for (const int threads : {1, 2}) {
    constexpr int kNodes = 4;
    Graph g;
    std::atomic<int64_t> runs{0};
    std::atomic<int64_t> elsewhere{0};  // bodies not on the calling thread
    std::thread::id caller;
    const Node* prev = call_chain(g, kNodes, [&](int) {
      spin_for(50);  // far above 8000 cycles
      if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
      runs.fetch_add(1);
    });
    ASSERT_THAT(g.status(), IsOk());
    ASSERT_NE(prev, nullptr);
    auto session = session_of(g, threads);
    ASSERT_NE(session, nullptr);
    Result<Callable> callable = session->make_callable({}, {}, {prev});
    ASSERT_THAT(callable.status(), IsOk());
    constexpr int kSteps = 50;
    for (int i = 0; i < kSteps; ++i) {
      caller = std::this_thread::get_id();
      ASSERT_THAT(callable->run({}, {}), IsOk());
      // A step on another thread: the chain follows its caller.
      std::thread other([&] {
        caller = std::this_thread::get_id();
        EXPECT_THAT(session->run({}, {}, {prev}), IsOk());
      });
      other.join();
    }
    EXPECT_EQ(runs.load(), int64_t{2} * kSteps * kNodes) << threads << " threads";
    EXPECT_EQ(elsewhere.load(), 0) << threads << " threads";
  }
}

TEST_F(ProbeTest, InliningOffGivesEveryNodeATask) {
  ASSERT_NO_FATAL_FAILURE(prepare(/*inline_nodes=*/false));
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(step()) << "step " << i;
}

TEST(CostModelTest, ANonPositiveThresholdIsRefused) {
  Graph g;
  ops::NoOp(g, "n");
  for (const int64_t bad : {int64_t{0}, int64_t{-5}}) {
    SessionOptions options;
    options.inline_below_cycles = bad;
    Result<std::unique_ptr<Session>> s = Session::create(g, options);
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("inline_below_cycles"), std::string::npos)
        << s.status().to_string();
  }
}

}  // namespace
}  // namespace graphrun::testing
