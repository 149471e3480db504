// Asynchronous calls against blocking ones, same process, same session.
//
// Batch_*: every client thread (1, 2, 4, 8) issues a batch of 64 calls and
// waits for the batch; the time column is wall time per call (all threads).
// Blocking variants run the 64 calls one after another on the thread (the
// baseline); Async variants issue the 64 with run_async and wait on a
// latch. Two graphs:
// - Small: the 10-node small graph (cheap built-in kernels: the plan runs
//   inline on the caller, so an async call granted at once runs there);
// - Calls: a diamond of 8 `ops::Call` nodes with default attributes (a
//   user's own node type), each adding 1 to its input: measured cheap, so
//   after the plan's first steps they run inline too.
//
// InFlight1000: 1000 run_async calls at once of a step whose one `Call`
// node sleeps 2 ms, on a 2-thread pool: the pool's capacity is 1000
// steps/s. Counters: steps_per_s, capacity (steps_per_s / 1000), the
// process's thread count while the 1000 are pending (threads, against
// threads_idle before), p50_ms / p99_ms latency from call to done.
#include <benchmark/benchmark.h>

#include <graphrun/graphrun.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/common/raw_graph.h"
#include "bench/common/small_graph.h"
#include "tests/testing/process.h"

namespace graphrun::bench {
namespace {

constexpr int kBatch = 64;

// A diamond of Call nodes: in -> a -> (b1..b6) -> sum of the six.
struct CallGraph {
  Graph g;
  Output x;
  Output out;
  CallGraph() {
    x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
    auto add_one = [](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
      float sum = 0.0f;
      for (const Tensor& t : in) sum += t.scalar<float>();
      return std::vector<Tensor>{Tensor(sum + 1.0f)};
    };
    Output a = ops::Call(g, {x}, {DType::kFloat32}, add_one, {}, "a")[0];
    std::vector<Output> mids;
    for (int i = 0; i < 6; ++i) mids.push_back(ops::Call(g, {a}, {DType::kFloat32}, add_one)[0]);
    out = ops::Call(g, mids, {DType::kFloat32}, add_one, {}, "out")[0];
  }
};

struct Shared {
  SmallGraph sg;
  CallGraph cg;
  std::unique_ptr<Session> session;
  std::unique_ptr<Session> calls;
  std::unique_ptr<Callable> small;
  std::unique_ptr<Callable> diamond;
  Shared() {
    session = Session::create(sg.g).value();
    calls = Session::create(cg.g).value();
    small = std::make_unique<Callable>(session->make_callable({sg.x, sg.y}, {sg.j}).value());
    diamond = std::make_unique<Callable>(calls->make_callable({cg.x}, {cg.out}).value());
  }
  static Shared& get() {
    static Shared shared;
    return shared;
  }
};

void run_blocking(benchmark::State& state, Callable& c, std::vector<Tensor> feeds) {
  std::vector<Tensor> out(c.num_fetches());
  Status st;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) st = c.run(feeds, out);
    benchmark::DoNotOptimize(out);
  }
  check_ok(st, "run");
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void run_async(benchmark::State& state, Callable& c, const std::vector<Tensor>& feeds) {
  std::atomic<int> errors{0};
  for (auto _ : state) {
    std::latch done(kBatch);
    for (int i = 0; i < kBatch; ++i) {
      c.run_async(feeds, [&](Result<std::vector<Tensor>> r, RunMetadata*) {
        if (!r.is_ok()) errors.fetch_add(1, std::memory_order_relaxed);
        done.count_down();
      });
    }
    done.wait();
  }
  if (errors.load() != 0) state.SkipWithError("an async call failed");
  state.SetItemsProcessed(state.iterations() * kBatch);
}

void BM_Batch_SmallBlocking(benchmark::State& state) {
  Shared& s = Shared::get();
  run_blocking(state, *s.small, {Tensor(1.5f), Tensor(2.0f)});
}
void BM_Batch_SmallAsync(benchmark::State& state) {
  Shared& s = Shared::get();
  run_async(state, *s.small, {Tensor(1.5f), Tensor(2.0f)});
}
void BM_Batch_CallsBlocking(benchmark::State& state) {
  Shared& s = Shared::get();
  run_blocking(state, *s.diamond, {Tensor(1.0f)});
}
void BM_Batch_CallsAsync(benchmark::State& state) {
  Shared& s = Shared::get();
  run_async(state, *s.diamond, {Tensor(1.0f)});
}

void batch_threads(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2, 4, 8}) b->Threads(t);
  b->UseRealTime();
}
BENCHMARK(BM_Batch_SmallBlocking)->Apply(batch_threads);
BENCHMARK(BM_Batch_SmallAsync)->Apply(batch_threads);
BENCHMARK(BM_Batch_CallsBlocking)->Apply(batch_threads);
BENCHMARK(BM_Batch_CallsAsync)->Apply(batch_threads);

void BM_InFlight1000(benchmark::State& state) {
  constexpr int kCalls = 1000;
  constexpr auto kStep = std::chrono::milliseconds(2);
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Call(
      g, {x}, {DType::kFloat32},
      [kStep](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
        std::this_thread::sleep_for(kStep);
        return std::vector<Tensor>{in[0]};
      },
      {}, "sleep")[0];
  SessionOptions options;
  options.inter_op_threads = 2;
  auto session = Session::create(g, options).value();
  Callable c = session->make_callable({x}, {y}).value();
  std::vector<Tensor> warm(1);
  check_ok(c.run(std::vector<Tensor>{Tensor(1.0f)}, warm), "warm-up run");
  const int idle_threads = testing::process_thread_count();
  std::vector<double> latencies_ms;
  int peak_threads = 0;
  std::atomic<int> errors{0};
  double seconds = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    std::vector<double> lat(kCalls);
    std::latch done(kCalls);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      const auto start = std::chrono::steady_clock::now();
      c.run_async({Tensor(1.0f)}, [&, i, start](Result<std::vector<Tensor>> r, RunMetadata*) {
        if (!r.is_ok()) errors.fetch_add(1, std::memory_order_relaxed);
        lat[static_cast<std::size_t>(i)] =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        done.count_down();
      });
    }
    peak_threads = std::max(peak_threads, testing::process_thread_count());
    done.wait();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    steps += kCalls;
    latencies_ms.insert(latencies_ms.end(), lat.begin(), lat.end());
  }
  if (errors.load() != 0) state.SkipWithError("an async call failed");
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    return latencies_ms[static_cast<std::size_t>(p * static_cast<double>(latencies_ms.size() - 1))];
  };
  const double rate = static_cast<double>(steps) / seconds;
  state.counters["steps_per_s"] = rate;
  state.counters["capacity"] = rate / (2.0 * 1000.0 / static_cast<double>(kStep.count()));
  state.counters["threads_idle"] = idle_threads;
  state.counters["threads"] = peak_threads;
  state.counters["p50_ms"] = pct(0.5);
  state.counters["p99_ms"] = pct(0.99);
}
BENCHMARK(BM_InFlight1000)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace graphrun::bench
