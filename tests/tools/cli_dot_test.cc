// `graphrun dot` through the real binary: the DOT text parsed back (node
// and edge statements with their attributes), the pruned part checked
// against the nodes a traced run of the same signature executed, the
// partial-run calls, and SVG through Graphviz.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_runner.h"

namespace graphrun {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using testing_cli::CliTest;
using testing_cli::kData;
using testing_cli::kTf;
using testing_cli::read_text;

using Attrs = std::map<std::string, std::string>;
struct DotEdge {
  std::string from;
  std::string to;
  Attrs attrs;
};
struct Dot {
  std::map<std::string, Attrs> nodes;  // every node statement, by id
  std::vector<DotEdge> edges;
  std::set<std::string> with_class(const std::string& cls) const {
    std::set<std::string> out;
    for (const auto& [id, a] : nodes) {
      std::istringstream classes(a.contains("class") ? a.at("class") : "");
      std::string c;
      while (classes >> c) {
        if (c == cls) out.insert(id);
      }
    }
    return out;
  }
};

// Reads a DOT quoted string at `pos` ("\n" decoded, "\x" -> x).
std::string read_quoted(const std::string& s, std::size_t& pos) {
  std::string out;
  EXPECT_EQ(s[pos], '"') << s;
  for (++pos; pos < s.size() && s[pos] != '"'; ++pos) {
    if (s[pos] == '\\' && pos + 1 < s.size()) {
      ++pos;
      out += s[pos] == 'n' ? '\n' : s[pos];
    } else {
      out += s[pos];
    }
  }
  ++pos;
  return out;
}

// The statement grammar graph_to_dot writes: one per line,
// `"id" [k=v, ...];` or `"a" -> "b" [k=v, ...];` (values quoted or bare).
Dot parse_dot(const std::string& text) {
  Dot dot;
  std::istringstream lines(text);
  std::string line;
  bool header = true;
  while (std::getline(lines, line)) {
    if (header) {
      EXPECT_EQ(line, "digraph \"graphrun\" {");
      header = false;
      continue;
    }
    const std::size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line[start] != '"') continue;
    std::size_t pos = start;
    const std::string first = read_quoted(line, pos);
    std::string second;
    const bool edge = line.compare(pos, 4, " -> ") == 0;
    if (edge) {
      pos += 4;
      second = read_quoted(line, pos);
    }
    Attrs attrs;
    EXPECT_EQ(line.compare(pos, 2, " ["), 0) << line;
    pos += 2;
    while (pos < line.size() && line[pos] != ']') {
      const std::size_t eq = line.find('=', pos);
      const std::string key = line.substr(pos, eq - pos);
      pos = eq + 1;
      std::string value;
      if (line[pos] == '"') {
        value = read_quoted(line, pos);
      } else {
        const std::size_t end = line.find_first_of(",]", pos);
        value = line.substr(pos, end - pos);
        pos = end;
      }
      attrs[key] = value;
      if (line.compare(pos, 2, ", ") == 0) pos += 2;
    }
    EXPECT_EQ(line.substr(pos), "];") << line;
    if (edge) {
      dot.edges.push_back({first, second, attrs});
    } else {
      EXPECT_FALSE(dot.nodes.contains(first)) << first << " twice";
      dot.nodes[first] = attrs;
    }
  }
  EXPECT_THAT(text, ::testing::EndsWith("}\n"));
  return dot;
}

// The node names in a Chrome trace written by `graphrun run --trace`.
std::set<std::string> traced_nodes(const std::filesystem::path& path) {
  google::protobuf::Struct root;
  const auto st = google::protobuf::util::JsonStringToMessage(read_text(path), &root);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::set<std::string> names;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() == "X") names.insert(f.at("name").string_value());
  }
  return names;
}

TEST_F(CliTest, DotOfFixtureHasNodesOpsShapesAndTypedEdges) {
  const auto o = run({"dot", kTf + "/const_plus_placeholder_add.pbtxt"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.err, "");
  const Dot dot = parse_dot(o.out);
  ASSERT_EQ(dot.nodes.size(), 3u);
  EXPECT_EQ(dot.nodes.at("Const").at("label"), "Const\nConst");
  EXPECT_EQ(dot.nodes.at("x").at("label"), "x\nPlaceholder");
  EXPECT_EQ(dot.nodes.at("add").at("label"), "add\nAdd");
  EXPECT_EQ(dot.nodes.at("x").at("shape"), "ellipse");
  EXPECT_EQ(dot.nodes.at("Const").at("shape"), "note");
  EXPECT_EQ(dot.nodes.at("add").at("shape"), "box");
  EXPECT_EQ(dot.with_class("graph-node").size(), 3u);
  EXPECT_TRUE(dot.with_class("needed").empty());  // no signature, no marking
  ASSERT_EQ(dot.edges.size(), 2u);
  std::set<std::string> edges;
  for (const DotEdge& e : dot.edges) {
    edges.insert(e.from + "->" + e.to);
    EXPECT_EQ(e.attrs.at("label"), "float32[3]");
    EXPECT_EQ(e.attrs.at("class"), "data");
  }
  EXPECT_THAT(edges, UnorderedElementsAre("Const->add", "x->add"));
}

TEST_F(CliTest, DotDrawsControlEdgesDashedAndWritesAFile) {
  const auto file = dir_ / "g.dot";
  const auto o = run({"dot", kTf + "/variables_a_times_b_init.pbtxt", "-o", file.string()});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "");
  const Dot dot = parse_dot(read_text(file));
  EXPECT_EQ(dot.nodes.size(), 10u);
  EXPECT_EQ(dot.nodes.at("a").at("shape"), "cylinder");
  std::set<std::string> control;
  int data = 0;
  for (const DotEdge& e : dot.edges) {
    if (e.attrs.at("class") == "control") {
      EXPECT_EQ(e.attrs.at("style"), "dashed");
      EXPECT_FALSE(e.attrs.contains("label"));
      control.insert(e.from + "->" + e.to);
    } else {
      ++data;
    }
  }
  EXPECT_THAT(control, UnorderedElementsAre("a/Assign->init", "b/Assign->init"));
  // As imported, an Assign reads only its initial value (no edge from its
  // variable): one edge per Assign and per read, two into c.
  EXPECT_EQ(data, 6);
}

// The nodes dot marks "needed" for a signature are exactly those a traced
// run of the same signature executes: the CLI's pruning is the engine's.
TEST_F(CliTest, DotNeededNodesEqualTracedRun) {
  struct Case {
    std::string graph;
    std::vector<std::string> run_args;  // for graphrun run
    std::vector<std::string> dot_args;  // the same signature for graphrun dot
    std::vector<std::string> init;
  };
  const std::string two = kData + "/two_stages.pbtxt";
  const std::string vars = kTf + "/variables_a_times_b_init.pbtxt";
  const std::string conv = kTf + "/tf_profiler_testdata_variables_conv2d.pbtxt";
  const std::vector<Case> cases = {
      {two, {"--feed", "x=1,2", "--fetch", "r1"}, {"--feed", "x", "--fetch", "r1"}, {}},
      // A fed intermediate tensor replaces its producer: only r2 runs.
      {two,
       {"--feed", "r1=1,2", "--feed", "y=3", "--fetch", "r2"},
       {"--feed", "r1", "--feed", "y", "--fetch", "r2"},
       {}},
      {vars, {"--target", "init"}, {"--target", "init"}, {}},
      {conv, {"--fetch", "Conv2D_1"}, {"--fetch", "Conv2D_1"}, {"--init", "init"}},
      {conv,
       {"--fetch", "Conv2D", "--target", "init"},
       {"--fetch", "Conv2D", "--target", "init"},
       {"--init", "init"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.graph + " " + ::testing::PrintToString(c.dot_args));
    const auto trace = dir_ / "t.json";
    std::vector<std::string> run_cmd = {"run", c.graph, "--trace", trace.string()};
    run_cmd.insert(run_cmd.end(), c.init.begin(), c.init.end());
    run_cmd.insert(run_cmd.end(), c.run_args.begin(), c.run_args.end());
    const auto r = run(run_cmd);
    ASSERT_EQ(r.code, 0) << r.err;
    std::vector<std::string> dot_cmd = {"dot", c.graph};
    dot_cmd.insert(dot_cmd.end(), c.dot_args.begin(), c.dot_args.end());
    const auto d = run(dot_cmd);
    ASSERT_EQ(d.code, 0) << d.err;
    const Dot dot = parse_dot(d.out);
    const std::set<std::string> needed = dot.with_class("needed");
    EXPECT_EQ(needed, traced_nodes(trace));
    EXPECT_FALSE(needed.empty());
    // Every graph node is either needed or pruned.
    std::set<std::string> pruned = dot.with_class("pruned");
    EXPECT_EQ(needed.size() + pruned.size(), dot.with_class("graph-node").size());
  }
}

TEST_F(CliTest, DotMarksFeedsAsReplacingTheProducer) {
  const auto o =
      run({"dot", kData + "/two_stages.pbtxt", "--feed", "r1", "--feed", "y", "--fetch", "r2"});
  ASSERT_EQ(o.code, 0) << o.err;
  const Dot dot = parse_dot(o.out);
  EXPECT_THAT(dot.with_class("feed"), UnorderedElementsAre("feed r1:0", "feed y:0"));
  EXPECT_THAT(dot.with_class("needed"), UnorderedElementsAre("r2"));
  EXPECT_THAT(dot.with_class("fetched"), UnorderedElementsAre("r2"));
  std::set<std::string> fed;
  std::set<std::string> from_feeds;
  for (const DotEdge& e : dot.edges) {
    if (e.attrs.at("class") == "data fed") fed.insert(e.from + "->" + e.to);
    if (e.attrs.at("class") == "feed") from_feeds.insert(e.from + "->" + e.to);
  }
  EXPECT_THAT(fed, UnorderedElementsAre("r1->r2", "y->r2"));
  EXPECT_THAT(from_feeds, UnorderedElementsAre("feed r1:0->r2", "feed y:0->r2"));
}

TEST_F(CliTest, DotOfTracedPartialRunColoursNodesByCall) {
  const auto o = run({"dot", kData + "/two_stages.pbtxt", "--trace-partial", "feed x=1,2; fetch r1",
                      "--trace-partial", "feed y=10; fetch r2"});
  ASSERT_EQ(o.code, 0) << o.err;
  const Dot dot = parse_dot(o.out);
  EXPECT_THAT(dot.with_class("step1"),
              UnorderedElementsAre("expensive/shape", "expensive/noise", "r1"));
  EXPECT_THAT(dot.with_class("step2"), UnorderedElementsAre("r2"));
  // x and y are fed: replaced by the feeds, they never run.
  EXPECT_THAT(dot.with_class("unexecuted"), UnorderedElementsAre("x", "y"));
  EXPECT_THAT(dot.with_class("feed"), UnorderedElementsAre("feed x:0", "feed y:0"));
  EXPECT_THAT(dot.with_class("legend"), UnorderedElementsAre("legend 1", "legend 2"));
  int legend_edges = 0;
  for (const DotEdge& e : dot.edges) {
    if (e.attrs.at("class") != "legend") continue;
    ++legend_edges;
    EXPECT_EQ(e.from + "->" + e.to, "legend 1->legend 2");
    EXPECT_EQ(e.attrs.at("style"), "invis");
  }
  EXPECT_EQ(legend_edges, 1);
  EXPECT_EQ(dot.nodes.at("r2").at("label"), "r2\nMul\ncall 2");
  EXPECT_NE(dot.nodes.at("r1").at("fillcolor"), dot.nodes.at("r2").at("fillcolor"));
  // The nodes of the calls are the needed ones.
  std::set<std::string> ran = dot.with_class("step1");
  ran.insert("r2");
  EXPECT_EQ(dot.with_class("needed"), ran);
}

#if GRAPHRUN_HAVE_GRAPHVIZ
TEST_F(CliTest, DotWritesSvgWithGraphviz) {
  const auto svg = dir_ / "g.svg";
  const auto o = run(
      {"dot", kTf + "/const_plus_placeholder_add.pbtxt", "--fetch", "add", "--svg", svg.string()});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out, "");
  const std::string text = read_text(svg);
  EXPECT_THAT(text, HasSubstr("<svg"));
  EXPECT_THAT(text, HasSubstr("<title>add</title>"));
  // The DOT class attribute survives into the SVG (Graphviz escapes '-').
  EXPECT_THAT(text, HasSubstr("class=\"node graph&#45;node needed fetched\""));
}
#else
TEST_F(CliTest, DotSvgSkippedBecauseGraphvizDotIsNotInstalled) {
  GTEST_SKIP() << "Graphviz's dot was not found at configure time";
}
#endif

TEST_F(CliTest, DotSvgWithoutGraphvizExits1) {
  const auto o = run_with_env(
      "PATH=/nonexistent",
      {"dot", kTf + "/const_plus_placeholder_add.pbtxt", "--svg", (dir_ / "g.svg").string()});
  expect_error(o, 1, "Graphviz 'dot' not found");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "g.svg"));
}

TEST_F(CliTest, DotErrors) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(run({"dot", g, "--fetch", "nope"}), 1, "nope");
  expect_error(run({"dot", g, "--feed", "zz"}), 1, "zz");
  expect_error(run({"dot", g, "--target", "missing_node"}), 1, "missing_node");
  expect_error(run({"dot", g, "--feed", "x=1"}), 2, "names only");
  expect_error(run({"dot", g, "--fetch", "add", "--trace-partial", "fetch add"}), 2,
               "--trace-partial cannot be combined");
  expect_error(run({"dot", g, "--trace-partial", "fetch add; bogus"}), 2, "--trace-partial step 1");
  expect_error(run({"dot", kData + "/missing.pbtxt"}), 1, "missing.pbtxt");
}

}  // namespace
}  // namespace graphrun
