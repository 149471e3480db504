// A call that waits for a thread of its session's pool (all busy) still
// honours its deadline, its stop token and the session's close(); thread
// counts past ThreadPool::max_threads() are refused.
//
// Each case blocks the pool's only thread with a kernel that waits on a
// Gate until the test opens it (or 20 s pass, so that a regression fails
// instead of hanging), and checks that the waiting call returned while the
// gate was still shut: no timing is asserted.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stop_token>
#include <thread>

#include "tests/testing/gate.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::Gate;
using ::graphrun::testing::IsOk;
using ::graphrun::testing::StatusIs;

// "block": a kernel that holds its thread until the gate opens; "sq": an
// unrelated Square of x.
struct Blocked {
  Graph g;
  Output block;
  Output x;
  Output sq;
  explicit Blocked(Gate& gate) {
    block = ops::Call(
        g, {}, {DType::kFloat32},
        [&gate](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
          gate.enter_and_wait();
          return std::vector<Tensor>{Tensor(1.0f)};
        },
        {}, "block")[0];
    x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    sq = ops::Square(g, x, "sq");
  }
};

std::unique_ptr<Session> one_thread_session(const Graph& g) {
  SessionOptions options;
  options.inter_op_threads = 1;
  return Session::create(g, options).value();
}

// Runs "block" on another thread and returns once its kernel holds the
// pool's only thread.
std::future<Result<std::vector<Tensor>>> occupy(Session& s, Blocked& m, Gate& gate) {
  auto done = std::async(std::launch::async, [&s, &m] { return s.run({}, {m.block}); });
  gate.await_entered();
  return done;
}

TEST(PoolWaitTest, RunWaitingForAThreadHonoursItsDeadline) {
  Gate gate;
  Blocked m(gate);
  auto s = one_thread_session(m.g);
  auto blocker = occupy(*s, m, gate);
  RunOptions options;
  options.timeout = std::chrono::milliseconds(200);
  const auto r = s->run({{m.x, Tensor(3.0f)}}, {m.sq}, {}, options);
  EXPECT_FALSE(gate.is_open()) << "the run returned only when the thread came free";
  EXPECT_THAT(r, StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
  gate.open();
  EXPECT_THAT(blocker.get(), IsOk());
  // The session works on.
  EXPECT_THAT(s->run({{m.x, Tensor(3.0f)}}, {m.sq}), IsOk());
}

TEST(PoolWaitTest, CallableWaitingForAThreadHonoursItsDeadline) {
  Gate gate;
  Blocked m(gate);
  auto s = one_thread_session(m.g);
  Callable square = s->make_callable({m.x}, {m.sq}).value();
  auto blocker = occupy(*s, m, gate);
  RunOptions options;
  options.timeout = std::chrono::milliseconds(200);
  const Tensor feeds[] = {Tensor(3.0f)};
  Tensor out[1];
  const Status st = square.run(feeds, out, options);
  EXPECT_FALSE(gate.is_open());
  EXPECT_THAT(st, StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
  gate.open();
  EXPECT_THAT(blocker.get(), IsOk());
  EXPECT_THAT(square.run(feeds, out), IsOk());
  EXPECT_EQ(out[0].scalar<float>(), 9.0f);
}

TEST(PoolWaitTest, RunWaitingForAThreadHonoursItsStopToken) {
  Gate gate;
  Blocked m(gate);
  auto s = one_thread_session(m.g);
  auto blocker = occupy(*s, m, gate);
  std::stop_source stop;
  RunOptions options;
  options.stop_token = stop.get_token();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop.request_stop();
  });
  const auto r = s->run({{m.x, Tensor(3.0f)}}, {m.sq}, {}, options);
  stopper.join();
  EXPECT_FALSE(gate.is_open());
  EXPECT_THAT(r, StatusIs(StatusCode::kCancelled, "cancelled by its caller"));
  gate.open();
  EXPECT_THAT(blocker.get(), IsOk());
}

TEST(PoolWaitTest, RunWaitingForAThreadReturnsWhenTheSessionCloses) {
  Gate gate;
  Blocked m(gate);
  auto s = one_thread_session(m.g);
  auto blocker = occupy(*s, m, gate);
  auto waiting = std::async(std::launch::async, [&] {
    return s->run({{m.x, Tensor(3.0f)}}, {m.sq});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it wait
  ASSERT_THAT(s->close(), IsOk());
  const auto r = waiting.get();
  EXPECT_FALSE(gate.is_open());
  EXPECT_THAT(r, StatusIs(StatusCode::kCancelled, "Session has been closed."));
  gate.open();
  // The blocker ran before the close: OK, or Cancelled at its next node.
  const Status blocked = blocker.get().status();
  EXPECT_TRUE(blocked.is_ok() || blocked.code() == StatusCode::kCancelled) << blocked.to_string();
}

TEST(PoolWaitTest, ClosingOneSessionDoesNotCancelAnotherWaitingOnTheSharedPool) {
  Gate gate;
  Blocked a(gate);
  Blocked b(gate);
  SessionOptions shared;
  shared.thread_pool = ThreadPool::create(1).value();
  auto sa = Session::create(a.g, shared).value();
  auto sb = Session::create(b.g, shared).value();
  auto blocker = occupy(*sa, a, gate);
  auto waiting = std::async(std::launch::async, [&] {
    return sb->run({{b.x, Tensor(3.0f)}}, {b.sq});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_THAT(sa->close(), IsOk());
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "session b's run gave up when session a closed";
  gate.open();
  const auto r = waiting.get();
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].scalar<float>(), 9.0f);
  // Session a's own run: OK, or Cancelled at its next node after the close.
  const Status blocked = blocker.get().status();
  EXPECT_TRUE(blocked.is_ok() || blocked.code() == StatusCode::kCancelled) << blocked.to_string();
}

TEST(PoolWaitTest, PartialRunCallWaitingForAThreadHonoursItsDeadline) {
  Gate gate;
  Blocked m(gate);
  auto s = one_thread_session(m.g);
  auto h = s->partial_run_setup({m.sq}, {m.x}).value();
  auto blocker = occupy(*s, m, gate);
  RunOptions options;
  options.timeout = std::chrono::milliseconds(200);
  const auto r = s->partial_run(h, {{m.x, Tensor(3.0f)}}, {m.sq}, {}, options);
  EXPECT_FALSE(gate.is_open());
  EXPECT_THAT(r, StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
  // An expired call deadline ends the run, without waiting for the busy
  // pool to clean it up.
  EXPECT_TRUE(h.is_done());
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  EXPECT_THAT(s->partial_run(h, {{m.x, Tensor(3.0f)}}, {m.sq}),
              StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
  gate.open();
  EXPECT_THAT(blocker.get(), IsOk());
  // The next step cleaned the ended run up; the session works on.
  EXPECT_THAT(s->run({{m.x, Tensor(3.0f)}}, {m.sq}), IsOk());
}

TEST(PoolWaitTest, PartialRunSetupWaitingForAThreadHonoursItsStopToken) {
  Gate gate;
  Blocked m(gate);
  auto s = one_thread_session(m.g);
  auto blocker = occupy(*s, m, gate);
  std::stop_source stop;
  stop.request_stop();
  RunOptions options;
  options.stop_token = stop.get_token();
  const auto h = s->partial_run_setup({m.sq}, {m.x}, {}, options);
  EXPECT_FALSE(gate.is_open());
  EXPECT_THAT(h.status(), StatusIs(StatusCode::kCancelled, "cancelled"));
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  gate.open();
  EXPECT_THAT(blocker.get(), IsOk());
}

// A kernel of a 1-thread session starts a std::thread that runs the same
// session and joins it: the inner run can never get the thread, and its
// deadline ends the wait (before the fix both waited forever).
TEST(PoolWaitTest, NestedRunFromAThreadOfAKernelEndsAtItsDeadline) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output sq = ops::Square(g, x, "sq");
  std::unique_ptr<Session> s;
  Status inner = Status::ok();
  Output nest = ops::Call(
      g, {}, {DType::kFloat32},
      [&](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
        std::thread t([&] {
          RunOptions options;
          options.timeout = std::chrono::milliseconds(300);
          inner = s->run({{x, Tensor(2.0f)}}, {sq}, {}, options).status();
        });
        t.join();
        return std::vector<Tensor>{Tensor(0.0f)};
      },
      {}, "nest")[0];
  s = one_thread_session(g);
  RunOptions options;
  options.timeout = std::chrono::seconds(10);
  EXPECT_THAT(s->run({}, {nest}, {}, options), IsOk());
  EXPECT_THAT(inner, StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
}

TEST(PoolWaitTest, ThreadCountsPastTheCapAreInvalidArgument) {
  const int cap = ThreadPool::max_threads();
  EXPECT_GE(cap, ThreadPool::kMinMaxThreads);
  EXPECT_EQ(cap, std::max(ThreadPool::kMinMaxThreads,
                          ThreadPool::kMaxThreadsPerCore * ThreadPool::default_threads()));
  for (const int threads : {cap + 1, 65537, 10'000'000, 2147483647}) {
    EXPECT_THAT(
        ThreadPool::create(threads).status(),
        StatusIs(StatusCode::kInvalidArgument, "threads = " + std::to_string(threads) +
                                                   " exceeds the limit of " + std::to_string(cap)));
    Graph g;
    ops::Const(g, Tensor(1.0f), "one");
    SessionOptions options;
    options.inter_op_threads = threads;
    EXPECT_THAT(Session::create(g, options).status(),
                StatusIs(StatusCode::kInvalidArgument,
                         "SessionOptions::inter_op_threads = " + std::to_string(threads) +
                             " exceeds the limit of " + std::to_string(cap)));
  }
  // At the cap: a pool that works and is destroyed cleanly.
  auto pool = ThreadPool::create(cap);
  ASSERT_THAT(pool.status(), IsOk());
  EXPECT_EQ((*pool)->num_threads(), cap);
  Graph g;
  Output one = ops::Const(g, Tensor(1.0f), "one");
  SessionOptions options;
  options.thread_pool = *pool;
  EXPECT_THAT(Session::create(g, options).value()->run({}, {one}), IsOk());
}

}  // namespace
}  // namespace graphrun
