// SessionRegistry without gRPC: handles, lookup, close, list, extend
// versions and the limits.
#include <fmt/format.h>
#include <graphrun/graph_def.h>
#include <graphrun/ops.h>
#include <graphrun/session_registry.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <regex>
#include <stop_token>
#include <thread>

#include "tests/service/slow_graph.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::IsOkAndHolds;
using ::graphrun::testing::kSlowDim;
using ::graphrun::testing::StatusIs;
using ::graphrun::testing::TensorEq;
using ::testing::ElementsAre;

// y = x * 2 (x a float placeholder).
v1::GraphDef doubler() {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  ops::Mul(g, x, ops::Const(g, Tensor(2.0f), "two"), "y");
  return graph_to_graph_def(g).value();
}

TEST(SessionRegistryTest, CreateGetRunCloseList) {
  SessionRegistry registry;
  auto created = registry.create(doubler());
  ASSERT_THAT(created, IsOk());
  EXPECT_TRUE(std::regex_match(created->handle, std::regex("s-[0-9a-f]{32}"))) << created->handle;
  EXPECT_EQ(created->graph_version, 0);
  EXPECT_THAT(registry.get(created->handle), IsOk());
  EXPECT_THAT(registry.run(created->handle, {{"x", Tensor(3.0f)}}, {"y"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));

  auto second = registry.create(doubler());
  ASSERT_THAT(second, IsOk());
  EXPECT_NE(second->handle, created->handle);
  std::vector<SessionInfo> list = registry.list();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].num_nodes, 3);
  EXPECT_EQ(list[0].open_partial_runs, 0);

  ASSERT_THAT(registry.close(created->handle), IsOk());
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_THAT(registry.get(created->handle), StatusIs(StatusCode::kNotFound, created->handle));
  EXPECT_THAT(registry.run(created->handle, {}, {"y"}, {}),
              StatusIs(StatusCode::kNotFound, created->handle));
  EXPECT_THAT(registry.close(created->handle), StatusIs(StatusCode::kNotFound, created->handle));
}

TEST(SessionRegistryTest, HandleKeepsAClosedSessionAlive) {
  SessionRegistry registry;
  auto created = registry.create(doubler()).value();
  std::shared_ptr<Session> session = registry.get(created.handle).value();
  ASSERT_THAT(registry.close(created.handle), IsOk());
  EXPECT_THAT(session->run({{"x", Tensor(1.0f)}}, {"y"}),
              StatusIs(StatusCode::kCancelled, "closed"));
}

TEST(SessionRegistryTest, UnknownHandlesAreNotFound) {
  SessionRegistry registry;
  EXPECT_THAT(registry.get("s-nope"), StatusIs(StatusCode::kNotFound, "session 's-nope'"));
  auto created = registry.create(doubler()).value();
  EXPECT_THAT(registry.partial_run(created.handle, "pr-nope", {}, {"y"}, {}),
              StatusIs(StatusCode::kNotFound, "partial run 'pr-nope'"));
  EXPECT_THAT(registry.cancel_partial_run(created.handle, "pr-nope"),
              StatusIs(StatusCode::kNotFound, "pr-nope"));
}

TEST(SessionRegistryTest, BadGraphIsInvalidArgumentNamingTheNode) {
  v1::GraphDef def = doubler();
  def.mutable_node(2)->set_op("NoSuchOp");
  SessionRegistry registry;
  EXPECT_THAT(registry.create(def), StatusIs(StatusCode::kInvalidArgument, "node 'y'"));
  EXPECT_EQ(registry.size(), 0u);
}

TEST(SessionRegistryTest, ExtendChecksTheGraphVersion) {
  SessionRegistry registry;
  auto created = registry.create(doubler()).value();
  Graph more;
  Output y = ops::Placeholder(more, DType::kFloat32, Shape::unknown(), "y");
  ops::Add(more, y, y, "z");
  v1::GraphDef nodes = graph_to_graph_def(more).value();
  nodes.mutable_node()->DeleteSubrange(0, 1);  // keep z only: it reads the session's y
  ASSERT_EQ(nodes.node_size(), 1);

  EXPECT_THAT(registry.extend(created.handle, nodes, 1),
              StatusIs(StatusCode::kFailedPrecondition, "graph version 0"));
  EXPECT_THAT(registry.extend(created.handle, nodes, 0), IsOkAndHolds(1));
  EXPECT_THAT(registry.run(created.handle, {{"x", Tensor(3.0f)}}, {"z"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(12.0f)))));
  EXPECT_THAT(registry.extend(created.handle, nodes, 0),
              StatusIs(StatusCode::kFailedPrecondition, "graph version 1"));
  // A duplicate name is named in the request's terms: which of its nodes,
  // and whether the session's graph or the request itself has it already
  // (the import numbered the session's nodes and the request's together).
  EXPECT_THAT(registry.extend(created.handle, nodes, 1),
              StatusIs(StatusCode::kInvalidArgument,
                       "node 'z' (Add), node #0 of the request: the session's graph already has "
                       "a node of that name"));
  Graph twice;
  Output w = ops::Placeholder(twice, DType::kFloat32, Shape::unknown(), "w");
  ops::Identity(twice, w, "w2");
  v1::GraphDef doubled = graph_to_graph_def(twice).value();
  *doubled.add_node() = doubled.node(1);
  EXPECT_THAT(registry.extend(created.handle, doubled, 1),
              StatusIs(StatusCode::kInvalidArgument,
                       "node 'w2' (Identity): the request names it twice (its nodes #1 and #2)"));
  std::vector<SessionInfo> list = registry.list();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].graph_version, 1);
  EXPECT_EQ(list[0].num_nodes, 4);
}

TEST(SessionRegistryTest, MaxSessions) {
  SessionRegistry registry(ServiceLimits{.max_sessions = 2});
  ASSERT_THAT(registry.create(doubler()), IsOk());
  auto second = registry.create(doubler());
  ASSERT_THAT(second, IsOk());
  EXPECT_THAT(registry.create(doubler()),
              StatusIs(StatusCode::kResourceExhausted, "max_sessions = 2"));
  ASSERT_THAT(registry.close(second->handle), IsOk());
  EXPECT_THAT(registry.create(doubler()), IsOk());
}

TEST(SessionRegistryTest, MaxPartialRunsPerSession) {
  SessionRegistry registry(ServiceLimits{.max_partial_runs_per_session = 2});
  auto created = registry.create(doubler()).value();
  auto first = registry.partial_run_setup(created.handle, {"x"}, {"y"}, {});
  ASSERT_THAT(first, IsOk());
  EXPECT_TRUE(std::regex_match(*first, std::regex("pr-[0-9a-f]{32}"))) << *first;
  ASSERT_THAT(registry.partial_run_setup(created.handle, {"x"}, {"y"}, {}), IsOk());
  EXPECT_THAT(registry.partial_run_setup(created.handle, {"x"}, {"y"}, {}),
              StatusIs(StatusCode::kResourceExhausted, "max_partial_runs_per_session = 2"));
  EXPECT_EQ(registry.list()[0].open_partial_runs, 2);
  // Completing one frees its slot and forgets its id.
  EXPECT_THAT(registry.partial_run(created.handle, *first, {{"x", Tensor(1.0f)}}, {"y"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f)))));
  EXPECT_THAT(registry.partial_run(created.handle, *first, {}, {"y"}, {}),
              StatusIs(StatusCode::kNotFound, *first));
  auto third = registry.partial_run_setup(created.handle, {"x"}, {"y"}, {});
  ASSERT_THAT(third, IsOk());
  // Cancelling frees one too.
  ASSERT_THAT(registry.cancel_partial_run(created.handle, *third), IsOk());
  EXPECT_EQ(registry.list()[0].open_partial_runs, 1);
}

TEST(SessionRegistryTest, MaxTensorBytesPerRequest) {
  SessionRegistry registry(ServiceLimits{.max_tensor_bytes_per_request = 16});
  auto created = registry.create(doubler()).value();
  EXPECT_THAT(registry.run(created.handle, {{"x", Tensor::filled(Shape{4}, 1.0f)}}, {"y"}, {}),
              IsOk());
  EXPECT_THAT(registry.run(created.handle, {{"x", Tensor::filled(Shape{5}, 1.0f)}}, {"y"}, {}),
              StatusIs(StatusCode::kResourceExhausted, "max_tensor_bytes_per_request = 16"));
  auto pr = registry.partial_run_setup(created.handle, {"x"}, {"y"}, {}).value();
  EXPECT_THAT(
      registry.partial_run(created.handle, pr, {{"x", Tensor::filled(Shape{5}, 1.0f)}}, {"y"}, {}),
      StatusIs(StatusCode::kResourceExhausted, "request feeds 20 tensor bytes"));
}

TEST(SessionRegistryTest, MaxGraphNodesAtCreateAndExtend) {
  SessionRegistry registry(ServiceLimits{.max_graph_nodes = 4});
  auto created = registry.create(doubler());  // 3 nodes
  ASSERT_THAT(created, IsOk());
  Graph big;
  for (int i = 0; i < 5; ++i) ops::Const(big, Tensor(1.0f), fmt::format("c{}", i));
  EXPECT_THAT(registry.create(graph_to_graph_def(big).value()),
              StatusIs(StatusCode::kResourceExhausted,
                       "the graph has 5 nodes (limit max_graph_nodes = 4)"));
  // One more node fits, two do not.
  v1::GraphDef two = graph_to_graph_def(big).value();
  two.mutable_node()->DeleteSubrange(2, 3);
  EXPECT_THAT(registry.extend(created->handle, two, 0),
              StatusIs(StatusCode::kResourceExhausted, "has 5 nodes (limit max_graph_nodes = 4)"));
  two.mutable_node()->DeleteSubrange(1, 1);
  EXPECT_THAT(registry.extend(created->handle, two, 0), IsOkAndHolds(1));
}

TEST(SessionRegistryTest, IdleSessionsAreClosedAndSayWhy) {
  SessionRegistry registry(ServiceLimits{.session_idle_timeout = std::chrono::milliseconds(50)});
  const std::string idle = registry.create(doubler()).value().handle;
  const std::string busy = registry.create(doubler()).value().handle;
  // A session in use (here: held through get(), as a call holds it) is
  // never collected, however long the call.
  std::shared_ptr<Session> in_use = registry.get(busy).value();
  const auto start = std::chrono::steady_clock::now();
  while (registry.size() == 2 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  ASSERT_EQ(registry.size(), 1u);
  EXPECT_THAT(registry.run(idle, {{"x", Tensor(1.0f)}}, {"y"}, {}),
              StatusIs(StatusCode::kNotFound,
                       "it was closed after 50 ms without a call (limit session_idle_timeout)"));
  EXPECT_THAT(registry.run(busy, {{"x", Tensor(1.0f)}}, {"y"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f)))));
  in_use.reset();
  EXPECT_EQ(registry.close_idle_sessions(), 0u);  // just used
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  // The sweeper or this call closes it; either way it is gone.
  registry.close_idle_sessions();
  EXPECT_EQ(registry.size(), 0u);
}

TEST(SessionRegistryTest, NoIdleTimeoutKeepsSessions) {
  SessionRegistry registry;
  const std::string handle = registry.create(doubler()).value().handle;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(registry.close_idle_sessions(), 0u);
  EXPECT_THAT(registry.get(handle), IsOk());
}

TEST(SessionRegistryTest, AbandonedPartialRunsAreCollected) {
  SessionRegistry registry(
      ServiceLimits{.partial_run_idle_timeout = std::chrono::milliseconds(30)});
  const std::string handle = registry.create(doubler()).value().handle;
  const std::string run = registry.partial_run_setup(handle, {"x"}, {"y"}, {}).value();
  // Abandoned: no call ever comes. The session's idle timeout (the
  // server's default) cancels it and the registry forgets it.
  const auto start = std::chrono::steady_clock::now();
  while (registry.list().at(0).open_partial_runs > 0 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(registry.list().at(0).open_partial_runs, 0);
  EXPECT_THAT(registry.partial_run(handle, run, {{"x", Tensor(1.0f)}}, {"y"}, {}),
              StatusIs(StatusCode::kNotFound, run));
  // A session asking for a longer timeout is capped by the server's.
  SessionOptions longer;
  longer.partial_run_idle_timeout = std::chrono::hours(1);
  const std::string capped = registry.create(doubler(), longer).value().handle;
  ASSERT_THAT(registry.partial_run_setup(capped, {"x"}, {"y"}, {}), IsOk());
  const auto open_runs = [&] {
    int64_t n = 0;
    for (const SessionInfo& info : registry.list()) n += info.open_partial_runs;
    return n;
  };
  const auto again = std::chrono::steady_clock::now();
  while (open_runs() > 0 && std::chrono::steady_clock::now() - again < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - again, std::chrono::seconds(10));
  EXPECT_EQ(open_runs(), 0);
}

// Calls on one partial run take turns: a second call waits for the one in
// progress instead of failing "in use", and gives up at its own deadline.
TEST(SessionRegistryTest, CallsOnOnePartialRunTakeTurns) {
  SessionRegistry registry;
  const std::string s = registry
                            .create(testing::slow_partial_graph_def(
                                testing::slow_products_for(std::chrono::milliseconds(500))))
                            .value()
                            .handle;
  const std::string pr = registry.partial_run_setup(s, {"a", "x"}, {"a2", "slow"}, {}).value();
  Result<std::vector<Tensor>> slow = internal_error("not run");
  std::thread first([&] {
    slow = registry.partial_run(s, pr, {{"x", Tensor::filled(Shape{kSlowDim, kSlowDim}, 0.001f)}},
                                {"slow"}, {});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it take its turn
  RunOptions hurried;
  hurried.timeout = std::chrono::milliseconds(1);
  const auto gave_up = registry.partial_run(s, pr, {{"a", Tensor(1.0f)}}, {"a2"}, {}, hurried);
  // Waits for the first call, then runs (a is still unfed: the run is as it was).
  const auto second = registry.partial_run(s, pr, {{"a", Tensor(1.0f)}}, {"a2"}, {});
  first.join();
  EXPECT_THAT(slow, IsOk());
  if (gave_up.is_ok()) {
    GTEST_LOG_(INFO) << "the first call ended within 1 ms of the second's arrival";
  } else {
    EXPECT_THAT(gave_up, StatusIs(StatusCode::kDeadlineExceeded, "the call in progress"));
  }
  // The hurried call either never ran (a still unfed) or fed a itself.
  if (gave_up.is_ok()) {
    EXPECT_THAT(second, StatusIs(StatusCode::kNotFound, pr));  // the run completed
  } else {
    EXPECT_THAT(second, IsOkAndHolds(ElementsAre(TensorEq(Tensor(1.0f)))));
  }
}

// What an asynchronous registry call reported, for the test thread to wait
// for (and to let go of the session it held).
struct AsyncResult {
  std::promise<Result<std::vector<Tensor>>> promise;
  std::shared_ptr<void> hold;
  std::future<Result<std::vector<Tensor>>> future = promise.get_future();
  SessionRegistry::StepDone done() {
    return [this](Result<std::vector<Tensor>> out, RunMetadata*, std::shared_ptr<void> h) {
      hold = std::move(h);  // kept past done: a session is not destroyed from its own done
      promise.set_value(std::move(out));
    };
  }
};

TEST(SessionRegistryTest, RunAsyncAnswersAndHoldsTheSession) {
  SessionRegistry registry;
  const std::string s = registry.create(doubler()).value().handle;
  AsyncResult ok;
  registry.run_async(s, {{"x", Tensor(3.0f)}}, {"y"}, {}, {}, ok.done());
  EXPECT_THAT(ok.future.get(), IsOkAndHolds(ElementsAre(TensorEq(Tensor(6.0f)))));
  EXPECT_NE(ok.hold, nullptr);
  AsyncResult missing;
  registry.run_async("s-nope", {}, {"y"}, {}, {}, missing.done());
  EXPECT_THAT(missing.future.get(), StatusIs(StatusCode::kNotFound, "s-nope"));
  EXPECT_EQ(missing.hold, nullptr);
}

// A session closed while its step runs: the step ends Cancelled, and the
// session lives on in the call's hold until the caller lets go of it.
TEST(SessionRegistryTest, RunAsyncOnASessionClosedMeanwhile) {
  SessionRegistry registry;
  const std::string s = registry.create(testing::slow_graph_def()).value().handle;
  AsyncResult slow;
  registry.run_async(s, {}, {"slow"}, {}, {}, slow.done());
  ASSERT_THAT(registry.close(s), IsOk());
  EXPECT_THAT(slow.future.get(), StatusIs(StatusCode::kCancelled, ""));
  EXPECT_EQ(registry.size(), 0u);
  slow.hold.reset();  // the session is destroyed here, outside its done
}

// Asynchronous calls on one partial run queue behind the one in progress
// (holding no thread) and take their turns in order; a queued call's stop
// ends its wait at once.
TEST(SessionRegistryTest, AsyncCallsOnOnePartialRunQueueAndLeaveAtTheirStop) {
  SessionRegistry registry;
  const std::string s = registry
                            .create(testing::slow_partial_graph_def(
                                testing::slow_products_for(std::chrono::milliseconds(500))))
                            .value()
                            .handle;
  const std::string pr = registry.partial_run_setup(s, {"a", "x"}, {"a2", "slow"}, {}).value();
  AsyncResult first;
  registry.partial_run_async(s, pr, {{"x", Tensor::filled(Shape{kSlowDim, kSlowDim}, 0.001f)}},
                             {"slow"}, {}, {}, first.done());
  std::stop_source stop;
  RunOptions stoppable;
  stoppable.stop_token = stop.get_token();
  AsyncResult stopped;
  registry.partial_run_async(s, pr, {{"a", Tensor(1.0f)}}, {"a2"}, {}, stoppable, stopped.done());
  AsyncResult third;
  registry.partial_run_async(s, pr, {{"a", Tensor(2.0f)}}, {"a2"}, {}, {}, third.done());
  stop.request_stop();
  const Result<std::vector<Tensor>> stopped_out = stopped.future.get();
  EXPECT_THAT(first.future.get(), IsOk());
  const Result<std::vector<Tensor>> third_out = third.future.get();
  if (stopped_out.is_ok()) {
    // The first call ended before the stop: the second fed a, and the run
    // completed with it.
    GTEST_LOG_(INFO) << "the first call ended before the second was stopped";
    EXPECT_THAT(third_out, StatusIs(StatusCode::kNotFound, pr));
  } else {
    EXPECT_THAT(stopped_out, StatusIs(StatusCode::kCancelled, "while it waited"));
    EXPECT_THAT(third_out, IsOkAndHolds(ElementsAre(TensorEq(Tensor(2.0f)))));
  }
}

// Calls queued on a partial run whose session closes are answered as the
// call in progress is: CANCELLED "Session has been closed." (they were
// NOT_FOUND naming the partial run, as if the client had used a stale
// handle). The same for blocking calls.
TEST(SessionRegistryTest, CallsQueuedOnAPartialRunOfAClosedSessionAreCancelled) {
  SessionRegistry registry;
  const std::string s = registry.create(testing::slow_partial_graph_def(2000)).value().handle;
  const std::string pr = registry.partial_run_setup(s, {"a", "x"}, {"a2", "slow"}, {}).value();
  AsyncResult first;
  registry.partial_run_async(s, pr, {{"x", Tensor::filled(Shape{kSlowDim, kSlowDim}, 0.001f)}},
                             {"slow"}, {}, {}, first.done());
  std::vector<std::unique_ptr<AsyncResult>> queued;
  for (int i = 0; i < 5; ++i) {
    queued.push_back(std::make_unique<AsyncResult>());
    registry.partial_run_async(s, pr, {{"a", Tensor(1.0f)}}, {"a2"}, {}, {}, queued.back()->done());
  }
  Result<std::vector<Tensor>> blocking = invalid_argument("not run");
  std::thread waiter([&] {
    blocking = registry.partial_run(s, pr, {{"a", Tensor(1.0f)}}, {"a2"}, {});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all queued behind the first
  ASSERT_THAT(registry.close(s), IsOk());
  EXPECT_THAT(first.future.get(), StatusIs(StatusCode::kCancelled, "Session has been closed."));
  for (auto& q : queued) {
    EXPECT_THAT(q->future.get(), StatusIs(StatusCode::kCancelled, "Session has been closed."));
  }
  waiter.join();
  EXPECT_THAT(blocking, StatusIs(StatusCode::kCancelled, "Session has been closed."));
}

}  // namespace
}  // namespace graphrun
