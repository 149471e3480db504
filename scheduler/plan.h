// Plan: the immutable, compiled form of one (feeds, fetches, targets)
// signature of a session's graph. Pruned to what the fetches and targets
// need, topologically ordered, renumbered densely, with every input resolved
// to a slot index so that a step does no lookups.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "scheduler/cost_model.h"

namespace graphrun::sched {

// One node of a plan. Ranges index the Plan's flat arrays.
struct NodeItem {
  const Node* node = nullptr;
  OpKernel* kernel = nullptr;  // owned by the session's kernel table
  int32_t output_base = 0;     // first output slot
  int32_t num_outputs = 0;
  int32_t input_begin = 0;  // into Plan::input_slots
  int32_t input_end = 0;
  int32_t succ_begin = 0;  // into Plan::successors (plan indices; data and control)
  int32_t succ_end = 0;
  int32_t num_preds = 0;     // distinct in-plan predecessors
  bool skip_kernel = false;  // NoOp: nothing to compute
  bool async = false;        // an AsyncOpKernel: finishes later (FlowInstance)
};

// Consecutive lightweight nodes along any path, at most: each runs nested in
// its predecessor's call stack (about 224 bytes a level plus the kernel's
// frames; a TBB worker's stack is 4 MiB), so a longer run gets a
// default-policy node, which starts a fresh task.
inline constexpr int32_t kMaxLightweightRun = 256;

// The resolved signature a plan is compiled for.
struct Signature {
  std::vector<Output> feeds;    // in the caller's order, distinct
  std::vector<Output> fetches;  // in the caller's order, may repeat
  std::vector<const Node*> targets;
  bool partial = false;  // a partial run's plan (adds the fields below)
  // May fuse chains of nodes into one kernel (OpKernel::fuse); never for
  // partial runs.
  bool fuse = false;
  // Cheap nodes may run inline (SessionOptions::inline_cheap_nodes), and
  // what cheap means (SessionOptions::inline_below_cycles).
  bool inline_nodes = true;
  uint64_t inline_below_cycles = kDefaultInlineCycles;
};

// Nodes after a fusion's head, at most (a bias add and an activation).
inline constexpr std::size_t kMaxFusedChain = 2;

// Thread safety: immutable after build; shared by concurrent steps.
struct Plan {
  std::vector<NodeItem> nodes;  // topological order
  std::vector<int32_t> input_slots;
  std::vector<int32_t> successors;
  int32_t num_slots = 0;            // node outputs, then one per feed
  std::vector<int32_t> feed_slots;  // per signature feed
  std::vector<DType> feed_dtypes;   // what each feed replaces
  std::vector<Shape> feed_shapes;
  std::vector<std::string> feed_names;
  std::vector<int32_t> fetch_slots;  // per signature fetch
  // Per fetch: no later fetch reads its slot, so the step's end moves the
  // value out instead of copying it (the slots are cleared next anyway).
  std::vector<uint8_t> fetch_moves;
  // Per slot: how many node executions read it; a slot is released after its
  // last reader unless kKeep (fetched slots).
  std::vector<int32_t> slot_readers;
  static constexpr int32_t kKeep = 1 << 30;
  std::string key;
  // Fusion: kernels the plan made (OpKernel::fuse), how many graph nodes
  // they absorbed, and the same signature unfused, which traced runs use
  // (a trace shows every node).
  std::vector<std::unique_ptr<OpKernel>> fused_kernels;
  int32_t fused_nodes = 0;
  // Some node is an asynchronous kernel (NodeItem::async).
  bool has_async = false;
  Signature unfused;
  // What the plan learns about its kernels' cost and how its nodes run
  // (scheduler/cost_model.h): a node is lightweight (runs inline on the
  // thread that completes its last predecessor, without a task) when cheap,
  // no lightweight run would pass kMaxLightweightRun, and, in a partial
  // run, it does not follow a fetched or targeted node. A policy whose
  // nodes are all cheap is run_inline: the caller runs the nodes itself, in
  // plan order for a full run, as they become ready for a partial run,
  // without a flow graph, a task, or entering the arena (FlowInstance). TF
  // runs inexpensive kernels inline the same way; here it also spares the
  // arena's shared counters, which made two clients of a small graph
  // contend. Never null once built.
  std::unique_ptr<CostModel> costs;

  // Partial-run plans only.
  bool partial = false;
  std::vector<std::vector<int32_t>> feed_readers;  // per feed: plan nodes reading it, distinct
  std::vector<int32_t> node_feed_inputs;           // per node: distinct feeds it reads
  std::vector<int32_t> fetch_producers;            // per fetch: producing plan node, -1 when fed
  std::vector<int32_t> fetch_feeds;                // per fetch: the feed index when fed, else -1
  std::vector<int32_t> target_nodes;               // per target: plan node
  std::vector<std::vector<int32_t>> fetch_needs;   // per fetch: feeds it depends on
  std::vector<std::vector<int32_t>> target_needs;  // per target: feeds it depends on
};

// Makes (or returns the cached) kernel of a node; errors name the node.
using KernelProvider = std::function<Result<OpKernel*>(const Node&)>;

// TensorFlow's message for a needed Placeholder `n` that is not fed (its
// name, dtype and shape).
std::string placeholder_message(const Node& n);

// Prunes, checks and compiles. Errors: a needed Placeholder not fed (names
// it with dtype and shape), a cycle (names nodes on it), kernel creation.
Result<std::shared_ptr<const Plan>> build_plan(const Graph& graph, const Signature& signature,
                                               const KernelProvider& kernels);

}  // namespace graphrun::sched
