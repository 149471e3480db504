// Shared by the libFuzzer targets in tests/fuzz/: an invariant check that
// stops the fuzzer with a message, a byte comparison of tensors, the memory guard for tensors that
// legitimately expand to hundreds of MiB, and the GraphDef round trip both
// GraphDef targets run.
//
// Thread safety: the fuzzers are single-threaded; these functions keep no
// state.
#pragma once

#include <google/protobuf/stubs/logging.h>
#include <graphrun/graph_def.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace graphrun::fuzz {

// A violated invariant is a finding: print why and abort, so libFuzzer
// keeps the input as a crash artifact.
#define GRAPHRUN_FUZZ_CHECK(cond, ...)                                                           \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ::graphrun::fuzz::print_details(__VA_ARGS__);                                              \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)

inline void print_details() {}
inline void print_details(const Status& s) {
  std::fprintf(stderr, "  status: %s\n", s.to_string().c_str());
}
inline void print_details(std::string_view what) {
  std::fprintf(stderr, "  %.*s\n", static_cast<int>(what.size()), what.data());
}
inline void print_details(std::string_view what, const Status& s) {
  print_details(what);
  print_details(s);
}

// Drops protobuf's own log lines (one per string field with invalid UTF-8:
// millions per run, and nothing the fuzzer needs). Every target calls it
// from LLVMFuzzerInitialize.
inline void quiet_protobuf_logs() { google::protobuf::SetLogHandler(nullptr); }

// With GRAPHRUN_FUZZ_VERBOSE=1 in the environment, why an input stopped
// short of the round trip (to check that seeds get through:
// `GRAPHRUN_FUZZ_VERBOSE=1 <target> -runs=0 <seed dir>`).
inline void verbose_rejection(const char* stage, const Status& s) {
  static const bool verbose = std::getenv("GRAPHRUN_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz: rejected by %s: %s\n", stage, s.to_string().c_str());
}

// True when both tensors hold the same bytes (dtype and shape are checked
// by the caller).
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.byte_size() == b.byte_size() &&
         (a.byte_size() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.byte_size()) == 0);
}

// Tensors a TensorProto may legitimately expand to (one typed value can
// ask for up to kMaxTensorProtoBytes = 2 GiB) are skipped above this size:
// allocating and zeroing them only makes the fuzzer slow and runs into its
// RSS limit. Protos over the 2 GiB cap still go through (they are rejected
// before any allocation, and that check is worth fuzzing).
inline constexpr int64_t kLargestFuzzedTensorBytes = int64_t{16} << 20;

// True when `proto` would expand to more than kLargestFuzzedTensorBytes
// but not past the 2 GiB cap. tensor_content is bounded by the input size
// and never counts.
inline bool expands_too_far_to_fuzz(const v1::TensorProto& proto) {
  if (!proto.tensor_content().empty()) return false;
  int64_t bytes = 8;  // the widest dtype; exact sizes below
  switch (proto.dtype()) {
    case v1::DT_BOOL: bytes = 1; break;
    case v1::DT_FLOAT:
    case v1::DT_INT32: bytes = 4; break;
    default: break;
  }
  for (const auto& d : proto.tensor_shape().dim()) {
    if (d.size() < 0) return false;  // rejected before allocating
    if (__builtin_mul_overflow(bytes, d.size(), &bytes)) return false;  // over the cap
  }
  return bytes > kLargestFuzzedTensorBytes && bytes <= kMaxTensorProtoBytes;
}

// The same for every tensor-valued attribute of a GraphDef.
inline bool expands_too_far_to_fuzz(const v1::GraphDef& def) {
  for (const v1::NodeDef& node : def.node()) {
    for (const auto& [name, value] : node.attr()) {
      if (value.has_tensor() && expands_too_far_to_fuzz(value.tensor())) return true;
      if (value.has_list()) {
        for (const auto& t : value.list().tensor()) {
          if (expands_too_far_to_fuzz(t)) return true;
        }
      }
    }
  }
  return false;
}

// bytes -> parse_graph_def(format) -> graph_from_graph_def; when the import
// succeeds: the graph exports, the export serializes in `format`, parses
// back, re-imports to a graph of the same size, and exports to the same
// bytes again (import(export(g)) is a fixed point).
inline void graph_def_round_trip(std::string_view bytes, GraphDefFormat format) {
  Result<v1::GraphDef> def = parse_graph_def(bytes, format);
  if (!def.is_ok()) return verbose_rejection("parse", def.status());
  if (expands_too_far_to_fuzz(*def)) return verbose_rejection("size", Status::ok());
  Result<Graph> graph = graph_from_graph_def(*def);
  if (!graph.is_ok()) return verbose_rejection("import", graph.status());
  GRAPHRUN_FUZZ_CHECK(graph->num_nodes() == def->node_size());

  Result<v1::GraphDef> exported = graph_to_graph_def(*graph);
  GRAPHRUN_FUZZ_CHECK(exported.is_ok(), exported.status());
  Result<std::string> written = serialize_graph_def(*exported, format);
  GRAPHRUN_FUZZ_CHECK(written.is_ok(), written.status());
  Result<v1::GraphDef> reparsed = parse_graph_def(*written, format);
  GRAPHRUN_FUZZ_CHECK(reparsed.is_ok(), reparsed.status());
  Result<Graph> again = graph_from_graph_def(*reparsed);
  GRAPHRUN_FUZZ_CHECK(again.is_ok(), again.status());
  GRAPHRUN_FUZZ_CHECK(again->num_nodes() == graph->num_nodes());

  Result<v1::GraphDef> exported_again = graph_to_graph_def(*again);
  GRAPHRUN_FUZZ_CHECK(exported_again.is_ok(), exported_again.status());
  Result<std::string> first = serialize_graph_def(*exported, GraphDefFormat::kBinary);
  Result<std::string> second = serialize_graph_def(*exported_again, GraphDefFormat::kBinary);
  GRAPHRUN_FUZZ_CHECK(first.is_ok() && second.is_ok());
  GRAPHRUN_FUZZ_CHECK(*first == *second, "the re-imported graph exports to other bytes");
}

}  // namespace graphrun::fuzz
