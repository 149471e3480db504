// One suite, two sessions: every typed test runs on an in-process Session
// (LocalBackend) and on a RemoteSession talking to an in-process Server on
// 127.0.0.1:0 (RemoteBackend), and expects the same values, codes and
// messages. Error tests compare the backend's Status with a local Session's
// on the same graph (for LocalBackend that comparison is trivially true; the
// fixed expectations next to it keep it honest). Where the two must differ,
// the test says why and asserts the difference.
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <graphrun/remote_session.h>
#include <graphrun/server.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tests/service/slow_graph.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::slow_graph;

using ::graphrun::testing::IsOk;
using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct LocalBackend {
  using SessionType = Session;
  static constexpr bool kRemote = false;
  Result<std::unique_ptr<Session>> open(const Graph& g, const SessionOptions& options = {}) {
    return Session::create(g, options);
  }
};

struct RemoteBackend {
  using SessionType = RemoteSession;
  static constexpr bool kRemote = true;
  std::unique_ptr<Server> server = Server::start().value();
  Result<std::unique_ptr<RemoteSession>> open(const Graph& g, const SessionOptions& options = {}) {
    return RemoteSession::create(server->address(), g, options);
  }
};

struct BackendNames {
  template <typename T>
  static std::string GetName(int /*index*/) {
    return T::kRemote ? "Remote" : "Local";
  }
};

template <typename Backend>
class ConformanceTest : public ::testing::Test {
 protected:
  std::unique_ptr<typename Backend::SessionType> open(const Graph& g,
                                                      const SessionOptions& options = {}) {
    auto session = backend_.open(g, options);
    EXPECT_THAT(session, IsOk());
    return session.is_ok() ? std::move(*session) : nullptr;
  }
  // What a local Session answers to `call` on the same graph.
  template <typename Call>
  static Status local_status(const Graph& g, Call call) {
    auto session = Session::create(g).value();
    return call(*session);
  }

  Backend backend_;
};

using Backends = ::testing::Types<LocalBackend, RemoteBackend>;
TYPED_TEST_SUITE(ConformanceTest, Backends, BackendNames);

// y = 2x, z = y + x.
struct Arith {
  Graph g;
  Output x, y, z;
  Arith() {
    x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
    y = ops::Mul(g, x, ops::Const(g, Tensor(2.0f), "two"), "y");
    z = ops::Add(g, y, x, "z");
  }
};

// A counter variable "count", its increment "inc" (AssignAdd 1) and "init".
struct Counter {
  Output count, inc;
  explicit Counter(Graph& g) {
    count = ops::Variable(g, Tensor(0.0f), "count");
    inc = ops::AssignAdd(g, count, ops::Const(g, Tensor(1.0f), "one"), {}, "inc");
    ops::GlobalVariablesInitializer(g, "init");
  }
};

// The seed example: an expensive stage (a random draw gated by the counter's
// increment) whose result two later partial-run calls scale by a and b.
struct Seed {
  Graph g;
  Counter counter{g};
  Seed() {
    Output expensive;
    {
      auto deps = g.control_dependencies({counter.inc.node()});
      expensive = ops::Identity(g, ops::RandomUniform(g, Shape{}), "expensive");
    }
    Output a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
    Output b = ops::Placeholder(g, DType::kFloat32, Shape{}, "b");
    ops::Mul(g, expensive, a, "y1");
    ops::Mul(g, expensive, b, "y2");
  }
};

template <typename S>
float read_scalar(S& session, const std::string& name) {
  auto out = session.run({}, {name});
  EXPECT_THAT(out, IsOk());
  return out.is_ok() ? (*out)[0].template scalar<float>() : -1.0f;
}

TYPED_TEST(ConformanceTest, RunsByNameAndByOutput) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->run({{"x", Tensor{1.0f, 2.0f}}}, {"z"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor{3.0f, 6.0f}))));
  // Outputs of the graph the session was created from.
  EXPECT_THAT(s->run({{m.x, Tensor(1.5f)}}, {m.y, m.z}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(3.0f)), TensorEq(Tensor(4.5f)))));
  // Tracing returns the step's node statistics.
  RunOptions options;
  options.trace = true;
  RunMetadata metadata;
  ASSERT_THAT(s->run({{"x", Tensor{1.0f, 2.0f}}}, {"z"}, {}, options, &metadata), IsOk());
  EXPECT_EQ(metadata.cpu_isa, cpu_isa_name(cpu_isa()));
  bool saw_z = false;
  for (const NodeExecStats& node : metadata.step_stats) {
    if (node.node != "z") continue;
    saw_z = true;
    EXPECT_EQ(node.op, "Add");
    ASSERT_EQ(node.output_shapes.size(), 1u);
    EXPECT_EQ(node.output_shapes[0], Shape{2});
    EXPECT_EQ(node.output_bytes, 8);
    EXPECT_LE(node.start_ns, node.end_ns);
  }
  EXPECT_TRUE(saw_z);
}

TYPED_TEST(ConformanceTest, FeedsAnyTensor) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  // Feeding the intermediate y replaces it: z = y + x with y fed.
  EXPECT_THAT(s->run({{"x", Tensor(1.0f)}, {"y", Tensor(10.0f)}}, {"z", "y"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(11.0f)), TensorEq(Tensor(10.0f)))));
  // Even a Const may be fed.
  EXPECT_THAT(s->run({{"x", Tensor(1.0f)}, {"two:0", Tensor(5.0f)}}, {"y"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(5.0f)))));
}

TYPED_TEST(ConformanceTest, FetchOrderAndDuplicates) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->run({{"x", Tensor(1.0f)}}, {"z", "x", "z:0", "y", "two"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(3.0f)), TensorEq(Tensor(1.0f)),
                                       TensorEq(Tensor(3.0f)), TensorEq(Tensor(2.0f)),
                                       TensorEq(Tensor(2.0f)))));
}

TYPED_TEST(ConformanceTest, TargetsOnly) {
  Graph g;
  Counter counter(g);
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->run({}, {}, {"init"}), IsOkAndHolds(::testing::IsEmpty()));
  EXPECT_THAT(s->run({}, {}, {"inc"}), IsOkAndHolds(::testing::IsEmpty()));
  // One node named twice (by Node and by "^name") is one target: it runs once.
  EXPECT_THAT(s->run({}, {}, {counter.inc.node(), "^inc"}), IsOk());
  EXPECT_EQ(read_scalar(*s, "count"), 2.0f);
}

TYPED_TEST(ConformanceTest, SeedPartialRunRunsTheExpensiveStageOnce) {
  Seed m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  ASSERT_THAT(s->run({}, {}, {"init"}), IsOk());
  auto h = s->partial_run_setup({"y1", "y2"}, {"a", "b"});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(h->id(), ::testing::StartsWith("pr-"));
  auto y1 = s->partial_run(*h, {{"a", Tensor(2.0f)}}, {"y1"});
  ASSERT_THAT(y1, IsOk());
  EXPECT_FALSE(h->is_done());
  auto y2 = s->partial_run(*h, {{"b", Tensor(4.0f)}}, {"y2"});
  ASSERT_THAT(y2, IsOk());
  EXPECT_TRUE(h->is_done());
  // One draw (powers of two scale exactly), and the stage ran once.
  const float draw1 = (*y1)[0].template scalar<float>() / 2.0f;
  const float draw2 = (*y2)[0].template scalar<float>() / 4.0f;
  EXPECT_EQ(draw1, draw2);
  EXPECT_NE(draw1, 0.0f);
  EXPECT_EQ(read_scalar(*s, "count"), 1.0f);
  // A completed run: the local message (remotely the server has forgotten
  // the run; RemoteSession maps that to the same answer).
  EXPECT_EQ(s->partial_run(*h, {}, {"y1"}).status(),
            Status(StatusCode::kInvalidArgument,
                   "partial run " + h->id() +
                       " is complete: every fetch and target of its setup has been produced"));
}

TYPED_TEST(ConformanceTest, StatefulOpsRunOncePerPartialRun) {
  Graph g;
  Counter counter(g);
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
  ops::Mul(g, a, ops::Const(g, Tensor(3.0f)), "y");
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  ASSERT_THAT(s->run({}, {}, {"init"}), IsOk());
  for (int i = 1; i <= 2; ++i) {
    auto h = s->partial_run_setup({"y"}, {"a"}, {"inc"});
    ASSERT_THAT(h, IsOk());
    EXPECT_THAT(s->partial_run(*h, {}, {}, {"inc"}), IsOk());
    EXPECT_THAT(s->partial_run(*h, {}, {}, {"inc"}), IsOk());  // ran already: not again
    EXPECT_EQ(read_scalar(*s, "count"), static_cast<float>(i));
    EXPECT_THAT(s->partial_run(*h, {{"a", Tensor(2.0f)}}, {"y"}),
                IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
    EXPECT_TRUE(h->is_done());
    EXPECT_EQ(read_scalar(*s, "count"), static_cast<float>(i));
  }
}

TYPED_TEST(ConformanceTest, PartialRunMisuseIsTheLocalError) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{}, "b");
  Output c = ops::Placeholder(g, DType::kFloat32, Shape{}, "c");
  ops::Add(g, a, b, "sum");
  ops::Neg(g, a, "neg");
  ops::Identity(g, c, "cc");
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  auto h = s->partial_run_setup({"sum", "neg"}, {"a", "b"});
  ASSERT_THAT(h, IsOk());
  // A feed not declared at setup.
  EXPECT_EQ(s->partial_run(*h, {{"c", Tensor(1.0f)}}, {"neg"}).status(),
            Status(StatusCode::kInvalidArgument,
                   "The feed 'c:0' was not specified in partial_run_setup."));
  // A fetch not computable yet: b has not been fed.
  EXPECT_EQ(s->partial_run(*h, {{"a", Tensor(1.0f)}}, {"sum"}).status(),
            Status(StatusCode::kInvalidArgument,
                   "Fetch 'sum:0' can't be computed from the feeds that have been fed so far: "
                   "'b:0' still missing"));
  // A fetch not declared, then an unknown one.
  EXPECT_EQ(s->partial_run(*h, {}, {"cc"}).status(),
            Status(StatusCode::kInvalidArgument,
                   "The fetch 'cc:0' was not specified in partial_run_setup."));
  EXPECT_THAT(s->partial_run(*h, {}, {"ghost"}), StatusIs(StatusCode::kNotFound, "ghost"));
  // Misuse left the run usable.
  EXPECT_THAT(s->partial_run(*h, {{"a", Tensor(1.0f)}, {"b", Tensor(2.0f)}}, {"sum", "neg"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(3.0f)), TensorEq(Tensor(-1.0f)))));
  EXPECT_TRUE(h->is_done());
  // An empty handle.
  typename std::remove_reference_t<decltype(*h)> empty;
  EXPECT_EQ(s->partial_run(empty, {}, {"sum"}).status(),
            Status(StatusCode::kInvalidArgument,
                   "Must run 'setup' before performing partial runs! (empty handle)"));
}

TYPED_TEST(ConformanceTest, CancelledPartialRunReportsItsCancellation) {
  Seed m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  ASSERT_THAT(s->run({}, {}, {"init"}), IsOk());
  auto h = s->partial_run_setup({"y1", "y2"}, {"a", "b"});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(s->cancel_partial_run(*h), IsOk());
  EXPECT_TRUE(h->is_done());
  EXPECT_EQ(s->partial_run(*h, {{"a", Tensor(1.0f)}}, {"y1"}).status(),
            Status(StatusCode::kCancelled, "partial run " + h->id() + " was cancelled"));
  EXPECT_THAT(s->cancel_partial_run(*h), IsOk());  // already done: OK
}

TYPED_TEST(ConformanceTest, KernelErrorEndsThePartialRunAndNamesTheNode) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "b");
  ops::MatMul(g, a, b, {}, "mm");
  ops::Neg(g, a, "neg");
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  const auto first_call = [](auto& session) {
    auto h = session.partial_run_setup({"mm", "neg"}, {"a", "b"});
    EXPECT_THAT(h, IsOk());
    const Status first = session
                             .partial_run(*h,
                                          {{"a", Tensor::filled(Shape{2, 3}, 1.0f)},
                                           {"b", Tensor::filled(Shape{2, 3}, 1.0f)}},
                                          {"mm"})
                             .status();
    // The error ended the run: the next call reports it again.
    EXPECT_EQ(session.partial_run(*h, {}, {"neg"}).status(), first);
    EXPECT_TRUE(session.partial_run(*h, {}, {"neg"}).status() == first);
    return first;
  };
  const Status status = first_call(*s);
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument, "node 'mm' (MatMul)"));
  EXPECT_EQ(status, this->local_status(g, first_call));
}

TYPED_TEST(ConformanceTest, ErrorsNameTheNodeAsLocally) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  const auto unknown_fetch = [](auto& session) {
    return session.run({{"x", Tensor(1.0f)}}, {"nosuch:0"}).status();
  };
  const Status status = unknown_fetch(*s);
  EXPECT_THAT(status, StatusIs(StatusCode::kNotFound, "nosuch"));
  EXPECT_EQ(status, this->local_status(m.g, unknown_fetch));

  const auto unknown_target = [](auto& session) { return session.run({}, {}, {"ghost"}).status(); };
  EXPECT_THAT(unknown_target(*s), StatusIs(StatusCode::kNotFound, "ghost"));
  EXPECT_EQ(unknown_target(*s), this->local_status(m.g, unknown_target));

  const auto missing_feed = [](auto& session) { return session.run({}, {"z"}).status(); };
  EXPECT_THAT(missing_feed(*s), StatusIs(StatusCode::kInvalidArgument, "x"));
  EXPECT_EQ(missing_feed(*s), this->local_status(m.g, missing_feed));

  const auto wrong_dtype = [](auto& session) {
    return session.run({{"x", Tensor(1)}}, {"z"}).status();
  };
  EXPECT_THAT(wrong_dtype(*s), StatusIs(StatusCode::kInvalidArgument, "x"));
  EXPECT_EQ(wrong_dtype(*s), this->local_status(m.g, wrong_dtype));

  const auto nothing = [](auto& session) { return session.run({}, {}).status(); };
  EXPECT_EQ(nothing(*s), Status(StatusCode::kInvalidArgument,
                                "Must specify at least one target to fetch or execute."));
}

TYPED_TEST(ConformanceTest, TimeoutIsDeadlineExceeded) {
  const Graph g = slow_graph();
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  RunOptions options;
  options.timeout = std::chrono::milliseconds(50);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(s->run({}, {"slow"}, {}, options), StatusIs(StatusCode::kDeadlineExceeded, ""));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// RunOptions::stop_token: another thread stops the call (remotely, the
// client cancels the RPC and the server stops the step).
TYPED_TEST(ConformanceTest, StopTokenCancelsARun) {
  const Graph g = slow_graph();
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  std::stop_source stop;
  RunOptions options;
  options.stop_token = stop.get_token();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop.request_stop();
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(s->run({}, {"slow"}, {}, options).status(),
            Status(StatusCode::kCancelled, "the run was cancelled by its caller"));
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TYPED_TEST(ConformanceTest, StopTokenOfACallCancelsThePartialRun) {
  Graph g = slow_graph();
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  ops::Identity(g, x, "x_out");
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  auto h = s->partial_run_setup({"slow", "x_out"}, {"x"});
  ASSERT_THAT(h, IsOk());
  std::stop_source stop;
  RunOptions options;
  options.stop_token = stop.get_token();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop.request_stop();
  });
  EXPECT_EQ(s->partial_run(*h, {}, {"slow"}, {}, options).status(),
            Status(StatusCode::kCancelled,
                   "partial run " + h->id() + ": the call was cancelled by its caller"));
  stopper.join();
  EXPECT_TRUE(h->is_done());
  // The whole run is over: the next call says how it ended.
  EXPECT_THAT(s->partial_run(*h, {{"x", Tensor(1.0f)}}, {"x_out"}),
              StatusIs(StatusCode::kCancelled, "cancelled by its caller"));
}

TYPED_TEST(ConformanceTest, StopTokenOfTheSetupCancelsThePartialRun) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  std::stop_source stop;
  RunOptions options;
  options.stop_token = stop.get_token();
  auto h = s->partial_run_setup({"y", "z"}, {"x"}, {}, options);
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(s->partial_run(*h, {{"x", Tensor(2.0f)}}, {"y"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(4.0f)))));
  stop.request_stop();
  EXPECT_EQ(
      s->partial_run(*h, {}, {"z"}).status(),
      Status(StatusCode::kCancelled, "partial run " + h->id() + " was cancelled by its caller"));
}

TYPED_TEST(ConformanceTest, CloseThenEveryCallIsCancelled) {
  Seed m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  ASSERT_THAT(s->run({}, {}, {"init"}), IsOk());
  auto h = s->partial_run_setup({"y1", "y2"}, {"a", "b"});
  ASSERT_THAT(h, IsOk());
  EXPECT_THAT(s->close(), IsOk());
  EXPECT_THAT(s->close(), IsOk());  // idempotent
  const Status closed(StatusCode::kCancelled, "Session has been closed.");
  EXPECT_EQ(s->run({}, {"count"}).status(), closed);
  EXPECT_EQ(s->partial_run_setup({"y1"}, {"a"}).status(), closed);
  EXPECT_EQ(s->partial_run(*h, {{"a", Tensor(1.0f)}}, {"y1"}).status(), closed);
  EXPECT_EQ(s->extend(m.g), closed);
}

TYPED_TEST(ConformanceTest, ExtendThenRunANewNode) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->run({}, {"w"}), StatusIs(StatusCode::kNotFound, "w"));
  ops::Mul(m.g, m.z, ops::Const(m.g, Tensor(10.0f), "ten"), "w");
  ASSERT_THAT(s->extend(m.g), IsOk());
  EXPECT_THAT(s->run({{"x", Tensor(1.0f)}}, {"w", "z"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(30.0f)), TensorEq(Tensor(3.0f)))));
  EXPECT_THAT(s->extend(m.g), IsOk());  // nothing new
  if constexpr (TypeParam::kRemote) {
    EXPECT_EQ(s->graph_version(), 1);
  }

  // A "grown" graph whose existing nodes differ: the local message.
  Graph other;
  ops::Const(other, Tensor(5.0f), "x");
  const auto extend_other = [&](auto& session) { return session.extend(other); };
  const Status status = extend_other(*s);
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument, "Session::extend"));
  Arith fresh;
  ops::Mul(fresh.g, fresh.z, ops::Const(fresh.g, Tensor(10.0f), "ten"), "w");
  const Status local = this->local_status(fresh.g, extend_other);
  EXPECT_EQ(status, local);
}

TYPED_TEST(ConformanceTest, ConcurrentUpdatesAreNotLost) {
  Graph g;
  Counter counter(g);
  auto s = this->open(g);
  ASSERT_NE(s, nullptr);
  ASSERT_THAT(s->run({}, {}, {"init"}), IsOk());
  constexpr int kThreads = 4;
  constexpr int kRuns = 100;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRuns; ++i) {
        if (!s->run({}, {}, {"inc"}).is_ok()) ++failures[static_cast<std::size_t>(t)];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(failures, ::testing::Each(0));
  EXPECT_EQ(read_scalar(*s, "count"), static_cast<float>(kThreads * kRuns));
}

// Differences with a reason.
TYPED_TEST(ConformanceTest, WhereLocalAndRemoteDiffer) {
  Arith m;
  auto s = this->open(m.g);
  ASSERT_NE(s, nullptr);
  // An Output of another graph whose node "x" has another id: a local
  // session checks the Output against its own copy and rejects it; a remote
  // session can only send the name "x:0", which the server resolves.
  Graph foreign;
  ops::Const(foreign, Tensor(0.0f), "pad");
  Output foreign_x = ops::Placeholder(foreign, DType::kFloat32, Shape{}, "x");
  const auto result = s->run({{foreign_x, Tensor(1.0f)}}, {"z"});
  // A message longer than the wire's 4096-byte cap arrives cut remotely
  // (gRPC carries it in metadata); locally it is whole.
  const std::string name(10000, 'n');
  const Status long_status = s->run({}, {name}).status();
  EXPECT_EQ(long_status.code(), StatusCode::kNotFound);
  // A thread pool cannot travel to a server.
  SessionOptions with_pool;
  with_pool.thread_pool = ThreadPool::create(1).value();
  auto pooled = this->backend_.open(m.g, with_pool);
  if constexpr (TypeParam::kRemote) {
    EXPECT_THAT(result, IsOkAndHolds(ElementsAre(TensorEq(Tensor(3.0f)))));
    EXPECT_EQ(long_status.message().size(), 4096u);
    EXPECT_THAT(long_status.message(), ::testing::EndsWith(" bytes cut)"));
    EXPECT_THAT(pooled, StatusIs(StatusCode::kInvalidArgument, "thread_pool"));
  } else {
    EXPECT_THAT(result, StatusIs(StatusCode::kNotFound, "is not in this session's graph"));
    EXPECT_GT(long_status.message().size(), 10000u);
    EXPECT_THAT(pooled, IsOk());
  }
}

// ---- RemoteSession only ----

class RemoteSessionTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = Server::start().value(); }
  std::unique_ptr<Server> server_;
};

TEST_F(RemoteSessionTest, DestroyingAHandleCancelsItsRunOnTheServer) {
  Seed m;
  auto s = RemoteSession::create(server_->address(), m.g).value();
  // Initialized: a run whose setup already failed would count as done.
  ASSERT_THAT(s->run({}, {}, {"init"}), IsOk());
  {
    auto h = s->partial_run_setup({"y1", "y2"}, {"a", "b"}).value();
    ASSERT_EQ(server_->registry().list().size(), 1u);
    EXPECT_EQ(server_->registry().list()[0].open_partial_runs, 1);
  }
  EXPECT_EQ(server_->registry().list()[0].open_partial_runs, 0);
  // Moving a handle over another abandons the other's run.
  auto h1 = s->partial_run_setup({"y1"}, {"a"}).value();
  auto h2 = s->partial_run_setup({"y2"}, {"b"}).value();
  EXPECT_EQ(server_->registry().list()[0].open_partial_runs, 2);
  h1 = std::move(h2);
  EXPECT_EQ(server_->registry().list()[0].open_partial_runs, 1);
  // Destroying the session closes it on the server.
  s.reset();
  EXPECT_TRUE(server_->registry().list().empty());
}

TEST_F(RemoteSessionTest, CreatesFromAGraphDefAndExtendsWithOne) {
  Arith m;
  auto s = RemoteSession::create(server_->address(), graph_to_graph_def(m.g).value()).value();
  EXPECT_THAT(s->handle(), ::testing::StartsWith("s-"));
  EXPECT_EQ(s->graph_version(), 0);
  ops::Neg(m.g, m.z, "minus_z");
  ASSERT_THAT(s->extend(graph_to_graph_def(m.g).value()), IsOk());
  EXPECT_EQ(s->graph_version(), 1);
  EXPECT_THAT(s->run({{"x", Tensor(1.0f)}}, {"minus_z"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(-3.0f)))));
}

TEST_F(RemoteSessionTest, ServerSideErrorsPassThrough) {
  // The server's import names the bad node; an unreachable server is
  // Unavailable; a session the server forgot on its own is NotFound.
  Arith m;
  v1::GraphDef bad = graph_to_graph_def(m.g).value();
  bad.mutable_node(0)->add_input("ghost");
  EXPECT_THAT(RemoteSession::create(server_->address(), bad),
              StatusIs(StatusCode::kInvalidArgument, "node 'x'"));

  auto s = RemoteSession::create(server_->address(), m.g).value();
  ASSERT_THAT(server_->registry().close(s->handle()), IsOk());
  EXPECT_EQ(s->run({{"x", Tensor(1.0f)}}, {"z"}).status(),
            Status(StatusCode::kNotFound, "session '" + s->handle() + "' not found"));
  EXPECT_THAT(s->close(), IsOk());  // already gone on the server

  const std::string address = server_->address();
  server_->shutdown();
  RemoteSessionOptions remote;
  remote.control_timeout = std::chrono::seconds(5);
  EXPECT_THAT(RemoteSession::create(address, m.g, {}, remote),
              StatusIs(StatusCode::kUnavailable, ""));
}

// An op whose kernel blocks until the test opens its gate and never polls
// for cancellation: a server stuck in it cannot answer.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool open = false;
};
Gate& gate() {
  static Gate g;
  return g;
}

class GateOp final : public OpKernel {
 public:
  Status compute(OpKernelContext& ctx) override {
    std::unique_lock lock(gate().mu);
    gate().entered = true;
    gate().cv.notify_all();
    gate().cv.wait(lock, [] { return gate().open; });
    return ctx.set_output(0, ctx.input(0));
  }
};

TEST(RemoteSessionServerTest, TokenAndLimitsAsARemoteSessionSeesThem) {
  ServerOptions options;
  options.auth_token = "s3cret-token";
  options.limits.max_sessions = 1;
  options.limits.max_tensor_bytes_per_request = 64;
  auto server = Server::start(options).value();
  Arith m;
  // No token, a wrong one: UNAUTHENTICATED, the token never echoed.
  EXPECT_THAT(RemoteSession::create(server->address(), m.g),
              StatusIs(StatusCode::kUnauthenticated, ""));
  RemoteSessionOptions wrong;
  wrong.bearer_token = "guess";
  const Status refused = RemoteSession::create(server->address(), m.g, {}, wrong).status();
  EXPECT_EQ(refused.code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.message(), ::testing::Not(HasSubstr("guess")));
  EXPECT_EQ(server->registry().size(), 0u);
  // The right token; then each limit names itself.
  RemoteSessionOptions right;
  right.bearer_token = "s3cret-token";
  auto s = RemoteSession::create(server->address(), m.g, {}, right);
  ASSERT_THAT(s, IsOk());
  EXPECT_THAT((*s)->run({{"x", Tensor(2.0f)}}, {"z"}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
  EXPECT_THAT(RemoteSession::create(server->address(), m.g, {}, right),
              StatusIs(StatusCode::kResourceExhausted, "limit max_sessions = 1"));
  EXPECT_THAT((*s)->run({{"x", Tensor::filled(Shape{32}, 1.0f)}}, {"z"}),
              StatusIs(StatusCode::kResourceExhausted, "limit max_tensor_bytes_per_request = 64"));
}

TEST_F(RemoteSessionTest, ClientDeadlineBoundsAStuckServer) {
  OpRegistry& registry = OpRegistry::global();
  if (registry.find("ConformanceGate") == nullptr) {
    ASSERT_THAT(registry.add(OpDef("ConformanceGate")
                                 .input("x", DType::kFloat32)
                                 .output("y", DType::kFloat32)
                                 .shape_fn(shape_fns::unchanged),
                             [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
                               return std::make_unique<GateOp>();
                             }),
                IsOk());
  }
  Graph g;
  Output c = ops::Const(g, Tensor(1.0f), "c");
  ASSERT_THAT(g.add_node(NodeSpec{.op = "ConformanceGate", .name = "gate", .inputs = {c}}), IsOk());
  {
    const std::lock_guard lock(gate().mu);
    gate().entered = false;
    gate().open = false;
  }
  RemoteSessionOptions remote;
  remote.deadline_margin = std::chrono::milliseconds(100);
  auto s = RemoteSession::create(server_->address(), g, {}, remote).value();
  RunOptions options;
  options.timeout = std::chrono::milliseconds(50);
  // The server's own deadline cannot fire (the kernel never returns to a
  // node boundary): the call's gRPC deadline ends it.
  const Status status = s->run({}, {"gate"}, {}, options).status();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.to_string();
  {
    // The server really was stuck in the kernel (bounded: if the server's
    // deadline had passed before the node started, it would never enter).
    std::unique_lock lock(gate().mu);
    EXPECT_TRUE(gate().cv.wait_for(lock, std::chrono::seconds(60), [] { return gate().entered; }));
    gate().open = true;
  }
  gate().cv.notify_all();
}

}  // namespace
}  // namespace graphrun
