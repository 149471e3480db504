// Concurrency (issue 4): many client threads on one session.
//
// Throughput: the 10-node small graph (bench/common/small_graph.h) run by
// 1, 2, 4, 8 and 32 client threads on ONE shared session, against the same
// threads each re-triggering a private prebuilt tbb::flow::graph (same
// kernels) in one shared arena of the session's size. Google Benchmark
// divides the wall time by the iterations of all threads, so the reported
// time is 1 / throughput and items_per_second is runs/s of all threads.
// Targets: 2 threads >= 1.7x one thread; 32 threads >= 0.9x 8 threads.
// A fourth variant runs the same kernels in a plain loop per thread: the
// machine's own scaling ceiling.
//
// AssignAdd: `AssignAdd(v, 1)` on one shared scalar variable from T
// threads (a prepared Callable with the update as its target), against a
// bare mutex-protected add in a loop.
#include <benchmark/benchmark.h>

#include <graphrun/graphrun.h>

#include <array>
#include <memory>
#include <mutex>

#include "bench/common/raw_graph.h"
#include "bench/common/small_graph.h"

namespace graphrun::bench {
namespace {

constexpr float kX = 1.5f;
constexpr float kY = 2.0f;

// One session for every thread count and thread of the process.
struct SharedSmallSession {
  SmallGraph sg;
  std::unique_ptr<Session> session;
  std::unique_ptr<Callable> callable;
  SharedSmallSession() {
    Result<std::unique_ptr<Session>> s = Session::create(sg.g);
    check_ok(s.status(), "creating the session");
    session = std::move(*s);
    Result<Callable> c = session->make_callable({sg.x, sg.y}, {sg.j});
    check_ok(c.status(), "make_callable");
    callable = std::make_unique<Callable>(std::move(*c));
  }
  static SharedSmallSession& get() {
    static SharedSmallSession shared;
    return shared;
  }
};

const Tensor& expected_value() {
  static const Tensor t = [] {
    SharedSmallSession& s = SharedSmallSession::get();
    Result<std::vector<Tensor>> out =
        s.session->run({{s.sg.x, Tensor(kX)}, {s.sg.y, Tensor(kY)}}, {s.sg.j});
    check_ok(out.status(), "reference run");
    return (*out)[0];
  }();
  return t;
}

void check_value(benchmark::State& state, const Tensor& t) {
  if (!t.is_initialized() || t.scalar<float>() != expected_value().scalar<float>()) {
    state.SkipWithError("wrong result");
  }
}

// Session::run by Output from every thread.
void BM_Throughput_Session(benchmark::State& state) {
  SharedSmallSession& s = SharedSmallSession::get();
  const FeedList feeds{{s.sg.x, Tensor(kX)}, {s.sg.y, Tensor(kY)}};
  const std::vector<TensorRef> fetches{s.sg.j};
  Result<std::vector<Tensor>> out = s.session->run(feeds, fetches);
  for (auto _ : state) {
    out = s.session->run(feeds, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  check_value(state, (*out)[0]);
  state.SetItemsProcessed(state.iterations());
}

// The shared session's Callable from every thread.
void BM_Throughput_Callable(benchmark::State& state) {
  SharedSmallSession& s = SharedSmallSession::get();
  const std::array<Tensor, 2> feeds{Tensor(kX), Tensor(kY)};
  std::array<Tensor, 1> fetches;
  Status st;
  for (auto _ : state) {
    st = s.callable->run(feeds, fetches);
    benchmark::DoNotOptimize(fetches);
  }
  check_ok(st, "callable run");
  check_value(state, fetches[0]);
  state.SetItemsProcessed(state.iterations());
}

// Baseline: every thread its own prebuilt flow graph, all in one arena of
// the session's size.
tbb::task_arena& shared_raw_arena() {
  static tbb::task_arena arena(session_threads());
  return arena;
}

void BM_Throughput_RawFlowGraph(benchmark::State& state) {
  SmallGraph sg;
  KernelTable kernels(sg.g);
  RawLayout layout = sg.raw_layout(kernels);
  tbb::task_arena& arena = shared_raw_arena();
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
  state.SetItemsProcessed(state.iterations());
}

// The machine's own ceiling: every thread runs the same kernels in a plain
// loop (no oneTBB, no graphrun). Its 2-thread / 1-thread ratio bounds what
// any scheduler can reach here (allocator and cache traffic included).
void BM_Throughput_Sequential(benchmark::State& state) {
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
  state.SetItemsProcessed(state.iterations());
}

void throughput_threads(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2, 4, 8, 32}) b->Threads(t);
  b->UseRealTime();
}
BENCHMARK(BM_Throughput_Session)->Apply(throughput_threads);
BENCHMARK(BM_Throughput_Callable)->Apply(throughput_threads);
BENCHMARK(BM_Throughput_RawFlowGraph)->Apply(throughput_threads);
BENCHMARK(BM_Throughput_Sequential)->Apply(throughput_threads);

// ---- AssignAdd on one shared variable ----

struct SharedCounter {
  Graph g;
  std::unique_ptr<Session> session;
  std::unique_ptr<Callable> locked;
  std::unique_ptr<Callable> unlocked;
  Output v;
  SharedCounter() {
    v = ops::Variable(g, Tensor(0.0f), "v");
    Output one = ops::Const(g, Tensor(1.0f), "one");
    Output add = ops::AssignAdd(g, v, one, {}, "add");
    Output add_fast = ops::AssignAdd(g, v, one, {.use_locking = false}, "add_unlocked");
    const Node* init = ops::GlobalVariablesInitializer(g);
    check_ok(g.status(), "building the counter graph");
    Result<std::unique_ptr<Session>> s = Session::create(g);
    check_ok(s.status(), "creating the session");
    session = std::move(*s);
    check_ok(session->run({}, {}, {init}).status(), "initializing");
    Result<Callable> c = session->make_callable({}, {}, {add.node()});
    check_ok(c.status(), "make_callable");
    locked = std::make_unique<Callable>(std::move(*c));
    c = session->make_callable({}, {}, {add_fast.node()});
    check_ok(c.status(), "make_callable");
    unlocked = std::make_unique<Callable>(std::move(*c));
  }
  static SharedCounter& get() {
    static SharedCounter shared;
    return shared;
  }
};

void run_counter(benchmark::State& state, const Callable& update) {
  Status st;
  for (auto _ : state) {
    st = update.run({}, {});
    benchmark::DoNotOptimize(st);
  }
  check_ok(st, "AssignAdd");
  state.SetItemsProcessed(state.iterations());  // updates
}

void BM_AssignAdd_Session(benchmark::State& state) {
  run_counter(state, *SharedCounter::get().locked);
}

// use_locking=false: may lose updates under contention (TF semantics).
void BM_AssignAdd_SessionUnlocked(benchmark::State& state) {
  run_counter(state, *SharedCounter::get().unlocked);
}

// Baseline: a float behind a mutex, incremented in a loop.
void BM_AssignAdd_Mutex(benchmark::State& state) {
  static std::mutex mu;
  static float value = 0;
  for (auto _ : state) {
    std::lock_guard lock(mu);
    value += 1.0f;
    benchmark::DoNotOptimize(value);
  }
  state.SetItemsProcessed(state.iterations());
}

void counter_threads(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2, 4, 8}) b->Threads(t);
  b->UseRealTime();
}
BENCHMARK(BM_AssignAdd_Session)->Apply(counter_threads);
BENCHMARK(BM_AssignAdd_SessionUnlocked)->Apply(counter_threads);
BENCHMARK(BM_AssignAdd_Mutex)->Apply(counter_threads);

}  // namespace
}  // namespace graphrun::bench
