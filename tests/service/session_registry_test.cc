// SessionRegistry without gRPC: handles, lookup, close, list, extend
// versions and the limits.
#include <graphrun/graph_def.h>
#include <graphrun/ops.h>
#include <graphrun/session_registry.h>
#include <gtest/gtest.h>

#include <regex>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::IsOkAndHolds;
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
  // A duplicate name is the import's error, naming the node.
  EXPECT_THAT(registry.extend(created.handle, nodes, 1),
              StatusIs(StatusCode::kInvalidArgument, "'z'"));
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

}  // namespace
}  // namespace graphrun
