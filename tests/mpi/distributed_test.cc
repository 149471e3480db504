// One graph across ranks: DistributedSession on rank 0, serve() on the
// others (part of mpi_test, run under mpirun on 1, 2 and 4 ranks). Every
// rank builds the same graph; nodes go to the last rank ("far") with a
// device scope, so that on 1 rank everything is local and on 4 ranks two
// ranks serve without work. Results are checked against an ordinary
// Session over the same graph in the driver's process.
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;
using testing::StatusIs;

int rank() { return mpi::World::current()->rank(); }
int size() { return mpi::World::current()->size(); }
std::string far() { return "/rank:" + std::to_string(size() - 1); }

RunOptions bounded() {
  RunOptions options;
  options.timeout = 60s;
  return options;
}

SessionOptions threads(int n) {
  SessionOptions options;
  options.inter_op_threads = n;
  return options;
}

// A node "check" on the caller's device scope: x, or InvalidArgument
// "negative input" when x < 0.
Output checked(Graph& g, Output x) {
  return ops::Call(
      g, {x}, {DType::kFloat32},
      [](OpKernelContext& ctx) -> Status {
        if (ctx.input(0).scalar<float>() < 0) return invalid_argument("negative input");
        return ctx.set_output(0, ctx.input(0));
      },
      {}, "check")[0];
}

// Rank 0 drives `g` with `drive`; the other ranks serve it until it closes.
void across_ranks(const Graph& g, const std::function<void(mpi::DistributedSession&)>& drive,
                  SessionOptions options = threads(2), mpi::ClusterOptions cluster = {}) {
  if (rank() != 0) {
    EXPECT_THAT(mpi::serve(g, options), IsOk());
    return;
  }
  auto session = mpi::DistributedSession::create(g, options, cluster);
  ASSERT_THAT(session, IsOk());
  drive(**session);
  EXPECT_THAT((*session)->close(), IsOk());
}

class DistributedTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

// x (rank 0) -> MatMul with w on the far rank -> Add on rank 0, and a
// tensor of the far rank fetched directly.
struct TwoStage {
  Graph g;
  Output x, w, product, sum, scaled;
  TwoStage() {
    x = ops::Placeholder(g, DType::kFloat32, Shape{2, 2}, "x");
    {
      auto scope = g.device(far());
      w = ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}}), "w");
      product = ops::MatMul(g, x, w, {}, "product");
      scaled = ops::Mul(g, product, ops::Const(g, Tensor(2.0f)), "scaled");
    }
    auto back = g.device("/rank:0");  // else it would follow `product`
    sum = ops::Add(g, product, x, "sum");
  }
};

TEST_F(DistributedTest, RunAcrossRanksGivesTheResultsOfOneProcess) {
  TwoStage t;
  ASSERT_THAT(t.g.status(), IsOk());
  const Tensor x = Tensor::matrix<float>({{1, -1}, {0.5f, 2}});
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    const auto& placed = s.placement();
    EXPECT_EQ(placed[t.product.node()->id()], size() - 1);
    EXPECT_EQ(placed[t.sum.node()->id()], 0);
    auto local = Session::create(t.g).value();
    auto want = local->run({{t.x, x}}, {t.sum, t.scaled, t.product}).value();
    for (int k = 0; k < 3; ++k) {  // the same signature again: cached plans
      auto got = s.run({{t.x, x}}, {t.sum, t.scaled, t.product}, {}, bounded());
      ASSERT_THAT(got, IsOk());
      ASSERT_EQ(got->size(), 3u);
      for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE((*got)[i].equals(want[i])) << i;
    }
    // Another signature, by name, fetching a far tensor only.
    auto only_far = s.run({{"x", x}}, {"scaled:0"}, {}, bounded());
    ASSERT_THAT(only_far, IsOk());
    EXPECT_TRUE((*only_far)[0].equals(want[1]));
  });
}

TEST_F(DistributedTest, AnyTensorMayBeFedOnWhicheverRankMakesIt) {
  TwoStage t;
  const Tensor x = Tensor::matrix<float>({{1, 0}, {0, 1}});
  const Tensor p = Tensor::matrix<float>({{10, 20}, {30, 40}});
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    // `product` lives on the far rank: fed there, its MatMul does not run.
    auto got = s.run({{t.x, x}, {t.product, p}}, {t.sum, t.scaled}, {}, bounded());
    ASSERT_THAT(got, IsOk());
    EXPECT_TRUE((*got)[0].equals(Tensor::matrix<float>({{11, 20}, {30, 41}})));
    EXPECT_TRUE((*got)[1].equals(Tensor::matrix<float>({{20, 40}, {60, 80}})));
    // Fetching a fed tensor returns the fed value.
    auto fed = s.run({{t.product, p}}, {t.product}, {}, bounded());
    ASSERT_THAT(fed, IsOk());
    EXPECT_TRUE((*fed)[0].equals(p));
  });
}

// A Callable gives run()'s results from positional feeds, from many
// threads at once, with far and local fetches, and checks its arity.
TEST_F(DistributedTest, ACallableRunsTheSignatureAcrossRanks) {
  TwoStage t;
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    auto local = Session::create(t.g).value();
    auto callable = s.make_callable({t.x}, {t.scaled, t.sum});
    ASSERT_THAT(callable, IsOk());
    EXPECT_EQ(callable->num_feeds(), 1u);
    EXPECT_EQ(callable->num_fetches(), 2u);
    std::atomic<int> wrong{0};
    std::vector<std::thread> callers;
    for (int k = 0; k < 3; ++k) {
      callers.emplace_back([&, k] {
        for (int i = 0; i < 10; ++i) {
          const Tensor x = Tensor::matrix<float>({{float(k), float(i)}, {1, -2}});
          auto want = local->run({{t.x, x}}, {t.scaled, t.sum}).value();
          std::vector<Tensor> got(2);
          const Tensor feeds[] = {x};
          if (!callable->run(feeds, got, bounded()).is_ok() || !got[0].equals(want[0]) ||
              !got[1].equals(want[1])) {
            ++wrong;
          }
        }
      });
    }
    for (auto& c : callers) c.join();
    EXPECT_EQ(wrong.load(), 0);
    // Only targets and a far fetch: rank 0 may have no part of its own.
    auto far_only = s.make_callable({t.x}, {t.product});
    ASSERT_THAT(far_only, IsOk());
    std::vector<Tensor> product(1);
    const Tensor eye[] = {Tensor::matrix<float>({{1, 0}, {0, 1}})};
    ASSERT_THAT(far_only->run(eye, product, bounded()), IsOk());
    EXPECT_TRUE(product[0].equals(Tensor::matrix<float>({{1, 2}, {3, 4}})));
    // Arity and names.
    std::vector<Tensor> one(1);
    EXPECT_THAT(callable->run({}, one), StatusIs(StatusCode::kInvalidArgument, "takes 1 feeds"));
    EXPECT_THAT(s.make_callable({"nope"}, {t.sum}), StatusIs(StatusCode::kNotFound, "nope"));
    mpi::DistributedSession::Callable empty;
    EXPECT_FALSE(empty.is_valid());
    EXPECT_THAT(empty.run({}, {}), StatusIs(StatusCode::kFailedPrecondition, "empty"));
  });
}

// A worker without the graph (serve_without_graph) gets its part from the
// driver as a GraphDef: one process's results for run, a far fetch (a
// fetch edge added to the adopted part), a partial run, and a far
// variable updated once per step.
TEST_F(DistributedTest, AWorkerWithoutTheGraphGetsItsPartFromTheDriver) {
  TwoStage t;
  Output counter, bump, runs;
  {
    auto scope = t.g.device(far());
    counter = ops::Variable(t.g, Tensor(int64_t{0}), "runs_var");
    bump = ops::AssignAdd(t.g, counter, ops::Const(t.g, Tensor(int64_t{1})), {}, "bump");
  }
  runs = ops::Identity(t.g, ops::ReadVariable(t.g, counter), "runs");  // placed with the variable
  const Node* init = ops::GlobalVariablesInitializer(t.g);
  ASSERT_THAT(t.g.status(), IsOk());
  if (rank() != 0) {
    EXPECT_THAT(mpi::serve_without_graph(threads(2)), IsOk());
    return;
  }
  auto s = mpi::DistributedSession::create(t.g, threads(2));
  ASSERT_THAT(s, IsOk());
  auto local = Session::create(t.g).value();
  const Tensor x = Tensor::matrix<float>({{1, -1}, {0.5f, 2}});
  auto want = local->run({{t.x, x}}, {t.sum, t.scaled}).value();
  ASSERT_THAT((*s)->run({}, {}, {init}, bounded()), IsOk());
  auto got = (*s)->run({{t.x, x}}, {t.sum, t.scaled}, {bump.node()}, bounded());
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE((*got)[0].equals(want[0]));
  EXPECT_TRUE((*got)[1].equals(want[1]));
  auto run = (*s)->partial_run_setup({t.scaled, t.sum}, {t.x}, {bump.node()}, bounded());
  ASSERT_THAT(run, IsOk());
  auto first = (*s)->partial_run(*run, {{t.x, x}}, {t.scaled}, {}, bounded());
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE((*first)[0].equals(want[1]));
  auto second = (*s)->partial_run(*run, {}, {t.sum}, {bump.node()}, bounded());
  ASSERT_THAT(second, IsOk());
  EXPECT_TRUE((*second)[0].equals(want[0]));
  auto total = (*s)->run({}, {runs}, {}, bounded());
  ASSERT_THAT(total, IsOk());
  EXPECT_EQ((*total)[0].scalar<int64_t>(), 2);  // once per step, once per partial run
  EXPECT_THAT((*s)->close(), IsOk());
}

// A Call node's kernel is code of the driver's program: a part holding one
// cannot be sent, and create() fails naming the node and the rank; that
// worker's serve_without_graph() returns Aborted.
TEST_F(DistributedTest, ACallNodeCannotBeSentToAWorkerWithoutTheGraph) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  {
    auto scope = g.device(far());
    static_cast<void>(checked(g, x));
  }
  ASSERT_THAT(g.status(), IsOk());
  if (rank() != 0) {
    const Status s = mpi::serve_without_graph();
    if (rank() == size() - 1) {
      EXPECT_THAT(s, StatusIs(StatusCode::kAborted, "create failed"));
    } else {  // an empty part: taken, or the close came first
      EXPECT_TRUE(s.is_ok() || s.code() == StatusCode::kAborted) << s.to_string();
    }
    return;
  }
  auto s = mpi::DistributedSession::create(g);
  if (size() == 1) {  // everything on rank 0: nothing to send
    EXPECT_THAT(s, IsOk());
    return;
  }
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "'check'"));
  EXPECT_THAT(s,
              StatusIs(StatusCode::kInvalidArgument, "rank " + std::to_string(size() - 1) + ":"));
}

// A variable on the far rank, updated from many threads of the driver at
// once, read from rank 0 through another signature: no update is lost.
TEST_F(DistributedTest, ConcurrentUpdatesOfAFarVariableAreNeverLost) {
  Graph g;
  Output var, add, read;
  {
    auto scope = g.device(far());
    var = ops::Variable(g, Tensor(int64_t{0}), "counter");
    add = ops::AssignAdd(g, var, ops::Const(g, Tensor(int64_t{1})), {}, "bump");
  }
  read = ops::Identity(g, ops::ReadVariable(g, var), "read");  // placed with the variable
  const Node* init = ops::GlobalVariablesInitializer(g);
  ASSERT_THAT(g.status(), IsOk());
  constexpr int kThreads = 4;
  constexpr int kEach = 25;
  across_ranks(
      g,
      [&](mpi::DistributedSession& s) {
        ASSERT_THAT(s.run({}, {}, {init}, bounded()), IsOk());
        std::vector<std::thread> workers;
        std::atomic<int> failures{0};
        for (int k = 0; k < kThreads; ++k) {
          workers.emplace_back([&] {
            for (int i = 0; i < kEach; ++i) {
              if (!s.run({}, {}, {add.node()}, bounded()).is_ok()) ++failures;
            }
          });
        }
        for (auto& w : workers) w.join();
        EXPECT_EQ(failures.load(), 0);
        auto total = s.run({}, {read}, {}, bounded());
        ASSERT_THAT(total, IsOk());
        EXPECT_EQ((*total)[0].scalar<int64_t>(), kThreads * kEach);
      },
      threads(kThreads));
}

// A variable "v" on the far rank holding `initial`, and "bump", an
// AssignAdd of 1 to it (also on the far rank).
std::pair<Output, Output> far_counter(Graph& g, float initial) {
  auto scope = g.device(far());
  Output var = ops::Variable(g, Tensor(initial), "v");
  return {var, ops::AssignAdd(g, var, ops::Const(g, Tensor(1.0f)), {}, "bump")};
}

// Targets are named as one process's session takes them: "node", "^node"
// or "node:0" (the distributed session once refused "node:0" with
// NotFound, so its counters drifted from one process's).
TEST_F(DistributedTest, TargetsNamedLikeTensorsRunTheirNode) {
  Graph g;
  const auto [var, bump] = far_counter(g, 0.0f);
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output read = ops::ReadVariable(g, var, "read");
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    ASSERT_THAT(s.run({}, {}, {init}, bounded()), IsOk());
    for (const char* name : {"bump", "^bump", "bump:0"}) {
      SCOPED_TRACE(name);
      EXPECT_THAT(s.run({}, {}, {name}, bounded()), IsOk());
    }
    auto v = s.run({}, {read}, {}, bounded());
    ASSERT_THAT(v, IsOk());
    EXPECT_EQ((*v)[0].scalar<float>(), 3.0f);
  });
}

// A control edge across ranks orders the nodes as in one process.
TEST_F(DistributedTest, ControlEdgesCrossRanks) {
  Graph g;
  const auto [var, bump] = far_counter(g, 10.0f);
  const Node* init = ops::GlobalVariablesInitializer(g);
  Output after;
  {
    auto deps = g.control_dependencies({bump.node()});
    after = ops::Const(g, Tensor(7.0f), "after");  // rank 0, after bump
  }
  Output read;
  {
    auto scope = g.device(far());
    read = ops::ReadVariable(g, var, "read");
  }
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    ASSERT_THAT(s.run({}, {}, {init}, bounded()), IsOk());
    for (int k = 0; k < 3; ++k) {
      auto got = s.run({}, {after}, {}, bounded());
      ASSERT_THAT(got, IsOk());
      EXPECT_EQ((*got)[0].scalar<float>(), 7.0f);
    }
    auto v = s.run({}, {read}, {}, bounded());
    ASSERT_THAT(v, IsOk());
    EXPECT_EQ((*v)[0].scalar<float>(), 13.0f);  // bump ran once per step
  });
}

// A kernel error on the far rank ends the step everywhere and names the
// rank and the node; the session goes on.
TEST_F(DistributedTest, AWorkerErrorNamesItsRankAndNode) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  Output y;
  {
    auto scope = g.device(far());
    y = checked(g, x);
  }
  Output z = ops::Add(g, y, x, "z");
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    const std::string where = size() > 1 ? "rank " + std::to_string(size() - 1) + ": " : "";
    EXPECT_THAT(s.run({{x, Tensor(-1.0f)}}, {z}, {}, bounded()),
                StatusIs(StatusCode::kInvalidArgument, where + "node 'check' (Call)"));
    auto ok = s.run({{x, Tensor(2.0f)}}, {z}, {}, bounded());
    ASSERT_THAT(ok, IsOk());
    EXPECT_EQ((*ok)[0].scalar<float>(), 4.0f);
  });
}

// A deadline ends a step whose far part never finishes, on every rank; so
// does the caller's stop token.
TEST_F(DistributedTest, DeadlinesAndStopsReachEveryRank) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output slow;
  {
    auto scope = g.device(far());
    slow = ops::Call(
        g, {x}, {DType::kFloat32},
        [](OpKernelContext& ctx) -> Status {
          if (ctx.input(0).scalar<float>() > 0) {
            while (!ctx.is_cancelled()) std::this_thread::sleep_for(1ms);
            return cancelled("gave up");
          }
          return ctx.set_output(0, ctx.input(0));
        },
        {}, "slow")[0];
  }
  Output z = ops::Add(g, slow, x, "z");
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    RunOptions soon;
    soon.timeout = 200ms;
    // Whichever rank's report comes first names what it waited for: the
    // far kernel 'slow', or rank 0's Recv of the fetch z:0 (named after it,
    // where it was once 'mpi_partition/recv_0').
    auto late = s.run({{x, Tensor(1.0f)}}, {z}, {}, soon);
    EXPECT_THAT(late, StatusIs(StatusCode::kDeadlineExceeded, ""));
    const std::string why = late.status().message();
    EXPECT_TRUE(why.find("node 'slow' (Call)") != std::string::npos ||
                why.find("node 'mpi_partition/z_0_from_rank_" + std::to_string(size() - 1) +
                         "' (MpiPartitionRecv)") != std::string::npos)
        << why;
    std::stop_source stop;
    RunOptions stoppable = bounded();
    stoppable.stop_token = stop.get_token();
    std::thread stopper([&] {
      std::this_thread::sleep_for(100ms);
      stop.request_stop();
    });
    auto stopped = s.run({{x, Tensor(1.0f)}}, {z}, {}, stoppable);
    EXPECT_THAT(stopped, StatusIs(StatusCode::kCancelled, ""));
    // The stop is the caller's: no rank is named for it (once "rank -1").
    EXPECT_EQ(stopped.status().message().find("rank -"), std::string::npos)
        << stopped.status().to_string();
    stopper.join();
    auto ok = s.run({{x, Tensor(0.0f)}}, {z}, {}, bounded());
    EXPECT_THAT(ok, IsOk());
  });
}

// A rank that does not answer (here: a kernel that ignores cancellation,
// as a stopped process would) fails the step with Unavailable naming it,
// a second after the deadline, instead of a hang; the session goes on.
TEST_F(DistributedTest, ARankThatDoesNotAnswerIsUnavailableAfterTheDeadline) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output stuck;
  {
    auto scope = g.device(far());
    stuck = ops::Call(
        g, {x}, {DType::kFloat32},
        [](OpKernelContext& ctx) -> Status {
          if (ctx.input(0).scalar<float>() > 0) std::this_thread::sleep_for(3s);
          return ctx.set_output(0, ctx.input(0));
        },
        {}, "stuck")[0];
  }
  auto back = g.device("/rank:0");
  Output z = ops::Add(g, stuck, x, "z");
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    RunOptions soon;
    soon.timeout = 200ms;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = s.run({{x, Tensor(1.0f)}}, {z}, {}, soon);
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (size() > 1) {
      EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable,
                              "rank " + std::to_string(size() - 1) + " did not answer"));
      EXPECT_LT(waited, 2800ms);  // not the kernel's 3 s
    } else {
      EXPECT_THAT(r, StatusIs(StatusCode::kDeadlineExceeded, ""));  // the kernel is local
    }
    auto p = s.partial_run_setup({z}, {x}, {}, soon);
    ASSERT_THAT(p, IsOk());
    auto pr = s.partial_run(*p, {{x, Tensor(1.0f)}}, {z}, {}, soon);
    EXPECT_THAT(
        pr, StatusIs(size() > 1 ? StatusCode::kUnavailable : StatusCode::kDeadlineExceeded, ""));
    EXPECT_TRUE(p->is_done());
    auto ok = s.run({{x, Tensor(0.0f)}}, {z}, {}, bounded());
    EXPECT_THAT(ok, IsOk());
  });
}

// A graph whose far rank reports its process id ('pid') and stops its own
// process (SIGSTOP) when 'stops' runs with x > 0; z = stops + x on rank 0.
// Its cluster options find a silent rank within 1.5 s.
struct StoppingWorker {
  Graph g;
  Output x, pid, stops, z;
  StoppingWorker() {
    x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    {
      auto scope = g.device(far());
      pid = ops::Call(
          g, {}, {DType::kInt64},
          [](OpKernelContext& ctx) -> Status {
            return ctx.set_output(0, Tensor(static_cast<int64_t>(::getpid())));
          },
          {}, "pid")[0];
      stops = ops::Call(
          g, {x}, {DType::kFloat32},
          [](OpKernelContext& ctx) -> Status {
            if (ctx.input(0).scalar<float>() > 0) std::raise(SIGSTOP);
            return ctx.set_output(0, ctx.input(0));
          },
          {}, "stops")[0];
    }
    auto back = g.device("/rank:0");
    z = ops::Add(g, stops, x, "z");
  }
  static mpi::ClusterOptions cluster() {
    mpi::ClusterOptions c;
    c.heartbeat_interval = 100ms;
    c.heartbeat_timeout = 1500ms;
    return c;
  }
  // The far rank's process id, 0 when the run fails (reported here).
  pid_t worker_pid(mpi::DistributedSession& s) const {
    auto who = s.run({}, {pid}, {}, bounded());
    EXPECT_THAT(who, IsOk());
    return who.is_ok() ? static_cast<pid_t>((*who)[0].scalar<int64_t>()) : 0;
  }
};

// A worker process stopped (SIGSTOP) in the middle of a call without a
// deadline: the heartbeat finds it silent, and the call fails with
// Unavailable naming its rank instead of waiting for ever. Once it
// continues (SIGCONT) it answers again and later steps run.
TEST_F(DistributedTest, AStoppedWorkerFailsCallsWithoutADeadlineSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs a worker rank";
  StoppingWorker w;
  auto& [g, x, pid, stops, z] = w;
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(
      g,
      [&](mpi::DistributedSession& s) {
        const pid_t worker = w.worker_pid(s);
        ASSERT_GT(worker, 0);
        const std::string silent = "rank " + std::to_string(size() - 1) + ": sent nothing";
        // No deadline: only the heartbeat ends the call.
        auto r = s.run({{x, Tensor(1.0f)}}, {z});
        EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable, silent));
        // The rank is still stopped: a partial run's setup fails the same way.
        auto p = s.partial_run_setup({z}, {x});
        EXPECT_THAT(p, StatusIs(StatusCode::kUnavailable, silent));
        ASSERT_EQ(::kill(worker, SIGCONT), 0);
        // It answers again within a heartbeat or two.
        Result<std::vector<Tensor>> ok = unavailable("not run");
        for (int attempt = 0; attempt < 100 && !ok.is_ok(); ++attempt) {
          ok = s.run({{x, Tensor(0.0f)}}, {z}, {}, bounded());
          if (!ok.is_ok()) {
            EXPECT_THAT(ok, StatusIs(StatusCode::kUnavailable, silent));
            std::this_thread::sleep_for(100ms);
          }
        }
        ASSERT_THAT(ok, IsOk());
        EXPECT_EQ((*ok)[0].scalar<float>(), 0.0f);
      },
      threads(2), StoppingWorker::cluster());
}

// close() with a worker stopped (SIGSTOP): it does not wait its whole
// close_timeout for a rank the heartbeat finds silent, and says which.
// The worker, continued, ends its serve() as usual.
TEST_F(DistributedTest, CloseDoesNotWaitForAStoppedWorkerSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs a worker rank";
  StoppingWorker w;
  auto& [g, x, pid, stops, z] = w;
  ASSERT_THAT(g.status(), IsOk());
  mpi::ClusterOptions cluster = StoppingWorker::cluster();
  cluster.close_timeout = 60s;  // the old close waited this long, then named no cause
  across_ranks(
      g,
      [&](mpi::DistributedSession& s) {
        const pid_t worker = w.worker_pid(s);
        ASSERT_GT(worker, 0);
        // The worker stops inside this step; the call returns when the
        // heartbeat finds it silent.
        auto r = s.run({{x, Tensor(1.0f)}}, {stops});
        EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable, "sent nothing"));
        EXPECT_THAT(s.close(), StatusIs(StatusCode::kUnavailable,
                                        "rank " + std::to_string(size() - 1) +
                                            " did not confirm the session's close: it sent "
                                            "nothing for 1500 ms"));
        ASSERT_EQ(::kill(worker, SIGCONT), 0);
      },
      threads(2), cluster);
}

// A heartbeat that could never be answered in time is refused.
TEST_F(DistributedTest, AHeartbeatTimeoutShorterThanItsIntervalIsRefused) {
  Graph g;
  ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  if (rank() != 0) {
    // The driver's create() fails before its hello: serve() is closed.
    EXPECT_THAT(mpi::serve(g), IsOk());
    return;
  }
  mpi::ClusterOptions cluster;
  cluster.heartbeat_interval = 1000ms;
  cluster.heartbeat_timeout = 500ms;
  EXPECT_THAT(mpi::DistributedSession::create(g, {}, cluster),
              StatusIs(StatusCode::kInvalidArgument, "heartbeat_timeout (500 ms)"));
}

// Ranks that built different graphs never run a step.
TEST_F(DistributedTest, ADifferentGraphOnAWorkerIsRefusedSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs a worker rank";
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  if (rank() == size() - 1) static_cast<void>(ops::Identity(g, x, "extra"));
  ASSERT_THAT(g.status(), IsOk());
  if (rank() == 0) {
    EXPECT_THAT(mpi::DistributedSession::create(g),
                StatusIs(StatusCode::kFailedPrecondition,
                         "rank " + std::to_string(size() - 1) + ": this rank's graph"));
  } else if (rank() == size() - 1) {
    EXPECT_THAT(mpi::serve(g), StatusIs(StatusCode::kFailedPrecondition, "not the driver"));
  } else {
    EXPECT_THAT(mpi::serve(g), IsOk());  // closed by the failed create()
  }
}

// A placement that cannot hold fails create() and every serve(), naming
// the node; nobody waits for a hello.
TEST_F(DistributedTest, APlacementThatCannotHoldFailsOnEveryRank) {
  Graph bad;  // a fine graph whose placement is not
  {
    Output y = ops::Placeholder(bad, DType::kFloat32, Shape{}, "y");
    auto scope = bad.device("/rank:64");
    static_cast<void>(ops::Identity(bad, y, "elsewhere"));
  }
  ASSERT_THAT(bad.status(), IsOk());
  if (rank() == 0) {
    EXPECT_THAT(mpi::DistributedSession::create(bad),
                StatusIs(StatusCode::kInvalidArgument, "'elsewhere'"));
  } else {
    EXPECT_THAT(mpi::serve(bad), StatusIs(StatusCode::kInvalidArgument, "'elsewhere'"));
  }
}

TEST_F(DistributedTest, CloseEndsTheWorkersAndLaterRuns) {
  TwoStage t;
  if (rank() != 0) {
    EXPECT_THAT(mpi::serve(t.g), IsOk());
    return;
  }
  auto s = mpi::DistributedSession::create(t.g).value();
  // A second session while this one is open is refused, and takes nothing
  // from it (it once timed out after 5 s and shut this one's workers down:
  // the run below then failed).
  EXPECT_THAT(mpi::DistributedSession::create(t.g),
              StatusIs(StatusCode::kFailedPrecondition, "another DistributedSession"));
  ASSERT_THAT(s->run({{t.x, Tensor::filled<float>(Shape{2, 2}, 1.0f)}}, {t.sum}, {}, bounded()),
              IsOk());
  auto callable = s->make_callable({t.x}, {t.scaled});
  ASSERT_THAT(callable, IsOk());
  ASSERT_THAT(s->close(), IsOk());
  EXPECT_THAT(s->close(), IsOk());
  EXPECT_THAT(s->run({{t.x, Tensor::filled<float>(Shape{2, 2}, 1.0f)}}, {t.sum}),
              StatusIs(StatusCode::kCancelled, "closed"));
  const Tensor feeds[] = {Tensor::filled<float>(Shape{2, 2}, 1.0f)};
  std::vector<Tensor> fetched(1);
  EXPECT_THAT(callable->run(feeds, fetched), StatusIs(StatusCode::kCancelled, "closed"));
  EXPECT_THAT(s->make_callable({t.x}, {t.sum}), StatusIs(StatusCode::kCancelled, "closed"));
  EXPECT_THAT(s->extend(t.g), StatusIs(StatusCode::kCancelled, "closed"));
}

TEST_F(DistributedTest, MisuseIsReportedOnTheDriver) {
  TwoStage t;
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    // Prefixed as one process's session prefixes them.
    EXPECT_THAT(s.run({}, {"nope:0"}), StatusIs(StatusCode::kNotFound, "fetch 'nope:0': "));
    EXPECT_THAT(s.run({{"nope:0", Tensor(1.0f)}}, {t.sum}),
                StatusIs(StatusCode::kNotFound, "feed 'nope:0': "));
    EXPECT_THAT(s.run({}, {}, {"nope"}), StatusIs(StatusCode::kNotFound, "nope"));
    EXPECT_THAT(s.run({}, {}),
                StatusIs(StatusCode::kInvalidArgument, "at least one target to fetch or execute"));
    // x is not fed: the error of rank 0's own part.
    EXPECT_THAT(s.run({}, {t.sum}, {}, bounded()), StatusIs(StatusCode::kInvalidArgument, "'x'"));
  });
  if (rank() == 0) {
    EXPECT_THAT(mpi::serve(t.g), StatusIs(StatusCode::kFailedPrecondition, "rank 0"));
  } else {
    EXPECT_THAT(mpi::DistributedSession::create(t.g),
                StatusIs(StatusCode::kFailedPrecondition, "rank 0"));
  }
}

// x (rank 0) -> h = 2x on the far rank, which counts its runs in a far
// variable -> y = h + z on rank 0; p is a placeholder of the far rank.
struct Staged {
  Graph g;
  Output x, z, p, h, y, q, count;
  const Node* init = nullptr;
  Staged() {
    x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    z = ops::Placeholder(g, DType::kFloat32, Shape{}, "z");
    {
      auto scope = g.device(far());
      Output counter = ops::Variable(g, Tensor(int64_t{0}), "runs");
      Output bump = ops::AssignAdd(g, counter, ops::Const(g, Tensor(int64_t{1})), {}, "bump");
      {
        auto deps = g.control_dependencies({bump.node()});
        h = ops::Mul(g, x, ops::Const(g, Tensor(2.0f)), "h");
      }
      count = ops::ReadVariable(g, counter, "count");
      p = ops::Placeholder(g, DType::kFloat32, Shape{}, "p");
      q = ops::Mul(g, p, ops::Const(g, Tensor(3.0f)), "q");
    }
    auto back = g.device("/rank:0");
    y = ops::Add(g, h, z, "y");
    q = ops::Add(g, q, z, "q_plus_z");
    init = ops::GlobalVariablesInitializer(g);
  }
};

int64_t runs_of(mpi::DistributedSession& s, const Staged& t) {
  auto c = s.run({}, {t.count}, {}, bounded());
  return c.is_ok() ? (*c)[0].scalar<int64_t>() : -1;
}

// A tensor fed twice (as an Output and by name) is refused on the driver,
// as one process refuses it, before any rank runs: the far counter's bump
// does not act. Once the far rank alone refused it, after rank 0's part ran.
TEST_F(DistributedTest, AFeedGivenTwiceIsRefusedBeforeAnyRankRuns) {
  Staged t;
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    ASSERT_THAT(s.run({}, {}, {t.init}, bounded()), IsOk());
    const FeedList twice{
        {t.x, Tensor(1.0f)}, {t.z, Tensor(0.0f)}, {t.p, Tensor(1.0f)}, {"p:0", Tensor(2.0f)}};
    EXPECT_THAT(s.run(twice, {t.y, t.q}, {}, bounded()),
                StatusIs(StatusCode::kInvalidArgument, "tensor 'p:0' is fed more than once"));
    EXPECT_EQ(runs_of(s, t), 0);
    EXPECT_THAT(s.make_callable({t.p, "p:0"}, {t.q}),
                StatusIs(StatusCode::kInvalidArgument, "tensor 'p:0' is fed more than once"));
    EXPECT_THAT(s.partial_run_setup({t.q}, {t.p, "p:0"}, {}, bounded()),
                StatusIs(StatusCode::kInvalidArgument, "tensor 'p:0' is fed more than once"));
    EXPECT_THAT(s.run({{t.x, Tensor(1.0f)}, {t.z, Tensor(0.0f)}}, {t.y}, {}, bounded()), IsOk());
    EXPECT_EQ(runs_of(s, t), 1);
  });
}

// One execution over several calls: the far stage runs once, as far as
// the first call's feeds allow, and the second call continues it (twice:
// once per partial run).
void expect_partial_runs_span_ranks(mpi::DistributedSession& s, const Staged& t,
                                    const RunOptions& options) {
  ASSERT_THAT(s.run({}, {}, {t.init}, options), IsOk());
  for (int round = 1; round <= 2; ++round) {
    auto run = s.partial_run_setup({t.h, t.y}, {t.x, t.z}, {}, options);
    ASSERT_THAT(run, IsOk());
    auto h = s.partial_run(*run, {{t.x, Tensor(3.0f)}}, {t.h}, {}, options);
    ASSERT_THAT(h, IsOk());
    EXPECT_EQ((*h)[0].scalar<float>(), 6.0f);
    EXPECT_FALSE(run->is_done());
    auto y = s.partial_run(*run, {{t.z, Tensor(1.0f)}}, {t.y}, {}, options);
    ASSERT_THAT(y, IsOk());
    EXPECT_EQ((*y)[0].scalar<float>(), 7.0f);
    EXPECT_TRUE(run->is_done());
    EXPECT_EQ(runs_of(s, t), round);  // the far stage ran once per partial run
  }
}

// A feed of a far tensor goes to its rank in a later call.
void expect_a_far_feed_in_a_later_call(mpi::DistributedSession& s, const Staged& t,
                                       const RunOptions& options) {
  auto run = s.partial_run_setup({t.q}, {t.p, t.z}, {}, options);
  ASSERT_THAT(run, IsOk());
  ASSERT_THAT(s.partial_run(*run, {{t.z, Tensor(0.5f)}}, {}, {}, options), IsOk());
  auto q = s.partial_run(*run, {{t.p, Tensor(2.0f)}}, {t.q}, {}, options);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ((*q)[0].scalar<float>(), 6.5f);
}

TEST_F(DistributedTest, APartialRunSpansRanksAndRunsEachNodeOnce) {
  Staged t;
  ASSERT_THAT(t.g.status(), IsOk());
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    ASSERT_NO_FATAL_FAILURE(expect_partial_runs_span_ranks(s, t, bounded()));
  });
}

TEST_F(DistributedTest, APartialRunFeedsAFarPlaceholderInALaterCall) {
  Staged t;
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    ASSERT_NO_FATAL_FAILURE(expect_a_far_feed_in_a_later_call(s, t, bounded()));
  });
}

// One thread on every rank (mpirun's default binding gives each rank one
// core): a worker's part of a partial run goes on between the driver's
// calls (its Sends go out though no call waits on the worker), and the
// last call returns. Once the worker's part stopped at the first call.
TEST_F(DistributedTest, PartialRunsSpanRanksWithOneThreadOnEveryRank) {
  Staged t;
  ASSERT_THAT(t.g.status(), IsOk());
  RunOptions brief;
  brief.timeout = 20s;
  across_ranks(
      t.g,
      [&](mpi::DistributedSession& s) {
        ASSERT_NO_FATAL_FAILURE(expect_partial_runs_span_ranks(s, t, brief));
        ASSERT_NO_FATAL_FAILURE(expect_a_far_feed_in_a_later_call(s, t, brief));
      },
      threads(1));
}

// Concurrent runs of two signatures, one thread on every rank: the driver
// and a worker once admitted two steps in different orders (a freed
// thread goes to whichever call finds it first), each then holding its
// only thread for a step the other had queued, until the deadline.
TEST_F(DistributedTest, ConcurrentRunsOfTwoSignaturesOnOneThreadPerRankAllFinish) {
  Graph g;
  Output delta = ops::Placeholder(g, DType::kInt64, Shape{}, "delta");
  Output sent = ops::Identity(g, delta, "sent");  // on rank 0: a Send to the far rank
  Output add;
  {
    auto scope = g.device(far());
    Output var = ops::Variable(g, Tensor(int64_t{0}), "total");
    add = ops::AssignAdd(g, var, sent, {}, "add");
  }
  Output echoed;
  {
    auto home = g.device("/rank:0");  // a Recv from the far rank
    echoed = ops::Mul(g, add, ops::Const(g, Tensor(int64_t{1})), "echoed");
  }
  const Node* init = ops::GlobalVariablesInitializer(g);
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(
      g,
      [&](mpi::DistributedSession& s) {
        RunOptions brief;
        brief.timeout = 20s;
        ASSERT_THAT(s.run({}, {}, {init}, brief), IsOk());
        auto callable = s.make_callable({delta}, {echoed});
        ASSERT_THAT(callable, IsOk());
        constexpr int kThreads = 16;
        constexpr int kEach = 20;
        std::atomic<int64_t> expected{0};
        std::atomic<int> failures{0};
        std::vector<std::thread> callers;
        for (int k = 0; k < kThreads; ++k) {
          callers.emplace_back([&, k] {
            for (int i = 0; i < kEach; ++i) {
              const int64_t d = 1 + (i % 3);
              Status st;
              if ((k + i) % 2 == 0) {
                st = s.run({{delta, Tensor(d)}}, {}, {add.node()}, brief).status();
              } else {
                std::vector<Tensor> in{Tensor(d)};
                std::vector<Tensor> out(1);
                st = callable->run(in, out, brief);
              }
              if (st.is_ok()) {
                expected += d;
              } else if (failures++ == 0) {
                ADD_FAILURE() << st.to_string();
              }
            }
          });
        }
        for (auto& c : callers) c.join();
        EXPECT_EQ(failures.load(), 0);
        auto read = s.run({{delta, Tensor(int64_t{0})}}, {echoed}, {}, brief);  // adds 0
        ASSERT_THAT(read, IsOk());
        EXPECT_EQ((*read)[0].scalar<int64_t>(), expected.load());
      },
      threads(1));
}

// Misuse is refused with one process's messages and leaves the run usable.
TEST_F(DistributedTest, PartialRunMisuseLeavesTheRunUsable) {
  Staged t;
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    ASSERT_THAT(s.run({}, {}, {t.init}, bounded()), IsOk());
    auto run = s.partial_run_setup({t.h, t.y}, {t.x, t.z}, {}, bounded());
    ASSERT_THAT(run, IsOk());
    EXPECT_THAT(s.partial_run(*run, {{t.p, Tensor(1.0f)}}, {}),
                StatusIs(StatusCode::kInvalidArgument, "'p:0' was not specified"));
    EXPECT_THAT(s.partial_run(*run, {}, {t.q}),
                StatusIs(StatusCode::kInvalidArgument, "'q_plus_z:0' was not specified"));
    EXPECT_THAT(s.partial_run(*run, {{t.x, Tensor(1.0f)}}, {t.y}),
                StatusIs(StatusCode::kInvalidArgument, "'z:0' still missing"));
    ASSERT_THAT(s.partial_run(*run, {{t.x, Tensor(1.0f)}}, {t.h}, {}, bounded()), IsOk());
    EXPECT_THAT(s.partial_run(*run, {{t.x, Tensor(1.0f)}}, {}),
                StatusIs(StatusCode::kInvalidArgument, "'x:0' has already been fed"));
    EXPECT_THAT(s.partial_run(*run, {}, {t.h}),
                StatusIs(StatusCode::kInvalidArgument, "'h:0' has already been fetched"));
    auto y = s.partial_run(*run, {{t.z, Tensor(1.0f)}}, {t.y}, {}, bounded());
    ASSERT_THAT(y, IsOk());
    EXPECT_EQ((*y)[0].scalar<float>(), 3.0f);
    EXPECT_THAT(s.partial_run(*run, {}, {t.y}), StatusIs(StatusCode::kInvalidArgument, "complete"));
    mpi::DistributedSession::PartialRun empty;
    EXPECT_THAT(s.partial_run(empty, {}, {t.y}), StatusIs(StatusCode::kInvalidArgument, "empty"));
  });
}

// Cancelled, abandoned and failed partial runs end on every rank; the
// session goes on and closes cleanly.
TEST_F(DistributedTest, PartialRunsEndEverywhereWhenCancelledDroppedOrFailed) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output z = ops::Placeholder(g, DType::kFloat32, Shape{}, "z");
  Output passed;
  {
    auto scope = g.device(far());
    passed = checked(g, x);
  }
  auto back = g.device("/rank:0");
  Output y = ops::Add(g, passed, z, "y");
  ASSERT_THAT(g.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    const std::string where = size() > 1 ? "rank " + std::to_string(size() - 1) + ": " : "";
    {
      auto run = s.partial_run_setup({y}, {x, z}, {}, bounded()).value();
      ASSERT_THAT(s.partial_run(run, {{x, Tensor(1.0f)}}, {}, {}, bounded()), IsOk());
      ASSERT_THAT(s.cancel_partial_run(run), IsOk());
      EXPECT_TRUE(run.is_done());
      EXPECT_THAT(s.partial_run(run, {{z, Tensor(1.0f)}}, {y}),
                  StatusIs(StatusCode::kCancelled, "cancelled"));
    }
    {
      auto dropped = s.partial_run_setup({y}, {x, z}, {}, bounded()).value();
      ASSERT_THAT(s.partial_run(dropped, {{x, Tensor(1.0f)}}, {}, {}, bounded()), IsOk());
    }  // destroyed half-way
    {
      auto run = s.partial_run_setup({y}, {x, z}, {}, bounded()).value();
      // The far kernel fails either before this call returns (then this
      // call says so) or after it (then the next one does): both are
      // TF's behaviour, and which one happens is a race we do not fix.
      auto fed = s.partial_run(run, {{x, Tensor(-1.0f)}}, {}, {}, bounded());
      const auto failed = StatusIs(StatusCode::kInvalidArgument, where + "node 'check' (Call)");
      if (fed.is_ok()) {
        EXPECT_THAT(s.partial_run(run, {{z, Tensor(1.0f)}}, {y}, {}, bounded()), failed);
      } else {
        EXPECT_THAT(fed, failed);
        EXPECT_THAT(s.partial_run(run, {{z, Tensor(1.0f)}}, {y}, {}, bounded()),
                    ::testing::Not(IsOk()));
      }
      EXPECT_TRUE(run.is_done());
    }
    auto ok = s.partial_run_setup({y}, {x, z}, {}, bounded()).value();
    ASSERT_THAT(s.partial_run(ok, {{x, Tensor(2.0f)}}, {}, {}, bounded()), IsOk());
    auto out = s.partial_run(ok, {{z, Tensor(1.0f)}}, {y}, {}, bounded());
    ASSERT_THAT(out, IsOk());
    EXPECT_EQ((*out)[0].scalar<float>(), 3.0f);
  });
}

// Partial runs from many threads at once over a far variable: each runs
// the far stage once, none is lost.
TEST_F(DistributedTest, ConcurrentPartialRunsAcrossRanksLoseNoUpdate) {
  Staged t;
  constexpr int kThreads = 4;
  constexpr int kEach = 10;
  across_ranks(
      t.g,
      [&](mpi::DistributedSession& s) {
        ASSERT_THAT(s.run({}, {}, {t.init}, bounded()), IsOk());
        std::atomic<int> failures{0};
        std::vector<std::thread> threads_;
        for (int k = 0; k < kThreads; ++k) {
          threads_.emplace_back([&, k] {
            for (int i = 0; i < kEach; ++i) {
              auto run = s.partial_run_setup({t.h, t.y}, {t.x, t.z}, {}, bounded());
              if (!run.is_ok()) {
                if (failures++ == 0) ADD_FAILURE() << run.status().to_string();
                continue;
              }
              const auto v = static_cast<float>(k * 100 + i);
              auto h = s.partial_run(*run, {{t.x, Tensor(v)}}, {t.h}, {}, bounded());
              auto y = s.partial_run(*run, {{t.z, Tensor(1.0f)}}, {t.y}, {}, bounded());
              if (!h.is_ok() || !y.is_ok() || (*y)[0].scalar<float>() != 2 * v + 1) {
                if (failures++ == 0) {
                  ADD_FAILURE() << h.status().to_string() << " / " << y.status().to_string();
                }
              }
            }
          });
        }
        for (auto& th : threads_) th.join();
        EXPECT_EQ(failures.load(), 0);
        EXPECT_EQ(runs_of(s, t), kThreads * kEach);
      },
      threads(kThreads));
}

// ---- extend

// TwoStage grown: on rank 0 a new node `neg`; on the far rank `mix` (an
// old far tensor and `neg`: a new edge into the far rank) and `mixed` (x
// through its edge so far); on rank 0 `back` (a new edge out of it).
struct Grown {
  Graph g;
  Output neg, mix, mixed, back;
  explicit Grown(const Graph& from) : g(from.clone()) {
    Output x = g.find_output("x:0").value();
    Output scaled = g.find_output("scaled:0").value();
    Output sum = g.find_output("sum:0").value();
    {
      auto scope = g.device("/rank:0");
      neg = ops::Neg(g, x, "neg");
    }
    {
      auto scope = g.device(far());
      mix = ops::Add(g, scaled, neg, "mix");
      mixed = ops::Mul(g, mix, x, "mixed");
    }
    auto scope = g.device("/rank:0");
    back = ops::Add(g, mixed, sum, "back");
  }
};

// New nodes on the far rank and on rank 0, joined by new edges both ways,
// run and fetch as in one process; the old signatures go on.
TEST_F(DistributedTest, ExtendAddsNodesOnTheFarRankWithNewEdgesBothWays) {
  TwoStage t;
  Grown grown(t.g);
  ASSERT_THAT(grown.g.status(), IsOk());
  const Tensor x = Tensor::matrix<float>({{1, -1}, {0.5f, 2}});
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    auto local = Session::create(grown.g).value();
    auto want = local->run({{"x", x}}, {"back:0", "mixed:0", "sum:0"}).value();
    EXPECT_THAT(s.run({{"x", x}}, {"back:0"}), StatusIs(StatusCode::kNotFound, "'back'"));
    ASSERT_THAT(s.run({{"x", x}}, {t.sum, t.scaled}, {}, bounded()), IsOk());  // planned before
    ASSERT_THAT(s.extend(grown.g), IsOk());
    // First a signature that fetches nothing of the far rank (no fetch
    // edge extends the far rank's session on the way).
    auto only_back = s.run({{"x", x}}, {"back:0"}, {}, bounded());
    ASSERT_THAT(only_back, IsOk());
    EXPECT_TRUE((*only_back)[0].equals(want[0]));
    EXPECT_EQ(s.placement()[static_cast<std::size_t>(grown.mix.node()->id())], size() - 1);
    EXPECT_EQ(s.placement()[static_cast<std::size_t>(grown.mixed.node()->id())], size() - 1);
    EXPECT_EQ(s.placement()[static_cast<std::size_t>(grown.back.node()->id())], 0);
    for (int k = 0; k < 2; ++k) {
      auto got = s.run({{"x", x}}, {"back:0", "mixed:0", "sum:0"}, {}, bounded());
      ASSERT_THAT(got, IsOk());
      for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE((*got)[i].equals(want[i])) << i;
    }
    auto far_only = s.run({{"x", x}}, {"mix:0"}, {}, bounded());  // a fetch edge of a new node
    ASSERT_THAT(far_only, IsOk());
    EXPECT_TRUE((*far_only)[0].equals(local->run({{"x", x}}, {"mix:0"}).value()[0]));
    auto old = s.run({{"x", x}}, {t.sum, t.scaled}, {}, bounded());
    ASSERT_THAT(old, IsOk());
    EXPECT_TRUE((*old)[0].equals(want[2]));
    EXPECT_THAT(s.extend(grown.g), IsOk());  // nothing new
  });
}

// A new variable on the far rank, its AssignAdd ordered before a new far
// node by a control edge and initialised from rank 0 (new control edges):
// a partial run updates it once.
TEST_F(DistributedTest, ExtendAddsAFarVariableUpdatedOncePerPartialRun) {
  Staged t;
  Graph grown = t.g.clone();
  Output x = grown.find_output("x:0").value();
  Output z = grown.find_output("z:0").value();
  Output h2, count2;
  {
    auto scope = grown.device(far());
    Output counter = ops::Variable(grown, Tensor(int64_t{0}), "runs2");
    Output bump =
        ops::AssignAdd(grown, counter, ops::Const(grown, Tensor(int64_t{1})), {}, "bump2");
    {
      auto deps = grown.control_dependencies({bump.node()});
      h2 = ops::Mul(grown, x, ops::Const(grown, Tensor(3.0f)), "h2");
    }
    count2 = ops::ReadVariable(grown, counter, "count2");
  }
  auto back = grown.device("/rank:0");
  Output y2 = ops::Add(grown, h2, z, "y2");
  const Node* init2 = ops::GlobalVariablesInitializer(grown, "init2");
  ASSERT_THAT(grown.status(), IsOk());
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    ASSERT_THAT(s.run({}, {}, {t.init}, bounded()), IsOk());
    ASSERT_THAT(s.extend(grown), IsOk());
    ASSERT_THAT(s.run({}, {}, {init2}, bounded()), IsOk());
    for (int round = 1; round <= 2; ++round) {
      auto run = s.partial_run_setup({h2, y2}, {x, z}, {}, bounded());
      ASSERT_THAT(run, IsOk());
      auto h = s.partial_run(*run, {{x, Tensor(2.0f)}}, {h2}, {}, bounded());
      ASSERT_THAT(h, IsOk());
      EXPECT_EQ((*h)[0].scalar<float>(), 6.0f);
      auto y = s.partial_run(*run, {{z, Tensor(1.0f)}}, {y2}, {}, bounded());
      ASSERT_THAT(y, IsOk());
      EXPECT_EQ((*y)[0].scalar<float>(), 7.0f);
      EXPECT_TRUE(run->is_done());
      auto c = s.run({}, {count2}, {}, bounded());
      ASSERT_THAT(c, IsOk());
      EXPECT_EQ((*c)[0].scalar<int64_t>(), round);  // once per partial run
    }
    EXPECT_EQ(runs_of(s, t), 0);  // the old stage did not run
  });
}

// Runs, Callables and partial runs from other threads while the graph
// grows five times: their results stay right, and nothing hangs.
TEST_F(DistributedTest, RunsFromOtherThreadsGoOnDuringExtends) {
  TwoStage t;
  constexpr int kExtends = 5;
  std::vector<Graph> grown;
  for (int k = 0; k < kExtends; ++k) {
    grown.push_back((k == 0 ? t.g : grown.back()).clone());
    Graph& g = grown.back();
    Output x = g.find_output("x:0").value();
    Output more;
    {
      auto scope = g.device(far());
      more =
          ops::Mul(g, g.find_output("scaled:0").value(),
                   ops::Const(g, Tensor(static_cast<float>(k + 1))), "more_" + std::to_string(k));
    }
    auto scope = g.device("/rank:0");
    static_cast<void>(ops::Add(g, more, x, "got_" + std::to_string(k)));
    ASSERT_THAT(g.status(), IsOk());
  }
  const Tensor x = Tensor::matrix<float>({{1, -1}, {0.5f, 2}});
  across_ranks(
      t.g,
      [&](mpi::DistributedSession& s) {
        auto local = Session::create(grown.back()).value();
        auto want = local->run({{t.x, x}}, {t.sum, t.scaled}).value();
        auto callable = s.make_callable({t.x}, {t.scaled, t.sum});
        ASSERT_THAT(callable, IsOk());
        std::atomic<bool> done{false};
        std::atomic<int> wrong{0}, ran{0};
        std::vector<std::thread> callers;
        callers.emplace_back([&] {
          while (!done.load()) {
            auto got = s.run({{t.x, x}}, {t.sum, t.scaled}, {}, bounded());
            if (!got.is_ok() || !(*got)[0].equals(want[0]) || !(*got)[1].equals(want[1])) {
              if (wrong++ == 0) ADD_FAILURE() << got.status().to_string();
            }
            ++ran;
          }
        });
        callers.emplace_back([&] {
          while (!done.load()) {
            std::vector<Tensor> got(2);
            const Tensor feeds[] = {x};
            const Status st = callable->run(feeds, got, bounded());
            if (!st.is_ok() || !got[0].equals(want[1]) || !got[1].equals(want[0])) {
              if (wrong++ == 0) ADD_FAILURE() << st.to_string();
            }
            ++ran;
          }
        });
        callers.emplace_back([&] {
          while (!done.load()) {
            auto run = s.partial_run_setup({t.scaled, t.sum}, {t.x}, {}, bounded());
            if (!run.is_ok()) {
              if (wrong++ == 0) ADD_FAILURE() << run.status().to_string();
              continue;
            }
            auto a = s.partial_run(*run, {{t.x, x}}, {t.scaled}, {}, bounded());
            auto b = s.partial_run(*run, {}, {t.sum}, {}, bounded());
            if (!a.is_ok() || !b.is_ok() || !(*a)[0].equals(want[1]) || !(*b)[0].equals(want[0])) {
              if (wrong++ == 0) {
                ADD_FAILURE() << a.status().to_string() << " / " << b.status().to_string();
              }
            }
            ++ran;
          }
        });
        for (int k = 0; k < kExtends; ++k) {  // no ASSERT: the callers are joined first
          const Status extended = s.extend(grown[static_cast<std::size_t>(k)]);
          EXPECT_THAT(extended, IsOk()) << k;
          const std::string got_k = "got_" + std::to_string(k) + ":0";
          auto got = s.run({{t.x, x}}, {got_k}, {}, bounded());
          EXPECT_THAT(got, IsOk()) << k;
          if (!extended.is_ok() || !got.is_ok()) break;
          EXPECT_TRUE((*got)[0].equals(local->run({{t.x, x}}, {got_k}).value()[0])) << k;
        }
        done = true;
        for (auto& c : callers) c.join();
        EXPECT_EQ(wrong.load(), 0);
        EXPECT_GT(ran.load(), 0);
      },
      threads(4));
}

// A Call node's kernel cannot travel: added on a worker rank it is refused
// (node and rank named) also where the worker holds the graph, since its
// serve() graph is the old one; nothing changes, and the graph grows on.
TEST_F(DistributedTest, ExtendRefusesACallOnAWorkerRank) {
  TwoStage t;
  Graph with_call = t.g.clone();
  Output xs = ops::Placeholder(with_call, DType::kFloat32, Shape{}, "xs");
  {
    auto scope = with_call.device(far());
    static_cast<void>(checked(with_call, xs));
  }
  Grown grown(t.g);
  ASSERT_THAT(with_call.status(), IsOk());
  const Tensor x = Tensor::matrix<float>({{1, 2}, {3, 4}});
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    const Status st = s.extend(with_call);
    if (size() == 1) {  // everything on rank 0: nothing to send
      ASSERT_THAT(st, IsOk());
      auto got = s.run({{"xs", Tensor(2.0f)}}, {"check:0"}, {}, bounded());
      ASSERT_THAT(got, IsOk());
      EXPECT_EQ((*got)[0].scalar<float>(), 2.0f);
      return;
    }
    EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "node 'check' (Call)"));
    EXPECT_THAT(
        st, StatusIs(StatusCode::kInvalidArgument, "placed on rank " + std::to_string(size() - 1)));
    EXPECT_THAT(s.run({}, {"check:0"}), StatusIs(StatusCode::kNotFound, "'check'"));
    ASSERT_THAT(s.extend(grown.g), IsOk());
    auto local = Session::create(grown.g).value();
    auto got = s.run({{"x", x}}, {"back:0"}, {}, bounded());
    ASSERT_THAT(got, IsOk());
    EXPECT_TRUE((*got)[0].equals(local->run({{"x", x}}, {"back:0"}).value()[0]));
  });
}

// A worker without the graph takes an extension into the part it adopted
// (a fetch edge of a new node included); a Call for it is refused.
TEST_F(DistributedTest, AWorkerWithoutTheGraphTakesAnExtension) {
  TwoStage t;
  Grown grown(t.g);
  Graph with_call = grown.g.clone();
  {
    auto scope = with_call.device(far());
    static_cast<void>(checked(with_call, ops::Placeholder(with_call, DType::kFloat32, {}, "xs")));
  }
  ASSERT_THAT(with_call.status(), IsOk());
  if (rank() != 0) {
    EXPECT_THAT(mpi::serve_without_graph(threads(2)), IsOk());
    return;
  }
  auto s = mpi::DistributedSession::create(t.g, threads(2));
  ASSERT_THAT(s, IsOk());
  const Tensor x = Tensor::matrix<float>({{1, -1}, {0.5f, 2}});
  auto local = Session::create(grown.g).value();
  auto want = local->run({{"x", x}}, {"back:0", "mix:0"}).value();
  ASSERT_THAT((*s)->extend(grown.g), IsOk());
  auto back = (*s)->run({{"x", x}}, {"back:0"}, {}, bounded());  // no fetch edge first
  ASSERT_THAT(back, IsOk());
  EXPECT_TRUE((*back)[0].equals(want[0]));
  auto got = (*s)->run({{"x", x}}, {"back:0", "mix:0"}, {}, bounded());
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE((*got)[0].equals(want[0]));
  EXPECT_TRUE((*got)[1].equals(want[1]));
  const Status st = (*s)->extend(with_call);
  if (size() == 1) {
    EXPECT_THAT(st, IsOk());
  } else {
    EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "node 'check' (Call)"));
  }
  EXPECT_THAT((*s)->close(), IsOk());
}

// An existing node changed (its op, its device) is refused naming it; a
// new node that would move a placed one (a far Assign of a variable placed
// on rank 0) names both. Nothing changes.
TEST_F(DistributedTest, ExtendRefusesChangedAndMovedNodes) {
  auto build = [](Graph& g, bool square, const std::string& device) {
    Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    auto scope = g.device(device);
    static_cast<void>(square ? ops::Square(g, x, "y") : ops::Neg(g, x, "y"));
    static_cast<void>(ops::Variable(g, Tensor(1.0f), "v"));
  };
  Graph g, changed, moved_device;
  build(g, false, "");
  build(changed, true, "");
  build(moved_device, false, far());
  static_cast<void>(ops::Identity(changed, changed.find_output("x:0").value(), "new"));
  static_cast<void>(ops::Identity(moved_device, moved_device.find_output("x:0").value(), "new"));
  Graph moves = g.clone();
  {
    auto scope = moves.device(far());
    static_cast<void>(ops::AssignAdd(moves, moves.find_output("v:0").value(),
                                     ops::Const(moves, Tensor(1.0f)), {}, "far_add"));
  }
  ASSERT_THAT(g.status(), IsOk());
  ASSERT_THAT(changed.status(), IsOk());
  ASSERT_THAT(moved_device.status(), IsOk());
  ASSERT_THAT(moves.status(), IsOk());
  across_ranks(g, [&](mpi::DistributedSession& s) {
    EXPECT_THAT(s.extend(changed), StatusIs(StatusCode::kInvalidArgument, "node 'y' (Square)"));
    EXPECT_THAT(s.extend(moved_device),
                StatusIs(StatusCode::kInvalidArgument, "on device '" + far() + "'"));
    const Status moved = s.extend(moves);
    if (size() == 1) {
      EXPECT_THAT(moved, IsOk());  // far is rank 0: nothing moves
    } else {
      EXPECT_THAT(moved, StatusIs(StatusCode::kInvalidArgument, "node 'far_add' (AssignAdd)"));
      EXPECT_THAT(moved, StatusIs(StatusCode::kInvalidArgument, "would move node 'v' (Variable)"));
      EXPECT_THAT(s.run({}, {"new:0"}), StatusIs(StatusCode::kNotFound, "'new'"));
    }
    auto y = s.run({{"x", Tensor(2.0f)}}, {"y:0"}, {}, bounded());
    ASSERT_THAT(y, IsOk());
    EXPECT_EQ((*y)[0].scalar<float>(), -2.0f);
  });
}

// A worker that fails to take its part (here: a new far node named like
// the step placeholder of that rank's part) fails the extend naming its
// rank; later extends are FailedPrecondition and the old signatures run.
TEST_F(DistributedTest, AWorkerThatFailsAnExtendStopsLaterExtends) {
  TwoStage t;
  Graph clash = t.g.clone();
  {
    auto scope = clash.device(far());
    static_cast<void>(
        ops::Identity(clash, clash.find_output("scaled:0").value(), "mpi_partition/step"));
  }
  Grown grown(t.g);
  ASSERT_THAT(clash.status(), IsOk());
  const Tensor x = Tensor::matrix<float>({{1, -1}, {0.5f, 2}});
  across_ranks(t.g, [&](mpi::DistributedSession& s) {
    const Status st = s.extend(clash);
    if (size() == 1) {  // rank 0's own part: refused before anything changes
      EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "rank 0's part"));
      EXPECT_THAT(s.extend(grown.g), IsOk());
    } else {
      EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument,
                               "rank " + std::to_string(size() - 1) + ": extending"));
      EXPECT_THAT(s.extend(grown.g), StatusIs(StatusCode::kFailedPrecondition, "half-way"));
    }
    auto old = s.run({{t.x, x}}, {t.sum, t.scaled}, {}, bounded());
    EXPECT_THAT(old, IsOk());
  });
}

}  // namespace
}  // namespace graphrun
