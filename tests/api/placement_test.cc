// Device strings on nodes (NodeSpec::device, Graph::device scopes) and the
// simple placer that turns them into ranks (place()).
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::IsOk;
using testing::StatusIs;

TEST(ParseDeviceTest, ReadsGraphrunsAndTensorFlowsForms) {
  struct Case {
    const char* text;
    int rank;
    const char* job;
  };
  const Case cases[] = {
      {"", -1, ""},
      {"/rank:0", 0, ""},
      {"/rank:12", 12, ""},
      {"/job:worker/task:1", 1, "worker"},
      {"/job:worker/replica:0/task:3/device:CPU:0", 3, "worker"},
      {"/job:localhost/replica:0/task:0/device:CPU:0", 0, "localhost"},
      {"/device:CPU:0", -1, ""},
      {"/device:GPU:1", -1, ""},
      {"/cpu:0", -1, ""},
      {"CPU:0", -1, ""},
      {"/job:ps", -1, "ps"},
      {"/rank:1/device:CPU:0", 1, ""},
      {"/rank:2147483647", 2147483647, ""},  // the largest (no world has it: placement says so)
  };
  for (const Case& c : cases) {
    Result<DeviceName> d = parse_device(c.text);
    ASSERT_THAT(d, IsOk()) << c.text;
    EXPECT_EQ(d->rank, c.rank) << c.text;
    EXPECT_EQ(d->job, c.job) << c.text;
  }
}

TEST(ParseDeviceTest, RefusesWhatIsNotADeviceName) {
  for (const char* text : {"/rank:x", "/rank:-1", "/rank:", "/task:99999999999", "/job:w/task:-1",
                           "/node:1", "rank", "/rank:1/task:1", "/rank:1/rank:2", "/job:/task:0",
                           "/job:a b", "/device:CPU:x", "/replica:r", "/device::0"}) {
    EXPECT_THAT(parse_device(text), StatusIs(StatusCode::kInvalidArgument, "is not a device name"))
        << text;
  }
}

TEST(ParseDeviceTest, ARankPastTheLargestIsNamedSo) {
  EXPECT_THAT(parse_device("/rank:2147483648"),
              StatusIs(StatusCode::kInvalidArgument, "rank '2147483648' is past the largest"));
  EXPECT_THAT(parse_device("/task:99999999999"),
              StatusIs(StatusCode::kInvalidArgument, "task '99999999999' is past the largest"));
}

TEST(DeviceScopeTest, PlacesNewNodesUntilTheGuardEndsAndNests) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  Output b;
  Output c;
  Output d;
  {
    auto on1 = g.device("/rank:1");
    b = ops::Neg(g, a, "b");
    {
      auto on2 = g.device("/job:worker/task:2");
      c = ops::Neg(g, b, "c");
      auto none = g.device("");
      d = ops::Neg(g, c, "d");
    }
    Result<Node*> own =
        g.add_node(NodeSpec{.op = "Neg", .name = "own", .inputs = {b}, .device = "/rank:0"});
    ASSERT_THAT(own, IsOk());
    EXPECT_EQ((*own)->device(), "/rank:0");
  }
  Output e = ops::Neg(g, d, "e");
  ASSERT_THAT(g.status(), IsOk());
  EXPECT_EQ(a.node()->device(), "");
  EXPECT_EQ(b.node()->device(), "/rank:1");
  EXPECT_EQ(c.node()->device(), "/job:worker/task:2");
  EXPECT_EQ(d.node()->device(), "");
  EXPECT_EQ(e.node()->device(), "");
}

TEST(DeviceScopeTest, ABadDeviceFailsTheNodeNamingIt) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  Result<Node*> bad =
      g.add_node(NodeSpec{.op = "Neg", .name = "bad", .inputs = {a}, .device = "/rank:one"});
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "node 'bad' (Neg)"));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, "rank 'one' is not a number"));
  Graph scoped;
  Output x = ops::Const(scoped, Tensor(1.0f), "x");
  auto scope = scoped.device("/gpu");
  EXPECT_FALSE(ops::Neg(scoped, x, "y").node() != nullptr);
  EXPECT_THAT(scoped.status(), StatusIs(StatusCode::kInvalidArgument, "node 'y' (Neg)"));
}

TEST(DeviceScopeTest, DevicesSurviveCloneMoveAndAppend) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  {
    auto on1 = g.device("/rank:1");
    ops::Neg(g, a, "b");
  }
  Graph copy = g.clone();
  EXPECT_EQ(copy.find_node("b")->device(), "/rank:1");
  Graph grown = g.clone();
  {
    auto on3 = grown.device("/rank:3");
    ops::Neg(grown, grown.find_output("b").value(), "c");
  }
  ASSERT_THAT(g.append_nodes_from(grown), IsOk());
  EXPECT_EQ(g.find_node("c")->device(), "/rank:3");
  Graph moved = std::move(g);
  EXPECT_EQ(moved.find_node("b")->device(), "/rank:1");
  EXPECT_EQ(moved.find_node("c")->device(), "/rank:3");
  EXPECT_EQ(moved.find_node("a")->device(), "");
}

int rank_of(const std::vector<int>& ranks, const Graph& g, const char* name) {
  return ranks[static_cast<std::size_t>(g.find_node(name)->id())];
}

TEST(PlaceTest, PlacedNodesKeepTheirRankAndOthersFollowTheirFirstInput) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");  // rank 0
  Output on1;
  {
    auto scope = g.device("/job:worker/task:1");
    on1 = ops::Neg(g, x, "on1");
  }
  Output after = ops::Neg(g, on1, "after");           // follows on1
  Output mixed = ops::Add(g, x, on1, "mixed");        // first input x: rank 0
  Output second = ops::Add(g, on1, x, "second");      // first input on1: rank 1
  Output free = ops::Const(g, Tensor(2.0f), "free");  // no input: rank 0
  const Node* group = ops::NoOp(g, "group");          // rank 0
  ASSERT_THAT(g.status(), IsOk());
  Result<std::vector<int>> ranks = place(g, 2);
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ(rank_of(*ranks, g, "x"), 0);
  EXPECT_EQ(rank_of(*ranks, g, "on1"), 1);
  EXPECT_EQ(rank_of(*ranks, g, "after"), 1);
  EXPECT_EQ(rank_of(*ranks, g, "mixed"), 0);
  EXPECT_EQ(rank_of(*ranks, g, "second"), 1);
  EXPECT_EQ(rank_of(*ranks, g, "free"), 0);
  EXPECT_EQ(rank_of(*ranks, g, group->name().c_str()), 0);
  static_cast<void>(after);
  static_cast<void>(mixed);
  static_cast<void>(second);
  static_cast<void>(free);
}

TEST(PlaceTest, AVariableAndItsAssignsShareTheRankOfThePlacedOne) {
  Graph g;
  Output v = ops::Variable(g, Tensor(0.0f), "v");  // unplaced
  Output one = ops::Const(g, Tensor(1.0f), "one");
  Output add;
  {
    auto scope = g.device("/rank:1");
    add = ops::AssignAdd(g, v, one, {}, "add");
  }
  ASSERT_THAT(g.status(), IsOk());
  Result<std::vector<int>> ranks = place(g, 2);
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ(rank_of(*ranks, g, "v"), 1);
  EXPECT_EQ(rank_of(*ranks, g, "add"), 1);
  EXPECT_EQ(rank_of(*ranks, g, "one"), 0);
  // The initializer (an Assign) goes with its variable.
  const Node* init = ops::GlobalVariablesInitializer(g);
  ASSERT_NE(init, nullptr);
  Result<std::vector<int>> again = place(g, 2);
  ASSERT_THAT(again, IsOk());
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node* n = g.node(id);
    if (n->op() == "Assign") {
      EXPECT_EQ((*again)[static_cast<std::size_t>(id)], 1) << n->name();
    }
  }
  // Unplaced everywhere: all on the first member's rank (0).
  Graph plain;
  Output w = ops::Variable(plain, Tensor(0.0f), "w");
  ops::AssignAdd(plain, w, ops::Const(plain, Tensor(1.0f)), {}, "inc");
  Result<std::vector<int>> zero = place(plain, 3);
  ASSERT_THAT(zero, IsOk());
  EXPECT_EQ(rank_of(*zero, plain, "w"), 0);
  EXPECT_EQ(rank_of(*zero, plain, "inc"), 0);
}

TEST(PlaceTest, PlacementsThatCannotHoldNameTheNode) {
  Graph split;
  Output v;
  {
    auto scope = split.device("/rank:0");
    v = ops::Variable(split, Tensor(0.0f), "v");
  }
  {
    auto scope = split.device("/rank:1");
    ops::AssignAdd(split, v, ops::Const(split, Tensor(1.0f)), {}, "far_add");
  }
  ASSERT_THAT(split.status(), IsOk());
  EXPECT_THAT(place(split, 2), StatusIs(StatusCode::kInvalidArgument, "use variable 'v'"));
  EXPECT_THAT(place(split, 2), StatusIs(StatusCode::kInvalidArgument, "'far_add'"));

  Graph far;
  {
    auto scope = far.device("/rank:2");
    ops::Const(far, Tensor(1.0f), "too_far");
  }
  EXPECT_THAT(place(far, 2), StatusIs(StatusCode::kInvalidArgument, "node 'too_far' (Const)"));
  EXPECT_THAT(place(far, 2), StatusIs(StatusCode::kInvalidArgument, "the world has 2 rank(s)"));
  EXPECT_THAT(place(far, 3), IsOk());
  EXPECT_THAT(place(far, 0), StatusIs(StatusCode::kInvalidArgument, "at least 1"));

  Graph jobs;
  {
    auto ps = jobs.device("/job:ps/task:0");
    ops::Const(jobs, Tensor(1.0f), "on_ps");
  }
  {
    auto worker = jobs.device("/job:worker/task:0");
    ops::Const(jobs, Tensor(1.0f), "on_worker");
  }
  EXPECT_THAT(place(jobs, 2), StatusIs(StatusCode::kInvalidArgument, "the tasks of one job"));
}

}  // namespace
}  // namespace graphrun
