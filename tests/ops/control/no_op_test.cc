#include <gmock/gmock.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <atomic>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::graphrun::testing::IsOk;
using ::graphrun::testing::make_session;
using ::graphrun::testing::run_all;
using ::graphrun::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A stateful Call that counts its executions and outputs the count.
Output counter(Graph& g, std::atomic<int>& count, std::string_view name) {
  return ops::Call(
      g, {}, {DType::kInt32},
      [&count](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
        return std::vector<Tensor>{Tensor(++count)};
      },
      {}, name)[0];
}

TEST(NoOpTest, BuildsAndRunsAsATarget) {
  Graph g;
  const Node* n = ops::NoOp(g, "nothing");
  ASSERT_NE(n, nullptr);
  ASSERT_TRUE(g.status().is_ok());
  EXPECT_EQ(n->op(), "NoOp");
  EXPECT_EQ(n->name(), "nothing");
  EXPECT_EQ(n->num_inputs(), 0);
  EXPECT_EQ(n->num_outputs(), 0);
  EXPECT_FALSE(n->is_stateful());
  Result<std::vector<Tensor>> out = run_all(g, {}, {}, {n});
  ASSERT_THAT(out, IsOk());
  EXPECT_THAT(*out, IsEmpty());
  EXPECT_THAT(run_all(g, {}, {}, {"nothing"}), IsOk());
}

TEST(NoOpTest, DefaultNameIsTheOpName) {
  Graph g;
  EXPECT_EQ(ops::NoOp(g)->name(), "NoOp");
  EXPECT_EQ(ops::NoOp(g)->name(), "NoOp_1");
}

TEST(GroupTest, RunsItsDependenciesAsATarget) {
  Graph g;
  std::atomic<int> a{0};
  std::atomic<int> b{0};
  std::atomic<int> unrelated{0};
  Output ca = counter(g, a, "a");
  Output cb = counter(g, b, "b");
  counter(g, unrelated, "unrelated");
  const Node* group = ops::Group(g, {ca.node(), cb.node()}, "both");
  ASSERT_NE(group, nullptr);
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(group->op(), "NoOp");
  EXPECT_THAT(group->control_inputs(), ElementsAre(ca.node(), cb.node()));
  auto session = make_session(g);
  ASSERT_NE(session, nullptr);
  for (int run = 1; run <= 3; ++run) {
    EXPECT_THAT(session->run({}, {}, {group}), IsOk());
    EXPECT_EQ(a.load(), run);
    EXPECT_EQ(b.load(), run);
  }
  EXPECT_EQ(unrelated.load(), 0);
}

TEST(GroupTest, OrdersAfterItsDependencies) {
  Graph g;
  std::atomic<int> first{0};
  Output c = counter(g, first, "first");
  const Node* group = ops::Group(g, {c.node()});
  // A Call depending on the group sees the counter already incremented.
  std::atomic<int> seen{-1};
  std::vector<Output> after;
  {
    auto deps = g.control_dependencies({group});
    after = ops::Call(g, {}, {DType::kInt32},
                      [&](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
                        seen = first.load();
                        return std::vector<Tensor>{Tensor(0)};
                      });
  }
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_THAT(run_all(g, {after[0]}), IsOk());
  EXPECT_EQ(seen.load(), 1);
}

TEST(GroupTest, InvalidDependencyIsABuildError) {
  Graph g;
  const Node* group = ops::Group(g, {nullptr}, "bad");
  EXPECT_EQ(group, nullptr);
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "control input"));
}

}  // namespace
}  // namespace graphrun
