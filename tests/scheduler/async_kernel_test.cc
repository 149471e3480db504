// Asynchronous kernels (AsyncOpKernel): a kernel that finishes later, from a
// thread of its own, holds none of the session's threads while it waits.
// Its results reach consumers and fetches in every kind of step, its
// successors run on the session's threads, errors and stops end the step,
// and kernels that wait for each other finish where blocking ones would
// deadlock.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/task.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::IsOk;
using testing::StatusIs;
using namespace std::chrono_literals;

// Runs each job on a thread of its own (the "other process" or device an
// asynchronous kernel waits for); joins them all when destroyed.
class Threads {
 public:
  ~Threads() { join(); }
  void post(std::function<void()> job) {
    const std::lock_guard lock(mu_);
    threads_.emplace_back([this, job = std::move(job)] {
      {
        const std::lock_guard seen(mu_);
        ids_.insert(std::this_thread::get_id());
      }
      job();
    });
  }
  void join() {
    std::vector<std::thread> threads;
    {
      const std::lock_guard lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }
  bool ran_on_one(std::thread::id id) {
    const std::lock_guard lock(mu_);
    return ids_.count(id) != 0;
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::set<std::thread::id> ids_;
};

// y = x + 1, written by `job`'s thread after `delay`; `result` says how it
// ends (OK by default).
class LaterKernel final : public AsyncOpKernel {
 public:
  LaterKernel(Threads& threads, std::chrono::milliseconds delay,
              std::function<Status(OpKernelContext&)> result)
      : threads_(threads), delay_(delay), result_(std::move(result)) {}
  void compute_async(OpKernelContext& ctx, Done done) override {
    threads_.post([this, &ctx, done = std::move(done)] {
      std::this_thread::sleep_for(delay_);
      done(result_ ? result_(ctx) : add_one(ctx));
    });
  }
  static Status add_one(OpKernelContext& ctx) {
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * y, ctx.allocate_output(0, ctx.input(0).shape()));
    y->flat<float>()[0] = ctx.input(0).flat<float>()[0] + 1.0f;
    return Status::ok();
  }

 private:
  Threads& threads_;
  std::chrono::milliseconds delay_;
  std::function<Status(OpKernelContext&)> result_;
};

// Finishes only once `n` executions (of any of its nodes) have started:
// the n-th start finishes them all, each with y = x + 1. As blocking
// kernels on fewer than n threads they would wait for ever.
class Gathering {
 public:
  explicit Gathering(int n) : n_(n) {}
  void arrive(OpKernelContext& ctx, AsyncOpKernel::Done done, Threads& threads) {
    std::vector<std::pair<OpKernelContext*, AsyncOpKernel::Done>> group;
    {
      const std::lock_guard lock(mu_);
      waiting_.emplace_back(&ctx, std::move(done));
      if (static_cast<int>(waiting_.size()) < n_) return;
      group.swap(waiting_);
    }
    threads.post([group = std::move(group)] {
      for (const auto& [c, d] : group) d(LaterKernel::add_one(*c));
    });
  }

 private:
  const int n_;
  std::mutex mu_;
  std::vector<std::pair<OpKernelContext*, AsyncOpKernel::Done>> waiting_;
};

class GatherKernel final : public AsyncOpKernel {
 public:
  GatherKernel(Gathering& gathering, Threads& threads) : gathering_(gathering), threads_(threads) {}
  void compute_async(OpKernelContext& ctx, Done done) override {
    gathering_.arrive(ctx, std::move(done), threads_);
  }

 private:
  Gathering& gathering_;
  Threads& threads_;
};

// Waits until the step says stop, then finishes with an error (the run
// reports why it stopped).
class UntilStoppedKernel final : public AsyncOpKernel {
 public:
  explicit UntilStoppedKernel(Threads& threads, std::atomic<int>& waiting)
      : threads_(threads), waiting_(waiting) {}
  void compute_async(OpKernelContext& ctx, Done done) override {
    ++waiting_;
    threads_.post([&ctx, done = std::move(done)] {
      const auto give_up = std::chrono::steady_clock::now() + 20s;
      while (!ctx.is_cancelled() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(1ms);
      }
      done(cancelled("stopped waiting"));
    });
  }

 private:
  Threads& threads_;
  std::atomic<int>& waiting_;
};

// One float in, one float out, same shape; the kernel comes with the node.
Output async_node(Graph& g, Output x, std::function<std::unique_ptr<OpKernel>()> make,
                  const std::string& name) {
  static const bool registered = [] {
    OpRegistry& r = OpRegistry::global();
    if (r.find("TestAsync") != nullptr) return true;
    return r
        .add(OpDef("TestAsync")
                 .input("x", DType::kFloat32)
                 .output("y", DType::kFloat32)
                 .shape_fn(shape_fns::unchanged),
             [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
               return invalid_argument("TestAsync nodes bring their own kernel");
             })
        .is_ok();
  }();
  EXPECT_TRUE(registered);
  auto factory = std::make_shared<const KernelFactory>(
      [make = std::move(make)](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
        return make();
      });
  auto node = g.add_node(
      NodeSpec{.op = "TestAsync", .name = name, .inputs = {x}, .kernel = std::move(factory)});
  EXPECT_TRUE(node.is_ok()) << node.status().to_string();
  return (*node)->output(0);
}

std::unique_ptr<Session> session_with_threads(const Graph& g, int threads) {
  SessionOptions options;
  options.inter_op_threads = threads;
  return Session::create(g, options).value();
}

// Runs `steps` steps of `s` feeding x = 0, 1, ... and fetching y, which
// must be x + 1 (wrap in ASSERT_NO_FATAL_FAILURE: a failed run ends it).
void expect_steps_add_one(Session& s, const Output& x, const Output& y, int steps) {
  for (int i = 0; i < steps; ++i) {
    auto r = s.run({{x, Tensor(static_cast<float>(i))}}, {y});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), static_cast<float>(i) + 1.0f);
  }
}

class AsyncKernelTest : public ::testing::TestWithParam<int> {
 protected:
  Output later(Graph& g, Output x, const std::string& name, std::chrono::milliseconds delay = 1ms,
               std::function<Status(OpKernelContext&)> result = {}) {
    return async_node(
        g, x,
        [this, delay, result] { return std::make_unique<LaterKernel>(threads_, delay, result); },
        name);
  }
  Threads threads_;
};

INSTANTIATE_TEST_SUITE_P(Threads, AsyncKernelTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param == 1 ? "OneThread" : "TwoThreads";
                         });

// x -> a = later(x) -> b = Square(a) -> c = later(b): a root, a node in the
// middle and a leaf are asynchronous, and both ends are fetched.
TEST_P(AsyncKernelTest, ResultsReachConsumersAndFetches) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = later(g, x, "a");
  Output b = ops::Square(g, a, "b");
  Output c = later(g, b, "c");
  auto s = session_with_threads(g, GetParam());
  for (int i = 0; i < 5; ++i) {
    auto r = s->run({{x, Tensor(2.0f + static_cast<float>(i))}}, {a, c});
    ASSERT_THAT(r, IsOk());
    const float av = 3.0f + static_cast<float>(i);
    EXPECT_EQ((*r)[0].scalar<float>(), av);
    EXPECT_EQ((*r)[1].scalar<float>(), av * av + 1.0f);
  }
}

TEST_P(AsyncKernelTest, AChainOfAsynchronousNodesRunsInOrder) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = x;
  for (int i = 0; i < 40; ++i) y = later(g, y, "step" + std::to_string(i), 0ms);
  auto s = session_with_threads(g, GetParam());
  auto r = s->run({{x, Tensor(0.5f)}}, {y});
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].scalar<float>(), 40.5f);
}

TEST_P(AsyncKernelTest, SuccessorsRunOnTheSessionsThreadsNotTheKernels) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = later(g, x, "a");
  std::mutex mu;
  std::vector<std::thread::id> ran_on;
  ops::CallAttrs cheap;
  cheap.cheap = true;  // would run inline on the thread that completed `a`
  Output after = ops::Call(
      g, {a}, {DType::kFloat32},
      [&](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        const std::lock_guard lock(mu);
        ran_on.push_back(std::this_thread::get_id());
        return std::vector<Tensor>{in[0]};
      },
      cheap, "after")[0];
  auto s = session_with_threads(g, GetParam());
  for (int i = 0; i < 10; ++i) ASSERT_THAT(s->run({{x, Tensor(1.0f)}}, {after}), IsOk());
  threads_.join();
  ASSERT_EQ(ran_on.size(), 10u);
  for (std::thread::id id : ran_on) EXPECT_FALSE(threads_.ran_on_one(id));
}

// A blocking caller of a plan with an asynchronous kernel never waits
// inside the pool, where oneTBB could hand it another caller's step (and
// across processes, steps that wait for each other would then deadlock).
// When every other node is cheap it runs the step itself, outside every
// arena, and waits for the kernel there (no thread hand-off: a message's
// round trip costs no wake-up); otherwise the step runs on the pool's own
// threads. Kernels called from inside the pool keep helping as before.
TEST_P(AsyncKernelTest, BlockingCallersWaitOutsideThePool) {
  struct Start {
    std::thread::id thread;
    bool in_task;  // inside a oneTBB task (a pool's thread, or a waiter in one)
  };
  std::mutex mu;
  auto recording = [&mu](std::vector<Start>& starts) {
    return [&mu, &starts]() -> std::unique_ptr<OpKernel> {
      class Recording final : public AsyncOpKernel {
       public:
        Recording(std::mutex& mu, std::vector<Start>& on) : mu_(mu), on_(on) {}
        void compute_async(OpKernelContext& ctx, Done done) override {
          {
            const std::lock_guard lock(mu_);
            on_.push_back({std::this_thread::get_id(), tbb::task::current_context() != nullptr});
          }
          done(LaterKernel::add_one(ctx));
        }

       private:
        std::mutex& mu_;
        std::vector<Start>& on_;
      };
      return std::make_unique<Recording>(mu, starts);
    };
  };
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  std::vector<Start> alone;  // `a`: nothing else in its steps but the feed
  Output a = async_node(g, x, recording(alone), "a");
  // `c` follows a Call node that is not marked cheap: a task of the pool.
  std::vector<Start> after_work;
  Output work = ops::Call(
      g, {x}, {DType::kFloat32},
      [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        return std::vector<Tensor>{in[0]};
      },
      ops::CallAttrs{}, "work")[0];
  Output c = async_node(g, work, recording(after_work), "c");
  auto s = session_with_threads(g, GetParam());
  Result<Callable> callable = s->make_callable({x}, {a});
  ASSERT_THAT(callable.status(), IsOk());
  for (int i = 0; i < 10; ++i) {
    auto r = s->run({{x, Tensor(1.0f)}}, {a, c});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), 2.0f);
    EXPECT_EQ((*r)[1].scalar<float>(), 2.0f);
    r = s->run({{x, Tensor(4.0f)}}, {a});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), 5.0f);
    const Tensor feeds[] = {Tensor(2.0f)};
    Tensor out[1];
    ASSERT_THAT(callable->run(feeds, out), IsOk());
    EXPECT_EQ(out[0].scalar<float>(), 3.0f);
  }
  const std::lock_guard lock(mu);
  // `a` alone (a run and a Callable): on this thread, in no task; `a` in
  // the steps with `c`, and `c`: on the pool's threads.
  ASSERT_EQ(alone.size(), 30u);
  ASSERT_EQ(after_work.size(), 10u);
  int on_caller = 0;
  for (const Start& st : alone) {
    if (st.thread == std::this_thread::get_id()) {
      ++on_caller;
      EXPECT_FALSE(st.in_task);
    }
  }
  EXPECT_EQ(on_caller, 20);
  for (const Start& st : after_work) EXPECT_NE(st.thread, std::this_thread::get_id());
}

// A kernel that lends the waiting thread a helper: y = x + 1 once the
// helper has been polled `polls_to_finish` times (never, for -1: it then
// finishes after the thread releases it, on a thread of its own). A kernel
// that finds no waiting thread finishes on a thread of its own at once.
class LendingKernel final : public AsyncOpKernel {
 public:
  struct Log {
    std::mutex mu;
    std::vector<std::thread::id> polled_on;
    int lent = 0;
    int not_lent = 0;
    int released = 0;
  };
  LendingKernel(Threads& threads, Log& log, int polls_to_finish)
      : threads_(threads), log_(log), polls_to_finish_(polls_to_finish) {}

  void compute_async(OpKernelContext& ctx, Done done) override {
    auto* helper = new Helper(*this, ctx, std::move(done));
    if (ctx.lend_to_waiter(*helper)) {
      const std::lock_guard lock(log_.mu);
      ++log_.lent;
      return;
    }
    {
      const std::lock_guard lock(log_.mu);
      ++log_.not_lent;
    }
    helper->finish_elsewhere();
  }

 private:
  class Helper final : public WaitHelper {
   public:
    Helper(LendingKernel& k, OpKernelContext& ctx, Done done)
        : k_(k), ctx_(ctx), done_(std::move(done)) {}
    bool poll() override {
      {
        const std::lock_guard lock(k_.log_.mu);
        k_.log_.polled_on.push_back(std::this_thread::get_id());
      }
      if (++polls_ != k_.polls_to_finish_) return false;
      done_(LaterKernel::add_one(ctx_));
      delete this;
      return true;
    }
    void release() override {
      {
        const std::lock_guard lock(k_.log_.mu);
        ++k_.log_.released;
      }
      finish_elsewhere();
    }
    void finish_elsewhere() {
      k_.threads_.post([this] {
        done_(LaterKernel::add_one(ctx_));
        delete this;
      });
    }

   private:
    ~Helper() = default;
    LendingKernel& k_;
    OpKernelContext& ctx_;
    Done done_;
    int polls_ = 0;
  };
  Threads& threads_;
  Log& log_;
  const int polls_to_finish_;
};

// A blocking caller that runs the step itself polls the helper its kernel
// lent, on its own thread, before anything else can end it (the kernel
// finishes at the first poll: every helper is polled at least once,
// however late the caller gets to wait); a step on the pool's threads (a
// traced run, an asynchronous run) has no thread to lend to.
TEST_P(AsyncKernelTest, AWaitingCallerPollsTheHelperItsKernelLent) {
  LendingKernel::Log log;
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = async_node(
      g, x, [&] { return std::make_unique<LendingKernel>(threads_, log, 1); }, "lending");
  auto s = session_with_threads(g, GetParam());
  ASSERT_NO_FATAL_FAILURE(expect_steps_add_one(*s, x, y, 5));
  {
    const std::lock_guard lock(log.mu);
    EXPECT_EQ(log.lent, 5);
    EXPECT_EQ(log.not_lent, 0);
    EXPECT_EQ(log.released, 0);
    ASSERT_EQ(log.polled_on.size(), 5u);
    for (std::thread::id id : log.polled_on) EXPECT_EQ(id, std::this_thread::get_id());
  }
  RunOptions traced;
  traced.trace = true;
  RunMetadata metadata;
  auto r = s->run({{x, Tensor(7.0f)}}, {y}, {}, traced, &metadata);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ((*r)[0].scalar<float>(), 8.0f);
  std::promise<float> async_result;
  s->run_async({{x, Tensor(9.0f)}}, {y}, {}, {},
               [&](Result<std::vector<Tensor>> out, RunMetadata*) {
                 async_result.set_value(out.is_ok() ? (*out)[0].scalar<float>() : -1.0f);
               });
  EXPECT_EQ(async_result.get_future().get(), 10.0f);
  threads_.join();
  const std::lock_guard lock(log.mu);
  EXPECT_EQ(log.lent, 5);
  EXPECT_EQ(log.not_lent, 2);
}

// A helper that never finishes under polling is released when the caller
// stops spinning (it then sleeps): the kernel finishes on its own and the
// step ends with its result.
TEST_P(AsyncKernelTest, AHelperStillOutIsReleasedBeforeTheCallerSleeps) {
  LendingKernel::Log log;
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = async_node(
      g, x, [&] { return std::make_unique<LendingKernel>(threads_, log, -1); }, "lending");
  auto s = session_with_threads(g, GetParam());
  ASSERT_NO_FATAL_FAILURE(expect_steps_add_one(*s, x, y, 3));
  threads_.join();
  const std::lock_guard lock(log.mu);
  EXPECT_EQ(log.lent, 3);
  EXPECT_EQ(log.released, 3);
  EXPECT_FALSE(log.polled_on.empty());
}

// One thread, started beforehand, that runs jobs at their times: a
// released helper's end costs a wake-up, not a thread's creation.
class Finisher {
 public:
  using Clock = std::chrono::steady_clock;
  Finisher() : thread_([this] { loop(); }) {}
  Finisher(const Finisher&) = delete;
  Finisher& operator=(const Finisher&) = delete;
  // Runs what is queued, then stops.
  ~Finisher() {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void at(Clock::time_point when, std::function<void()> job) {
    {
      const std::lock_guard lock(mu_);
      jobs_.emplace_back(when, std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto [when, job] = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(when);
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Clock::time_point, std::function<void()>>> jobs_;  // guarded by mu_
  bool stop_ = false;                                                     // guarded by mu_
  std::thread thread_;
};

// A kernel like LendingKernel whose helper finishes once `delay` has passed
// since the kernel started: polled by the waiting thread, or, once
// released, on the Finisher's thread.
class TimedLendingKernel final : public AsyncOpKernel {
 public:
  TimedLendingKernel(Finisher& finisher, std::atomic<int>& released,
                     std::chrono::microseconds delay)
      : finisher_(finisher), released_(released), delay_(delay) {}

  void compute_async(OpKernelContext& ctx, Done done) override {
    auto* helper =
        new Helper(*this, ctx, std::move(done), std::chrono::steady_clock::now() + delay_);
    if (!ctx.lend_to_waiter(*helper)) helper->release();
  }

 private:
  class Helper final : public WaitHelper {
   public:
    Helper(TimedLendingKernel& k, OpKernelContext& ctx, Done done,
           std::chrono::steady_clock::time_point at)
        : k_(k), ctx_(ctx), done_(std::move(done)), at_(at) {}
    bool poll() override {
      if (std::chrono::steady_clock::now() < at_) return false;
      finish();
      return true;
    }
    void release() override {
      k_.released_.fetch_add(1);
      k_.finisher_.at(at_, [this] { finish(); });
    }

   private:
    ~Helper() = default;
    void finish() {
      done_(LaterKernel::add_one(ctx_));
      delete this;
    }
    TimedLendingKernel& k_;
    OpKernelContext& ctx_;
    Done done_;
    const std::chrono::steady_clock::time_point at_;
  };
  Finisher& finisher_;
  std::atomic<int>& released_;
  const std::chrono::microseconds delay_;
};

// A caller whose wait outlasted its spin (50 us) by a little spins longer
// at its next steps, up to twice that wait: a peer that answers 150 us
// later is caught spinning, not after a sleep and a wake-up (two ranks
// answering each other otherwise stay in step with each other's sleeps).
// A wait far past the spin's ceiling (1 ms) leaves the spin short: every
// such step sleeps.
TEST_P(AsyncKernelTest, ACallerSpinsLongerAfterAWaitJustPastItsSpin) {
  std::atomic<int> released{0};
  Finisher finisher;
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output soon = async_node(
      g, x,
      [&] {
        return std::make_unique<TimedLendingKernel>(finisher, released,
                                                    std::chrono::microseconds(150));
      },
      "soon");
  Output late = async_node(
      g, x,
      [&] {
        return std::make_unique<TimedLendingKernel>(finisher, released,
                                                    std::chrono::milliseconds(5));
      },
      "late");
  auto s = session_with_threads(g, GetParam());
  constexpr int kSteps = 20;
  ASSERT_NO_FATAL_FAILURE(expect_steps_add_one(*s, x, soon, kSteps));
  // The first step sleeps; later ones only if a step is delayed past
  // twice the previous wait (a loaded machine): far fewer than every one.
  EXPECT_GE(released.load(), 1);
  EXPECT_LE(released.load(), kSteps / 4);
  released.store(0);
  constexpr int kLateSteps = 4;
  ASSERT_NO_FATAL_FAILURE(expect_steps_add_one(*s, x, late, kLateSteps));
  EXPECT_EQ(released.load(), kLateSteps);
}

// Four kernels that finish only when all four have started: a blocking
// kernel would hold one of the session's one or two threads until the
// others start, which they never could.
TEST_P(AsyncKernelTest, KernelsThatWaitForEachOtherFinishOnFewerThreads) {
  Gathering gathering(4);
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  std::vector<Output> parts;
  for (int i = 0; i < 4; ++i) {
    parts.push_back(async_node(
        g, ops::Mul(g, x, ops::Const(g, Tensor(static_cast<float>(i + 1)))),
        [&] { return std::make_unique<GatherKernel>(gathering, threads_); },
        "gather" + std::to_string(i)));
  }
  Output sum = ops::Add(g, ops::Add(g, parts[0], parts[1]), ops::Add(g, parts[2], parts[3]), "sum");
  auto s = session_with_threads(g, GetParam());
  for (int i = 0; i < 10; ++i) {
    auto r = s->run({{x, Tensor(1.0f)}}, {sum});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), 1.0f + 2.0f + 3.0f + 4.0f + 4.0f);
  }
}

TEST_P(AsyncKernelTest, CallablesAndAsynchronousRunsWaitForTheKernel) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = later(g, x, "a", 5ms);
  Output b = ops::Neg(g, a, "b");
  auto s = session_with_threads(g, GetParam());
  auto callable = s->make_callable({x}, {b});
  ASSERT_THAT(callable, IsOk());
  Tensor feed(1.0f);
  std::vector<Tensor> out(1);
  ASSERT_THAT(callable->run({&feed, 1}, out), IsOk());
  EXPECT_EQ(out[0].scalar<float>(), -2.0f);
  std::vector<std::future<Result<std::vector<Tensor>>>> futures;
  for (int i = 0; i < 4; ++i) futures.push_back(s->run_async({{x, Tensor(float(i))}}, {b, a}));
  for (int i = 0; i < 4; ++i) {
    auto r = futures[static_cast<std::size_t>(i)].get();
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), -(float(i) + 1.0f));
    EXPECT_EQ((*r)[1].scalar<float>(), float(i) + 1.0f);
  }
}

// A partial run: the asynchronous node's output is fetched by the first
// call; the second feeds y and fetches a + y without running `a` again.
TEST_P(AsyncKernelTest, PartialRunsFetchAnAsynchronousOutputThenGoOn) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  std::atomic<int> runs{0};
  Output a = later(g, x, "a", 2ms, [&](OpKernelContext& ctx) {
    ++runs;
    return LaterKernel::add_one(ctx);
  });
  Output sum = ops::Add(g, a, y, "sum");
  auto s = session_with_threads(g, GetParam());
  auto h = s->partial_run_setup({a, sum}, {x, y});
  ASSERT_THAT(h, IsOk());
  auto first = s->partial_run(*h, {{x, Tensor(1.0f)}}, {a});
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ((*first)[0].scalar<float>(), 2.0f);
  auto second = s->partial_run(*h, {{y, Tensor(10.0f)}}, {sum});
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ((*second)[0].scalar<float>(), 12.0f);
  EXPECT_EQ(runs.load(), 1);
}

// Between its calls a partial run goes on as far as its feeds allow, on
// one thread too: a call that feeds x and fetches nothing returns, and the
// asynchronous kernel's successor still runs (an MPI worker's Send must go
// out before the driver's next call). Blocking and asynchronous calls.
TEST_P(AsyncKernelTest, APartialRunGoesOnBetweenItsCalls) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  Output a = later(g, x, "a", 2ms);
  std::atomic<int> passed{0};
  Output seen = ops::Call(
      g, {a}, {DType::kFloat32},
      [&](OpKernelContext& ctx) -> Status {
        ++passed;
        return ctx.set_output(0, ctx.input(0));
      },
      {}, "seen")[0];
  Output sum = ops::Add(g, seen, y, "sum");
  auto s = session_with_threads(g, GetParam());
  for (const bool asynchronous : {false, true}) {
    SCOPED_TRACE(asynchronous ? "partial_run_async" : "partial_run");
    const int before = passed.load();
    auto h = s->partial_run_setup({sum}, {x, y});
    ASSERT_THAT(h, IsOk());
    const FeedList first{{x, Tensor(1.0f)}};
    if (asynchronous) {
      ASSERT_THAT(s->partial_run_async(*h, first, {}).get(), IsOk());
    } else {
      ASSERT_THAT(s->partial_run(*h, first, {}), IsOk());
    }
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (passed.load() == before && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(passed.load(), before + 1) << "`seen` did not run between the calls";
    const FeedList second{{y, Tensor(10.0f)}};
    auto r = asynchronous ? s->partial_run_async(*h, second, {sum}).get()
                          : s->partial_run(*h, second, {sum});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), 12.0f);
    EXPECT_EQ(passed.load(), before + 1);
  }
}

// An asynchronous partial-run call whose fetch comes from a kernel that
// finishes on another thread returns it, its run then goes on; on one
// thread the call must not hold the pool's only worker while it waits.
TEST_P(AsyncKernelTest, AsynchronousPartialRunCallsAwaitAKernelFinishedElsewhere) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  Output a = later(g, x, "a", 5ms);
  Output b = later(g, ops::Add(g, a, y), "b", 5ms);
  auto s = session_with_threads(g, GetParam());
  RunOptions bounded;
  bounded.timeout = 20s;
  for (int round = 0; round < 3; ++round) {
    auto h = s->partial_run_setup({a, b}, {x, y}, {}, bounded);
    ASSERT_THAT(h, IsOk());
    auto first = s->partial_run_async(*h, {{x, Tensor(1.0f)}}, {a}, {}, bounded).get();
    ASSERT_THAT(first, IsOk());
    EXPECT_EQ((*first)[0].scalar<float>(), 2.0f);
    auto second = s->partial_run_async(*h, {{y, Tensor(10.0f)}}, {b}, {}, bounded).get();
    ASSERT_THAT(second, IsOk());
    EXPECT_EQ((*second)[0].scalar<float>(), 13.0f);
  }
}

// A blocking partial-run call that arrives while the pool's worker is busy
// with another partial run's node still gets its fetch from a kernel
// finished on another thread (on one thread both runs live in the pool's
// asynchronous arena, which the call enters beside the busy worker).
TEST_P(AsyncKernelTest, ABlockingPartialRunCallBesideABusyWorkerGetsItsFetch) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = later(g, x, "a", 5ms);
  Output busy_in = ops::Placeholder(g, DType::kFloat32, Shape{}, "busy_in");
  std::atomic<bool> busy_started{false};
  Output busy = ops::Call(
      g, {busy_in}, {DType::kFloat32},
      [&](OpKernelContext& ctx) -> Status {
        busy_started = true;
        std::this_thread::sleep_for(300ms);
        return ctx.set_output(0, ctx.input(0));
      },
      {}, "busy")[0];
  auto s = session_with_threads(g, GetParam());
  RunOptions bounded;
  bounded.timeout = 10s;
  for (int round = 0; round < 2; ++round) {
    busy_started = false;
    // Another partial run's node keeps the worker busy after its call
    // returned (it holds no permit: the call below gets one at once).
    auto other = s->partial_run_setup({busy}, {busy_in}, {}, bounded);
    ASSERT_THAT(other, IsOk());
    ASSERT_THAT(s->partial_run(*other, {{busy_in, Tensor(1.0f)}}, {}, {}, bounded), IsOk());
    while (!busy_started.load()) std::this_thread::sleep_for(1ms);
    auto h = s->partial_run_setup({a}, {x}, {}, bounded);
    ASSERT_THAT(h, IsOk());
    auto r = s->partial_run(*h, {{x, Tensor(1.0f)}}, {a}, {}, bounded);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), 2.0f);
    ASSERT_THAT(s->partial_run(*other, {}, {busy}, {}, bounded), IsOk());
  }
}

// SessionOptions::queue_async_calls = false: four asynchronous steps
// whose kernels finish only together all start, on one thread too (queued,
// the first would hold the 1-thread pool's only permit and the others
// never start).
TEST_P(AsyncKernelTest, UnqueuedAsynchronousCallsAllStartAtOnce) {
  Gathering gathering(4);
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = async_node(
      g, x, [&] { return std::make_unique<GatherKernel>(gathering, threads_); }, "gather");
  SessionOptions options;
  options.inter_op_threads = 1;
  options.queue_async_calls = false;
  auto s = Session::create(g, options).value();
  std::vector<std::future<Result<std::vector<Tensor>>>> futures;
  for (int i = 0; i < 4; ++i) {
    futures.push_back(s->run_async({{x, Tensor(static_cast<float>(i))}}, {y}));
  }
  for (int i = 0; i < 4; ++i) {
    auto r = futures[static_cast<std::size_t>(i)].get();
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ((*r)[0].scalar<float>(), static_cast<float>(i) + 1.0f);
  }
}

TEST_P(AsyncKernelTest, ErrorsFromDoneAndFromComputeAsyncNameTheNode) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output bad = later(g, x, "bad", 1ms,
                     [](OpKernelContext&) { return invalid_argument("the peer said no"); });
  Output silent = later(g, x, "silent", 1ms, [](OpKernelContext&) { return Status::ok(); });
  Output thrower = async_node(
      g, x,
      [] {
        struct Throws final : AsyncOpKernel {
          void compute_async(OpKernelContext&, Done) override {
            throw std::runtime_error("no transport");
          }
        };
        return std::make_unique<Throws>();
      },
      "thrower");
  auto s = session_with_threads(g, GetParam());
  EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {bad}), StatusIs(StatusCode::kInvalidArgument, "'bad'"));
  EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {bad}),
              StatusIs(StatusCode::kInvalidArgument, "the peer said no"));
  EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {silent}),
              StatusIs(StatusCode::kInternal, "did not produce output 0"));
  EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {thrower}),
              StatusIs(StatusCode::kInternal, "kernel threw: no transport"));
  // The session stays usable.
  Output fine = later(g, x, "fine");
  ASSERT_THAT(s->extend(g), IsOk());
  EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {fine}), IsOk());
}

TEST_P(AsyncKernelTest, ADeadlineOrCloseEndsAStepWhoseKernelIsOut) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  std::atomic<int> waiting{0};
  Output w = async_node(
      g, x, [&] { return std::make_unique<UntilStoppedKernel>(threads_, waiting); }, "w");
  Output after = ops::Neg(g, w, "after");
  auto s = session_with_threads(g, GetParam());
  RunOptions timed;
  timed.timeout = 50ms;
  EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {after}, {}, timed),
              StatusIs(StatusCode::kDeadlineExceeded, "'w'"));
  auto pending = s->run_async({{x, Tensor(1.0f)}}, {after});
  while (waiting.load() < 2) std::this_thread::sleep_for(1ms);
  ASSERT_THAT(s->close(), IsOk());
  EXPECT_THAT(pending.get(), StatusIs(StatusCode::kCancelled, "closed"));
}

TEST_P(AsyncKernelTest, TracedRunsTimeTheNodeFromStartToDone) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = later(g, x, "a", 20ms);
  auto s = session_with_threads(g, GetParam());
  RunOptions traced;
  traced.trace = true;
  RunMetadata metadata;
  ASSERT_THAT(s->run({{x, Tensor(1.0f)}}, {a}, {}, traced, &metadata), IsOk());
  bool found = false;
  for (const NodeExecStats& st : metadata.step_stats) {
    if (st.node != "a") continue;
    found = true;
    EXPECT_GE(st.end_ns - st.start_ns, 20'000'000);
    EXPECT_EQ(st.output_shapes, std::vector<Shape>{Shape{}});
  }
  EXPECT_TRUE(found);
}

TEST(AsyncKernelSyncTest, ComputeBlocksUntilDone) {
  Threads threads;
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output a = async_node(
      g, x, [&] { return std::make_unique<LaterKernel>(threads, 10ms, nullptr); }, "a");
  LaterKernel kernel(threads, 10ms, nullptr);
  Tensor slots[2] = {Tensor(4.0f), Tensor()};
  const int32_t input_slots[] = {0};
  const KernelRuntime runtime;
  OpKernelContext ctx(*a.node(), slots, input_slots, &slots[1], runtime, nullptr, 0);
  OpKernel& as_kernel = kernel;
  EXPECT_EQ(as_kernel.as_async(), &kernel);
  ASSERT_THAT(as_kernel.compute(ctx), IsOk());
  EXPECT_EQ(slots[1].scalar<float>(), 5.0f);
}

}  // namespace
}  // namespace graphrun
