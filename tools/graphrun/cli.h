// File: tools/graphrun/cli.h
// The pieces of the `graphrun` command line that need no process: feed and
// partial-run step syntax, inline values, printing, output file names, the
// Chrome trace writer, and the `run` command itself (main.cc only parses
// arguments with CLI11 and maps the result to an exit code; `dot` and
// `bench` live in dot.h and bench.h).
// docs/cli.md is the user-facing specification.
//
// Thread safety: stateless functions; thread-safe for distinct arguments.
#pragma once

#include <graphrun/session.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace graphrun::cli {

// Exit codes (docs/cli.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;

// An inline value's structure before its dtype is known: the shape the
// brackets (or the list) give, and the element tokens in row-major order.
struct ValueLiteral {
  Shape shape;
  bool bracketed = false;  // written with [ ], which fixes the shape
  std::vector<std::string> tokens;
};
// Syntax only: "3", "1,2,3", "[[1,2],[3,4]]", "[]", "true,false". Tokens
// must look like numbers, nan/inf, or true/false. InvalidArgument naming
// the position otherwise.
Result<ValueLiteral> parse_value_literal(std::string_view text);
// The literal as a tensor of `dtype` (the fed tensor's declared dtype).
// An unbracketed list of exactly declared.num_elements() tokens is given
// the declared shape when that is fully defined and not rank 1. `feed`
// names the tensor in messages.
Result<Tensor> literal_to_tensor(const ValueLiteral& literal, DType dtype, const Shape& declared,
                                 std::string_view feed);

// A --feed argument: NAME=VALUES or NAME=@FILE.npy.
struct FeedArg {
  std::string name;
  std::string file;     // set for @FILE
  ValueLiteral values;  // set otherwise
};
Result<FeedArg> parse_feed_arg(std::string_view arg);

// One --partial step: ';'-separated clauses "feed NAME=VALUES",
// "fetch A[,B]", "target N[,M]" (a ':' may replace the space).
struct StepSpec {
  std::vector<FeedArg> feeds;
  std::vector<std::string> fetches;
  std::vector<std::string> targets;
};
Result<StepSpec> parse_step(std::string_view text);

// The longest file name output_file_name returns (Linux's NAME_MAX).
inline constexpr std::size_t kMaxOutputFileNameBytes = 255;
// "<name>.npy" with every byte outside [A-Za-z0-9._-] percent-encoded. When
// that is longer than kMaxOutputFileNameBytes: the escaped name's first 234
// bytes (less, so as not to split a %XX escape), '~', the FNV-1a 64-bit hash
// of the whole tensor name as 16 hex digits, ".npy".
std::string output_file_name(std::string_view tensor_name);

// `--print-limit`'s default.
inline constexpr int64_t kDefaultPrintLimit = 32;
// "add: float32[3] [11, 22, 33]", elided past `limit` elements (0: no limit)
// with "(N of M elements shown)"; a zero-element tensor's empty lists count
// as elements: "(N of M empty lists shown)", and for it 0 means
// kDefaultPrintLimit (its elements are all shown; its lists are bounded).
std::string format_fetch(std::string_view name, const Tensor& value, int64_t limit);

// Step statistics of one call: `step` 0 for a run, K >= 1 for the K-th
// partial-run call.
struct TracedCall {
  int step = 0;
  std::vector<NodeExecStats> stats;
};
// Chrome trace event format (JSON object form): one "X" event per node
// execution, thread_name metadata per arena slot, ts/dur in microseconds
// relative to the earliest start.
std::string chrome_trace_json(std::span<const TracedCall> calls, std::string_view process_name);

// Shared by the commands (run, dot, bench).
// The longest error message one_line returns, before its "left out" note.
inline constexpr std::size_t kMaxErrorMessageBytes = 2000;
// `s` with line breaks and tabs replaced by spaces, so that error messages
// stay on one line, and other control bytes shown as \xNN. A
// longer message than kMaxErrorMessageBytes is cut at a " <- " or ", "
// separator: "... and K more (B bytes of the message left out)".
std::string one_line(std::string s);
// A JSON string literal (quotes included).
std::string json_escape(std::string_view s);
// A feed argument resolved against the graph: the value with the tensor's
// declared dtype, checked against its declared shape. Errors name the feed.
Result<Feed> resolve_feed(const Graph& graph, const FeedArg& arg);
// A load_graph_file failure as one message, "graph file '<path>': <Code>:
// <message>" (the prefix once even when the message starts with it).
std::string graph_file_error(std::string_view path, const Status& status);
// Writes `bytes` to `path` (created or truncated); Internal "<what> '<path>':
// cannot ...: <reason>" when it cannot (a directory, a full disk).
Status write_output_file(const std::string& path, std::string_view bytes, std::string_view what);
// NotFound / InvalidArgument naming the fetch or target when the graph has
// no such tensor or node.
Status check_fetch(const Graph& graph, const std::string& name);
Status check_target(const Graph& graph, const std::string& name);

// `graphrun run`'s arguments, as given on the command line.
struct RunArgs {
  std::string graph;
  std::vector<std::string> feeds;
  std::vector<std::string> fetches;
  std::vector<std::string> targets;
  std::vector<std::string> partial;
  // Targets run first, in a run of their own (e.g. a variables' `init`).
  std::vector<std::string> init;
  std::string out_dir;
  std::string trace;
  int64_t print_limit = kDefaultPrintLimit;
};
// Runs the command: prints fetches to `out`, one error line to `err`;
// returns the exit code.
int run_command(const RunArgs& args, std::FILE* out, std::FILE* err);

}  // namespace graphrun::cli
