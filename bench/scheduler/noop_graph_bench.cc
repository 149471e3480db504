// Cases 2 and 3: large graphs of NoOp nodes linked by control dependencies,
// run as a target. They measure the scheduler's per-node cost (RunState
// checks, kernel call, flow-graph task) against empty continue_nodes.
//
//   NoOpChain10k:      n0 -> n1 -> ... -> n9999
//   Wavefront100x100:  w(i,j) runs after w(i-1,j) and w(i,j-1)
//
// Variants: _Session (Session::run with the last node as target),
// _Callable (prepared), _RawFlowGraph (empty continue_nodes, same edges in
// the same registration order), _RawFlowGraphKernels (continue_nodes calling
// the same NoOp kernel through an OpKernelContext), _RawFlowGraphPlanOrder
// (empty continue_nodes allocated in a breadth-first topological order
// instead of node-id order: isolates memory layout).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <graphrun/graphrun.h>

#include <memory>
#include <string>

#include "bench/common/raw_graph.h"

namespace graphrun::bench {
namespace {

struct NoOpGraph {
  Graph g;
  const Node* last = nullptr;
  int nodes = 0;
};

std::unique_ptr<NoOpGraph> make_chain(int n) {
  auto out = std::make_unique<NoOpGraph>();
  const Node* prev = nullptr;
  for (int i = 0; i < n; ++i) {
    const Node* node = ops::NoOp(out->g, fmt::format("n{}", i));
    if (prev != nullptr) {
      check_ok(out->g.add_control_input(out->g.mutable_node(node->id()), prev), "control edge");
    }
    prev = node;
  }
  check_ok(out->g.status(), "building the chain");
  out->last = prev;
  out->nodes = n;
  return out;
}

std::unique_ptr<NoOpGraph> make_wavefront(int rows, int cols) {
  auto out = std::make_unique<NoOpGraph>();
  std::vector<const Node*> grid(static_cast<std::size_t>(rows * cols));
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      const Node* node = ops::NoOp(out->g, fmt::format("w{}_{}", i, j));
      Node* mut = out->g.mutable_node(node->id());
      if (i > 0)
        check_ok(out->g.add_control_input(mut, grid[static_cast<std::size_t>((i - 1) * cols + j)]),
                 "edge");
      if (j > 0)
        check_ok(out->g.add_control_input(mut, grid[static_cast<std::size_t>(i * cols + j - 1)]),
                 "edge");
      grid[static_cast<std::size_t>(i * cols + j)] = node;
    }
  }
  check_ok(out->g.status(), "building the wavefront");
  out->last = grid.back();
  out->nodes = rows * cols;
  return out;
}

void set_counters(benchmark::State& state, int nodes) {
  state.SetItemsProcessed(state.iterations() * nodes);  // node executions
  state.counters["nodes"] = nodes;
  // Seconds per node (console shows e.g. "25n" = 25 ns per node).
  state.counters["per_node"] =
      benchmark::Counter(static_cast<double>(nodes), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

using Maker = std::unique_ptr<NoOpGraph> (*)();
std::unique_ptr<NoOpGraph> chain10k() { return make_chain(10000); }
std::unique_ptr<NoOpGraph> wave100() { return make_wavefront(100, 100); }

void run_session(benchmark::State& state, Maker make) {
  auto graph = make();
  auto session = std::move(Session::create(graph->g).value());
  const std::vector<TargetRef> targets{graph->last};
  Result<std::vector<Tensor>> out = session->run({}, {}, targets);  // compiles the plan
  check_ok(out.status(), "warm-up run");
  for (auto _ : state) {
    out = session->run({}, {}, targets);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  set_counters(state, graph->nodes);
}

void run_callable(benchmark::State& state, Maker make) {
  auto graph = make();
  auto session = std::move(Session::create(graph->g).value());
  Result<Callable> callable = session->make_callable({}, {}, {graph->last});
  check_ok(callable.status(), "make_callable");
  check_ok(callable->run({}, {}), "warm-up run");
  Status s;
  for (auto _ : state) {
    s = callable->run({}, {});
    benchmark::DoNotOptimize(s);
  }
  check_ok(s, "run");
  set_counters(state, graph->nodes);
}

void run_raw(benchmark::State& state, Maker make,
             RawLayout::Order order = RawLayout::Order::kNodeId) {
  auto graph = make();
  KernelTable kernels(graph->g);
  const std::array<const Node*, 1> targets{graph->last};
  RawLayout layout = RawLayout::make(graph->g, kernels, {}, {}, targets, order);
  const auto succ = successor_lists(layout);
  tbb::task_arena arena(session_threads());
  std::unique_ptr<EmptyFlowGraph> raw;
  arena.execute([&] { raw = std::make_unique<EmptyFlowGraph>(succ); });
  raw->run(arena);  // warm-up, as the session variants
  for (auto _ : state) raw->run(arena);
  arena.execute([&] { raw.reset(); });
  set_counters(state, graph->nodes);
}

void run_raw_kernels(benchmark::State& state, Maker make) {
  auto graph = make();
  KernelTable kernels(graph->g);
  const std::array<const Node*, 1> targets{graph->last};
  RawLayout layout = RawLayout::make(graph->g, kernels, {}, {}, targets);
  tbb::task_arena arena(session_threads());
  std::unique_ptr<RawFlowGraph> raw;
  arena.execute([&] { raw = std::make_unique<RawFlowGraph>(layout, tbb_runtime()); });
  bool ok = raw->run(arena, {}, {});
  for (auto _ : state) ok &= raw->run(arena, {}, {});
  if (!ok) state.SkipWithError("kernel failed");
  arena.execute([&] { raw.reset(); });
  set_counters(state, graph->nodes);
}

void BM_NoOpChain10k_Session(benchmark::State& s) { run_session(s, chain10k); }
void BM_NoOpChain10k_Callable(benchmark::State& s) { run_callable(s, chain10k); }
void BM_NoOpChain10k_RawFlowGraph(benchmark::State& s) { run_raw(s, chain10k); }
void BM_NoOpChain10k_RawFlowGraphKernels(benchmark::State& s) { run_raw_kernels(s, chain10k); }
void BM_NoOpChain10k_RawFlowGraphPlanOrder(benchmark::State& s) {
  run_raw(s, chain10k, RawLayout::Order::kKahn);
}
BENCHMARK(BM_NoOpChain10k_Session)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NoOpChain10k_Callable)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NoOpChain10k_RawFlowGraph)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NoOpChain10k_RawFlowGraphKernels)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NoOpChain10k_RawFlowGraphPlanOrder)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_Wavefront100x100_Session(benchmark::State& s) { run_session(s, wave100); }
void BM_Wavefront100x100_Callable(benchmark::State& s) { run_callable(s, wave100); }
void BM_Wavefront100x100_RawFlowGraph(benchmark::State& s) { run_raw(s, wave100); }
void BM_Wavefront100x100_RawFlowGraphKernels(benchmark::State& s) { run_raw_kernels(s, wave100); }
void BM_Wavefront100x100_RawFlowGraphPlanOrder(benchmark::State& s) {
  run_raw(s, wave100, RawLayout::Order::kKahn);
}
BENCHMARK(BM_Wavefront100x100_Session)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Wavefront100x100_Callable)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Wavefront100x100_RawFlowGraph)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Wavefront100x100_RawFlowGraphKernels)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Wavefront100x100_RawFlowGraphPlanOrder)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace graphrun::bench
