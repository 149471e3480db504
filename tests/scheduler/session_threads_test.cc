// Threads and sessions (issue 4): the peak number of threads running a
// session's kernels never exceeds its pool (inline steps included), pools
// shared by sessions, graph extension while other threads run, callers that
// are themselves inside an arena.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "tests/testing/op_harness.h"
#include "tests/testing/threads.h"

namespace graphrun {
namespace {

using ::testing::ElementsAre;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::run_bounded;
using testing::run_together;
using testing::StatusIs;
using testing::TensorEq;

// Counts the threads inside instrumented kernels, keeping the peak.
struct ConcurrencyProbe {
  std::atomic<int> active{0};
  std::atomic<int> peak{0};

  void enter() {
    const int now = active.fetch_add(1) + 1;
    int seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void leave() { active.fetch_sub(1); }
};

void spin_for(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

// parts[0] + parts[1] + ..., the last node named `name`.
Output add_all(Graph& g, const std::vector<Output>& parts, std::string_view name) {
  Output sum = parts[0];
  for (std::size_t i = 1; i + 1 < parts.size(); ++i) sum = ops::Add(g, sum, parts[i]);
  return ops::Add(g, sum, parts.back(), name);
}

// `width` independent probed nodes (each busy for `busy`, half of them also
// using intra-op parallel_for), summed into one output.
Output wide_probed_graph(Graph& g, ConcurrencyProbe* probe, int width,
                         std::chrono::microseconds busy) {
  std::vector<Output> parts;
  for (int i = 0; i < width; ++i) {
    const bool intra = i % 2 == 1;
    parts.push_back(ops::Call(g, {}, {DType::kFloat32},
                              [probe, busy, intra](OpKernelContext& ctx) -> Status {
                                if (intra) {
                                  ctx.parallel_for(8, 1, [&](int64_t begin, int64_t end) {
                                    for (int64_t k = begin; k < end; ++k) {
                                      probe->enter();
                                      spin_for(busy / 8);
                                      probe->leave();
                                    }
                                  });
                                } else {
                                  probe->enter();
                                  spin_for(busy);
                                  probe->leave();
                                }
                                return ctx.set_output(0, Tensor(1.0f));
                              },
                              {.output_shapes = {Shape()}, .stateful = true})[0]);
  }
  return add_all(g, parts, "total");
}

TEST(SessionThreadsTest, PeakKernelConcurrencyNeverExceedsThePoolSize) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    Graph g;
    ConcurrencyProbe probe;
    Output total = wide_probed_graph(g, &probe, 8, std::chrono::microseconds(500));
    SessionOptions options;
    options.inter_op_threads = threads;
    auto s = testing::make_session(g, options);
    run_together("6 callers", 6, [&](int) {
      for (int r = 0; r < 5; ++r) {
        EXPECT_THAT(s->run({}, {total}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(8.0f)))));
      }
    });
    EXPECT_GE(probe.peak.load(), 1);
    EXPECT_LE(probe.peak.load(), threads);
  }
}

// A cheap kernel (so its plan runs inline on the caller, outside the arena)
// that spreads work with parallel_for: the work must still run in the
// session's arena, within its pool.
class CheapSpreadKernel : public OpKernel {
 public:
  CheapSpreadKernel(ConcurrencyProbe* probe, std::atomic<int>* wrong_arena, int pool_size)
      : probe_(probe), wrong_arena_(wrong_arena), pool_size_(pool_size) {}
  bool is_cheap() const override { return true; }
  Status compute(OpKernelContext& ctx) override {
    ctx.parallel_for(16, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        if (tbb::this_task_arena::max_concurrency() != pool_size_) wrong_arena_->fetch_add(1);
        probe_->enter();
        spin_for(std::chrono::microseconds(50));
        probe_->leave();
      }
    });
    return ctx.set_output(0, ctx.input(0));
  }

 private:
  ConcurrencyProbe* probe_;
  std::atomic<int>* wrong_arena_;
  int pool_size_;
};

TEST(SessionThreadsTest, IntraOpWorkOfInlineStepsStaysInThePool) {
  // 3 threads: unlike the machine's default arena (2 on CI), so a chunk run
  // in the wrong arena shows in max_concurrency().
  constexpr int kPool = 3;
  ConcurrencyProbe probe;
  std::atomic<int> wrong_arena{0};
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  auto factory = std::make_shared<const KernelFactory>(
      [&](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
        return std::make_unique<CheapSpreadKernel>(&probe, &wrong_arena, kPool);
      });
  Result<Node*> spread =
      g.add_node(NodeSpec{.op = "Identity", .name = "spread", .inputs = {x}, .kernel = factory});
  ASSERT_THAT(spread.status(), IsOk());
  Output y = ops::Neg(g, Output(*spread, 0), "y");
  SessionOptions options;
  options.inter_op_threads = kPool;
  auto s = testing::make_session(g, options);
  run_together("6 callers", 6, [&](int t) {
    for (int r = 0; r < 5; ++r) {
      const auto v = static_cast<float>(t * 10 + r);
      EXPECT_THAT(s->run({{x, Tensor(v)}}, {y}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(-v)))));
    }
  });
  EXPECT_EQ(wrong_arena.load(), 0);
  EXPECT_GE(probe.peak.load(), 1);
  EXPECT_LE(probe.peak.load(), kPool);
}

TEST(SessionThreadsTest, SessionsSharingAPoolShareItsThreads) {
  Result<std::shared_ptr<ThreadPool>> pool = ThreadPool::create(2);
  ASSERT_THAT(pool.status(), IsOk());
  EXPECT_EQ((*pool)->num_threads(), 2);
  ConcurrencyProbe probe;  // shared by both sessions' kernels
  Graph g1, g2;
  Output t1 = wide_probed_graph(g1, &probe, 6, std::chrono::microseconds(500));
  Output t2 = wide_probed_graph(g2, &probe, 6, std::chrono::microseconds(500));
  SessionOptions options;
  options.thread_pool = *pool;
  options.inter_op_threads = 64;  // ignored: the pool decides
  auto s1 = testing::make_session(g1, options);
  auto s2 = testing::make_session(g2, options);
  run_together("6 callers, 2 sessions", 6, [&](int t) {
    Session& s = t % 2 == 0 ? *s1 : *s2;
    const Output& total = t % 2 == 0 ? t1 : t2;
    for (int r = 0; r < 5; ++r) {
      EXPECT_THAT(s.run({}, {total}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
    }
  });
  EXPECT_LE(probe.peak.load(), 2);
  // The pool outlives the sessions that share it, and can serve a new one.
  s1.reset();
  s2.reset();
  auto s3 = testing::make_session(g1, options);
  EXPECT_THAT(s3->run({}, {t1}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
}

// A pool of more threads than cores (allowed up to max_threads()) runs that
// many kernels at once: `width` kernels that each wait until all of them
// have started complete only then. oneTBB's default allows cores - 1
// workers, so without the pool raising that limit the step ran two at a
// time on two cores and its kernels waited for one another in vain.
TEST(SessionThreadsTest, APoolLargerThanTheMachineRunsThatManyKernelsAtOnce) {
  const int threads = std::min(ThreadPool::max_threads(), ThreadPool::default_threads() + 2);
  std::atomic<int> started{0};
  Graph g;
  std::vector<Output> parts;
  for (int i = 0; i < threads; ++i) {
    parts.push_back(ops::Call(g, {}, {DType::kFloat32},
                              [&started, threads](OpKernelContext& ctx) -> Status {
                                started.fetch_add(1);
                                const auto give_up =
                                    std::chrono::steady_clock::now() + std::chrono::seconds(20);
                                while (started.load() < threads) {
                                  if (std::chrono::steady_clock::now() > give_up) {
                                    return internal_error("only {} of {} kernels ever ran at once",
                                                          started.load(), threads);
                                  }
                                  std::this_thread::sleep_for(std::chrono::microseconds(100));
                                }
                                return ctx.set_output(0, Tensor(1.0f));
                              },
                              {.output_shapes = {Shape()}, .stateful = true})[0]);
  }
  Output total = add_all(g, parts, "total");
  SessionOptions options;
  options.inter_op_threads = threads;
  auto s = testing::make_session(g, options);
  EXPECT_THAT(s->run({}, {total}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(static_cast<float>(threads))))));
}

TEST(SessionThreadsTest, InvalidPoolSizeIsRejected) {
  EXPECT_THAT(ThreadPool::create(-1).status(), StatusIs(StatusCode::kInvalidArgument, "threads"));
}

// A kernel that runs another session (sharing the pool, or not) and the
// same session under another signature, from inside the arena.
TEST(SessionThreadsTest, KernelsMayCallSessionsWithoutDeadlock) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    Result<std::shared_ptr<ThreadPool>> pool = ThreadPool::create(threads);
    ASSERT_THAT(pool.status(), IsOk());
    Graph inner_g;
    Output ix = ops::Placeholder(inner_g, DType::kFloat32, Shape(), "x");
    Output iy = ops::Mul(inner_g, ix, ops::Const(inner_g, Tensor(10.0f)), "y");
    SessionOptions options;
    options.thread_pool = *pool;
    auto shared_inner = testing::make_session(inner_g, options);
    auto own_inner = testing::make_session(inner_g);

    Graph g;
    Output c = ops::Const(g, Tensor(2.0f), "c");
    Output sq = ops::Square(g, c, "sq");
    Session* self = nullptr;
    std::vector<Output> calls;
    for (int i = 0; i < 4; ++i) {
      calls.push_back(ops::Call(
          g, {c}, {DType::kFloat32},
          [&, i](OpKernelContext& ctx) -> Status {
            Session& inner = i % 2 == 0 ? *shared_inner : *own_inner;
            GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> a, inner.run({{ix, ctx.input(0)}}, {iy}));
            GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> b, self->run({}, {sq}));
            return ctx.set_output(0,
                                  Tensor(a[0].scalar<float>() + b[0].scalar<float>()));  // 20 + 4
          },
          {.output_shapes = {Shape()}})[0]);
    }
    Output total = add_all(g, calls, "total");
    auto s = testing::make_session(g, options);
    self = s.get();
    run_together("3 callers", 3, [&](int) {
      for (int r = 0; r < 5; ++r) {
        EXPECT_THAT(s->run({}, {total}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(96.0f)))));
      }
    });
  }
}

TEST(SessionThreadsTest, CallersInsideOneTbbTasksAndOtherArenas) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape(), "x");
  Output y = ops::Add(g, ops::Square(g, x), x, "y");
  auto s = testing::make_session(g);
  std::atomic<int> ok{0};
  auto check = [&](int i) {
    const auto v = static_cast<float>(i);
    Result<std::vector<Tensor>> out = s->run({{x, Tensor(v)}}, {y});
    if (out.is_ok() && (*out)[0].scalar<float>() == v * v + v) ok.fetch_add(1);
  };
  run_bounded("callers in oneTBB tasks", [&] {
    tbb::parallel_for(0, 64, check);  // workers of the default arena
    tbb::task_arena other(2);
    other.execute([&] { tbb::parallel_for(64, 128, check); });
  });
  EXPECT_EQ(ok.load(), 128);
}

TEST(SessionThreadsTest, DestroyingASessionWaitsForCallsInFlight) {
  Graph g;
  std::atomic<bool> started{false};
  std::atomic<bool> kernel_returned{false};
  Output p = ops::Call(
      g, {}, {DType::kFloat32},
      [&](OpKernelContext& ctx) -> Status {
        started.store(true);
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!ctx.is_cancelled()) {
          if (std::chrono::steady_clock::now() > give_up) return internal_error("never cancelled");
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        kernel_returned.store(true);
        return cancelled("stopped");
      },
      {}, "poller")[0];
  auto s = testing::make_session(g);
  Session* raw = s.get();
  auto run = std::async(std::launch::async, [raw, p] { return raw->run({}, {p}).status(); });
  while (!started.load()) std::this_thread::yield();
  s.reset();  // closes, then returns only once the run has left the session
  EXPECT_TRUE(kernel_returned.load());
  ASSERT_EQ(run.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_THAT(run.get(), StatusIs(StatusCode::kCancelled, "closed"));
}

TEST(SessionThreadsTest, ExtendWhileOtherThreadsRun) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape(), "x");
  Output y = ops::Add(g, x, ops::Const(g, Tensor(1.0f)), "y");
  auto s = testing::make_session(g);
  constexpr int kExtensions = 40;
  std::atomic<bool> extending{true};
  std::atomic<int> runs{0};
  // Three runners on the old signature, one thread extending.
  run_together("extend under load", 4, [&](int t) {
    if (t == 3) {
      while (runs.load() < 3) std::this_thread::yield();  // the runners are running
      for (int i = 0; i < kExtensions; ++i) {
        // Each new node adds i to y; run it right after extending.
        Output z =
            ops::Add(g, y, ops::Const(g, Tensor(static_cast<float>(i))), fmt::format("z{}", i));
        EXPECT_THAT(s->extend(g), IsOk());
        EXPECT_THAT(s->run({{x, Tensor(1.0f)}}, {z}),
                    IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f + static_cast<float>(i))))));
      }
      extending.store(false);
      return;
    }
    int i = 0;
    while (extending.load()) {
      const auto v = static_cast<float>(t * 1000 + i++);
      EXPECT_THAT(s->run({{"x", Tensor(v)}}, {"y"}),
                  IsOkAndHolds(ElementsAre(TensorEq(Tensor(v + 1.0f)))));
      runs.fetch_add(1);
    }
  });
  EXPECT_GT(runs.load(), 0);
  EXPECT_EQ(s->graph().num_nodes(), g.num_nodes());
  // Every extension is still runnable by name.
  EXPECT_THAT(s->run({{x, Tensor(0.0f)}}, {fmt::format("z{}", kExtensions - 1)}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(1.0f + kExtensions - 1)))));
}

}  // namespace
}  // namespace graphrun
