#include <fmt/format.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::StatusIs;

TEST(TensorNameTest, Parses) {
  auto a = parse_tensor_name("a");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->node, "a");
  EXPECT_EQ(a->index, 0);
  auto b = parse_tensor_name("scope/mm:3");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->node, "scope/mm");
  EXPECT_EQ(b->index, 3);
  for (const char* bad : {"", ":0", "a:", "a:x", "a:-1", "a:1x"}) {
    EXPECT_EQ(parse_tensor_name(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(GraphTest, UniqueNamesTakeTheSmallestFreeSuffix) {
  Graph g;
  ops::NoOp(g, "n");
  ops::NoOp(g, "n_2");  // taken by hand: the suffixes skip it
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i) names.push_back(ops::NoOp(g, "n")->name());
  EXPECT_EQ(names, (std::vector<std::string>{"n_1", "n_3", "n_4", "n_5"}));
  ops::NoOp(g, "n_7");
  EXPECT_EQ(ops::NoOp(g, "n")->name(), "n_6");
  EXPECT_EQ(ops::NoOp(g, "n")->name(), "n_8");
  // A clone and a moved-to graph go on from there.
  Graph copy = g.clone();
  EXPECT_EQ(ops::NoOp(copy, "n")->name(), "n_9");
  Graph moved(std::move(g));
  EXPECT_EQ(ops::NoOp(moved, "n")->name(), "n_9");
  // Many unnamed nodes of one op: distinct names (and no quadratic search).
  Graph big;
  for (int i = 0; i < 20000; ++i) ops::NoOp(big);
  EXPECT_EQ(big.node(19999)->name(), "NoOp_19999");
  EXPECT_TRUE(big.status().is_ok());
}

// Names ending in a number are indexed by that number's runs of 8 (one
// cache line of the index per run): every such name is still found and
// made unique, whatever its digits (leading zeros, more than fit a number).
TEST(GraphTest, NamesEndingInNumbersAreFoundAndMadeUniqueWhateverTheirDigits) {
  Graph g;
  std::vector<std::string> asked;
  for (int i = 0; i < 3000; ++i) asked.push_back(fmt::format("n{}", i));
  for (int i = 0; i < 100; ++i) asked.push_back(fmt::format("n0{}", i));   // "n00", "n01", ...
  for (int i = 0; i < 50; ++i) asked.push_back(fmt::format("{}", 7 * i));  // all digits
  asked.push_back("n12345678901234567890123");
  asked.push_back("n1234567890123456789012");
  for (const std::string& name : asked) EXPECT_EQ(ops::NoOp(g, name)->name(), name);
  // Taken names get the smallest free suffix, which is itself a number.
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(ops::NoOp(g, fmt::format("n{}", i))->name(), fmt::format("n{}_1", i));
  EXPECT_EQ(ops::NoOp(g, "n12345678901234567890123")->name(), "n12345678901234567890123_1");
  EXPECT_EQ(ops::NoOp(g, "0")->name(), "0_1");
  for (int i = 0; i < 20; ++i) ops::NoOp(g, "n7_1");  // "n7_1_1", ...
  EXPECT_EQ(ops::NoOp(g, "n7_1")->name(), "n7_1_21");
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  // Every node is found under its own name, and only there.
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node* n = g.node(id);
    ASSERT_EQ(g.find_node(n->name()), n) << n->name();
  }
  EXPECT_EQ(g.find_node("n3000"), nullptr);
  EXPECT_EQ(g.find_node("n000"), nullptr);
  EXPECT_EQ(g.find_node("n12345678901234567890124"), nullptr);
}

TEST(GraphTest, UniqueNamesAndScopes) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f));
  Output b = ops::Const(g, Tensor(2.0f));
  Output c = ops::Const(g, Tensor(3.0f), "Const");
  EXPECT_EQ(a.node()->name(), "Const");
  EXPECT_EQ(b.node()->name(), "Const_1");
  EXPECT_EQ(c.node()->name(), "Const_2");
  {
    auto outer = g.name_scope("layer1");
    Output d = ops::Add(g, a, b);
    EXPECT_EQ(d.node()->name(), "layer1/Add");
    auto inner = g.name_scope("inner");
    EXPECT_EQ(ops::Add(g, a, b).node()->name(), "layer1/inner/Add");
  }
  EXPECT_EQ(ops::Add(g, a, b).node()->name(), "Add");
  EXPECT_EQ(a.name(), "Const:0");
  EXPECT_TRUE(g.status().is_ok());
}

// TensorFlow's rule for node names, [A-Za-z0-9.][A-Za-z0-9_./>-]*: a name
// with ':' could not be fetched (it reads as an output index), one with a
// space could not be written to a graph file and read back.
TEST(GraphTest, NodeNamesFollowTensorFlowsRule) {
  for (const char* good : {"x", ".x", "0a", "a/b", "a-b", "a>b", "a.b_c", "A9"}) {
    EXPECT_TRUE(is_valid_node_name(good)) << good;
    Graph g;
    Output c = ops::Const(g, Tensor(1.0f), good);
    ASSERT_TRUE(c.is_valid()) << good << ": " << g.status().to_string();
    EXPECT_EQ(c.node()->name(), good);
    EXPECT_TRUE(g.status().is_ok());
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"a b", "' ' at 1"},       {"a:b", "':' at 1"},
      {"_x", "'_' at 0"},        {"-x", "'-' at 0"},
      {"/x", "'/' at 0"},        {">x", "'>' at 0"},
      {"x\n", "byte 0x0a at 1"}, {"caf\xc3\xa9", "byte 0xc3 at 3"},
      {"a^b", "'^' at 1"}};
  for (const auto& [name, why] : bad) {
    EXPECT_FALSE(is_valid_node_name(name)) << name;
    Graph g;
    Output c = ops::Const(g, Tensor(1.0f), name);
    EXPECT_FALSE(c.is_valid()) << name;
    EXPECT_THAT(g.status(),
                StatusIs(StatusCode::kInvalidArgument,
                         fmt::format("node '{}' (Const): not a valid node name ({};", name, why)))
        << name;
    // The graph keeps the error: no session is made of it.
    EXPECT_THAT(Session::create(g).status(), StatusIs(StatusCode::kInvalidArgument, why)) << name;
  }
  EXPECT_FALSE(is_valid_node_name(""));
}

// As TensorFlow's name_scope: at the top a scope starts as a name does;
// inside another, any name characters go (the full name still starts
// with the outer scope's first character).
TEST(GraphTest, NameScopesFollowTensorFlowsRule) {
  {
    Graph g;
    auto outer = g.name_scope("outer");
    auto inner = g.name_scope("_inner");
    Output c = ops::Const(g, Tensor(1.0f), "_c");
    EXPECT_EQ(c.node()->name(), "outer/_inner/_c");
    EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
  }
  {
    // An empty scope at the top is no scope, as TensorFlow's root.
    Graph g;
    auto none = g.name_scope("");
    EXPECT_EQ(ops::Const(g, Tensor(1.0f), "c").node()->name(), "c");
    EXPECT_TRUE(g.status().is_ok()) << g.status().to_string();
  }
  {
    Graph g;
    { auto top = g.name_scope("_top"); }
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument,
                                     "name_scope('_top'): not a valid scope ('_' at 0;"));
  }
  {
    Graph g;
    auto outer = g.name_scope("outer");
    { auto empty = g.name_scope(""); }
    EXPECT_THAT(g.status(),
                StatusIs(StatusCode::kInvalidArgument,
                         "name_scope('') inside 'outer': not a valid scope (it is empty;"));
  }
  {
    Graph g;
    auto outer = g.name_scope("outer");
    { auto spaced = g.name_scope("in ner"); }
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "(' ' at 2;"));
  }
  {
    // A node's own name under a scope may start with '_', not hold ':'.
    Graph g;
    auto outer = g.name_scope("s");
    EXPECT_FALSE(ops::Const(g, Tensor(1.0f), "x:0").is_valid());
    EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument,
                                     "node 's/x:0' (Const): not a valid node name (':' at 3;"));
  }
}

// As TensorFlow's NodeDef check: an attribute the op does not declare is
// refused (a typo would silently do nothing); '_' annotations go through.
TEST(GraphTest, UndeclaredAttributesAreRefusedAnnotationsKept) {
  {
    Graph g;
    Output a = ops::Const(g, Tensor::filled<float>(Shape{2, 2}, 1.0f), "a");
    Result<Node*> mm = g.add_node(
        NodeSpec{.op = "MatMul", .name = "mm", .inputs = {a, a}, .attrs = {{"transpose_B", true}}});
    EXPECT_THAT(mm.status(),
                StatusIs(StatusCode::kInvalidArgument,
                         "node 'mm' (MatMul): MatMul declares no attribute 'transpose_B' (its "
                         "attributes: T, transpose_a, transpose_b)"));
    EXPECT_THAT(Session::create(g).status(), StatusIs(StatusCode::kInvalidArgument, "transpose_B"));
  }
  {
    Graph g;
    Output a = ops::Const(g, Tensor::filled<float>(Shape{2, 2}, 1.0f), "a");
    Result<Node*> mm =
        g.add_node(NodeSpec{.op = "MatMul",
                            .name = "mm",
                            .inputs = {a, a},
                            .attrs = {{"_class", std::string("loc:@a")}, {"transpose_b", true}}});
    ASSERT_TRUE(mm.is_ok()) << mm.status().to_string();
    const AttrValue* note = (*mm)->find_attr("_class");
    ASSERT_NE(note, nullptr);
    EXPECT_EQ(std::get<std::string>(*note), "loc:@a");
    auto session = Session::create(g).value();
    auto out = session->run({}, {(*mm)->output(0)});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ((*out)[0].flat<float>()[0], 2.0f);
  }
}

TEST(GraphTest, FindOutput) {
  Graph g;
  Output a = ops::Const(g, Tensor(1.0f), "a");
  const Node* n = ops::NoOp(g, "n");
  ASSERT_TRUE(g.find_output("a").is_ok());
  EXPECT_EQ(*g.find_output("a:0"), a);
  EXPECT_THAT(g.find_output("zz:0"), StatusIs(StatusCode::kNotFound, "zz"));
  EXPECT_THAT(g.find_output("a:2"), StatusIs(StatusCode::kInvalidArgument, "out of range"));
  EXPECT_THAT(g.find_output("n:0"), StatusIs(StatusCode::kInvalidArgument, "has no outputs"));
  EXPECT_EQ(g.find_node("n"), n);
}

TEST(GraphTest, BuildErrorsNameTheNodeAndStick) {
  Graph g;
  Output f = ops::Const(g, Tensor(1.0f), "f");
  Output i = ops::Const(g, Tensor(1), "i");
  Output bad = ops::Add(g, f, i, "mixed");
  EXPECT_FALSE(bad.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "mixed"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "int32"));
  // A builder given an invalid Output does nothing and keeps the first error.
  Output later = ops::Neg(g, bad);
  EXPECT_FALSE(later.is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "mixed"));
  // A session refuses the graph.
  EXPECT_THAT(Session::create(g), StatusIs(StatusCode::kInvalidArgument, "mixed"));
}

TEST(GraphTest, ShapeMismatchKnownAtBuildTimeNamesShapes) {
  Graph g;
  Output a = ops::Const(g, Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}}), "a");
  Output b = ops::Const(g, Tensor::matrix<float>({{1, 2}, {3, 4}}), "b");
  EXPECT_FALSE(ops::MatMul(g, a, b, {}, "mm").is_valid());
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "mm"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[2,3]"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "[2,2]"));
}

TEST(GraphTest, UnknownOpAndInputFromAnotherGraph) {
  Graph g;
  EXPECT_THAT(g.add_node(NodeSpec{"NoSuchOp", "x", {}, {}, {}, nullptr}),
              StatusIs(StatusCode::kNotFound, "op 'NoSuchOp' is not registered"));
  Graph g2;
  Output other = ops::Const(g2, Tensor(1.0f));
  Graph g3;
  EXPECT_FALSE(ops::Neg(g3, other).is_valid());
  EXPECT_THAT(g3.status(), StatusIs(StatusCode::kInvalidArgument, "another graph"));
}

TEST(GraphTest, ControlDependenciesScope) {
  Graph g;
  const Node* first = ops::NoOp(g, "first");
  Output x;
  {
    auto deps = g.control_dependencies({first});
    x = ops::Const(g, Tensor(1.0f), "x");
  }
  Output y = ops::Const(g, Tensor(1.0f), "y");
  ASSERT_EQ(x.node()->control_inputs().size(), 1u);
  EXPECT_EQ(x.node()->control_inputs()[0], first);
  EXPECT_TRUE(y.node()->control_inputs().empty());
}

// control_dependencies() checks its nodes as add_node checks control
// inputs: a null one or one of another graph is left out and recorded in
// the graph's status (it once entered the scope, and the session's copy of
// the graph then read past its nodes or bound another node).
TEST(GraphTest, ControlDependenciesOnANullOrForeignNodeAreBuildErrors) {
  Graph other;
  const Node* foreign = ops::NoOp(other, "foreign");
  for (const Node* bad : {foreign, static_cast<const Node*>(nullptr)}) {
    Graph g;
    const Node* first = ops::NoOp(g, "first");
    Output x;
    {
      auto deps = g.control_dependencies({first, bad});
      x = ops::Const(g, Tensor(1.0f), "x");
    }
    EXPECT_THAT(g.status(),
                StatusIs(StatusCode::kInvalidArgument,
                         bad == nullptr ? "control_dependencies: dependency #2 is null"
                                        : "dependency #2 is node 'foreign' of another graph"));
    ASSERT_TRUE(x.is_valid());
    ASSERT_EQ(x.node()->control_inputs().size(), 1u);
    EXPECT_EQ(x.node()->control_inputs()[0], first);
    EXPECT_THAT(Session::create(g).status(), StatusIs(StatusCode::kInvalidArgument, "dependency"));
  }
}

TEST(GraphTest, CloneIsIndependentAndKeepsNames) {
  Graph g;
  Output a = ops::Const(g, Tensor(2.0f), "a");
  Output b = ops::Square(g, a, "b");
  Graph copy = g.clone();
  ops::Neg(g, b, "only_in_original");
  EXPECT_EQ(copy.num_nodes(), 2);
  const Node* cb = copy.find_node("b");
  ASSERT_NE(cb, nullptr);
  EXPECT_EQ(cb->input(0).node(), copy.find_node("a"));
  EXPECT_EQ(&cb->graph(), &copy);
  // A moved graph's nodes point at their new owner.
  Graph moved = std::move(copy);
  EXPECT_EQ(&moved.find_node("b")->graph(), &moved);
}

// Inputs and control inputs share one allocation that grows as control
// inputs are added: the data inputs stay, the controls keep their order,
// duplicates are dropped, and clones point into themselves.
TEST(GraphTest, ControlInputsAddedLaterKeepInputsAndOrder) {
  Graph g;
  Output a = ops::Const(g, Tensor(2.0f), "a");
  Output b = ops::Const(g, Tensor(3.0f), "b");
  Output sum = ops::Add(g, a, b, "sum");
  std::vector<const Node*> deps;
  for (int i = 0; i < 9; ++i) deps.push_back(ops::NoOp(g, fmt::format("dep{}", i)));
  Node* s = g.mutable_node(sum.node()->id());
  for (const Node* d : deps) {
    ASSERT_TRUE(g.add_control_input(s, d).is_ok());
    ASSERT_TRUE(g.add_control_input(s, deps.front()).is_ok());  // a duplicate
    ASSERT_EQ(s->num_inputs(), 2);
    EXPECT_EQ(s->input(0), a);
    EXPECT_EQ(s->input(1), b);
  }
  ASSERT_EQ(s->control_inputs().size(), deps.size());
  for (std::size_t i = 0; i < deps.size(); ++i) EXPECT_EQ(s->control_inputs()[i], deps[i]);
  Node* lone = g.mutable_node(ops::NoOp(g, "lone")->id());
  ASSERT_TRUE(g.add_control_input(lone, deps[0]).is_ok());
  Graph copy = g.clone();
  EXPECT_EQ(copy.find_node("lone")->control_inputs()[0], copy.find_node("dep0"));
  const Node* cs = copy.find_node("sum");
  ASSERT_EQ(cs->control_inputs().size(), deps.size());
  for (std::size_t i = 0; i < deps.size(); ++i) {
    EXPECT_EQ(cs->control_inputs()[i], copy.find_node(deps[i]->name()));
  }
  EXPECT_EQ(cs->input(1).node(), copy.find_node("b"));
  // A node without data inputs holds a lone control input in place, then
  // moves them to an allocation as more come.
  for (std::size_t k = 1; k < 3; ++k) {
    ASSERT_TRUE(g.add_control_input(lone, deps[k]).is_ok());
    ASSERT_EQ(lone->control_inputs().size(), k + 1);
    for (std::size_t i = 0; i <= k; ++i) EXPECT_EQ(lone->control_inputs()[i], deps[i]);
  }
  // The copy's own additions do not reach the original.
  ASSERT_TRUE(copy.add_control_input(copy.mutable_node(cs->id()), copy.find_node("a")).is_ok());
  EXPECT_EQ(cs->control_inputs().size(), deps.size() + 1);
  EXPECT_EQ(s->control_inputs().size(), deps.size());
  EXPECT_EQ(copy.find_node("lone")->control_inputs().size(), 1u);
}

// Node pointers stay valid while thousands more nodes are added, and clones
// and extends of a big graph keep every edge.
TEST(GraphTest, NodePointersStayValidAsTheGraphGrows) {
  Graph g;
  Output x = ops::Const(g, Tensor(1.0f), "x");
  const Node* first = x.node();
  Output last = x;
  for (int i = 0; i < 3000; ++i) last = ops::Neg(g, last);
  EXPECT_EQ(g.node(0), first);
  EXPECT_EQ(first->name(), "x");
  Graph copy = g.clone();
  for (int i = 0; i < 2000; ++i) last = ops::Neg(g, last);
  ASSERT_TRUE(copy.append_nodes_from(g).is_ok());
  ASSERT_EQ(copy.num_nodes(), g.num_nodes());
  for (int id = 1; id < copy.num_nodes(); ++id) {
    ASSERT_EQ(copy.node(id)->input(0).node(), copy.node(id - 1)) << id;
    ASSERT_EQ(g.node(id)->input(0).node(), g.node(id - 1)) << id;
  }
  EXPECT_EQ(g.node(0), first);
}

// Past the biggest chunk (65,536 nodes, 6.5 MiB: allocated on huge pages
// where Linux has them), nodes keep their addresses and a clone (one chunk
// for them all) holds each with its edges.
TEST(GraphTest, AGraphPastTheBiggestChunkKeepsItsNodesAndClonesWhole) {
  constexpr int kNodes = 2 * 65536 + 100;
  Graph g;
  std::vector<const Node*> made;
  made.reserve(kNodes);
  for (int i = 0; i < kNodes; ++i) {
    ops::NoOp(g, fmt::format("n{}", i));
    Node* node = g.mutable_node(g.num_nodes() - 1);
    if (i > 0) {
      ASSERT_TRUE(g.add_control_input(node, made.back()).is_ok());
    }
    made.push_back(node);
  }
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  Graph copy = g.clone();
  ASSERT_EQ(copy.num_nodes(), kNodes);
  for (int id = 0; id < kNodes; ++id) {
    ASSERT_EQ(g.node(id), made[static_cast<std::size_t>(id)]) << id;
    const Node* c = copy.node(id);
    ASSERT_NE(c, made[static_cast<std::size_t>(id)]) << id;
    ASSERT_EQ(c->name(), fmt::format("n{}", id));
    if (id > 0) {
      ASSERT_EQ(c->control_inputs().size(), 1u) << id;
      ASSERT_EQ(c->control_inputs()[0], copy.node(id - 1)) << id;
    }
  }
  for (const int id : {0, 65535, 65536, 131071, 131072, kNodes - 1}) {
    EXPECT_EQ(copy.find_node(fmt::format("n{}", id)), copy.node(id)) << id;
    EXPECT_EQ(g.find_node(fmt::format("n{}", id)), made[static_cast<std::size_t>(id)]) << id;
  }
}

// Nodes with equal attributes and output signatures keep one copy of them
// (memory per node); a node's values are its own whatever it shares.
TEST(GraphTest, NodesShareEqualAttributesAndKeepTheirOwnValues) {
  OpRegistry r;
  auto factory = [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return unimplemented("not needed");
  };
  ASSERT_TRUE(r.add(OpDef("Src")
                        .output("y", "dtype")
                        .type_attr("dtype", all_dtypes())
                        .attr("factor", 1.0)
                        .attr("label", std::string("x"))
                        .attr("value", Tensor()),
                    factory)
                  .is_ok());
  Graph g(r);
  auto add = [&](std::string name, AttrMap attrs) {
    Result<Node*> n = g.add_node(NodeSpec{"Src", std::move(name), {}, {}, std::move(attrs), {}});
    EXPECT_TRUE(n.is_ok()) << n.status().to_string();
    return n.is_ok() ? *n : nullptr;
  };
  const Node* a = add("a", {{"dtype", DType::kFloat32}});
  const Node* b = add("b", {{"dtype", DType::kFloat32}, {"factor", 1.0}});
  const Node* c = add("c", {{"dtype", DType::kFloat64}});
  const Node* d = add("d", {{"dtype", DType::kFloat32}, {"label", std::string("y")}});
  const Node* zero = add("zero", {{"dtype", DType::kFloat32}, {"factor", 0.0}});
  const Node* negzero = add("negzero", {{"dtype", DType::kFloat32}, {"factor", -0.0}});
  const Node* t1 = add("t1", {{"dtype", DType::kFloat32}, {"value", Tensor(1.0f)}});
  const Node* t2 = add("t2", {{"dtype", DType::kFloat32}, {"value", Tensor(1.0f)}});
  ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
  // Equal (the default filled in): one copy.
  EXPECT_EQ(&a->attrs(), &b->attrs());
  // Another dtype (also another output signature) or label: their own.
  EXPECT_NE(&a->attrs(), &c->attrs());
  EXPECT_EQ(c->output_dtype(0), DType::kFloat64);
  EXPECT_EQ(a->output_dtype(0), DType::kFloat32);
  EXPECT_NE(&a->attrs(), &d->attrs());
  EXPECT_EQ(std::get<std::string>(*d->find_attr("label")), "y");
  EXPECT_EQ(std::get<std::string>(*a->find_attr("label")), "x");
  // -0.0 == 0.0 but is another value: never shared with 0.0.
  EXPECT_NE(&zero->attrs(), &negzero->attrs());
  EXPECT_TRUE(std::signbit(std::get<double>(*negzero->find_attr("factor"))));
  EXPECT_FALSE(std::signbit(std::get<double>(*zero->find_attr("factor"))));
  // Tensors are not compared: each node keeps its own.
  EXPECT_NE(&t1->attrs(), &t2->attrs());
  // A clone shares them too, and adds to them after the original's.
  Graph copy = g.clone();
  EXPECT_EQ(&copy.find_node("a")->attrs(), &a->attrs());
  auto e = copy.add_node(NodeSpec{"Src", "e", {}, {}, {{"dtype", DType::kFloat64}}, {}});
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(&(*e)->attrs(), &c->attrs());
}

// The signature cache keys attribute names by their length and their first
// and last 8 bytes; names alike in those (the same key) still give each
// node the attributes it was given.
TEST(GraphTest, AttributeNamesAlikeAtBothEndsKeepTheirOwnValues) {
  OpRegistry r;
  auto factory = [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return unimplemented("not needed");
  };
  const std::string first = "scale_of_the_left_branch_factor";
  const std::string second = "scale_of_the_rght_branch_factor";
  ASSERT_EQ(first.size(), second.size());
  ASSERT_TRUE(
      r.add(OpDef("Twin").output("y", DType::kFloat32).attr(first, 1.0).attr(second, 1.0), factory)
          .is_ok());
  Graph g(r);
  std::vector<const Node*> nodes;
  for (int i = 0; i < 6; ++i) {
    // Alternately the first and the second name set to i.
    AttrMap attrs{{i % 2 == 0 ? first : second, static_cast<double>(i)}};
    Result<Node*> n = g.add_node(NodeSpec{"Twin", fmt::format("t{}", i), {}, {}, attrs, {}});
    ASSERT_TRUE(n.is_ok()) << n.status().to_string();
    nodes.push_back(*n);
  }
  for (int i = 0; i < 6; ++i) {
    const Node* n = nodes[static_cast<std::size_t>(i)];
    const double set = static_cast<double>(i);
    EXPECT_EQ(std::get<double>(*n->find_attr(first)), i % 2 == 0 ? set : 1.0) << i;
    EXPECT_EQ(std::get<double>(*n->find_attr(second)), i % 2 == 0 ? 1.0 : set) << i;
  }
  // The same name and value again: the attributes of the first such node.
  Result<Node*> again = g.add_node(NodeSpec{"Twin", "again", {}, {}, {{second, 3.0}}, {}});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(&(*again)->attrs(), &nodes[3]->attrs());
}

TEST(GraphTest, ANodeLikeARecentOneReusesItsCheckedSignatureAndStillSeesItsOwnInputs) {
  OpRegistry r;
  auto factory = [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return unimplemented("not needed");
  };
  int shape_calls = 0;
  // y has x's shape with `extra` appended; x must be a float.
  ASSERT_TRUE(r.add(OpDef("Grow")
                        .input("x", DType::kFloat32)
                        .output("y", DType::kFloat32)
                        .attr("extra", int64_t{1})
                        .shape_fn([&shape_calls](InferenceContext& c) {
                          ++shape_calls;
                          GRAPHRUN_ASSIGN_OR_RETURN(int64_t extra, c.attr<int64_t>("extra"));
                          const auto in = c.input_shape(0).dims();
                          std::vector<int64_t> dims(in.begin(), in.end());
                          dims.push_back(extra);
                          c.set_output(0, Shape(dims));
                          return Status::ok();
                        }),
                    factory)
                  .is_ok());
  ASSERT_TRUE(r.add(OpDef("Src")
                        .output("y", "dtype")
                        .type_attr("dtype", all_dtypes())
                        .attr("shape", Shape::unknown())
                        .shape_fn([](InferenceContext& c) {
                          GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, c.attr<Shape>("shape"));
                          c.set_output(0, shape);
                          return Status::ok();
                        }),
                    factory)
                  .is_ok());
  Graph g(r);
  auto add = [&](const std::string& op, std::vector<Output> inputs, AttrMap attrs) -> Node* {
    Result<Node*> n = g.add_node(NodeSpec{op, op, std::move(inputs), {}, std::move(attrs), {}});
    return n.is_ok() ? *n : nullptr;
  };
  auto src = [&](DType dtype, Shape shape) {
    return Output(add("Src", {}, {{"dtype", dtype}, {"shape", shape}}), 0);
  };
  const Output a = src(DType::kFloat32, Shape({2}));
  const Output b = src(DType::kFloat32, Shape({3}));
  // The same attributes over inputs of other shapes, alternating: each node
  // gets its own inputs' shape.
  for (int i = 0; i < 3; ++i) {
    const Node* ga = add("Grow", {a}, {{"extra", int64_t{5}}});
    const Node* gb = add("Grow", {b}, {{"extra", int64_t{5}}});
    ASSERT_NE(ga, nullptr);
    ASSERT_NE(gb, nullptr);
    EXPECT_EQ(ga->output_shape(0), Shape({2, 5}));
    EXPECT_EQ(gb->output_shape(0), Shape({3, 5}));
    EXPECT_EQ(&ga->attrs(), &add("Grow", {a}, {{"extra", int64_t{5}}})->attrs());
  }
  // Equal nodes one after another run the shape function once.
  const int calls_before = shape_calls;
  for (int i = 0; i < 5; ++i) {
    const Node* n = add("Grow", {b}, {{"extra", int64_t{7}}});
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->output_shape(0), Shape({3, 7}));
  }
  EXPECT_EQ(shape_calls - calls_before, 1);
  // An attribute as given but equal to its default after filling: another
  // signature, the same shared attributes.
  const Node* by_default = add("Grow", {a}, {});
  ASSERT_NE(by_default, nullptr);
  EXPECT_EQ(by_default->output_shape(0), Shape({2, 1}));
  EXPECT_EQ(&by_default->attrs(), &add("Grow", {a}, {{"extra", int64_t{1}}})->attrs());
  // A failing node with the signature of a good one but another input
  // dtype is refused every time, naming itself, and good ones still pass.
  const Output ints = src(DType::kInt32, Shape({2}));
  for (int i = 0; i < 2; ++i) {
    Result<Node*> bad =
        g.add_node(NodeSpec{"Grow", "bad", {ints}, {}, {{"extra", int64_t{5}}}, {}});
    EXPECT_THAT(bad.status(), StatusIs(StatusCode::kInvalidArgument, "'bad'"));
  }
  // More signatures than the cache keeps, then the first ones again: every
  // node has its own attribute and shape.
  std::vector<const Node*> many;
  for (int64_t e = 0; e < 300; ++e) many.push_back(add("Grow", {a}, {{"extra", e % 150}}));
  for (int64_t e = 0; e < 300; ++e) {
    ASSERT_NE(many[static_cast<std::size_t>(e)], nullptr);
    EXPECT_EQ(many[static_cast<std::size_t>(e)]->output_shape(0), Shape({2, e % 150}));
    EXPECT_EQ(std::get<int64_t>(*many[static_cast<std::size_t>(e)]->find_attr("extra")), e % 150);
  }
  // An op the registry lacks is refused after a run of known ones; one
  // registered since is found.
  Result<Node*> missing = g.add_node(NodeSpec{"Later", "later", {}, {}, {}, {}});
  EXPECT_THAT(missing.status(), StatusIs(StatusCode::kNotFound, "'Later'"));
  ASSERT_TRUE(r.add(OpDef("Later"), factory).is_ok());
  EXPECT_TRUE(g.add_node(NodeSpec{"Later", "later", {}, {}, {}, {}}).is_ok());
  EXPECT_TRUE(g.add_node(NodeSpec{"Grow", "grow", {a}, {}, {}, {}}).is_ok());
  // A moved graph keeps adding nodes of a known signature correctly.
  Graph moved = std::move(g);
  Result<Node*> after =
      moved.add_node(NodeSpec{"Grow", "after", {a}, {}, {{"extra", int64_t{5}}}, {}});
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ((*after)->output_shape(0), Shape({2, 5}));
  EXPECT_EQ(&(*after)->graph(), &moved);
}

TEST(GraphTest, NodesFedByConstsInferShapesFromEachConstsValue) {
  Graph g;
  const Output x = ops::Placeholder(g, DType::kFloat32, Shape({6}));
  for (int i = 0; i < 2; ++i) {
    const Output r23 = ops::Reshape(g, x, ops::Const(g, Tensor::vector<int32_t>({2, 3})));
    const Output r32 = ops::Reshape(g, x, ops::Const(g, Tensor::vector<int32_t>({3, 2})));
    ASSERT_TRUE(g.status().is_ok()) << g.status().to_string();
    EXPECT_EQ(r23.shape(), Shape({2, 3}));
    EXPECT_EQ(r32.shape(), Shape({3, 2}));
  }
}

// add_node(spec, attrs): the map is read, never changed (defaults go into
// the node), and a map changed in place between nodes is seen anew.
TEST(GraphTest, AttributesGivenApartAreOnlyReadAndMayNotAlsoBeInTheSpec) {
  Graph g;
  AttrMap attrs{{"dtype", DType::kFloat32}};
  Result<Node*> a = g.add_node(NodeSpec{.op = "Placeholder", .name = "a"}, attrs);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(attrs.size(), 1u);
  ASSERT_NE((*a)->find_attr("shape"), nullptr);  // the default, in the node
  EXPECT_TRUE((*a)->output_shape(0).is_unknown_rank());
  attrs["shape"] = Shape({3});
  Result<Node*> b = g.add_node(NodeSpec{.op = "Placeholder", .name = "b"}, attrs);
  attrs["dtype"] = DType::kInt32;
  Result<Node*> c = g.add_node(NodeSpec{.op = "Placeholder", .name = "c"}, attrs);
  ASSERT_TRUE(b.is_ok() && c.is_ok());
  EXPECT_EQ((*b)->output_shape(0), Shape({3}));
  EXPECT_EQ((*b)->output_dtype(0), DType::kFloat32);
  EXPECT_EQ((*c)->output_dtype(0), DType::kInt32);
  // The same map again: the same checked signature as b's.
  attrs["dtype"] = DType::kFloat32;
  Result<Node*> d = g.add_node(NodeSpec{.op = "Placeholder", .name = "d"}, attrs);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(&(*d)->attrs(), &(*b)->attrs());
  // Attributes in both places are refused, naming the node, and recorded.
  Result<Node*> both =
      g.add_node(NodeSpec{.op = "Placeholder", .name = "both", .attrs = attrs}, attrs);
  EXPECT_THAT(both.status(), StatusIs(StatusCode::kInvalidArgument, "'both'"));
  EXPECT_THAT(g.status(), StatusIs(StatusCode::kInvalidArgument, "given both"));
  EXPECT_EQ(g.num_nodes(), 4);
}

TEST(OpRegistryTest, CustomOpsAreCheckedAndRegisteredOnce) {
  OpRegistry r;
  auto factory = [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return unimplemented("not needed");
  };
  EXPECT_TRUE(
      r.add(OpDef("Mine").input("x", "T").output("y", "T").type_attr("T", float_dtypes()), factory)
          .is_ok());
  EXPECT_THAT(r.add(OpDef("Mine"), factory), StatusIs(StatusCode::kAlreadyExists, "Mine"));
  EXPECT_THAT(r.add(OpDef("Broken").input("x", "U"), factory),
              StatusIs(StatusCode::kInvalidArgument, "undeclared type attribute 'U'"));
  EXPECT_NE(r.find("Mine"), nullptr);
  EXPECT_EQ(r.find("Other"), nullptr);
}

TEST(OpRegistryTest, TypeAttrsAreInferredAndRestricted) {
  OpRegistry r;
  auto factory = [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
    return unimplemented("not needed");
  };
  ASSERT_TRUE(
      r.add(OpDef("Src").output("y", "dtype").type_attr("dtype", all_dtypes()), factory).is_ok());
  ASSERT_TRUE(r.add(OpDef("FloatOnly")
                        .input("x", "T")
                        .output("y", "T")
                        .type_attr("T", float_dtypes())
                        .shape_fn(shape_fns::unchanged),
                    factory)
                  .is_ok());
  Graph g(r);
  auto f = g.add_node(NodeSpec{"Src", "f", {}, {}, {{"dtype", DType::kFloat64}}, nullptr});
  ASSERT_TRUE(f.is_ok());
  auto ok = g.add_node(NodeSpec{"FloatOnly", "ok", {(*f)->output(0)}, {}, {}, nullptr});
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ((*ok)->output_dtype(0), DType::kFloat64);
  EXPECT_EQ(std::get<DType>(*(*ok)->find_attr("T")), DType::kFloat64);
  auto i = g.add_node(NodeSpec{"Src", "i", {}, {}, {{"dtype", DType::kInt32}}, nullptr});
  ASSERT_TRUE(i.is_ok());
  EXPECT_THAT(g.add_node(NodeSpec{"FloatOnly", "bad", {(*i)->output(0)}, {}, {}, nullptr}),
              StatusIs(StatusCode::kInvalidArgument, "T is int32, which is not one of"));
  EXPECT_THAT(g.add_node(NodeSpec{"Src", "noattr", {}, {}, {}, nullptr}),
              StatusIs(StatusCode::kInvalidArgument, "type attribute 'dtype' is not set"));
}

}  // namespace
}  // namespace graphrun
