// Graph <-> GraphDef: every built-in op round-trips, nodes load in any
// order, TensorFlow's forms (VariableV2, two-input Assign, AddV2, ignored
// attributes) translate, and graphs survive binary and text files.
#include <google/protobuf/util/message_differencer.h>
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::IsOk;
using testing::IsOkAndHolds;
using testing::StatusIs;
using testing::TensorEq;

std::vector<std::string> input_names(const Node& n) {
  std::vector<std::string> out;
  for (const Output& in : n.inputs()) out.push_back(in.name());
  return out;
}
std::vector<std::string> control_names(const Node& n) {
  std::vector<std::string> out;
  for (const Node* d : n.control_inputs()) out.push_back(d->name());
  return out;
}

// Same nodes (by name) with the same op, inputs, control inputs, attributes,
// output dtypes and shapes.
void expect_same_graph(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.num_nodes(), b.num_nodes());
  for (int id = 0; id < a.num_nodes(); ++id) {
    const Node& x = *a.node(id);
    const Node* y = b.find_node(x.name());
    ASSERT_NE(y, nullptr) << x.name();
    EXPECT_EQ(x.op(), y->op()) << x.name();
    EXPECT_EQ(input_names(x), input_names(*y)) << x.name();
    EXPECT_EQ(control_names(x), control_names(*y)) << x.name();
    EXPECT_EQ(x.attrs(), y->attrs()) << x.name();
    ASSERT_EQ(x.num_outputs(), y->num_outputs()) << x.name();
    for (int k = 0; k < x.num_outputs(); ++k) {
      EXPECT_EQ(x.output_dtype(k), y->output_dtype(k)) << x.name();
      EXPECT_EQ(x.output_shape(k), y->output_shape(k)) << x.name();
    }
  }
}

// One builder per built-in op, each adding at least one node of that op. An
// op registered without an entry here fails BuiltinOpsRoundTrip: add its
// builder (and GraphDef support) with the op.
using OpBuilder = std::function<void(Graph&)>;
// Ops without a builder function (TF aliases).
void binary(Graph& g, std::string op, Output x) {
  (void)g.add_node(NodeSpec{.op = std::move(op), .inputs = {x, x}});
}
std::map<std::string, OpBuilder> builders() {
  auto x = [](Graph& g) { return ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}})); };
  std::map<std::string, OpBuilder> b{
      {"Placeholder",
       [](Graph& g) {
         ops::Placeholder(g, DType::kInt64, Shape{-1, 3});
       }},
      {"PlaceholderWithDefault",
       [](Graph& g) { ops::PlaceholderWithDefault(g, ops::Const(g, Tensor(false)), Shape{}); }},
      {"Const",
       [](Graph& g) {
         ops::Const(g, Tensor{int32_t{1}, int32_t{2}});
       }},
      {"Identity", [=](Graph& g) { ops::Identity(g, x(g)); }},
      {"NoOp", [=](Graph& g) { ops::Group(g, {x(g).node()}); }},
      {"Reshape", [=](Graph& g) { ops::Reshape(g, x(g), {4}); }},
      {"Cast", [=](Graph& g) { ops::Cast(g, x(g), DType::kFloat64); }},
      {"Fill",
       [](Graph& g) {
         ops::Fill(g, ops::Const(g, Tensor{int64_t{2}, int64_t{2}}), ops::Const(g, Tensor(1.0)));
       }},
      {"Add", [=](Graph& g) { ops::Add(g, x(g), x(g)); }},
      {"AddV2", [=](Graph& g) { binary(g, "AddV2", x(g)); }},
      {"RealDiv", [=](Graph& g) { binary(g, "RealDiv", x(g)); }},
      {"Sub", [=](Graph& g) { ops::Sub(g, x(g), x(g)); }},
      {"Mul", [=](Graph& g) { ops::Mul(g, x(g), x(g)); }},
      {"Div", [=](Graph& g) { ops::Div(g, x(g), x(g)); }},
      {"Neg", [=](Graph& g) { ops::Neg(g, x(g)); }},
      {"Square", [=](Graph& g) { ops::Square(g, x(g)); }},
      {"Sqrt", [=](Graph& g) { ops::Sqrt(g, x(g)); }},
      {"Exp", [=](Graph& g) { ops::Exp(g, x(g)); }},
      {"Log", [=](Graph& g) { ops::Log(g, x(g)); }},
      {"Tanh", [=](Graph& g) { ops::Tanh(g, x(g)); }},
      {"Sigmoid", [=](Graph& g) { ops::Sigmoid(g, x(g)); }},
      {"Relu", [=](Graph& g) { ops::Relu(g, x(g)); }},
      {"MatMul", [=](Graph& g) { ops::MatMul(g, x(g), x(g), {.transpose_b = true}); }},
      {"Conv2D",
       [](Graph& g) {
         ops::Conv2D(g, ops::Const(g, Tensor::filled<float>(Shape{1, 4, 4, 2}, 1.0f)),
                     ops::Const(g, Tensor::filled<float>(Shape{2, 2, 2, 3}, 0.5f)),
                     {.strides = {1, 2, 1, 1}, .padding = "SAME", .dilations = {1, 1, 2, 1}});
       }},
      {"Sum", [=](Graph& g) { ops::Sum(g, x(g), {1}, true); }},
      {"Mean", [=](Graph& g) { ops::Mean(g, x(g), {0}); }},
      {"Max",
       [=](Graph& g) {
         ops::Max(g, x(g), {0, 1});
       }},
      {"Variable",
       [=](Graph& g) {
         ops::Variable(g, Tensor{1.0f, 2.0f}, "v");
       }},
      {"ReadVariable",
       [=](Graph& g) { ops::ReadVariable(g, ops::Variable(g, Tensor(1.0f), "rv")); }},
      {"Assign",
       [=](Graph& g) {
         Output v = ops::Variable(g, Tensor(1.0f), "av");
         ops::Assign(g, v, ops::Const(g, Tensor(2.0f)), {.use_locking = false});
       }},
      {"AssignAdd",
       [=](Graph& g) {
         Output v = ops::Variable(g, Tensor(int64_t{1}), "aav");
         ops::AssignAdd(g, v, ops::Const(g, Tensor(int64_t{2})));
       }},
      {"AssignSub",
       [=](Graph& g) {
         Output v = ops::Variable(g, Tensor(1.0), "asv");
         ops::AssignSub(g, v, ops::Const(g, Tensor(2.0)));
       }},
      {"RandomUniform",
       [](Graph& g) {
         ops::RandomUniform(g, Shape{2, 3}, DType::kFloat64, {.seed = 7});
       }},
      {"RandomStandardNormal", [](Graph& g) { ops::RandomNormal(g, Shape{4}); }},
      {"IteratorGetNext",
       [](Graph& g) {
         ops::TensorRowsIterator(g, Tensor::matrix<int32_t>({{1, 2}, {3, 4}}));
         ops::RangeIterator(g, 0, 10, 3);
       }},
      {"IteratorReset", [](Graph& g) { ops::RangeIterator(g, 5, 0, -1); }},
  };
  return b;
}

// Call and StatelessCall hold a C++ callable and cannot be written.
bool is_callable_op(const std::string& op) { return op == "Call" || op == "StatelessCall"; }

TEST(GraphDefTest, BuiltinOpsRoundTrip) {
  Graph g;
  std::map<std::string, OpBuilder> all = builders();
  std::vector<std::string> missing;
  for (const std::string& op : OpRegistry::global().op_names()) {
    if (is_callable_op(op)) continue;
    auto it = all.find(op);
    if (it == all.end()) {
      missing.push_back(op);
      continue;
    }
    it->second(g);
  }
  EXPECT_TRUE(missing.empty()) << "ops without a round-trip builder: "
                               << ::testing::PrintToString(missing);
  ASSERT_THAT(g.status(), IsOk());
  // Every op of the registry (but the callables) has a node.
  std::set<std::string> present;
  for (int id = 0; id < g.num_nodes(); ++id) present.insert(g.node(id)->op());
  for (const std::string& op : OpRegistry::global().op_names()) {
    if (!is_callable_op(op)) {
      EXPECT_TRUE(present.contains(op)) << op;
    }
  }
  // A control edge to a later node, so the GraphDef is not in build order.
  Node* first = g.mutable_node(0);
  ASSERT_THAT(g.add_control_input(first, g.node(g.num_nodes() - 1)), IsOk());

  Result<v1::GraphDef> def = graph_to_graph_def(g);
  ASSERT_THAT(def, IsOk());
  Result<Graph> back = graph_from_graph_def(*def);
  ASSERT_THAT(back, IsOk());
  expect_same_graph(g, *back);

  // And through both file formats.
  for (GraphDefFormat f : {GraphDefFormat::kBinary, GraphDefFormat::kText}) {
    Result<std::string> bytes = serialize_graph_def(*def, f);
    ASSERT_THAT(bytes, IsOk());
    Result<v1::GraphDef> parsed = parse_graph_def(*bytes, GraphDefFormat::kAuto);
    ASSERT_THAT(parsed, IsOk());
    Result<Graph> again = graph_from_graph_def(*parsed);
    ASSERT_THAT(again, IsOk());
    expect_same_graph(g, *again);
  }
}

TEST(GraphDefTest, RoundTripGraphRunsTheSame) {
  Graph g;
  Output v = ops::Variable(g, Tensor{1.0f, 2.0f}, "v");
  Output y = ops::Add(g, ops::MatMul(g, ops::Reshape(g, v, {1, 2}), ops::Reshape(g, v, {2, 1})),
                      ops::Const(g, Tensor::matrix<float>({{10}})), "y");
  const Node* init = ops::GlobalVariablesInitializer(g);
  ASSERT_THAT(g.status(), IsOk());
  Result<v1::GraphDef> def = graph_to_graph_def(g);
  ASSERT_THAT(def, IsOk());
  Result<Graph> back = graph_from_graph_def(*def);
  ASSERT_THAT(back, IsOk());
  auto session = testing::make_session(*back);
  ASSERT_THAT(session->run({}, {}, {init->name()}), IsOk());
  EXPECT_THAT(session->run({}, {"y"}, {}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor::matrix<float>({{15}})))));
  (void)y;
}

// NodeDef.device carries a node's placement both ways; a device that is
// not one fails the import naming the node.
TEST(GraphDefTest, DevicesGoBothWays) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  {
    auto scope = g.device("/job:worker/task:1");
    ops::Neg(g, a, "b");
  }
  ASSERT_THAT(g.status(), IsOk());
  Result<v1::GraphDef> def = graph_to_graph_def(g);
  ASSERT_THAT(def, IsOk());
  ASSERT_EQ(def->node_size(), 2);
  EXPECT_EQ(def->node(0).device(), "");
  EXPECT_EQ(def->node(1).device(), "/job:worker/task:1");
  Result<Graph> back = graph_from_graph_def(*def);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->find_node("b")->device(), "/job:worker/task:1");
  EXPECT_EQ(back->find_node("a")->device(), "");
  def->mutable_node(1)->set_device("/job:worker/task:x");
  EXPECT_THAT(graph_from_graph_def(*def), StatusIs(StatusCode::kInvalidArgument, "node 'b'"));
}

TEST(GraphDefTest, CallableNodesCannotBeExported) {
  Graph g;
  Output x = ops::Const(g, Tensor(1.0f), "x");
  ops::Call(
      g, {x}, {DType::kFloat32},
      [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        return std::vector<Tensor>{in[0]};
      },
      {}, "my_fn");
  ASSERT_THAT(g.status(), IsOk());
  EXPECT_THAT(graph_to_graph_def(g),
              StatusIs(StatusCode::kInvalidArgument,
                       "node 'my_fn' (Call): runs a C++ callable, which cannot be written"));
}

Result<Graph> import_text(std::string_view text) {
  GRAPHRUN_ASSIGN_OR_RETURN(v1::GraphDef def, parse_graph_def(text, GraphDefFormat::kText));
  return graph_from_graph_def(def);
}

TEST(GraphDefTest, NodesMayComeInAnyOrder) {
  Result<Graph> g = import_text(R"pb(
    node { name: "init" op: "NoOp" input: "^v/Assign" }
    node {
      name: "c"
      op: "Mul"
      input: "v"
      input: "k:0"
      attr {
        key: "T"
        value { type: DT_FLOAT }
      }
    }
    node {
      name: "v/Assign"
      op: "Assign"
      input: "v"
      input: "k"
      attr {
        key: "T"
        value { type: DT_FLOAT }
      }
    }
    node {
      name: "k"
      op: "Const"
      attr {
        key: "dtype"
        value { type: DT_FLOAT }
      }
      attr {
        key: "value"
        value {
          tensor {
            dtype: DT_FLOAT
            tensor_shape {}
            float_val: 4
          }
        }
      }
    }
    node {
      name: "v"
      op: "VariableV2"
      attr {
        key: "dtype"
        value { type: DT_FLOAT }
      }
      attr {
        key: "shape"
        value { shape {} }
      }
    }
  )pb");
  ASSERT_THAT(g, IsOk());
  // Added in a topological order; ties in GraphDef order.
  std::vector<std::string> order;
  for (int id = 0; id < g->num_nodes(); ++id) order.push_back(g->node(id)->name());
  EXPECT_EQ(order, (std::vector<std::string>{"k", "v", "c", "v/Assign", "init"}));
  // The TF assign became graphrun's one-input form.
  const Node* assign = g->find_node("v/Assign");
  EXPECT_EQ(assign->num_inputs(), 1);
  EXPECT_EQ(assign->input(0).name(), "k:0");
  EXPECT_THAT(assign->attr<std::string>("var"), IsOkAndHolds(std::string("v")));
  EXPECT_EQ(g->find_node("v")->op(), "Variable");
  auto session = testing::make_session(*g);
  ASSERT_THAT(session->run({}, {}, {"init"}), IsOk());
  EXPECT_THAT(session->run({}, {"c"}, {}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor(16.0f)))));
}

TEST(GraphDefTest, TensorFlowFormsTranslate) {
  // AddV2 is graphrun's alias of Add; MatMul's grad_a/grad_b are dropped; "_" attrs are dropped;
  // the old ref "Variable" with empty container/shared_name is graphrun's
  // Variable; AssignAdd with a variable input becomes the one-input form.
  Result<Graph> g = import_text(R"pb(
    node {
      name: "a"
      op: "Const"
      attr {
        key: "dtype"
        value { type: DT_FLOAT }
      }
      attr {
        key: "value"
        value {
          tensor {
            dtype: DT_FLOAT
            tensor_shape {
              dim { size: 1 }
              dim { size: 1 }
            }
            float_val: 3
          }
        }
      }
      attr {
        key: "_output_shapes"
        value {
          list {
            shape {
              dim { size: 1 }
              dim { size: 1 }
            }
          }
        }
      }
    }
    node {
      name: "m"
      op: "MatMul"
      input: "a"
      input: "a"
      attr {
        key: "T"
        value { type: DT_FLOAT }
      }
      attr {
        key: "grad_a"
        value { b: false }
      }
      attr {
        key: "grad_b"
        value { b: false }
      }
      attr {
        key: "transpose_a"
        value { b: false }
      }
    }
    node {
      name: "s"
      op: "AddV2"
      input: "m"
      input: "a"
      attr {
        key: "T"
        value { type: DT_FLOAT }
      }
    }
    node {
      name: "w"
      op: "Variable"
      attr {
        key: "dtype"
        value { type: DT_FLOAT }
      }
      attr {
        key: "shape"
        value {
          shape {
            dim { size: 1 }
            dim { size: 1 }
          }
        }
      }
      attr {
        key: "container"
        value { s: "" }
      }
      attr {
        key: "shared_name"
        value { s: "" }
      }
    }
    node { name: "w/Assign" op: "Assign" input: "w" input: "a" }
    node {
      name: "w/inc"
      op: "AssignAdd"
      input: "w"
      input: "s"
      attr {
        key: "_class"
        value { list { s: "loc:@w" } }
      }
    }
    node { name: "w/read" op: "Identity" input: "w" }
  )pb");
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->find_node("s")->op(), "AddV2");
  EXPECT_FALSE(g->find_node("m")->attrs().contains("grad_a"));
  EXPECT_FALSE(g->find_node("a")->attrs().contains("_output_shapes"));
  EXPECT_EQ(g->find_node("w")->attrs().size(), 2u);  // dtype, shape
  EXPECT_THAT(g->find_node("w/inc")->attr<std::string>("var"), IsOkAndHolds(std::string("w")));
  auto session = testing::make_session(*g);
  ASSERT_THAT(session->run({}, {}, {"w/Assign"}), IsOk());
  ASSERT_THAT(session->run({}, {}, {"w/inc"}), IsOk());
  // w = 3 + (3*3 + 3) = 15
  EXPECT_THAT(session->run({}, {"w/read"}, {}),
              IsOkAndHolds(::testing::ElementsAre(TensorEq(Tensor::matrix<float>({{15}})))));
}

TEST(GraphDefTest, EmptyGraphDefIsAnEmptyGraph) {
  Result<Graph> g = graph_from_graph_def(v1::GraphDef());
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->num_nodes(), 0);
}

TEST(GraphDefTest, ParsesBinaryAndText) {
  Graph g;
  ops::Add(g, ops::Placeholder(g, DType::kInt32, Shape{2}, "x"),
           ops::Const(g, Tensor{int32_t{1}, int32_t{2}}, "k"), "y");
  Result<v1::GraphDef> def = graph_to_graph_def(g);
  ASSERT_THAT(def, IsOk());
  Result<std::string> binary = serialize_graph_def(*def, GraphDefFormat::kBinary);
  Result<std::string> text = serialize_graph_def(*def, GraphDefFormat::kText);
  ASSERT_THAT(binary, IsOk());
  ASSERT_THAT(text, IsOk());
  EXPECT_NE(text->find("name: \"y\""), std::string::npos);
  for (auto [bytes, format] :
       {std::pair{*binary, GraphDefFormat::kBinary}, std::pair{*binary, GraphDefFormat::kAuto},
        std::pair{*text, GraphDefFormat::kText}, std::pair{*text, GraphDefFormat::kAuto}}) {
    Result<v1::GraphDef> parsed = parse_graph_def(bytes, format);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*parsed, *def));
  }
  EXPECT_THAT(parse_graph_def("node { name: \"a\" op: }", GraphDefFormat::kText),
              StatusIs(StatusCode::kInvalidArgument, "not a text-format GraphDef: line 1, column"));
  EXPECT_THAT(parse_graph_def(std::string("\x0a\x05\x0a", 3), GraphDefFormat::kBinary),
              StatusIs(StatusCode::kInvalidArgument, "not a binary GraphDef"));
}

class GraphFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("graphrun_graphdef_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(GraphFileTest, SaveAndLoadByExtension) {
  Graph g;
  ops::Mul(g, ops::Placeholder(g, DType::kFloat32, Shape{2}, "x"),
           ops::Const(g, Tensor{2.0f, 3.0f}), "y");
  for (const char* name : {"g.pb", "g.pbtxt", "g.txt", "g.graph"}) {
    const std::filesystem::path path = dir_ / name;
    ASSERT_THAT(save_graph_file(g, path), IsOk()) << name;
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const bool text = bytes.find("node {") != std::string::npos;
    EXPECT_EQ(text, std::string_view(name) == "g.pbtxt" || std::string_view(name) == "g.txt")
        << name;
    Result<Graph> back = load_graph_file(path);
    ASSERT_THAT(back, IsOk()) << name;
    expect_same_graph(g, *back);
    EXPECT_THAT(testing::run_one(*back, "y", {{"x", Tensor{1.0f, 2.0f}}}),
                IsOkAndHolds(TensorEq(Tensor{2.0f, 6.0f})));
  }
  EXPECT_THAT(load_graph_file(dir_ / "missing.pb"),
              StatusIs(StatusCode::kNotFound, "missing.pb': cannot open"));
}

TEST_F(GraphFileTest, LoadRefusesWhatIsNotARegularFile) {
  // Once an uncaught std::ios_failure (a directory) or a read until
  // std::bad_alloc (/dev/zero).
  std::filesystem::create_directories(dir_ / "graph.pbtxt");
  EXPECT_THAT(
      load_graph_file(dir_ / "graph.pbtxt"),
      StatusIs(StatusCode::kInvalidArgument, "graph file '" + (dir_ / "graph.pbtxt").string() +
                                                 "': is a directory, not a regular file"));
  EXPECT_THAT(load_graph_file("/dev/zero"),
              StatusIs(StatusCode::kInvalidArgument,
                       "graph file '/dev/zero': is a character device, not a regular file"));
  // A file whose stat size is 0 but which has content (/proc) is read to
  // its end: its text is not a GraphDef (once read as an empty graph).
  EXPECT_THAT(load_graph_file("/proc/self/status"),
              StatusIs(StatusCode::kInvalidArgument,
                       "graph file '/proc/self/status': not a text-format GraphDef"));
  // Every file error names the file first.
  std::ofstream(dir_ / "bad.pbtxt") << "node {";
  EXPECT_THAT(
      load_graph_file(dir_ / "bad.pbtxt"),
      StatusIs(StatusCode::kInvalidArgument,
               "graph file '" + (dir_ / "bad.pbtxt").string() + "': not a text-format GraphDef"));
}

}  // namespace
}  // namespace graphrun
