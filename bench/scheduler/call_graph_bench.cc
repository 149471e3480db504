// Case 12: the scheduler's cost per node on a user's own work. Every DAG
// node is an ops::Call node with default attributes whose body is one
// shared std::function (empty here: the cost measured is the scheduler's);
// one control edge per DAG edge; a prepared Callable with the DAG's sink as
// its target. The baseline is the fastest plain oneTBB form of the same
// work: a tbb::flow::graph of default-policy continue_nodes, built once
// inside its arena and re-triggered, each body calling the same
// std::function, the nodes constructed in the order one thread runs them
// (the same layout graphrun's plan uses: at 1 thread it runs the tree
// 2.1-2.4x and the wavefront 1.2-1.4x faster than the DAG's own node
// order, _RawIdOrder).
//
//   Chain1k, Chain10k, Chain100k, Chain1M:  n0 -> n1 -> ... (sink: the
//              last node; Chain1M at 1 thread only: ratios.py compares its
//              time per node with Chain1k's)
//   Tree64k:   a binary fan-out tree of 65,535 nodes (each node precedes
//              its two children), plus a sink after every leaf
//   Wavefront256:  256x256, w(i,j) after w(i-1,j) and w(i,j-1)
//   Small10:   10 nodes, 12 edges (two roots, one sink)
//
// Variants, each at 1 and 2 threads (the session's pool, the raw graph's
// arena):
//   _Raw{1,2}T    the continue_node graph, nodes in run order
//   _RawIdOrder{1,2}T  the same, nodes in the DAG's order (informational)
//   _Call{1,2}T   graphrun, default Call nodes (cheap = false): the plan
//                 measures them and runs the cheap ones inline
//   _Cheap{1,2}T  graphrun, Call nodes declared cheap (the hint)
//   _Task{1,2}T   graphrun with SessionOptions::inline_cheap_nodes off:
//                 every node a flow-graph task (a node that is not inlined)
// Counter "nodes": DAG nodes per run (ratios.py prints ns per node).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <graphrun/graphrun.h>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "bench/common/raw_graph.h"

namespace graphrun::bench {
namespace {

// A DAG in topological order: edges (from, to) with from < to.
struct Dag {
  int nodes = 0;
  std::vector<std::pair<int, int>> edges;
  int sink = 0;
};

Dag chain(int n) {
  Dag d;
  d.nodes = n;
  for (int i = 1; i < n; ++i) d.edges.emplace_back(i - 1, i);
  d.sink = n - 1;
  return d;
}

Dag fan_out_tree(int levels) {
  Dag d;
  const int tree = (1 << levels) - 1;
  d.nodes = tree + 1;
  for (int i = 0; 2 * i + 2 < tree; ++i) {
    d.edges.emplace_back(i, 2 * i + 1);
    d.edges.emplace_back(i, 2 * i + 2);
  }
  for (int leaf = tree / 2; leaf < tree; ++leaf) d.edges.emplace_back(leaf, tree);
  d.sink = tree;
  return d;
}

Dag wavefront(int side) {
  Dag d;
  d.nodes = side * side;
  for (int i = 0; i < side; ++i) {
    for (int j = 0; j < side; ++j) {
      if (i > 0) d.edges.emplace_back((i - 1) * side + j, i * side + j);
      if (j > 0) d.edges.emplace_back(i * side + j - 1, i * side + j);
    }
  }
  d.sink = d.nodes - 1;
  return d;
}

// a, b roots; c(a,b) d(a) e(b) f(c,d) g(c,e) h(f,g) i(h) j(i).
Dag small10() {
  Dag d;
  d.nodes = 10;
  d.edges = {{0, 2}, {1, 2}, {0, 3}, {1, 4}, {2, 5}, {3, 5},
             {2, 6}, {4, 6}, {5, 7}, {6, 7}, {7, 8}, {8, 9}};
  d.sink = 9;
  return d;
}

// The work every engine's node calls.
const std::function<void()>& work() {
  static const std::function<void()> fn = [] {};
  return fn;
}

// The DAG's nodes in the order oneTBB runs them on one thread: depth
// first, a node's last successor first (the one its task bypasses into).
std::vector<int> run_order(const Dag& dag) {
  std::vector<std::vector<int>> succ(static_cast<std::size_t>(dag.nodes));
  std::vector<int> preds(static_cast<std::size_t>(dag.nodes), 0);
  for (const auto& [from, to] : dag.edges) {
    succ[static_cast<std::size_t>(from)].push_back(to);
    ++preds[static_cast<std::size_t>(to)];
  }
  std::vector<int> order;
  std::vector<int> ready;
  for (int i = dag.nodes; i-- > 0;) {
    if (preds[static_cast<std::size_t>(i)] == 0) ready.push_back(i);
  }
  while (!ready.empty()) {
    const int i = ready.back();
    ready.pop_back();
    order.push_back(i);
    for (const int s : succ[static_cast<std::size_t>(i)]) {
      if (--preds[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
    }
  }
  return order;
}

// The baseline: default-policy continue_nodes calling work(), constructed
// in the order they run (`in_run_order`), which puts the nodes that run
// one after another next to each other in memory, or in the DAG's order.
class RawDag {
 public:
  RawDag(const Dag& dag, int threads, bool in_run_order) : arena_(threads) {
    arena_.execute([&] {
      graph_ = std::make_unique<tbb::flow::graph>();
      const std::function<void()>* fn = &work();
      std::vector<int> order(static_cast<std::size_t>(dag.nodes));
      for (int i = 0; i < dag.nodes; ++i) order[static_cast<std::size_t>(i)] = i;
      if (in_run_order) order = run_order(dag);
      std::vector<Node*> node_of(static_cast<std::size_t>(dag.nodes), nullptr);
      for (const int i : order) {
        node_of[static_cast<std::size_t>(i)] =
            &nodes_.emplace_back(*graph_, [fn](const tbb::flow::continue_msg&) {
              (*fn)();
              return tbb::flow::continue_msg();
            });
      }
      std::vector<bool> has_pred(static_cast<std::size_t>(dag.nodes), false);
      for (const auto& [from, to] : dag.edges) {
        tbb::flow::make_edge(*node_of[static_cast<std::size_t>(from)],
                             *node_of[static_cast<std::size_t>(to)]);
        has_pred[static_cast<std::size_t>(to)] = true;
      }
      // Put last first: the first root's task runs first (LIFO).
      for (int i = dag.nodes; i-- > 0;) {
        if (!has_pred[static_cast<std::size_t>(i)])
          roots_.push_back(node_of[static_cast<std::size_t>(i)]);
      }
    });
  }
  ~RawDag() {
    arena_.execute([&] {
      nodes_.clear();
      graph_.reset();
    });
  }
  void run() {
    arena_.execute([&] {
      for (auto* root : roots_) root->try_put(tbb::flow::continue_msg());
      graph_->wait_for_all();
    });
  }

 private:
  using Node = tbb::flow::continue_node<tbb::flow::continue_msg>;
  tbb::task_arena arena_;
  std::unique_ptr<tbb::flow::graph> graph_;
  std::deque<Node> nodes_;
  std::vector<Node*> roots_;
};

// The same DAG as a graphrun Graph of Call nodes.
struct CallGraph {
  Graph g;
  const Node* sink = nullptr;
};

std::unique_ptr<CallGraph> make_call_graph(const Dag& dag, bool cheap) {
  auto out = std::make_unique<CallGraph>();
  const std::function<void()>* fn = &work();
  ops::CallableFn body = [fn](std::span<const Tensor>) -> Result<std::vector<Tensor>> {
    (*fn)();
    return std::vector<Tensor>();
  };
  ops::CallAttrs attrs;
  attrs.cheap = cheap;
  std::vector<Node*> nodes;
  nodes.reserve(static_cast<std::size_t>(dag.nodes));
  for (int i = 0; i < dag.nodes; ++i) {
    ops::Call(out->g, {}, {}, body, attrs, fmt::format("n{}", i));
    nodes.push_back(out->g.mutable_node(out->g.num_nodes() - 1));
  }
  for (const auto& [from, to] : dag.edges) {
    check_ok(out->g.add_control_input(nodes[static_cast<std::size_t>(to)],
                                      nodes[static_cast<std::size_t>(from)]),
             "control edge");
  }
  check_ok(out->g.status(), "building the Call graph");
  out->sink = nodes[static_cast<std::size_t>(dag.sink)];
  return out;
}

void BM_Raw(benchmark::State& state, Dag (*make)(), int threads, bool in_run_order) {
  const Dag dag = make();
  RawDag raw(dag, threads, in_run_order);
  for (auto _ : state) raw.run();
  state.counters["nodes"] = dag.nodes;
}

void BM_Graphrun(benchmark::State& state, Dag (*make)(), int threads, bool cheap,
                 bool inline_nodes) {
  const Dag dag = make();
  const std::unique_ptr<CallGraph> cg = make_call_graph(dag, cheap);
  SessionOptions options;
  options.inter_op_threads = threads;
  options.inline_cheap_nodes = inline_nodes;
  Result<std::unique_ptr<Session>> session = Session::create(cg->g, options);
  check_ok(session.status(), "Session::create");
  Result<Callable> callable = (*session)->make_callable({}, {}, {cg->sink});
  check_ok(callable.status(), "make_callable");
  // Steady state: the plan has measured its kernels and chosen its policy
  // (scheduler/cost_model.h: a few measured steps, then a rebuild).
  for (int i = 0; i < 8; ++i) check_ok(callable->run({}, {}), "warm-up run");
  for (auto _ : state) {
    const Status s = callable->run({}, {});
    if (!s.is_ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
  }
  state.counters["nodes"] = dag.nodes;
}

Dag chain1k() { return chain(1000); }
Dag chain10k() { return chain(10000); }
Dag chain100k() { return chain(100000); }
Dag chain1m() { return chain(1000000); }
Dag tree64k() { return fan_out_tree(16); }
Dag wavefront256() { return wavefront(256); }

void register_case(const char* name, Dag (*make)(), bool one_thread_only = false) {
  for (const int t : {1, 2}) {
    if (one_thread_only && t == 2) break;
    benchmark::RegisterBenchmark(fmt::format("BM_Call{}_Raw{}T", name, t).c_str(),
                                 [make, t](benchmark::State& s) { BM_Raw(s, make, t, true); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(fmt::format("BM_Call{}_RawIdOrder{}T", name, t).c_str(),
                                 [make, t](benchmark::State& s) { BM_Raw(s, make, t, false); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        fmt::format("BM_Call{}_Call{}T", name, t).c_str(),
        [make, t](benchmark::State& s) { BM_Graphrun(s, make, t, false, true); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        fmt::format("BM_Call{}_Cheap{}T", name, t).c_str(),
        [make, t](benchmark::State& s) { BM_Graphrun(s, make, t, true, true); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        fmt::format("BM_Call{}_Task{}T", name, t).c_str(),
        [make, t](benchmark::State& s) { BM_Graphrun(s, make, t, false, false); })
        ->UseRealTime();
  }
}

const bool registered = [] {
  register_case("Small10", small10);
  register_case("Chain1k", chain1k);
  register_case("Chain10k", chain10k);
  register_case("Chain100k", chain100k);
  register_case("Chain1M", chain1m, /*one_thread_only=*/true);
  register_case("Tree64k", tree64k);
  register_case("Wavefront256", wavefront256);
  return true;
}();

}  // namespace
}  // namespace graphrun::bench
