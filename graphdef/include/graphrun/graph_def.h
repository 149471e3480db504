/// @file graphrun/graph_def.h
/// Graphs as data: Graph <-> GraphDef (package graphrun.v1, TensorFlow's
/// field numbers, so GraphDefs written by TensorFlow load when they use ops
/// graphrun has), Tensor <-> TensorProto, and graph files (.pb binary,
/// .pbtxt text).
///
/// @code
///   GRAPHRUN_ASSIGN_OR_RETURN(Graph g, load_graph_file("model.pbtxt"));
///   GRAPHRUN_ASSIGN_OR_RETURN(auto session, Session::create(g));
/// @endcode
///
/// Import never crashes on bad input: every problem is an InvalidArgument (or
/// Unimplemented for a TensorFlow feature graphrun lacks) whose message
/// starts with the node, e.g. "node 'c' (Mul): input 1 'b:3' is out of
/// range". docs/graph-files.md lists the import rules.
///
/// Link graphrun::graphdef (it brings protobuf; the core libraries do not).
///
/// Thread safety: every function here is thread-safe for distinct arguments;
/// the inputs are only read, and the caller owns every result.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>
#include <graphrun/v1/graph.pb.h>
#include <graphrun/v1/tensor.pb.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace graphrun {

/// Builds a graph over `registry` (which must outlive it) from `def`. Nodes
/// may come in any order; they are added in a topological order of their
/// data and control inputs (ties keep the GraphDef's order). TensorFlow's ref
/// variables (VariableV2, Variable) and two-input Assign/AssignAdd/AssignSub
/// become graphrun's Variable and one-input assigns; attribute names starting
/// with "_" are dropped. Reads `def` only.
Result<Graph> graph_from_graph_def(const v1::GraphDef& def,
                                   const OpRegistry& registry = default_op_registry());

/// Every node of `graph` with its op, inputs ("node", "node:k"), control
/// inputs ("^node") and attributes, in node-id order. A Call/StatelessCall
/// node (a C++ callable) cannot be written: InvalidArgument naming it. Reads
/// `graph` only; do not modify it concurrently.
Result<v1::GraphDef> graph_to_graph_def(const Graph& graph);

/// Largest tensor a TensorProto may expand to (2 GiB, protobuf's own message
/// limit): a single typed value can ask for any shape, so the expansion is
/// capped before anything is allocated.
inline constexpr int64_t kMaxTensorProtoBytes = int64_t{1} << 31;

/// The bytes `proto` decodes to, computed without decoding anything: the
/// size of `tensor_content`, else elements x dtype size (one typed value can
/// ask for any shape; unknown dtypes count 8 bytes an element). Saturates at
/// kMaxTensorProtoBytes + 1; a shape with a dimension below 1 counts 0
/// (tensor_from_proto refuses or makes it empty). Thread-safe.
int64_t tensor_proto_bytes(const v1::TensorProto& proto);
/// The sum of tensor_proto_bytes over every tensor an import of `def` would
/// materialize (each attribute of type tensor or list(tensor): a Const's
/// value), saturating at kMaxTensorProtoBytes + 1. Thread-safe.
int64_t graph_def_tensor_bytes(const v1::GraphDef& def);

/// A tensor from its proto: `tensor_content` (little-endian bytes whose size
/// must equal elements x dtype size) or the dtype's typed field (fewer values
/// than elements: the last repeats; none: zeros; more: InvalidArgument).
/// Dtypes: float32, float64, int32, int64, bool; another TensorFlow dtype is
/// Unimplemented. Messages carry no node name; callers prefix it.
Result<Tensor> tensor_from_proto(const v1::TensorProto& proto);
/// `tensor` as dtype, shape and `tensor_content` (little-endian). An
/// uninitialized tensor gives dtype DT_INVALID and no content.
v1::TensorProto tensor_to_proto(const Tensor& tensor);

/// How a graph is serialized: protobuf binary, protobuf text format, or
/// kAuto: text when no byte is a control character other than tab, CR or LF
/// (a binary GraphDef always has one), else binary.
enum class GraphDefFormat {
  kBinary,  ///< protobuf's binary wire format (.pb)
  kText,    ///< protobuf's text format (.pbtxt)
  kAuto,    ///< text or binary, decided from the bytes
};

/// Deepest message nesting parse_graph_def accepts, in both formats: 100,
/// protobuf's default for binary (the outer GraphDef is level 0; a NodeDef
/// level 1, an attr map entry 2, its AttrValue 3, a TensorProto 4, its
/// TensorShapeProto 5, a Dim 6: real GraphDefs stay below 10). Protobuf's
/// text parser has no limit of its own and overflows the stack on a file a
/// few thousand messages deep.
inline constexpr int kMaxGraphDefNesting = 100;

/// Largest graph file load_graph_file reads: INT_MAX bytes (2 GiB - 1),
/// protobuf's message size limit.
inline constexpr int64_t kMaxGraphFileBytes = (int64_t{1} << 31) - 1;

/// Parses a GraphDef; InvalidArgument (with the text parser's line and
/// column for text) when the bytes are not one, or when messages nest deeper
/// than kMaxGraphDefNesting (for binary the message says so: "messages nest
/// more than 100 levels deep"; for text, protobuf's "Message is too deep").
Result<v1::GraphDef> parse_graph_def(std::string_view bytes,
                                     GraphDefFormat format = GraphDefFormat::kAuto);
/// Serializes `def` in `format` (kAuto means binary).
Result<std::string> serialize_graph_def(const v1::GraphDef& def,
                                        GraphDefFormat format = GraphDefFormat::kBinary);

/// Reads a graph file: ".pb" binary, ".pbtxt" or ".txt" text, anything else
/// sniffed (kAuto); then graph_from_graph_def over the default registry.
/// Reads exactly the size stat gives. Errors about the file start with
/// "graph file '<path>': ": NotFound when it does not exist, InvalidArgument
/// when it is not a regular file (a directory, a device such as /dev/zero, a
/// pipe) or larger than kMaxGraphFileBytes, parse_graph_def's errors; import
/// errors are graph_from_graph_def's (they start with the node).
Result<Graph> load_graph_file(const std::filesystem::path& path);
/// Writes `graph` to `path`: text for ".pbtxt"/".txt", binary otherwise.
/// Replaces the file (written to a temporary beside it, then renamed).
Status save_graph_file(const Graph& graph, const std::filesystem::path& path);

}  // namespace graphrun
