// Session::run_async and Callable::run_async: the same results and errors
// as the blocking calls, `done` exactly once (under races with stop,
// deadline and close), queued calls that hold no thread, the destructor
// waiting for pending dones, calls started from `done`.
//
// Blocking cases hold the pool's only thread with a kernel that waits on a
// Gate until the test opens it (or 20 s pass, so that a regression fails
// instead of hanging). No timing is asserted.
#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/gate.h"
#include "tests/testing/op_harness.h"
#include "tests/testing/process.h"
#include "tests/testing/threads.h"

namespace graphrun {
namespace {

using ::graphrun::testing::Gate;
using ::graphrun::testing::IsOk;
using ::graphrun::testing::process_thread_count;
using ::graphrun::testing::StatusIs;
using Fetched = Result<std::vector<Tensor>>;

// Counts calls of done and keeps the last result; wait() blocks until `n`
// calls arrived (20 s at most).
class Dones {
 public:
  RunDone make() {
    return [this](Fetched r, RunMetadata*) {
      // Notified under the lock: a waiter that returns (and may destroy
      // this) cannot do so before the notification is over.
      const std::lock_guard lock(mu_);
      ++calls_;
      if (!r.is_ok()) ++errors_;
      last_ = std::move(r);
      cv_.notify_all();
    };
  }
  bool wait(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return calls_ >= n; });
  }
  int calls() {
    const std::lock_guard lock(mu_);
    return calls_;
  }
  int errors() {
    const std::lock_guard lock(mu_);
    return errors_;
  }
  Fetched last() {
    const std::lock_guard lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
  int errors_ = 0;
  Fetched last_ = Status(cancelled("no call yet"));
};

std::unique_ptr<Session> session_with_threads(const Graph& g, int threads) {
  SessionOptions options;
  options.inter_op_threads = threads;
  return Session::create(g, options).value();
}

// x -> sq = Square(x) -> plus = sq + 1 (through Call nodes: `cheap` makes
// the plan run inline on the caller, else it runs on the flow graph).
struct Small {
  Graph g;
  Output x;
  Output sq;
  Output plus;
  explicit Small(bool cheap) {
    x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    ops::CallAttrs attrs;
    attrs.cheap = cheap;
    attrs.stateful = false;
    sq = ops::Call(
        g, {x}, {DType::kFloat32},
        [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
          const float v = in[0].scalar<float>();
          return std::vector<Tensor>{Tensor(v * v)};
        },
        attrs, "sq")[0];
    plus = ops::Call(
        g, {sq}, {DType::kFloat32},
        [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
          return std::vector<Tensor>{Tensor(in[0].scalar<float>() + 1.0f)};
        },
        attrs, "plus")[0];
  }
};

// "block" holds its thread until the gate opens, then feeds "after".
struct Blocked {
  Graph g;
  Output block;
  Output after;
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
    after = ops::Square(g, block, "after");
    x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    sq = ops::Square(g, x, "sq");
  }
};

class RunAsyncTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(Plans, RunAsyncTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "Inline" : "FlowGraph";
                         });

TEST_P(RunAsyncTest, DeliversTheFetchesInOrder) {
  Small m(GetParam());
  auto s = session_with_threads(m.g, 2);
  Dones dones;
  s->run_async({{m.x, Tensor(3.0f)}}, {m.plus, m.sq, m.x}, {}, {}, dones.make());
  ASSERT_TRUE(dones.wait(1));
  const Fetched r = dones.last();
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].scalar<float>(), 10.0f);
  EXPECT_EQ((*r)[1].scalar<float>(), 9.0f);
  EXPECT_EQ((*r)[2].scalar<float>(), 3.0f);
  EXPECT_EQ(dones.calls(), 1);
}

TEST_P(RunAsyncTest, FutureFormsMatchTheBlockingRun) {
  Small m(GetParam());
  auto s = session_with_threads(m.g, 2);
  const Fetched blocking = s->run({{m.x, Tensor(4.0f)}}, {m.plus});
  Fetched async = s->run_async({{m.x, Tensor(4.0f)}}, {m.plus}).get();
  ASSERT_THAT(blocking, IsOk());
  ASSERT_THAT(async, IsOk());
  EXPECT_EQ((*async)[0].scalar<float>(), (*blocking)[0].scalar<float>());
  Callable c = s->make_callable({m.x}, {m.plus}).value();
  Fetched via_callable = c.run_async({Tensor(4.0f)}).get();
  ASSERT_THAT(via_callable, IsOk());
  EXPECT_EQ((*via_callable)[0].scalar<float>(), 17.0f);
}

TEST_P(RunAsyncTest, ErrorsBeforeTheStepAreReportedOnTheCallingThread) {
  Small m(GetParam());
  auto s = session_with_threads(m.g, 2);
  std::thread::id where;
  Status status;
  s->run_async({}, {"nope:0"}, {}, {}, [&](Fetched r, RunMetadata*) {
    where = std::this_thread::get_id();
    status = r.status();
  });
  EXPECT_EQ(where, std::this_thread::get_id());
  EXPECT_EQ(status.to_string(), s->run({}, {"nope:0"}).status().to_string());
  // An unfed placeholder, a wrong feed dtype: the blocking call's errors.
  auto error_of = [&](const FeedList& feeds) {
    return s->run_async(feeds, {m.plus}).get().status().to_string();
  };
  EXPECT_EQ(error_of({}), s->run({}, {m.plus}).status().to_string());
  EXPECT_EQ(error_of({{m.x, Tensor(int32_t{1})}}),
            s->run({{m.x, Tensor(int32_t{1})}}, {m.plus}).status().to_string());
  Callable c = s->make_callable({m.x}, {m.plus}).value();
  EXPECT_THAT(c.run_async({}).get(), StatusIs(StatusCode::kInvalidArgument, "feed"));
}

// done must not throw. One that throws anyway is caught and reported on
// standard error, and its call still ends cleanly: later calls run and the
// session's destructor returns. (The exception once escaped run_async on
// the inline path and left the destructor waiting for ever; on a pool
// thread oneTBB aborted the process.) Every kind of call: steps, an error
// before the step, a Callable, a partial run's call and its misuse.
TEST_P(RunAsyncTest, ADoneThatThrowsIsReportedAndTheCallStillEnds) {
  Small m(GetParam());
  auto s = session_with_threads(m.g, 2);
  std::atomic<int> calls{0};
  RunDone throwing = [&calls](Fetched, RunMetadata*) {
    calls++;
    throw std::runtime_error("boom from done");
  };
  ::testing::internal::CaptureStderr();
  int expected = 0;
  for (int i = 0; i < 3; ++i, ++expected) {
    EXPECT_NO_THROW(s->run_async({{m.x, Tensor(2.0f)}}, {m.plus}, {}, {}, throwing));
  }
  EXPECT_NO_THROW(s->run_async({}, {"nowhere:0"}, {}, {}, throwing));
  ++expected;
  {
    auto callable = s->make_callable({m.x}, {m.plus}).value();
    EXPECT_NO_THROW(callable.run_async({Tensor(3.0f)}, throwing));
    ++expected;
    auto handle = s->partial_run_setup({m.plus}, {m.x}).value();
    EXPECT_NO_THROW(s->partial_run_async(handle, {}, {"nowhere:0"}, {}, {}, throwing));  // misuse
    ++expected;
    EXPECT_NO_THROW(
        s->partial_run_async(handle, {{m.x, Tensor(4.0f)}}, {m.plus}, {}, {}, throwing));
    ++expected;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (calls.load() < expected && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(calls.load(), expected);
  }
  // The session still serves calls, then goes without waiting in vain.
  Dones dones;
  s->run_async({{m.x, Tensor(2.0f)}}, {m.plus}, {}, {}, dones.make());
  ASSERT_TRUE(dones.wait(1));
  ASSERT_THAT(dones.last().status(), IsOk());
  EXPECT_EQ(dones.last()->at(0).scalar<float>(), 5.0f);
  graphrun::testing::run_bounded("destroying the session", [&] { s.reset(); });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, ::testing::HasSubstr("done callback threw (boom from done)"));
}

TEST_P(RunAsyncTest, KernelErrorsNameTheNode) {
  Graph g;
  ops::CallAttrs attrs;
  attrs.cheap = GetParam();
  Output bad = ops::Call(
      g, {}, {DType::kFloat32},
      [](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
        return invalid_argument("boom");
      },
      attrs, "bad")[0];
  auto s = session_with_threads(g, 2);
  const Fetched r = s->run_async({}, {bad}).get();
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "bad"));
  EXPECT_EQ(r.status().to_string(), s->run({}, {bad}).status().to_string());
}

TEST_P(RunAsyncTest, StatefulNodesActOncePerStepWithNoLostUpdate) {
  Graph g;
  Output v = ops::Variable(g, Tensor(0.0f), "v");
  Output inc = ops::AssignAdd(g, v, ops::Const(g, Tensor(1.0f)), {}, "inc");
  Output read = ops::ReadVariable(g, v, "read");
  const Node* init = ops::GlobalVariablesInitializer(g);
  auto s = session_with_threads(g, 2);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  constexpr int kRuns = 2000;
  Dones dones;
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < kRuns / 2; ++i) s->run_async({}, {}, {inc.node()}, {}, dones.make());
    });
  }
  for (std::thread& t : callers) t.join();
  ASSERT_TRUE(dones.wait(kRuns));
  EXPECT_EQ(dones.errors(), 0);
  const Fetched total = s->run({}, {read});
  ASSERT_THAT(total, IsOk());
  EXPECT_EQ((*total)[0].scalar<float>(), static_cast<float>(kRuns));
}

TEST_P(RunAsyncTest, EffectsAreVisibleToARunStartedFromDone) {
  Graph g;
  Output v = ops::Variable(g, Tensor(0.0f), "v");
  ops::AssignAdd(g, v, ops::Const(g, Tensor(1.0f)), {}, "inc");
  const Node* init = ops::GlobalVariablesInitializer(g);
  auto s = session_with_threads(g, 2);
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  // Each done starts the next step: 50 in a chain, each sees the last.
  std::promise<std::vector<float>> seen;
  std::vector<float> values;
  std::function<void(int)> step = [&](int left) {
    s->run_async({}, {"inc:0"}, {}, {}, [&, left](Fetched r, RunMetadata*) {
      values.push_back(r.is_ok() ? (*r)[0].scalar<float>() : -1.0f);
      if (left > 1) {
        step(left - 1);
      } else {
        seen.set_value(values);
      }
    });
  };
  step(50);
  auto future = seen.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const std::vector<float> got = future.get();
  ASSERT_EQ(got.size(), 50u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(i + 1));
}

TEST_P(RunAsyncTest, ChainsOfCallsFromDoneDoNotGrowTheStack) {
  Small m(GetParam());
  auto s = session_with_threads(m.g, 1);
  constexpr int kChain = 20000;
  std::promise<int> finished;
  std::atomic<int> ok{0};
  std::function<void(int)> step = [&](int left) {
    s->run_async({{m.x, Tensor(2.0f)}}, {m.plus}, {}, {}, [&, left](Fetched r, RunMetadata*) {
      if (r.is_ok() && (*r)[0].scalar<float>() == 5.0f) ok.fetch_add(1);
      if (left > 1) {
        step(left - 1);
      } else {
        finished.set_value(ok.load());
      }
    });
  };
  step(kChain);
  auto future = finished.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(future.get(), kChain);
}

TEST_P(RunAsyncTest, TracedRunsReportEveryNode) {
  Small m(GetParam());
  auto s = session_with_threads(m.g, 2);
  RunOptions options;
  options.trace = true;
  std::promise<std::vector<std::string>> nodes;
  s->run_async({{m.x, Tensor(1.0f)}}, {m.plus}, {}, options, [&](Fetched r, RunMetadata* md) {
    std::vector<std::string> names;
    if (r.is_ok() && md != nullptr) {
      for (const NodeExecStats& st : md->step_stats) names.push_back(st.node);
      names.push_back(md->cpu_isa);
    }
    nodes.set_value(names);
  });
  std::vector<std::string> names = nodes.get_future().get();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names.back(), cpu_isa_name(cpu_isa()));
  names.pop_back();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"plus", "sq"}));
  // Untraced: no metadata.
  std::promise<bool> got_metadata;
  s->run_async({{m.x, Tensor(1.0f)}}, {m.plus}, {}, {},
               [&](Fetched, RunMetadata* md) { got_metadata.set_value(md != nullptr); });
  EXPECT_FALSE(got_metadata.get_future().get());
}

// ---- a busy pool: queued calls ----

class QueuedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = session_with_threads(m_.g, 1);
    s_->run_async({}, {m_.after}, {}, {}, blocker_.make());
    gate_.await_entered();
  }
  void TearDown() override {
    gate_.open();
    EXPECT_TRUE(blocker_.wait(1));
  }
  Gate gate_;
  Blocked m_{gate_};
  std::unique_ptr<Session> s_;
  Dones blocker_;
};

TEST_F(QueuedTest, QueuedCallsHoldNoThreadAndAllComplete) {
  const int threads_before = process_thread_count();
  constexpr int kCalls = 10000;
  Dones dones;
  Callable c = s_->make_callable({m_.x}, {m_.sq}).value();
  for (int i = 0; i < kCalls; ++i) {
    if (i % 2 == 0) {
      s_->run_async({{m_.x, Tensor(3.0f)}}, {m_.sq}, {}, {}, dones.make());
    } else {
      c.run_async({Tensor(3.0f)}, dones.make());
    }
  }
  EXPECT_EQ(dones.calls(), 0) << "every call waits for the blocked thread";
  EXPECT_LE(process_thread_count(), threads_before + 1) << "a queued call must not hold a thread";
  gate_.open();
  ASSERT_TRUE(dones.wait(kCalls));
  EXPECT_EQ(dones.errors(), 0);
  EXPECT_EQ((*dones.last())[0].scalar<float>(), 9.0f);
}

TEST_F(QueuedTest, QueuedCallsStartInArrivalOrder) {
  std::mutex mu;
  std::vector<int> order;
  Dones dones;
  for (int i = 0; i < 20; ++i) {
    RunDone count = dones.make();
    s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}, {}, {},
                  [&, i, count](Fetched r, RunMetadata* md) {
                    {
                      const std::lock_guard lock(mu);
                      order.push_back(i);
                    }
                    count(std::move(r), md);
                  });
  }
  gate_.open();
  ASSERT_TRUE(dones.wait(20));
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(order, expected);
}

TEST_F(QueuedTest, DeadlineFiresWhileQueued) {
  RunOptions options;
  options.timeout = std::chrono::milliseconds(50);
  Dones dones;
  s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}, {}, options, dones.make());
  ASSERT_TRUE(dones.wait(1));
  EXPECT_FALSE(gate_.is_open());
  EXPECT_THAT(dones.last(), StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
}

TEST_F(QueuedTest, StopWhileQueuedCallsDoneOnTheStoppingThread) {
  std::stop_source stop;
  RunOptions options;
  options.stop_token = stop.get_token();
  std::thread::id where;
  Status status;
  s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}, {}, options, [&](Fetched r, RunMetadata*) {
    where = std::this_thread::get_id();
    status = r.status();
  });
  stop.request_stop();
  EXPECT_EQ(where, std::this_thread::get_id());
  EXPECT_THAT(status, StatusIs(StatusCode::kCancelled, "waited for a thread"));
  // Already stopped before the call: Cancelled too.
  EXPECT_THAT(s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}, {}, options).get(),
              StatusIs(StatusCode::kCancelled, ""));
}

TEST_F(QueuedTest, CloseEndsQueuedCallsBeforeItReturns) {
  Dones dones;
  for (int i = 0; i < 100; ++i)
    s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}, {}, {}, dones.make());
  ASSERT_THAT(s_->close(), IsOk());
  EXPECT_EQ(dones.calls(), 100);
  EXPECT_EQ(dones.errors(), 100);
  EXPECT_THAT(dones.last(), StatusIs(StatusCode::kCancelled, "Session has been closed."));
  // The running step ends Cancelled once its kernel returns.
  gate_.open();
  ASSERT_TRUE(blocker_.wait(1));
  EXPECT_THAT(blocker_.last(), StatusIs(StatusCode::kCancelled, ""));
  // Later calls fail at once.
  EXPECT_THAT(s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}).get(),
              StatusIs(StatusCode::kCancelled, "Session has been closed."));
}

TEST_F(QueuedTest, BlockingAndAsyncCallersShareTheQueue) {
  Dones dones;
  s_->run_async({{m_.x, Tensor(1.0f)}}, {m_.sq}, {}, {}, dones.make());
  auto blocking = std::async(std::launch::async, [&] {
    return s_->run({{m_.x, Tensor(2.0f)}}, {m_.sq});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s_->run_async({{m_.x, Tensor(3.0f)}}, {m_.sq}, {}, {}, dones.make());
  gate_.open();
  ASSERT_TRUE(dones.wait(2));
  EXPECT_EQ(dones.errors(), 0);
  const Fetched b = blocking.get();
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)[0].scalar<float>(), 4.0f);
}

TEST(RunAsyncRunningTest, StopAndDeadlineEndARunningStep) {
  Gate gate;
  Blocked m(gate);
  auto s = session_with_threads(m.g, 2);
  std::stop_source stop;
  RunOptions stoppable;
  stoppable.stop_token = stop.get_token();
  Dones stopped;
  s->run_async({}, {m.after}, {}, stoppable, stopped.make());
  RunOptions timed;
  timed.timeout = std::chrono::milliseconds(30);
  Dones expired;
  s->run_async({}, {m.after}, {}, timed, expired.make());
  gate.await_entered(2);
  stop.request_stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_EQ(stopped.calls(), 0) << "the kernel does not poll: the step ends after it";
  gate.open();
  ASSERT_TRUE(stopped.wait(1));
  ASSERT_TRUE(expired.wait(1));
  EXPECT_THAT(stopped.last(), StatusIs(StatusCode::kCancelled, "cancelled by its caller"));
  EXPECT_THAT(expired.last(), StatusIs(StatusCode::kDeadlineExceeded, "deadline expired"));
}

// Every call gets exactly one done whatever the interleaving of its
// completion with a stop, a deadline and close().
TEST(RunAsyncRaceTest, DoneExactlyOnceAgainstStopDeadlineAndClose) {
  for (const bool cheap : {false, true}) {
    for (int round = 0; round < 20; ++round) {
      Small m(cheap);
      auto s = session_with_threads(m.g, 2);
      constexpr int kCalls = 200;
      std::vector<std::atomic<int>> calls(kCalls);
      std::vector<std::stop_source> stops(kCalls);
      std::thread caller([&] {
        for (int i = 0; i < kCalls; ++i) {
          RunOptions options;
          options.stop_token = stops[static_cast<std::size_t>(i)].get_token();
          if (i % 3 == 0) options.timeout = std::chrono::milliseconds(i % 2);
          s->run_async(
              {{m.x, Tensor(1.0f)}}, {m.plus}, {}, options,
              [&calls, i](Fetched, RunMetadata*) { calls[static_cast<std::size_t>(i)]++; });
        }
      });
      std::thread stopper([&] {
        for (int i = 0; i < kCalls; i += 2) stops[static_cast<std::size_t>(i)].request_stop();
      });
      if (round % 2 == 1) {
        std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
        ASSERT_THAT(s->close(), IsOk());
      }
      caller.join();
      stopper.join();
      s.reset();  // waits for every pending done
      for (int i = 0; i < kCalls; ++i) {
        ASSERT_EQ(calls[static_cast<std::size_t>(i)].load(), 1)
            << "call " << i << " round " << round;
      }
    }
  }
}

TEST(RunAsyncLifetimeTest, DestroyingTheSessionWaitsForPendingDones) {
  Gate gate;
  Blocked m(gate);
  auto s = session_with_threads(m.g, 1);
  std::atomic<int> calls{0};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> seen_destroyed{false};
  s->run_async({}, {m.after}, {}, {}, [&](Fetched, RunMetadata*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (destroyed.load()) seen_destroyed = true;
    calls++;
  });
  gate.await_entered();
  for (int i = 0; i < 50; ++i) {
    s->run_async({{m.x, Tensor(1.0f)}}, {m.sq}, {}, {}, [&](Fetched, RunMetadata*) {
      if (destroyed.load()) seen_destroyed = true;
      calls++;
    });
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.open();
  });
  s.reset();
  destroyed = true;
  opener.join();
  EXPECT_EQ(calls.load(), 51);
  EXPECT_FALSE(seen_destroyed.load());
}

// A done may hold the last reference to its session and drop it (an
// asynchronous pipeline that owns its session): the destructor, which
// waits for the calls in flight and so for that very done, leaves the
// session's end to a thread of its own (it once waited for ever). Both a
// done on a pool thread (the step ran) and one on the calling thread (the
// call failed before its step) may do so; the session then ends.
TEST(RunAsyncLifetimeTest, ADoneMayDestroyItsOwnSession) {
  for (const int threads : {1, 2}) {
    for (const bool fails_early : {false, true}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, fails early: " << fails_early);
      auto alive = std::make_shared<int>(0);
      const std::weak_ptr<int> watch = alive;
      auto holder = std::make_shared<std::unique_ptr<Session>>();
      {
        Graph g;  // the session keeps its own copy, the only one left
        Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
        ops::Call(
            g, {x}, {DType::kFloat32},
            [alive](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
              return std::vector<Tensor>{Tensor(in[0].scalar<float>() * 3.0f)};
            },
            {}, "triple");
        *holder = session_with_threads(g, threads);
      }
      alive.reset();
      std::promise<Fetched> result;
      std::future<Fetched> future = result.get_future();
      Session* session = holder->get();
      const Tensor feed = fails_early ? Tensor(int32_t{2}) : Tensor(2.0f);
      // By name: the Outputs' graph is gone.
      session->run_async({{"x:0", feed}}, {"triple:0"}, {}, {},
                         [holder, &result](Fetched r, RunMetadata*) {
                           holder->reset();  // the last reference
                           result.set_value(std::move(r));
                         });
      holder.reset();
      ASSERT_EQ(future.wait_for(std::chrono::seconds(20)), std::future_status::ready)
          << "the done still waits in the destructor of its own session";
      Fetched r = future.get();
      if (fails_early) {
        EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, "x"));
      } else {
        ASSERT_THAT(r, IsOk());
        EXPECT_EQ((*r)[0].scalar<float>(), 6.0f);
      }
      // The session, and with it its graph's callable, ends.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!watch.expired() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_TRUE(watch.expired()) << "the session was never destroyed";
    }
  }
}

TEST(RunAsyncLifetimeTest, ACallableMayGoBeforeItsDone) {
  Gate gate;
  Blocked m(gate);
  auto s = session_with_threads(m.g, 1);
  Dones blocker;
  s->run_async({}, {m.after}, {}, {}, blocker.make());
  gate.await_entered();
  Dones dones;
  {
    Callable c = s->make_callable({m.x}, {m.sq}).value();
    c.run_async({Tensor(5.0f)}, dones.make());
  }
  gate.open();
  ASSERT_TRUE(dones.wait(1));
  ASSERT_THAT(dones.last(), IsOk());
  EXPECT_EQ((*dones.last())[0].scalar<float>(), 25.0f);
  ASSERT_TRUE(blocker.wait(1));
}

// Two pools of two threads each run two 100 ms steps at once: asynchronous
// steps get every thread of their pool (the process allows the workers).
TEST(RunAsyncPoolTest, AsyncStepsUseEveryThreadOfThePool) {
  Gate gate;
  Blocked m(gate);
  auto s = session_with_threads(m.g, 2);
  Dones dones;
  s->run_async({}, {m.after}, {}, {}, dones.make());
  s->run_async({}, {m.after}, {}, {}, dones.make());
  EXPECT_TRUE(gate.await_entered(2)) << "both kernels must run at once";
  gate.open();
  ASSERT_TRUE(dones.wait(2));
  EXPECT_EQ(dones.errors(), 0);
}

// ---- partial_run_async ----

// a, b fed; sa = Square(a); sb = Square(b); sum = sa + sb; count =
// AssignAdd(v, 1) after sum (a target, stateful: once per partial run).
struct Partial {
  Graph g;
  Output a;
  Output b;
  Output sa;
  Output sb;
  Output sum;
  Output v;
  Output count;
  Output read;
  const Node* init = nullptr;
  Partial() {
    a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
    b = ops::Placeholder(g, DType::kFloat32, Shape{}, "b");
    sa = ops::Square(g, a, "sa");
    sb = ops::Square(g, b, "sb");
    sum = ops::Add(g, sa, sb, "sum");
    v = ops::Variable(g, Tensor(0.0f), "v");
    Output one = ops::Const(g, Tensor(1.0f), "one");
    {
      const auto after_sum = g.control_dependencies({sum.node()});
      count = ops::AssignAdd(g, v, one, {}, "count");
    }
    read = ops::ReadVariable(g, v, "read");
    init = ops::GlobalVariablesInitializer(g);
  }
};

TEST(PartialRunAsyncTest, StepsThroughARunLikeTheBlockingCalls) {
  Partial m;
  auto s = session_with_threads(m.g, 2);
  ASSERT_THAT(s->run({}, {}, {m.init}), IsOk());
  PartialRunHandle h = s->partial_run_setup({m.sa, m.sum}, {m.a, m.b}, {m.count.node()}).value();
  const Fetched first = s->partial_run_async(h, {{m.a, Tensor(3.0f)}}, {m.sa}).get();
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ((*first)[0].scalar<float>(), 9.0f);
  EXPECT_FALSE(h.is_done());
  const Fetched second = s->partial_run_async(h, {{m.b, Tensor(4.0f)}}, {m.sum}).get();
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ((*second)[0].scalar<float>(), 25.0f);
  EXPECT_TRUE(h.is_done());
  EXPECT_EQ((*s->run({}, {m.read}))[0].scalar<float>(), 1.0f) << "the target ran once";
  // The run is complete: a further call fails as partial_run() would.
  EXPECT_THAT(s->partial_run_async(h, {}, {m.sa}).get(),
              StatusIs(StatusCode::kInvalidArgument, "complete"));
}

TEST(PartialRunAsyncTest, MisuseIsReportedOnTheCallingThreadAndLeavesTheRunUsable) {
  Partial m;
  auto s = session_with_threads(m.g, 2);
  PartialRunHandle h = s->partial_run_setup({m.sa, m.sum}, {m.a, m.b}).value();
  std::thread::id where;
  Status status;
  s->partial_run_async(h, {{m.a, Tensor(1.0f)}}, {m.sum}, {}, {}, [&](Fetched r, RunMetadata*) {
    where = std::this_thread::get_id();
    status = r.status();
  });
  EXPECT_EQ(where, std::this_thread::get_id());
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument, "can't be computed"));
  PartialRunHandle empty;
  EXPECT_THAT(s->partial_run_async(empty, {}, {m.sa}).get(),
              StatusIs(StatusCode::kInvalidArgument, "setup"));
  const Fetched ok = s->partial_run_async(h, {{m.a, Tensor(2.0f)}}, {m.sa}).get();
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ((*ok)[0].scalar<float>(), 4.0f);
}

// Two partial runs (set up first: a setup waits for a thread) on a pool
// whose only thread then waits in another session's kernel.
class PartialQueuedTest : public QueuedTest {
 protected:
  void SetUp() override {
    QueuedTest::SetUp();
    SessionOptions shared;
    shared.thread_pool = ThreadPool::create(1).value();
    blocked_ = Session::create(m_.g, shared).value();
    s_ = Session::create(p_.g, shared).value();
    h1_ = s_->partial_run_setup({p_.sa, p_.sb}, {p_.a, p_.b}).value();
    h2_ = s_->partial_run_setup({p_.sa, p_.sb}, {p_.a, p_.b}).value();
    blocked_->run_async({}, {m_.after}, {}, {}, blocked_done_.make());
    ASSERT_TRUE(gate_.await_entered(2));
  }
  void TearDown() override {
    QueuedTest::TearDown();
    EXPECT_TRUE(blocked_done_.wait(1));
  }
  Partial p_;
  std::unique_ptr<Session> blocked_;
  std::unique_ptr<Session> s_;
  PartialRunHandle h1_;
  PartialRunHandle h2_;
  Dones blocked_done_;
};

TEST_F(PartialQueuedTest, ACallInProgressExcludesAnotherOnTheSameHandle) {
  PartialRunHandle& h = h1_;
  Dones first;
  s_->partial_run_async(h, {{p_.a, Tensor(3.0f)}}, {p_.sa}, {}, {}, first.make());
  EXPECT_EQ(first.calls(), 0) << "queued behind the blocked kernel";
  EXPECT_THAT(s_->partial_run(h, {{p_.b, Tensor(1.0f)}}, {p_.sb}),
              StatusIs(StatusCode::kFailedPrecondition, "in use"));
  EXPECT_THAT(s_->partial_run_async(h, {{p_.b, Tensor(1.0f)}}, {p_.sb}).get(),
              StatusIs(StatusCode::kFailedPrecondition, "in use"));
  gate_.open();
  ASSERT_TRUE(first.wait(1));
  ASSERT_THAT(first.last(), IsOk());
  EXPECT_EQ((*first.last())[0].scalar<float>(), 9.0f);
  const Fetched rest = s_->partial_run_async(h, {{p_.b, Tensor(2.0f)}}, {p_.sb}).get();
  ASSERT_THAT(rest, IsOk());
  EXPECT_EQ((*rest)[0].scalar<float>(), 4.0f);
  EXPECT_TRUE(h.is_done());
}

TEST_F(PartialQueuedTest, QueuedCallsEndTheirRunAtTheDeadlineOrClose) {
  PartialRunHandle& timed = h1_;
  RunOptions options;
  options.timeout = std::chrono::milliseconds(30);
  const Fetched expired =
      s_->partial_run_async(timed, {{p_.a, Tensor(1.0f)}}, {p_.sa}, {}, options).get();
  EXPECT_FALSE(gate_.is_open());
  EXPECT_THAT(expired, StatusIs(StatusCode::kDeadlineExceeded, "waited for a thread"));
  EXPECT_TRUE(timed.is_done());
  // The run ended with that status: its next call reports it.
  EXPECT_THAT(s_->partial_run(timed, {{p_.b, Tensor(1.0f)}}, {p_.sb}),
              StatusIs(StatusCode::kDeadlineExceeded, ""));
  PartialRunHandle& closing = h2_;
  Dones dones;
  s_->partial_run_async(closing, {{p_.a, Tensor(1.0f)}}, {p_.sa}, {}, {}, dones.make());
  ASSERT_THAT(s_->close(), IsOk());
  EXPECT_EQ(dones.calls(), 1);
  EXPECT_THAT(dones.last(), StatusIs(StatusCode::kCancelled, "closed"));
}

TEST_F(PartialQueuedTest, CancellingTheRunEndsItsQueuedCallAtOnce) {
  Dones dones;
  s_->partial_run_async(h1_, {{p_.a, Tensor(1.0f)}}, {p_.sa}, {}, {}, dones.make());
  EXPECT_EQ(dones.calls(), 0) << "queued behind the blocked kernel";
  // Does not wait for the pool: the queued call leaves the queue.
  ASSERT_THAT(s_->cancel_partial_run(h1_), IsOk());
  EXPECT_FALSE(gate_.is_open());
  EXPECT_EQ(dones.calls(), 1);
  EXPECT_THAT(dones.last(), StatusIs(StatusCode::kCancelled, "cancelled"));
  EXPECT_TRUE(h1_.is_done());
  EXPECT_THAT(s_->partial_run_async(h1_, {{p_.b, Tensor(1.0f)}}, {p_.sb}).get(),
              StatusIs(StatusCode::kCancelled, ""));
}

TEST(PartialRunAsyncTest, ManyRunsBetweenFeedsHoldNoThread) {
  Partial m;
  SessionOptions options;
  options.inter_op_threads = 2;
  options.max_open_partial_runs = 10000;
  auto s = Session::create(m.g, options).value();
  ASSERT_THAT(s->run({}, {}, {m.init}), IsOk());
  constexpr int kRuns = 10000;
  std::vector<PartialRunHandle> runs;
  for (int i = 0; i < kRuns; ++i) {
    runs.push_back(s->partial_run_setup({m.sa, m.sum}, {m.a, m.b}, {m.count.node()}).value());
  }
  Dones firsts;
  for (PartialRunHandle& h : runs)
    s->partial_run_async(h, {{m.a, Tensor(2.0f)}}, {m.sa}, {}, {}, firsts.make());
  ASSERT_TRUE(firsts.wait(kRuns));
  EXPECT_EQ(firsts.errors(), 0);
  const int threads = process_thread_count();
  EXPECT_EQ(s->num_open_partial_runs(), static_cast<std::size_t>(kRuns));
  Dones seconds;
  for (PartialRunHandle& h : runs)
    s->partial_run_async(h, {{m.b, Tensor(1.0f)}}, {m.sum}, {}, {}, seconds.make());
  ASSERT_TRUE(seconds.wait(kRuns));
  EXPECT_EQ(seconds.errors(), 0);
  EXPECT_EQ((*seconds.last())[0].scalar<float>(), 5.0f);
  EXPECT_LE(process_thread_count(), threads + 1);
  EXPECT_EQ(s->num_open_partial_runs(), 0u);
  EXPECT_EQ((*s->run({}, {m.read}))[0].scalar<float>(), static_cast<float>(kRuns))
      << "each run's target acted once";
}

}  // namespace
}  // namespace graphrun
