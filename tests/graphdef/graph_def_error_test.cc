// GraphDef import errors: each is an InvalidArgument (Unimplemented for a
// TensorFlow feature graphrun lacks) whose message starts with the node,
// never a crash.
#include <google/protobuf/util/message_differencer.h>
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/graphdef/nested_graph_def.h"
#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using testing::IsOk;
using testing::StatusIs;

Result<Graph> import_text(std::string_view text) {
  GRAPHRUN_ASSIGN_OR_RETURN(v1::GraphDef def, parse_graph_def(text, GraphDefFormat::kText));
  return graph_from_graph_def(def);
}

// A float scalar Const named `name`, in text format.
std::string scalar_const(std::string_view name) {
  return "node { name: \"" + std::string(name) +
         "\" op: \"Const\" attr { key: \"dtype\" value { type: DT_FLOAT } } "
         "attr { key: \"value\" value { tensor { dtype: DT_FLOAT tensor_shape {} float_val: 1 "
         "} } } }\n";
}

// c = a * b (float), in text format.
std::string mul(std::string_view name, std::string_view a, std::string_view b) {
  return "node { name: \"" + std::string(name) + "\" op: \"Mul\" input: \"" + std::string(a) +
         "\" input: \"" + std::string(b) + "\" attr { key: \"T\" value { type: DT_FLOAT } } }\n";
}

// Messages start with the node; the rest is checked as a substring.
void expect_error(std::string_view text, StatusCode code, std::string_view starts_with,
                  std::string_view contains) {
  Result<Graph> g = import_text(text);
  ASSERT_FALSE(g.is_ok()) << text;
  EXPECT_EQ(g.status().code(), code) << g.status().to_string();
  EXPECT_TRUE(g.status().message().starts_with(starts_with)) << g.status().to_string();
  EXPECT_NE(g.status().message().find(contains), std::string::npos) << g.status().to_string();
}

TEST(GraphDefErrorTest, ValidGraphImports) {
  EXPECT_THAT(import_text(scalar_const("a") + scalar_const("b") + mul("c", "a", "b")), IsOk());
}

TEST(GraphDefErrorTest, UnknownOp) {
  expect_error(scalar_const("a") + R"pb(node { name: "s" op: "SaveV2" input: "a" })pb",
               StatusCode::kInvalidArgument, "node 's' (SaveV2): ", "op 'SaveV2' is not supported");
}

TEST(GraphDefErrorTest, DanglingInput) {
  expect_error(scalar_const("a") + mul("c", "a", "nowhere"), StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "input 1 'nowhere' names no node of the graph");
  expect_error(scalar_const("a") + mul("c", "a", "^gone"), StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "input 1 '^gone' names no node");
}

TEST(GraphDefErrorTest, BadInputNames) {
  expect_error(scalar_const("a") + mul("c", "a", "a:x"), StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "input 'a:x' has a bad output index");
  expect_error(scalar_const("a") + mul("c", "a", "a:-1"), StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "bad output index");
  expect_error(scalar_const("a") + mul("c", "a", "a:99999999999"), StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "bad output index");
  expect_error(scalar_const("a") + mul("c", "^a", "a"), StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "data input 1 'a' follows a control input");
}

TEST(GraphDefErrorTest, InputIndexOutOfRange) {
  expect_error(
      scalar_const("a") + mul("c", "a", "a:3"), StatusCode::kInvalidArgument,
      "node 'c' (Mul): ", "input 1 'a:3' is out of range: node 'a' (Const) has 1 output(s)");
}

TEST(GraphDefErrorTest, WrongInputCount) {
  expect_error(scalar_const("a") + R"pb(node {
                                          name: "c"
                                          op: "Mul"
                                          input: "a"
                                          attr {
                                            key: "T"
                                            value { type: DT_FLOAT }
                                          }
                                        })pb",
               StatusCode::kInvalidArgument, "node 'c' (Mul): ", "expects 2 input(s), got 1");
}

TEST(GraphDefErrorTest, DuplicateAndInvalidNames) {
  expect_error(scalar_const("a") + scalar_const("a"), StatusCode::kInvalidArgument,
               "node 'a' (Const): ", "duplicate node name (node #0 and node #1)");
  expect_error(scalar_const("a:b"), StatusCode::kInvalidArgument,
               "node 'a:b' (Const): ", "invalid node name");
  expect_error(scalar_const(""), StatusCode::kInvalidArgument,
               "node '' (Const): ", "invalid node name");
}

TEST(GraphDefErrorTest, Cycle) {
  expect_error(scalar_const("a") + mul("b", "a", "d") + mul("c", "b", "a") + mul("d", "c", "a"),
               StatusCode::kInvalidArgument, "node '",
               "is on a cycle of inputs: 'b' <- 'd' <- 'c' <- 'b'");
  // A control edge closes a cycle too.
  expect_error(R"pb(node { name: "x" op: "NoOp" input: "^y" }
                    node { name: "y" op: "NoOp" input: "^x" })pb",
               StatusCode::kInvalidArgument, "node 'x' (NoOp): ", "'x' <- 'y' <- 'x'");
}

TEST(GraphDefErrorTest, LongCycleIsNamedByItsEndsAndACount) {
  // n0 <- n1 <- ... <- n99 <- n0 (control edges).
  // A NoOp named n<i> waiting for n<(i + 1) % n>, for every i below n.
  auto ring = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) {
      text += "node { name: \"n" + std::to_string(i) + "\" op: \"NoOp\" input: \"^n" +
              std::to_string((i + 1) % n) + "\" }\n";
    }
    return text;
  };
  Result<Graph> g = import_text(ring(100));
  ASSERT_FALSE(g.is_ok());
  const std::string message = g.status().message();
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      message.starts_with("node 'n0' (NoOp): is on a cycle of inputs of 100 nodes: 'n0' "
                          "<- 'n1' <- "))
      << message;
  EXPECT_NE(message.find("'n7' <- ... 84 more ... <- 'n92' <- "), std::string::npos) << message;
  EXPECT_NE(message.find("<- 'n99' <- 'n0' (a <- b: a waits for b)"), std::string::npos) << message;
  EXPECT_EQ(message.find("'n50'"), std::string::npos) << message;
  EXPECT_LT(message.size(), 400U) << message;
  // A cycle of 16 or fewer is named whole.
  expect_error(ring(16), StatusCode::kInvalidArgument,
               "node 'n0' (NoOp): is on a cycle of inputs: ", "'n7' <- 'n8' <- 'n9'");
}

TEST(GraphDefErrorTest, BadAttributes) {
  // Wrong kind.
  expect_error(scalar_const("a") + R"pb(node {
                                          name: "c"
                                          op: "Mul"
                                          input: "a"
                                          input: "a"
                                          attr {
                                            key: "T"
                                            value { s: "float" }
                                          }
                                        })pb",
               StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "attribute 'T': must be a type, got a string");
  expect_error(scalar_const("a") + R"pb(node {
                                          name: "m"
                                          op: "MatMul"
                                          input: "a"
                                          input: "a"
                                          attr {
                                            key: "transpose_a"
                                            value { i: 1 }
                                          }
                                        })pb",
               StatusCode::kInvalidArgument,
               "node 'm' (MatMul): ", "attribute 'transpose_a': must be a bool, got a int");
  expect_error(R"pb(node {
                      name: "p"
                      op: "Placeholder"
                      attr {
                        key: "dtype"
                        value { type: DT_FLOAT }
                      }
                      attr {
                        key: "shape"
                        value { list { i: 1 } }
                      }
                    })pb",
               StatusCode::kInvalidArgument,
               "node 'p' (Placeholder): ", "attribute 'shape': must be a shape, got a list(int)");
  // Unknown attribute.
  expect_error(scalar_const("a") + R"pb(node {
                                          name: "c"
                                          op: "Mul"
                                          input: "a"
                                          input: "a"
                                          attr {
                                            key: "fast"
                                            value { b: true }
                                          }
                                        })pb",
               StatusCode::kInvalidArgument,
               "node 'c' (Mul): ", "unknown attribute 'fast' (graphrun's Mul declares: T)");
  // A type graphrun has not.
  expect_error(R"pb(node {
                      name: "p"
                      op: "Placeholder"
                      attr {
                        key: "dtype"
                        value { type: DT_STRING }
                      }
                    })pb",
               StatusCode::kUnimplemented,
               "node 'p' (Placeholder): ", "attribute 'dtype': dtype DT_STRING is not supported");
  // A type the op does not allow.
  expect_error(
      R"pb(node {
             name: "p"
             op: "Placeholder"
             attr {
               key: "dtype"
               value { type: DT_INT32 }
             }
           }
           node {
             name: "e"
             op: "Exp"
             input: "p"
             attr {
               key: "T"
               value { type: DT_INT32 }
             }
           })pb",
      StatusCode::kInvalidArgument, "node 'e' (Exp): ", "T is int32, which is not one of");
  // Functions are not supported.
  expect_error(R"pb(node {
                      name: "p"
                      op: "Placeholder"
                      attr {
                        key: "dtype"
                        value { func { name: "f" } }
                      }
                    })pb",
               StatusCode::kInvalidArgument,
               "node 'p' (Placeholder): ", "attribute 'dtype': must be a type, got a func");
  // Missing required attribute.
  expect_error(R"pb(node {
                      name: "k"
                      op: "Const"
                      attr {
                        key: "dtype"
                        value { type: DT_FLOAT }
                      }
                    })pb",
               StatusCode::kInvalidArgument,
               "node 'k' (Const): ", "required attribute 'value' (tensor) is missing");
}

TEST(GraphDefErrorTest, BadTensors) {
  expect_error(
      R"pb(node {
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
                   tensor_shape { dim { size: 3 } }
                   tensor_content: "\000\000\200?"
                 }
               }
             }
           })pb",
      StatusCode::kInvalidArgument, "node 'k' (Const): ",
      "attribute 'value': tensor_content holds 4 bytes, but a float32[3] tensor needs 12");
  expect_error(
      R"pb(node {
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
                   tensor_shape { dim { size: -2 } }
                 }
               }
             }
           })pb",
      StatusCode::kInvalidArgument, "node 'k' (Const): ", "dimensions >= 0, got -2");
  expect_error(
      R"pb(node {
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
                   tensor_shape {
                     dim { size: 4294967296 }
                     dim { size: 4294967296 }
                   }
                   float_val: 1
                 }
               }
             }
           })pb",
      StatusCode::kInvalidArgument, "node 'k' (Const): ", "more elements than int64 can count");
  expect_error(
      R"pb(node {
             name: "k"
             op: "Const"
             attr {
               key: "dtype"
               value { type: DT_INT32 }
             }
             attr {
               key: "value"
               value {
                 tensor {
                   dtype: DT_INT32
                   tensor_shape { dim { size: 1 } }
                   int_val: 1
                   int_val: 2
                 }
               }
             }
           })pb",
      StatusCode::kInvalidArgument, "node 'k' (Const): ", "2 value(s) given for a int32[1] tensor");
  expect_error(
      R"pb(node {
             name: "k"
             op: "Const"
             attr {
               key: "dtype"
               value { type: DT_STRING }
             }
             attr {
               key: "value"
               value {
                 tensor {
                   dtype: DT_STRING
                   tensor_shape {}
                   string_val: "x"
                 }
               }
             }
           })pb",
      StatusCode::kUnimplemented, "node 'k' (Const): ", "DT_STRING is not supported");
  // A declared shape: -1 is fine, below -1 or past rank 8 is not.
  expect_error(R"pb(node {
                      name: "p"
                      op: "Placeholder"
                      attr {
                        key: "dtype"
                        value { type: DT_FLOAT }
                      }
                      attr {
                        key: "shape"
                        value { shape { dim { size: -5 } } }
                      }
                    })pb",
               StatusCode::kInvalidArgument, "node 'p' (Placeholder): ", "negative dimension -5");
}

TEST(GraphDefErrorTest, Variables) {
  const std::string var = R"pb(
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
      attr {
        key: "shared_name"
        value { s: "shared" }
      }
    })pb";
  expect_error(var, StatusCode::kUnimplemented,
               "node 'v' (VariableV2): ", "attribute 'shared_name' is 'shared'");
  // An assign whose first input is no variable.
  expect_error(scalar_const("a") + R"pb(node { name: "s" op: "Assign" input: "a" input: "a" })pb",
               StatusCode::kInvalidArgument,
               "node 's' (Assign): ", "input 0 'a' must be a variable (VariableV2 or Variable)");
  // graphrun's one-input form naming something else.
  expect_error(scalar_const("a") + R"pb(node {
                                          name: "s"
                                          op: "AssignAdd"
                                          input: "a"
                                          attr {
                                            key: "var"
                                            value { s: "a" }
                                          }
                                        })pb",
               StatusCode::kInvalidArgument,
               "node 's' (AssignAdd): ", "attribute 'var' names 'a', which is not a variable node");
  // A variable with an unknown dimension.
  expect_error(R"pb(node {
                      name: "v"
                      op: "VariableV2"
                      attr {
                        key: "dtype"
                        value { type: DT_FLOAT }
                      }
                      attr {
                        key: "shape"
                        value { shape { dim { size: -1 } } }
                      }
                    })pb",
               StatusCode::kInvalidArgument, "node 'v' (Variable): ", "must be fully defined");
}

TEST(GraphDefErrorTest, CallOpsCannotBeLoaded) {
  expect_error(R"pb(node {
                      name: "f"
                      op: "Call"
                      attr {
                        key: "Tout"
                        value { list { type: DT_FLOAT } }
                      }
                    })pb",
               StatusCode::kInvalidArgument, "node 'f' (Call): ", "wraps a C++ callable");
}

TEST(GraphDefErrorTest, GarbageNeverCrashes) {
  // Truncations of a valid binary GraphDef: each either parses (and imports
  // or fails cleanly) or is rejected as bytes.
  Result<v1::GraphDef> def = parse_graph_def(
      scalar_const("a") + scalar_const("b") + mul("c", "a", "b"), GraphDefFormat::kText);
  ASSERT_THAT(def, IsOk());
  const std::string bytes = def->SerializeAsString();
  for (std::size_t n = 0; n <= bytes.size(); ++n) {
    Result<v1::GraphDef> parsed = parse_graph_def(bytes.substr(0, n), GraphDefFormat::kBinary);
    if (parsed.is_ok()) (void)graph_from_graph_def(*parsed);
  }
}

// parse_graph_def's nesting limit, kMaxGraphDefNesting (100): protobuf's
// text parser has none of its own and overflowed the stack on a file a few
// thousand messages deep; binary keeps protobuf's default, set explicitly.
TEST(GraphDefErrorTest, NestingUpToTheLimitParses) {
  for (int depth : {1, 2, 3, 4, 10, kMaxGraphDefNesting - 1, kMaxGraphDefNesting}) {
    Result<v1::GraphDef> text =
        parse_graph_def(testing::nested_graph_def_text(depth), GraphDefFormat::kText);
    Result<v1::GraphDef> binary =
        parse_graph_def(testing::nested_graph_def_binary(depth), GraphDefFormat::kBinary);
    ASSERT_THAT(text, IsOk()) << depth;
    ASSERT_THAT(binary, IsOk()) << depth;
    // The two generators build the same message.
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*text, *binary)) << depth;
  }
}

TEST(GraphDefErrorTest, NestingPastTheLimitIsInvalidArgument) {
  for (int depth : {kMaxGraphDefNesting + 1, kMaxGraphDefNesting + 2, 3 * kMaxGraphDefNesting}) {
    EXPECT_THAT(parse_graph_def(testing::nested_graph_def_text(depth), GraphDefFormat::kText),
                StatusIs(StatusCode::kInvalidArgument,
                         "Message is too deep, the parser exceeded the configured recursion "
                         "limit of 100"))
        << depth;
    EXPECT_THAT(parse_graph_def(testing::nested_graph_def_binary(depth), GraphDefFormat::kBinary),
                StatusIs(StatusCode::kInvalidArgument, "messages nest more than 100 levels deep"))
        << depth;
    // kAuto sniffs each format and keeps the limit.
    EXPECT_THAT(parse_graph_def(testing::nested_graph_def_text(depth)),
                StatusIs(StatusCode::kInvalidArgument, "Message is too deep"));
    EXPECT_THAT(parse_graph_def(testing::nested_graph_def_binary(depth)),
                StatusIs(StatusCode::kInvalidArgument, "messages nest more than 100 levels"));
  }
}

TEST(GraphDefErrorTest, ThousandsOfLevelsDoNotOverflowTheStack) {
  // 9000 messages (141 kB of text): the file that crashed `graphrun run`.
  const int depth = 9000;
  EXPECT_THAT(parse_graph_def(testing::nested_graph_def_text(depth), GraphDefFormat::kText),
              StatusIs(StatusCode::kInvalidArgument, "Message is too deep"));
  EXPECT_THAT(parse_graph_def(testing::nested_graph_def_binary(depth), GraphDefFormat::kBinary),
              StatusIs(StatusCode::kInvalidArgument, "messages nest more than 100 levels"));
}

TEST(GraphDefErrorTest, NestedGroupsCountTowardsTheLimit) {
  // An unknown field 7 as nested groups (start tag 0x3b, end tag 0x3c):
  // protobuf parses unknown groups, one level each.
  auto groups = [](int depth) {
    return std::string(static_cast<std::size_t>(depth), '\x3b') +
           std::string(static_cast<std::size_t>(depth), '\x3c');
  };
  EXPECT_THAT(parse_graph_def(groups(kMaxGraphDefNesting), GraphDefFormat::kBinary), IsOk());
  EXPECT_THAT(parse_graph_def(groups(kMaxGraphDefNesting + 1), GraphDefFormat::kBinary),
              StatusIs(StatusCode::kInvalidArgument, "messages nest more than 100 levels"));
}

TEST(GraphDefErrorTest, MalformedDeepBinaryIsNotBlamedOnNesting) {
  // Cut short, the outer lengths overrun the bytes: malformed, whatever
  // the depth, and the message does not claim otherwise.
  const std::string deep = testing::nested_graph_def_binary(3 * kMaxGraphDefNesting);
  for (std::size_t n : {std::size_t{1}, std::size_t{50}, deep.size() / 2, deep.size() - 1}) {
    Result<v1::GraphDef> parsed = parse_graph_def(deep.substr(0, n), GraphDefFormat::kBinary);
    ASSERT_FALSE(parsed.is_ok()) << n;
    EXPECT_THAT(parsed, StatusIs(StatusCode::kInvalidArgument, "not a binary GraphDef")) << n;
    EXPECT_EQ(parsed.status().message().find("nest"), std::string::npos)
        << parsed.status().to_string();
  }
}

}  // namespace
}  // namespace graphrun
