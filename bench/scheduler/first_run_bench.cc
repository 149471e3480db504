// Case 5: the first run of a new signature of a 1,000-node graph: what a
// cache miss costs (plan build + flow-graph instance build + the run), next
// to building and running a raw tbb::flow::graph of the same DAG from
// scratch, and a warm run of both for scale.
//
// The DAG (1,000 nodes, scalar float): 100 Consts; 8 layers of 100 Adds,
// node k of a layer adding node k and a random node of the layer before;
// a binary Add tree of 99 nodes over the last layer; a final Neg.
//
// Variants:
//   _NewSignature   one session; each iteration fetches {final, const k} for
//                   a k it has not fetched before (plan covers the same 1,000
//                   nodes; kernels already made). Every 100 iterations the
//                   session is replaced outside the timed region.
//   _FreshSession   a new Session per iteration (created and destroyed
//                   outside the timed region); the timed first run also makes
//                   the 1,000 kernels and is the arena's first use.
//   _RawFlowGraph   build a RawFlowGraph (1,000 continue_nodes + edges) from
//                   a precomputed layout, inside the arena, and run it once;
//                   kept (as the session keeps its plans), freed every 100
//                   iterations outside the timed region.
//   _RawFlowGraphFromGraph  the same, also deriving the layout (pruning,
//                   slots, edges) from the Graph: the raw analogue of a plan.
//   _WarmSession / _WarmCallable / _WarmRawFlowGraph  a cached plan and a
//                   pooled instance / a prebuilt raw graph, re-run.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <graphrun/graphrun.h>

#include <memory>
#include <random>
#include <string>

#include "bench/common/raw_graph.h"

namespace graphrun::bench {
namespace {

constexpr int kWidth = 100;
constexpr int kLayers = 8;
constexpr int kNodes = 1000;

struct LayeredGraph {
  Graph g;
  std::vector<Output> consts;
  Output final;

  LayeredGraph() {
    std::mt19937 rng(42);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, kWidth - 2);
    for (int k = 0; k < kWidth; ++k) {
      consts.push_back(ops::Const(g, Tensor(value(rng)), fmt::format("c{}", k)));
    }
    std::vector<Output> prev = consts;
    for (int layer = 0; layer < kLayers; ++layer) {
      std::vector<Output> cur;
      for (int k = 0; k < kWidth; ++k) {
        int r = pick(rng);
        if (r >= k) ++r;  // another node than k
        cur.push_back(ops::Add(g, prev[static_cast<std::size_t>(k)],
                               prev[static_cast<std::size_t>(r)], fmt::format("l{}_{}", layer, k)));
      }
      prev = std::move(cur);
    }
    int t = 0;
    while (prev.size() > 1) {
      std::vector<Output> cur;
      for (std::size_t k = 0; k + 1 < prev.size(); k += 2) {
        cur.push_back(ops::Add(g, prev[k], prev[k + 1], fmt::format("t{}", t++)));
      }
      if (prev.size() % 2 == 1) cur.push_back(prev.back());
      prev = std::move(cur);
    }
    final = ops::Neg(g, prev[0], "final");
    check_ok(g.status(), "building the layered graph");
    if (g.num_nodes() != kNodes) {
      std::fprintf(stderr, "layered graph has %d nodes\n", g.num_nodes());
      std::abort();
    }
  }
};

const LayeredGraph& layered() {
  static const LayeredGraph* g = new LayeredGraph();  // shared by every variant
  return *g;
}

void set_counters(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations());  // first runs (or runs)
  state.counters["nodes"] = kNodes;
}

std::unique_ptr<Session> new_session(const Graph& g) {
  return std::move(Session::create(g).value());
}

void BM_FirstRun1000_NewSignature(benchmark::State& state) {
  const LayeredGraph& lg = layered();
  std::vector<std::vector<TensorRef>> fetch_lists;
  for (const Output& c : lg.consts) fetch_lists.push_back({lg.final, c});
  std::unique_ptr<Session> session;
  std::size_t next = fetch_lists.size();
  Result<std::vector<Tensor>> out = std::vector<Tensor>{};
  for (auto _ : state) {
    if (next == fetch_lists.size()) {
      state.PauseTiming();
      session.reset();
      session = new_session(lg.g);
      check_ok(session->run({}, {lg.final}).status(), "kernel warm-up");  // its own signature
      next = 0;
      state.ResumeTiming();
    }
    out = session->run({}, fetch_lists[next++]);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  set_counters(state);
}
BENCHMARK(BM_FirstRun1000_NewSignature)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_FirstRun1000_FreshSession(benchmark::State& state) {
  const LayeredGraph& lg = layered();
  const std::vector<TensorRef> fetches{lg.final};
  Result<std::vector<Tensor>> out = std::vector<Tensor>{};
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Session> session = new_session(lg.g);
    state.ResumeTiming();
    out = session->run({}, fetches);
    benchmark::DoNotOptimize(out);
    state.PauseTiming();
    session.reset();
    state.ResumeTiming();
  }
  check_ok(out.status(), "run");
  set_counters(state);
}
BENCHMARK(BM_FirstRun1000_FreshSession)->UseRealTime()->Unit(benchmark::kMicrosecond);

template <bool kWithLayout>
void raw_first_run(benchmark::State& state) {
  const LayeredGraph& lg = layered();
  KernelTable kernels(lg.g);
  const std::array<Output, 1> fetch_outputs{lg.final};
  RawLayout layout = RawLayout::make(lg.g, kernels, {}, fetch_outputs, {});
  tbb::task_arena arena(session_threads());
  arena.initialize();
  std::array<Tensor, 1> fetches;
  bool ok = true;
  // Built graphs are kept, 100 at a time, as a session keeps its compiled
  // signatures: the heap grows the same way in both variants.
  std::vector<std::unique_ptr<RawLayout>> layouts;
  std::vector<std::unique_ptr<RawFlowGraph>> built;
  auto clear = [&] {
    arena.execute([&] { built.clear(); });
    layouts.clear();
  };
  for (auto _ : state) {
    if (built.size() == kWidth) {
      state.PauseTiming();
      clear();
      state.ResumeTiming();
    }
    arena.execute([&] {
      const RawLayout* use = &layout;
      if constexpr (kWithLayout) {
        layouts.push_back(
            std::make_unique<RawLayout>(RawLayout::make(lg.g, kernels, {}, fetch_outputs, {})));
        use = layouts.back().get();
      }
      built.push_back(std::make_unique<RawFlowGraph>(*use, tbb_runtime()));
      ok &= built.back()->run_here({}, fetches);
    });
    benchmark::DoNotOptimize(fetches);
  }
  clear();
  if (!ok) state.SkipWithError("kernel failed");
  set_counters(state);
}
void BM_FirstRun1000_RawFlowGraph(benchmark::State& state) { raw_first_run<false>(state); }
void BM_FirstRun1000_RawFlowGraphFromGraph(benchmark::State& state) { raw_first_run<true>(state); }
BENCHMARK(BM_FirstRun1000_RawFlowGraph)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FirstRun1000_RawFlowGraphFromGraph)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_FirstRun1000_WarmSession(benchmark::State& state) {
  const LayeredGraph& lg = layered();
  auto session = new_session(lg.g);
  const std::vector<TensorRef> fetches{lg.final};
  Result<std::vector<Tensor>> out = session->run({}, fetches);
  for (auto _ : state) {
    out = session->run({}, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  set_counters(state);
}
BENCHMARK(BM_FirstRun1000_WarmSession)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_FirstRun1000_WarmCallable(benchmark::State& state) {
  const LayeredGraph& lg = layered();
  auto session = new_session(lg.g);
  Result<Callable> callable = session->make_callable({}, {lg.final});
  check_ok(callable.status(), "make_callable");
  std::array<Tensor, 1> fetches;
  Status s = callable->run({}, fetches);
  for (auto _ : state) {
    s = callable->run({}, fetches);
    benchmark::DoNotOptimize(s);
  }
  check_ok(s, "run");
  set_counters(state);
}
BENCHMARK(BM_FirstRun1000_WarmCallable)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_FirstRun1000_WarmRawFlowGraph(benchmark::State& state) {
  const LayeredGraph& lg = layered();
  KernelTable kernels(lg.g);
  const std::array<Output, 1> fetch_outputs{lg.final};
  RawLayout layout = RawLayout::make(lg.g, kernels, {}, fetch_outputs, {});
  tbb::task_arena arena(session_threads());
  std::unique_ptr<RawFlowGraph> raw;
  arena.execute([&] { raw = std::make_unique<RawFlowGraph>(layout, tbb_runtime()); });
  std::array<Tensor, 1> fetches;
  bool ok = raw->run(arena, {}, fetches);
  for (auto _ : state) {
    ok &= raw->run(arena, {}, fetches);
    benchmark::DoNotOptimize(fetches);
  }
  if (!ok) state.SkipWithError("kernel failed");
  arena.execute([&] { raw.reset(); });
  set_counters(state);
}
BENCHMARK(BM_FirstRun1000_WarmRawFlowGraph)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace graphrun::bench
