// The TensorFlow-written GraphDefs of testdata/tf-graphdefs (provenance and
// expected values in its README): each loads and runs to the documented
// result.
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using ::testing::ElementsAre;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::StatusIs;
using testing::TensorEq;

std::filesystem::path fixture(std::string_view name) {
  return std::filesystem::path(GRAPHRUN_GRAPHDEF_TESTDATA) / "tf-graphdefs" / name;
}

Graph load(std::string_view name) {
  Result<Graph> g = load_graph_file(fixture(name));
  EXPECT_THAT(g, IsOk()) << name;
  if (!g.is_ok()) return Graph();
  return std::move(g).value();
}

TEST(TfFixturesTest, VariablesATimesBInit) {
  Graph g = load("variables_a_times_b_init.pbtxt");
  ASSERT_GT(g.num_nodes(), 0);
  auto session = testing::make_session(g);
  // Before init the variables are uninitialized.
  EXPECT_THAT(session->run({}, {"c"}, {}), StatusIs(StatusCode::kFailedPrecondition, "'a'"));
  ASSERT_THAT(session->run({}, {}, {"init"}), IsOk());
  EXPECT_THAT(session->run({}, {"c"}, {}), IsOkAndHolds(ElementsAre(TensorEq(Tensor(30.0f)))));
}

TEST(TfFixturesTest, ConstPlusPlaceholderAdd) {
  Graph g = load("const_plus_placeholder_add.pbtxt");
  EXPECT_THAT(testing::run_one(g, "add", {{"x", Tensor{10.0f, 20.0f, 30.0f}}}),
              IsOkAndHolds(TensorEq(Tensor{11.0f, 22.0f, 33.0f})));
}

TEST(TfFixturesTest, ConstSumAxis1) {
  Graph g = load("const_sum_axis1.pbtxt");
  EXPECT_THAT(testing::run_one(g, "Sum"), IsOkAndHolds(TensorEq(Tensor{3.0f, 3.0f, 3.0f})));
}

TEST(TfFixturesTest, PlaceholderWithDefaultBroadcastAdd) {
  Graph g = load("placeholder_with_default_broadcast_add.pbtxt");
  auto session = testing::make_session(g);
  EXPECT_THAT(session->run({}, {"keras_learning_phase"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(false)))));
  EXPECT_THAT(session->run({{"keras_learning_phase", Tensor(true)}}, {"keras_learning_phase"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor(true)))));
  Tensor p0 = Tensor::filled<float>(Shape{1, 4, 4, 1}, 10.0f);
  Tensor p1(DType::kFloat32, Shape{1, 4, 4, 4});
  Tensor expected(DType::kFloat32, Shape{1, 4, 4, 4});
  for (int64_t i = 0; i < p1.num_elements(); ++i) {
    p1.flat<float>()[static_cast<std::size_t>(i)] = static_cast<float>(i % 4);
    expected.flat<float>()[static_cast<std::size_t>(i)] = 10.0f + static_cast<float>(i % 4);
  }
  EXPECT_THAT(session->run({{"placeholder_0", p0}, {"placeholder_1", p1}}, {"result"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(expected))));
}

// TF's tfprof test graph: three variables initialized from random normals,
// two stride-2 SAME convolutions of an all-zero input. Whatever the random
// weights, the convolutions are zeros: [2,6,6,3] -> [2,3,3,6] -> [2,2,2,12].
TEST(TfFixturesTest, VariablesConv2d) {
  Graph g = load("tf_profiler_testdata_variables_conv2d.pbtxt");
  ASSERT_GT(g.num_nodes(), 0);
  auto session = testing::make_session(g);
  EXPECT_THAT(session->run({}, {"Conv2D_1"}, {}), StatusIs(StatusCode::kFailedPrecondition, ""));
  ASSERT_THAT(session->run({}, {}, {"init"}), IsOk());
  EXPECT_THAT(session->run({}, {"Conv2D"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor::filled<float>(Shape{2, 3, 3, 6}, 0.0f)))));
  EXPECT_THAT(session->run({}, {"Conv2D_1"}, {}),
              IsOkAndHolds(ElementsAre(TensorEq(Tensor::filled<float>(Shape{2, 2, 2, 12}, 0.0f)))));
  // The scalar weight is one draw of N(0, 0.001^2): a scalar, tiny, not 0.
  Result<std::vector<Tensor>> w = session->run({}, {"ScalarW/read"}, {});
  ASSERT_THAT(w, IsOk());
  ASSERT_EQ((*w)[0].shape(), Shape());
  EXPECT_LT(std::abs((*w)[0].scalar<float>()), 0.01f);
  EXPECT_NE((*w)[0].scalar<float>(), 0.0f);
}

TEST(TfFixturesTest, EveryFixtureSurvivesABinaryRoundTrip) {
  for (const char* name : {"variables_a_times_b_init.pbtxt", "const_plus_placeholder_add.pbtxt",
                           "const_sum_axis1.pbtxt", "placeholder_with_default_broadcast_add.pbtxt",
                           "tf_profiler_testdata_variables_conv2d.pbtxt"}) {
    Graph g = load(name);
    Result<v1::GraphDef> def = graph_to_graph_def(g);
    ASSERT_THAT(def, IsOk()) << name;
    Result<v1::GraphDef> parsed = parse_graph_def(def->SerializeAsString(), GraphDefFormat::kAuto);
    ASSERT_THAT(parsed, IsOk()) << name;
    Result<Graph> back = graph_from_graph_def(*parsed);
    ASSERT_THAT(back, IsOk()) << name;
    EXPECT_EQ(back->num_nodes(), g.num_nodes()) << name;
  }
}

}  // namespace
}  // namespace graphrun
