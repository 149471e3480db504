// Drives the real `graphrun` binary: stdout, stderr, exit codes, written
// .npy files and Chrome traces (parsed with protobuf's JSON parser).
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <graphrun/graph_def.h>
#include <gtest/gtest.h>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/tools/cli_runner.h"
#include "tools/graphrun/npy.h"

namespace graphrun {
namespace {

using ::testing::HasSubstr;
using testing_cli::CliTest;
using testing_cli::kData;
using testing_cli::kTf;
using testing_cli::read_text;

TEST_F(CliTest, RunFeedsInlineAndPrints) {
  const auto o = run(
      {"run", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x=10,20,30", "--fetch", "add"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "add: float32[3] [11, 22, 33]\n");
  EXPECT_EQ(o.err, "");
}

TEST_F(CliTest, RunFetchesWithoutFeeds) {
  const auto o = run({"run", kTf + "/const_sum_axis1.pbtxt", "--fetch", "Sum"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "Sum: float32[3] [3, 3, 3]\n");
}

TEST_F(CliTest, RunsBinaryGraphFile) {
  auto graph = load_graph_file(kTf + "/const_plus_placeholder_add.pbtxt");
  ASSERT_TRUE(graph.is_ok());
  const auto pb = dir_ / "g.pb";
  ASSERT_TRUE(save_graph_file(*graph, pb).is_ok());
  const auto o = run({"run", pb.string(), "--feed", "x=[1,2,3]", "--fetch", "add"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "add: float32[3] [2, 4, 6]\n");
}

TEST_F(CliTest, InitRunsFirstThenFetch) {
  const auto o =
      run({"run", kTf + "/variables_a_times_b_init.pbtxt", "--init", "init", "--fetch", "c"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "c: float32[] 30\n");
}

TEST_F(CliTest, RunFeedsNpyAndWritesNpy) {
  const auto in = dir_ / "x.npy";
  ASSERT_TRUE(npy::write_file(Tensor::filled(Shape{1, 4, 4, 1}, 10.0f), in).is_ok());
  std::vector<float> p1;
  for (int i = 0; i < 16; ++i)
    for (int c = 0; c < 4; ++c) p1.push_back(static_cast<float>(c));
  ASSERT_TRUE(
      npy::write_file(Tensor::from_span<float>(Shape{1, 4, 4, 4}, p1), dir_ / "p1.npy").is_ok());
  const auto out_dir = dir_ / "out";
  const auto o = run({"run", kTf + "/placeholder_with_default_broadcast_add.pbtxt", "--feed",
                      "placeholder_0=@" + in.string(), "--feed",
                      "placeholder_1=@" + (dir_ / "p1.npy").string(), "--fetch", "result:0",
                      "--fetch", "keras_learning_phase", "--out-dir", out_dir.string()});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("result:0: float32[1,4,4,4] [[[[10, 11, 12, 13], "));
  EXPECT_THAT(o.out, HasSubstr("(32 of 64 elements shown)"));
  EXPECT_THAT(o.out, HasSubstr("keras_learning_phase: bool[] false"));
  auto result = npy::read_file(out_dir / "result%3A0.npy");
  ASSERT_TRUE(result.is_ok()) << result.status().to_string();
  ASSERT_EQ(result->debug_type(), "float32[1,4,4,4]");
  for (std::size_t i = 0; i < 64; ++i) EXPECT_EQ(result->flat<float>()[i], 10.0f + p1[i]);
  auto phase = npy::read_file(out_dir / "keras_learning_phase.npy");
  ASSERT_TRUE(phase.is_ok());
  EXPECT_EQ(*phase, Tensor(false));
}

TEST_F(CliTest, FlatListTakesDeclaredShapeAndBoolFeeds) {
  const auto o = run({"run", kTf + "/placeholder_with_default_broadcast_add.pbtxt", "--feed",
                      "keras_learning_phase=true", "--fetch", "keras_learning_phase"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "keras_learning_phase: bool[] true\n");
}

// The seed example: r1 = x + noise (a random draw), r2 = r1 * y, in one
// partial run over two calls. The draw happens once, so r2 == r1 * y
// exactly, and the trace shows every node once with the call that ran it.
TEST_F(CliTest, PartialRunSeedExampleComputesStageOnce) {
  const auto trace = dir_ / "trace.json";
  const auto out_dir = dir_ / "out";
  const auto o =
      run({"run", kData + "/two_stages.pbtxt", "--partial", "feed x=1,2; fetch r1", "--partial",
           "feed:y=10;fetch:r2", "--out-dir", out_dir.string(), "--trace", trace.string()});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_THAT(o.out, testing::MatchesRegex("step 1:\nr1: float32\\[2\\] \\[.*\\]\n"
                                           "step 2:\nr2: float32\\[2\\] \\[.*\\]\n"));
  auto r1 = npy::read_file(out_dir / "r1.npy");
  auto r2 = npy::read_file(out_dir / "r2.npy");
  ASSERT_TRUE(r1.is_ok() && r2.is_ok());
  for (std::size_t i = 0; i < 2; ++i) {
    const float noise = r1->flat<float>()[i] - static_cast<float>(i + 1);
    EXPECT_GE(noise, 0.0f);
    EXPECT_LT(noise, 1.0f);
    EXPECT_EQ(r2->flat<float>()[i], r1->flat<float>()[i] * 10.0f);
  }
}

struct TraceEvent {
  std::string name;
  double ts = 0;
  double dur = 0;
  int tid = 0;
  int step = 0;
};

// Parses a Chrome trace with protobuf's JSON parser (google.protobuf.Struct)
// and checks the format's invariants: X events with ts/dur >= 0 on a named
// real thread (arena slot >= 0), each node once, and a node's start after
// its inputs' ends when they ran in the same call.
std::map<std::string, TraceEvent> check_trace(const std::filesystem::path& path,
                                              const std::filesystem::path& graph_file) {
  google::protobuf::Struct root;
  const auto st = google::protobuf::util::JsonStringToMessage(read_text(path), &root);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::map<std::string, TraceEvent> events;
  std::map<int, std::string> thread_names;
  const auto& list = root.fields().at("traceEvents").list_value();
  EXPECT_GT(list.values_size(), 0);
  EXPECT_EQ(root.fields().at("otherData").struct_value().fields().at("cpu_isa").string_value(),
            cpu_isa_name(cpu_isa()));
  for (const auto& v : list.values()) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    const int tid = static_cast<int>(f.at("tid").number_value());
    if (ph == "M") {
      if (f.at("name").string_value() == "thread_name") {
        thread_names[tid] = f.at("args").struct_value().fields().at("name").string_value();
      }
      continue;
    }
    EXPECT_EQ(ph, "X");
    TraceEvent e;
    e.name = f.at("name").string_value();
    e.ts = f.at("ts").number_value();
    e.dur = f.at("dur").number_value();
    e.tid = tid;
    const auto& args = f.at("args").struct_value().fields();
    EXPECT_EQ(args.at("op").string_value(), f.at("cat").string_value());
    EXPECT_TRUE(args.contains("output_shapes"));
    EXPECT_TRUE(args.contains("output_bytes"));
    if (args.contains("step")) e.step = static_cast<int>(args.at("step").number_value());
    EXPECT_GE(e.ts, 0.0) << e.name;
    EXPECT_GE(e.dur, 0.0) << e.name;
    EXPECT_GE(e.tid, 0) << e.name;
    EXPECT_FALSE(events.contains(e.name)) << e.name << " appears twice";
    events[e.name] = e;
  }
  for (const auto& [name, e] : events) {
    EXPECT_THAT(thread_names[e.tid], HasSubstr("arena slot")) << name;
  }
  auto graph = load_graph_file(graph_file);
  EXPECT_TRUE(graph.is_ok());
  if (!graph.is_ok()) return events;
  for (const auto& [name, e] : events) {
    const Node* node = graph->find_node(name);
    EXPECT_NE(node, nullptr) << name;
    if (node == nullptr) continue;
    std::vector<const Node*> preds(node->control_inputs().begin(), node->control_inputs().end());
    for (const Output& in : node->inputs()) preds.push_back(in.node());
    for (const Node* p : preds) {
      const auto it = events.find(p->name());
      if (it == events.end() || it->second.step != e.step) continue;
      // Printed with 3 decimals: allow the rounding of three numbers.
      EXPECT_GE(e.ts, it->second.ts + it->second.dur - 0.002) << name << " after " << p->name();
    }
  }
  return events;
}

TEST_F(CliTest, TraceOfRunHasEveryNodeOnceOnRealThreads) {
  const auto trace = dir_ / "t.json";
  const std::string graph = kTf + "/tf_profiler_testdata_variables_conv2d.pbtxt";
  // Conv2D_1 needs the variables: run init first (untraced), then trace.
  const auto o = run({"run", graph, "--init", "init", "--fetch", "Conv2D_1", "--print-limit", "2",
                      "--trace", trace.string()});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("Conv2D_1: float32[2,2,2,12] [[[[0, 0, ...]"));
  const auto events = check_trace(trace, graph);
  std::vector<std::string> names;
  for (const auto& [name, e] : events) names.push_back(name);
  EXPECT_THAT(names, testing::UnorderedElementsAre("zeros", "DW/read", "DW", "DW2", "DW2/read",
                                                   "Conv2D", "Conv2D_1"));
}

TEST_F(CliTest, TraceOfPartialRunNamesSteps) {
  const auto trace = dir_ / "t.json";
  const std::string graph = kData + "/two_stages.pbtxt";
  const auto o = run({"run", graph, "--partial", "feed x=1,2; fetch r1", "--partial",
                      "feed y=10; fetch r2", "--trace", trace.string()});
  ASSERT_EQ(o.code, 0) << o.err;
  const auto events = check_trace(trace, graph);
  ASSERT_EQ(events.size(), 4u);  // x and y are fed: they do not execute
  EXPECT_EQ(events.at("expensive/noise").step, 1);
  EXPECT_EQ(events.at("r1").step, 1);
  EXPECT_EQ(events.at("r2").step, 2);
  EXPECT_GE(events.at("r2").ts, events.at("r1").ts + events.at("r1").dur - 0.002);
}

TEST_F(CliTest, HelpExits0) {
  const auto o = run({"run", "--help"});
  EXPECT_EQ(o.code, 0);
  EXPECT_THAT(o.out, HasSubstr("--partial"));
}

}  // namespace
}  // namespace graphrun
