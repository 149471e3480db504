// File: bench/common/raw_graph.h
// Baselines for the scheduler benchmarks: the same DAG as a graphrun Graph,
// run without graphrun's scheduler.
//
//   KernelTable kernels(graph);                       // same factories a Session uses
//   RawLayout layout = RawLayout::make(graph, kernels, feeds, fetches, targets);
//   tbb::task_arena arena(2);
//   std::unique_ptr<RawFlowGraph> raw;
//   arena.execute([&] { raw = std::make_unique<RawFlowGraph>(layout, runtime); });  // built inside
//   raw->run(arena, feed_values);                      // arena.execute + try_put + wait_for_all
//
// RawFlowGraph is a hand-built, prebuilt, re-triggered tbb::flow::graph: one
// default-policy continue_node per node, an edge per distinct dependency in
// the same order the scheduler registers them (so the same successor is the
// bypassed one), bodies that call the node's OpKernel on a flat slot array.
// What it does not do, and graphrun's scheduler does: name resolution, the
// plan-cache lookup, the instance pool, per-node cancel/deadline/closed
// checks, output validation, early release of consumed slots, fetch copies.
// run_sequential() runs the same kernels in a plain loop on the caller.
//
// Thread safety: not thread-safe; one run at a time. Build, run and destroy
// a RawFlowGraph inside the arena it runs in (see
// /work/shared/reference/onetbb-mechanics.md, Q1: a graph built outside its
// arena costs ~47x per run).
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/tensor.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace graphrun::bench {

// Aborts with the status message: benchmarks are useless on a broken setup.
inline void check_ok(const Status& s, const char* what) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "bench setup failed: %s: %s\n", what, s.to_string().c_str());
    std::abort();
  }
}

// The intra-op runtime a Session installs (scheduler/session_impl.cc): a
// tbb::parallel_for in the calling arena.
inline void tbb_parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, n, static_cast<std::size_t>(std::max<int64_t>(grain, 1))),
      [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
}
inline KernelRuntime tbb_runtime() {
  KernelRuntime rt;
  rt.parallel_for = &tbb_parallel_for;
  return rt;
}
// No parallel_for: OpKernelContext then runs fn(0, n) inline.
inline KernelRuntime serial_runtime() { return KernelRuntime{}; }

// One kernel per node, made by the same factory a Session would use.
// Thread safety: thread-compatible.
class KernelTable {
 public:
  explicit KernelTable(const Graph& g) : kernels_(static_cast<std::size_t>(g.num_nodes())) {}
  OpKernel* get(const Node& n) {
    auto& slot = kernels_[static_cast<std::size_t>(n.id())];
    if (slot == nullptr) {
      OpKernelConstruction c(n, resources_);
      const KernelFactory& factory =
          n.kernel_override() ? *n.kernel_override() : n.registration().factory;
      Result<std::unique_ptr<OpKernel>> made = factory(c);
      check_ok(made.status(), n.describe().c_str());
      slot = std::move(*made);
    }
    return slot.get();
  }

 private:
  ResourceManager resources_;
  std::vector<std::unique_ptr<OpKernel>> kernels_;
};

// The pruned DAG with a flat slot layout: what a hand-written program would
// know about its graph up front. By default nodes are in id order (builders
// add a node after its inputs and control inputs, so id order is
// topological; add_control_input on an older node would break that and
// aborts here).
struct RawLayout {
  struct Item {
    const Node* node = nullptr;
    OpKernel* kernel = nullptr;
    int32_t output_base = 0;
    int32_t input_begin = 0;
    int32_t input_end = 0;
    std::vector<int32_t> successors;  // item indices, ascending node id
    int32_t num_preds = 0;
  };
  std::vector<Item> items;
  std::vector<int32_t> input_slots;
  int32_t num_slots = 0;
  std::vector<int32_t> feed_slots;
  std::vector<int32_t> fetch_slots;

  // How items (and so the flow-graph nodes, in memory) are ordered: by node
  // id, or in a breadth-first topological order (Kahn, FIFO).
  enum class Order { kNodeId, kKahn };

  static RawLayout make(const Graph& g, KernelTable& kernels, std::span<const Output> feeds,
                        std::span<const Output> fetches, std::span<const Node* const> targets,
                        Order order = Order::kNodeId) {
    const auto n = static_cast<std::size_t>(g.num_nodes());
    auto fed_index = [&](const Output& o) -> int {
      for (std::size_t f = 0; f < feeds.size(); ++f) {
        if (feeds[f] == o) return static_cast<int>(f);
      }
      return -1;
    };
    std::vector<char> needed(n, 0);
    std::vector<const Node*> stack;
    auto want = [&](const Node* node) {
      if (!needed[static_cast<std::size_t>(node->id())]) {
        needed[static_cast<std::size_t>(node->id())] = 1;
        stack.push_back(node);
      }
    };
    for (const Output& f : fetches) {
      if (fed_index(f) < 0) want(f.node());
    }
    for (const Node* t : targets) want(t);
    while (!stack.empty()) {
      const Node* node = stack.back();
      stack.pop_back();
      for (const Output& in : node->inputs()) {
        if (fed_index(in) < 0) want(in.node());
      }
      for (const Node* dep : node->control_inputs()) want(dep);
    }

    // Distinct in-graph predecessors of every needed node, by node id.
    std::vector<std::vector<int>> preds_of(n);
    std::vector<std::vector<int>> succs_of(n);
    for (std::size_t id = 0; id < n; ++id) {
      if (!needed[id]) continue;
      const Node* node = g.node(static_cast<int>(id));
      std::vector<int>& preds = preds_of[id];
      for (const Output& in : node->inputs()) {
        if (fed_index(in) < 0) preds.push_back(in.node()->id());
      }
      for (const Node* dep : node->control_inputs()) preds.push_back(dep->id());
      std::sort(preds.begin(), preds.end());
      preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
      for (int p : preds) succs_of[static_cast<std::size_t>(p)].push_back(static_cast<int>(id));
    }
    std::vector<int> ids;
    if (order == Order::kNodeId) {
      for (std::size_t id = 0; id < n; ++id) {
        if (needed[id]) ids.push_back(static_cast<int>(id));
      }
    } else {
      std::vector<int> remaining(n, 0);
      std::deque<int> ready;
      for (std::size_t id = 0; id < n; ++id) {
        remaining[id] = static_cast<int>(preds_of[id].size());
        if (needed[id] && remaining[id] == 0) ready.push_back(static_cast<int>(id));
      }
      while (!ready.empty()) {
        const int id = ready.front();
        ready.pop_front();
        ids.push_back(id);
        for (int s : succs_of[static_cast<std::size_t>(id)]) {
          if (--remaining[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
        }
      }
    }

    RawLayout layout;
    std::vector<int32_t> index_of(n, -1);
    int32_t slot = 0;
    for (int id_int : ids) {
      const auto id = static_cast<std::size_t>(id_int);
      const Node* node = g.node(id_int);
      index_of[id] = static_cast<int32_t>(layout.items.size());
      Item item;
      item.node = node;
      item.kernel = kernels.get(*node);
      item.output_base = slot;
      slot += node->num_outputs();
      layout.items.push_back(std::move(item));
    }
    const int32_t feed_base = slot;
    for (std::size_t f = 0; f < feeds.size(); ++f) {
      layout.feed_slots.push_back(feed_base + static_cast<int32_t>(f));
    }
    layout.num_slots = feed_base + static_cast<int32_t>(feeds.size());
    auto slot_of = [&](const Output& o) {
      const int f = fed_index(o);
      if (f >= 0) return feed_base + f;
      const int32_t i = index_of[static_cast<std::size_t>(o.node()->id())];
      if (i < 0) std::abort();
      return layout.items[static_cast<std::size_t>(i)].output_base + o.index();
    };
    for (Item& item : layout.items) {
      item.input_begin = static_cast<int32_t>(layout.input_slots.size());
      for (const Output& in : item.node->inputs()) layout.input_slots.push_back(slot_of(in));
      item.input_end = static_cast<int32_t>(layout.input_slots.size());
      const auto id = static_cast<std::size_t>(item.node->id());
      item.num_preds = static_cast<int32_t>(preds_of[id].size());
      const auto self = static_cast<int32_t>(&item - layout.items.data());
      // Successors by ascending node id, as scheduler/plan.cc registers them.
      for (int s : succs_of[id]) {
        const int32_t si = index_of[static_cast<std::size_t>(s)];
        if (si <= self) std::abort();  // not a topological order
        item.successors.push_back(si);
      }
    }
    for (const Output& f : fetches) layout.fetch_slots.push_back(slot_of(f));
    return layout;
  }

  // Runs item i's kernel on `slots`; false when the kernel failed.
  bool execute(int32_t i, Tensor* slots, const KernelRuntime& runtime) const {
    const Item& item = items[static_cast<std::size_t>(i)];
    OpKernelContext ctx(
        *item.node, slots,
        std::span<const int32_t>(input_slots.data() + item.input_begin,
                                 static_cast<std::size_t>(item.input_end - item.input_begin)),
        slots + item.output_base, runtime, nullptr, 0);
    return item.kernel->compute(ctx).is_ok();
  }
};

// The same kernels in a plain loop on the calling thread.
// Thread safety: not thread-safe.
class RawSequential {
 public:
  explicit RawSequential(const RawLayout& layout, KernelRuntime runtime = serial_runtime())
      : layout_(layout), runtime_(runtime), slots_(static_cast<std::size_t>(layout.num_slots)) {}

  // Returns false when a kernel failed.
  bool run(std::span<const Tensor> feeds, std::span<Tensor> fetches) {
    for (std::size_t f = 0; f < feeds.size(); ++f) {
      slots_[static_cast<std::size_t>(layout_.feed_slots[f])] = feeds[f];
    }
    bool ok = true;
    const auto n = static_cast<int32_t>(layout_.items.size());
    for (int32_t i = 0; i < n; ++i) ok &= layout_.execute(i, slots_.data(), runtime_);
    for (std::size_t f = 0; f < fetches.size(); ++f) {
      fetches[f] = slots_[static_cast<std::size_t>(layout_.fetch_slots[f])];
    }
    return ok;
  }

 private:
  const RawLayout& layout_;
  KernelRuntime runtime_;
  std::vector<Tensor> slots_;
};

// A hand-built tbb::flow::graph over a RawLayout, re-triggered per run.
// Thread safety: not thread-safe; construct, run and destroy inside `arena`.
class RawFlowGraph {
 public:
  using NodeT = tbb::flow::continue_node<tbb::flow::continue_msg>;

  RawFlowGraph(const RawLayout& layout, KernelRuntime runtime)
      : layout_(layout), runtime_(runtime), slots_(static_cast<std::size_t>(layout.num_slots)) {
    const auto n = static_cast<int32_t>(layout.items.size());
    for (int32_t i = 0; i < n; ++i) {
      nodes_.emplace_back(graph_, [this, i](const tbb::flow::continue_msg&) {
        if (!layout_.execute(i, slots_.data(), runtime_)) {
          failed_.store(true, std::memory_order_relaxed);  // read after wait_for_all
        }
        return tbb::flow::continue_msg();
      });
    }
    for (int32_t i = 0; i < n; ++i) {
      const RawLayout::Item& item = layout.items[static_cast<std::size_t>(i)];
      if (item.num_preds == 0) roots_.push_back(&nodes_[static_cast<std::size_t>(i)]);
      for (int32_t s : item.successors) {
        tbb::flow::make_edge(nodes_[static_cast<std::size_t>(i)],
                             nodes_[static_cast<std::size_t>(s)]);
      }
    }
  }
  RawFlowGraph(const RawFlowGraph&) = delete;
  RawFlowGraph& operator=(const RawFlowGraph&) = delete;
  ~RawFlowGraph() { graph_.wait_for_all(); }

  // Call inside the graph's arena. Returns false when a kernel failed.
  bool run_here(std::span<const Tensor> feeds, std::span<Tensor> fetches) {
    for (std::size_t f = 0; f < feeds.size(); ++f) {
      slots_[static_cast<std::size_t>(layout_.feed_slots[f])] = feeds[f];
    }
    for (NodeT* r : roots_) r->try_put(tbb::flow::continue_msg());
    graph_.wait_for_all();
    for (std::size_t f = 0; f < fetches.size(); ++f) {
      fetches[f] = slots_[static_cast<std::size_t>(layout_.fetch_slots[f])];
    }
    return !failed_.load(std::memory_order_relaxed);
  }
  bool run(tbb::task_arena& arena, std::span<const Tensor> feeds, std::span<Tensor> fetches) {
    bool ok = false;
    arena.execute([&] { ok = run_here(feeds, fetches); });
    return ok;
  }

 private:
  const RawLayout& layout_;
  KernelRuntime runtime_;
  std::vector<Tensor> slots_;
  std::atomic<bool> failed_{false};
  tbb::task_group_context context_{tbb::task_group_context::isolated};
  tbb::flow::graph graph_{context_};
  std::deque<NodeT> nodes_;
  std::vector<NodeT*> roots_;
};

// Empty-body continue_nodes over explicit edges: the pure oneTBB floor.
// Thread safety: not thread-safe; construct, run and destroy inside the arena.
class EmptyFlowGraph {
 public:
  using NodeT = tbb::flow::continue_node<tbb::flow::continue_msg>;

  // `successors[i]` lists node i's successors in registration order; nodes
  // with no predecessor are roots.
  explicit EmptyFlowGraph(const std::vector<std::vector<int32_t>>& successors) {
    const std::size_t n = successors.size();
    std::vector<int32_t> preds(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      nodes_.emplace_back(graph_,
                          [](const tbb::flow::continue_msg&) { return tbb::flow::continue_msg(); });
      for (int32_t s : successors[i]) ++preds[static_cast<std::size_t>(s)];
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (preds[i] == 0) roots_.push_back(&nodes_[i]);
      for (int32_t s : successors[i])
        tbb::flow::make_edge(nodes_[i], nodes_[static_cast<std::size_t>(s)]);
    }
  }
  EmptyFlowGraph(const EmptyFlowGraph&) = delete;
  EmptyFlowGraph& operator=(const EmptyFlowGraph&) = delete;
  ~EmptyFlowGraph() { graph_.wait_for_all(); }

  void run(tbb::task_arena& arena) {
    arena.execute([&] {
      for (NodeT* r : roots_) r->try_put(tbb::flow::continue_msg());
      graph_.wait_for_all();
    });
  }

 private:
  tbb::task_group_context context_{tbb::task_group_context::isolated};
  tbb::flow::graph graph_{context_};
  std::deque<NodeT> nodes_;
  std::vector<NodeT*> roots_;
};

// The successor lists of a RawLayout (for EmptyFlowGraph).
inline std::vector<std::vector<int32_t>> successor_lists(const RawLayout& layout) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(layout.items.size());
  for (const RawLayout::Item& item : layout.items) out.push_back(item.successors);
  return out;
}

// The arena size a default Session uses (SessionOptions::inter_op_threads = 0).
inline int session_threads() { return tbb::info::default_concurrency(); }

}  // namespace graphrun::bench
