// Case 1: a small scalar graph, 10 arithmetic nodes over 2 fed placeholders,
// one fetch. Measures the fixed per-run cost of Session::run and of a
// prepared Callable against a prebuilt raw tbb::flow::graph.
//
//   a = x + y        b = x * y
//   c = a - b        d = -a        e = b^2
//   f = c * d        g = e + c
//   h = f - g        i = h^2       j = i + f   (fetched)
//
// The placeholders are cut from the plan by their feeds, so every variant
// runs the same 10 nodes (13 edges, roots a and b).
#include <benchmark/benchmark.h>

#include <graphrun/graphrun.h>

#include <array>
#include <cmath>
#include <memory>

#include "bench/common/raw_graph.h"
#include "bench/common/small_graph.h"

namespace graphrun::bench {
namespace {

constexpr int kNodes = 10;
constexpr float kX = 1.5f;
constexpr float kY = 2.0f;

// The expected value of j, computed in plain floats.
float expected_j(float x, float y) {
  const float a = x + y, b = x * y;
  const float c = a - b, d = -a, e = b * b;
  const float f = c * d, g = e + c;
  const float h = f - g, i = h * h;
  return i + f;
}

void check_value(benchmark::State& state, const Tensor& t) {
  if (!t.is_initialized() || t.scalar<float>() != expected_j(kX, kY)) {
    state.SkipWithError("wrong result");
  }
}

void set_counters(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations());  // runs
  state.counters["nodes"] = kNodes;
}

// Session::run with string names, feeds and fetch lists built once.
void BM_SmallGraph_Session(benchmark::State& state) {
  SmallGraph sg;
  auto session = std::move(Session::create(sg.g).value());
  const FeedList feeds{{"x", Tensor(kX)}, {"y", Tensor(kY)}};
  const std::vector<TensorRef> fetches{"j"};
  Result<std::vector<Tensor>> out = session->run(feeds, fetches);  // compiles the plan
  check_ok(out.status(), "warm-up run");
  for (auto _ : state) {
    out = session->run(feeds, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  check_value(state, (*out)[0]);
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_Session)->UseRealTime();

// Session::run naming tensors by Output (no name parsing or lookup).
void BM_SmallGraph_SessionOutputs(benchmark::State& state) {
  SmallGraph sg;
  auto session = std::move(Session::create(sg.g).value());
  const FeedList feeds{{sg.x, Tensor(kX)}, {sg.y, Tensor(kY)}};
  const std::vector<TensorRef> fetches{sg.j};
  Result<std::vector<Tensor>> out = session->run(feeds, fetches);
  check_ok(out.status(), "warm-up run");
  for (auto _ : state) {
    out = session->run(feeds, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  check_value(state, (*out)[0]);
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_SessionOutputs)->UseRealTime();

// A prepared Callable: positional feeds and fetches, no lookups.
void BM_SmallGraph_Callable(benchmark::State& state) {
  SmallGraph sg;
  auto session = std::move(Session::create(sg.g).value());
  Result<Callable> callable = session->make_callable({"x", "y"}, {"j"});
  check_ok(callable.status(), "make_callable");
  const std::array<Tensor, 2> feeds{Tensor(kX), Tensor(kY)};
  std::array<Tensor, 1> fetches;
  Status s;
  for (auto _ : state) {
    s = callable->run(feeds, fetches);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(fetches);
  }
  check_ok(s, "run");
  check_value(state, fetches[0]);
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_Callable)->UseRealTime();

// Baseline (a): a prebuilt tbb::flow::graph running the same OpKernels on a
// slot array, built and triggered inside a task_arena of the session's size.
void BM_SmallGraph_RawFlowGraph(benchmark::State& state) {
  SmallGraph sg;
  KernelTable kernels(sg.g);
  RawLayout layout = sg.raw_layout(kernels);
  if (layout.items.size() != kNodes) state.SkipWithError("layout size");
  tbb::task_arena arena(session_threads());
  std::unique_ptr<RawFlowGraph> raw;
  arena.execute([&] { raw = std::make_unique<RawFlowGraph>(layout, tbb_runtime()); });
  const std::array<Tensor, 2> feeds{Tensor(kX), Tensor(kY)};
  std::array<Tensor, 1> fetches;
  bool ok = true;
  for (auto _ : state) {
    ok &= raw->run(arena, feeds, fetches);
    benchmark::DoNotOptimize(fetches);
  }
  if (!ok) state.SkipWithError("kernel failed");
  check_value(state, fetches[0]);
  arena.execute([&] { raw.reset(); });
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_RawFlowGraph)->UseRealTime();

// The oneTBB floor: the same DAG with plain float bodies (no Tensor, no
// kernel).
void BM_SmallGraph_RawFlowGraphFloat(benchmark::State& state) {
  using NodeT = tbb::flow::continue_node<tbb::flow::continue_msg>;
  using tbb::flow::continue_msg;
  struct Instance {
    std::array<float, 12> v{};  // x, y, a..j
    tbb::task_group_context context{tbb::task_group_context::isolated};
    tbb::flow::graph graph{context};
    std::deque<NodeT> nodes;
  };
  tbb::task_arena arena(session_threads());
  std::unique_ptr<Instance> inst;
  arena.execute([&] {
    inst = std::make_unique<Instance>();
    float* v = inst->v.data();
    enum { X, Y, A, B, C, D, E, F, G, H, I, J };
    auto add = [&](auto fn) {
      return &inst->nodes.emplace_back(inst->graph, [v, fn](const continue_msg&) {
        fn(v);
        return continue_msg();
      });
    };
    NodeT* a = add([](float* p) { p[A] = p[X] + p[Y]; });
    NodeT* b = add([](float* p) { p[B] = p[X] * p[Y]; });
    NodeT* c = add([](float* p) { p[C] = p[A] - p[B]; });
    NodeT* d = add([](float* p) { p[D] = -p[A]; });
    NodeT* e = add([](float* p) { p[E] = p[B] * p[B]; });
    NodeT* f = add([](float* p) { p[F] = p[C] * p[D]; });
    NodeT* g = add([](float* p) { p[G] = p[E] + p[C]; });
    NodeT* h = add([](float* p) { p[H] = p[F] - p[G]; });
    NodeT* i = add([](float* p) { p[I] = p[H] * p[H]; });
    NodeT* j = add([](float* p) { p[J] = p[I] + p[F]; });
    // Same registration order as the scheduler: per node, successors by id.
    using tbb::flow::make_edge;
    make_edge(*a, *c);
    make_edge(*a, *d);
    make_edge(*b, *c);
    make_edge(*b, *e);
    make_edge(*c, *f);
    make_edge(*c, *g);
    make_edge(*d, *f);
    make_edge(*e, *g);
    make_edge(*f, *h);
    make_edge(*f, *j);
    make_edge(*g, *h);
    make_edge(*h, *i);
    make_edge(*i, *j);
  });
  NodeT* a = &inst->nodes[0];
  NodeT* b = &inst->nodes[1];
  for (auto _ : state) {
    arena.execute([&] {
      inst->v[0] = kX;
      inst->v[1] = kY;
      a->try_put(continue_msg());
      b->try_put(continue_msg());
      inst->graph.wait_for_all();
    });
    benchmark::DoNotOptimize(inst->v[11]);
  }
  if (inst->v[11] != expected_j(kX, kY)) state.SkipWithError("wrong result");
  arena.execute([&] { inst.reset(); });
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_RawFlowGraphFloat)->UseRealTime();

// Baseline (b): the same kernels in a plain loop on the caller.
void BM_SmallGraph_Sequential(benchmark::State& state) {
  SmallGraph sg;
  KernelTable kernels(sg.g);
  RawLayout layout = sg.raw_layout(kernels);
  RawSequential seq(layout);
  const std::array<Tensor, 2> feeds{Tensor(kX), Tensor(kY)};
  std::array<Tensor, 1> fetches;
  bool ok = true;
  for (auto _ : state) {
    ok &= seq.run(feeds, fetches);
    benchmark::DoNotOptimize(fetches);
  }
  if (!ok) state.SkipWithError("kernel failed");
  check_value(state, fetches[0]);
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_Sequential)->UseRealTime();

// The arithmetic alone, in plain floats.
void BM_SmallGraph_SequentialFloat(benchmark::State& state) {
  float x = kX, y = kY, j = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(x);
    benchmark::DoNotOptimize(y);
    j = expected_j(x, y);
    benchmark::DoNotOptimize(j);
  }
  set_counters(state);
}
BENCHMARK(BM_SmallGraph_SequentialFloat)->UseRealTime();

}  // namespace
}  // namespace graphrun::bench
