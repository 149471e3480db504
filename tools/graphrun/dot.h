// File: tools/graphrun/dot.h
// `graphrun dot`: a graph as Graphviz DOT, optionally with the part a
// signature needs (the engine's pruning rule) and, for a traced partial
// run, which call ran each node. docs/cli.md is the user-facing
// specification (classes, colours, shapes).
//
// Thread safety: stateless functions; thread-safe for distinct arguments.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/status.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace graphrun::cli {

// A resolved signature: what Session::run(feeds, fetches, targets) is given.
struct DotSignature {
  std::vector<Output> feeds;
  std::vector<Output> fetches;
  std::vector<const Node*> targets;
};

// The nodes a run of `sig` executes, by Node::id(): reverse reachability
// from the fetches (unless fed) and targets over data and control inputs,
// stopping at fed tensors — the rule of scheduler/plan.cc's build_plan.
std::vector<bool> needed_nodes(const Graph& graph, const DotSignature& sig);

struct DotMarks {
  bool has_signature = false;
  DotSignature signature;
  // Traced partial run: node name -> 1-based call that reported it.
  bool traced = false;
  int num_steps = 0;
  std::map<std::string, int> step_of;
};

// The DOT text: one statement per line, every node and edge with a `class`
// attribute (kept in SVG) saying what it is.
std::string graph_to_dot(const Graph& graph, const DotMarks& marks);

// `graphrun dot`'s arguments, as given on the command line.
struct DotArgs {
  std::string graph;
  std::vector<std::string> feeds;  // tensor names
  std::vector<std::string> fetches;
  std::vector<std::string> targets;
  std::vector<std::string> trace_partial;  // --partial step syntax; runs the graph
  std::vector<std::string> init;
  std::string out;  // DOT file; stdout when neither out nor svg is given
  std::string svg;  // SVG through Graphviz's `dot -Tsvg`
};
// Runs the command: DOT to `out` (or the files), one error line to `err`;
// returns the exit code.
int dot_command(const DotArgs& args, std::FILE* out, std::FILE* err);

}  // namespace graphrun::cli
