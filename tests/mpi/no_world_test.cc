// The collectives in a process that never initialised MPI: graphs build
// (the ops register themselves), and running one is FailedPrecondition
// naming the node and what to call first.
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::StatusIs;

TEST(MpiNoWorldTest, RunningACollectiveWithoutAWorldNamesWhatToCallFirst) {
  EXPECT_EQ(mpi::World::current(), nullptr);
  Graph g;
  Output x = ops::Const(g, Tensor(1.0f), "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "sum");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  EXPECT_EQ(sum.node()->op(), "MpiAllReduce");
  auto s = Session::create(g).value();
  EXPECT_THAT(s->run({}, {sum}),
              StatusIs(StatusCode::kFailedPrecondition, "graphrun::mpi::World::init() first"));
  EXPECT_THAT(s->run({}, {sum}), StatusIs(StatusCode::kFailedPrecondition, "'sum'"));
}

}  // namespace
}  // namespace graphrun
