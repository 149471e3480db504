// Partial runs (issue 3): what one execution spread over calls saves, and
// what a partial_run call costs against a run.
//
// PartialSeed: the seed example with a dominant first stage,
//   r1 = expensive(x)   (4 dense layers, 128x256 by 256x256)
//   r2 = Sum(Tanh(r1))  (cheap)
// fetched one after the other: two runs execute `expensive` twice, one
// partial run (setup, feed x fetch r1, fetch r2) once. Target: >= 1.8x.
//
// PartialSmall: bench/scheduler/small_graph_bench.cc's 10-node graph. A
// partial run's setup plus one call feeding both placeholders and fetching
// the output, against Session::run (target <= 2x); setup (+ cancel) alone;
// and a cold run (new session, first run) for scale.
#include <benchmark/benchmark.h>

#include <graphrun/graphrun.h>

#include "bench/common/raw_graph.h"
#include "bench/common/small_graph.h"

namespace graphrun::bench {
namespace {

struct SeedModel {
  Graph g;
  Output x, r1, r2;
  SeedModel() {
    g.set_seed(1);
    x = ops::Placeholder(g, DType::kFloat32, Shape{128, 256}, "x");
    Output h = x;
    for (int i = 0; i < 4; ++i) {
      Output w = ops::Const(g, Tensor::filled<float>(Shape{256, 256}, 1.0f / 256.0f),
                            fmt::format("w{}", i));
      h = ops::Relu(g, ops::MatMul(g, h, w));
    }
    r1 = ops::Identity(g, h, "r1");
    r2 = ops::Sum(g, ops::Tanh(g, r1), {0, 1}, false, "r2");
    check_ok(g.status(), "building the seed model");
  }
};

void BM_PartialSeed_TwoRuns(benchmark::State& state) {
  SeedModel m;
  auto session = std::move(Session::create(m.g).value());
  const Tensor x = Tensor::filled<float>(Shape{128, 256}, 0.5f);
  check_ok(session->run({{m.x, x}}, {m.r1}).status(), "warm-up");
  check_ok(session->run({{m.x, x}}, {m.r2}).status(), "warm-up");
  for (auto _ : state) {
    auto a = session->run({{m.x, x}}, {m.r1});
    auto b = session->run({{m.x, x}}, {m.r2});
    if (!a.is_ok() || !b.is_ok()) state.SkipWithError("run failed");
    benchmark::DoNotOptimize(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSeed_TwoRuns)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_PartialSeed_PartialRun(benchmark::State& state) {
  SeedModel m;
  auto session = std::move(Session::create(m.g).value());
  const Tensor x = Tensor::filled<float>(Shape{128, 256}, 0.5f);
  for (auto _ : state) {
    auto h = session->partial_run_setup({m.r1, m.r2}, {m.x});
    if (!h.is_ok()) {
      state.SkipWithError("setup failed");
      break;
    }
    auto a = session->partial_run(*h, {{m.x, x}}, {m.r1});
    auto b = session->partial_run(*h, {}, {m.r2});
    if (!a.is_ok() || !b.is_ok()) state.SkipWithError("partial run failed");
    benchmark::DoNotOptimize(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSeed_PartialRun)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_PartialSmall_Run(benchmark::State& state) {
  SmallGraph m;
  auto session = std::move(Session::create(m.g).value());
  const FeedList feeds{{"x", Tensor(1.5f)}, {"y", Tensor(2.0f)}};
  const std::vector<TensorRef> fetches{"j"};
  check_ok(session->run(feeds, fetches).status(), "warm-up");
  for (auto _ : state) {
    auto out = session->run(feeds, fetches);
    if (!out.is_ok()) state.SkipWithError("run failed");
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSmall_Run)->UseRealTime();

void BM_PartialSmall_SetupAndCall(benchmark::State& state) {
  SmallGraph m;
  auto session = std::move(Session::create(m.g).value());
  const FeedList feeds{{"x", Tensor(1.5f)}, {"y", Tensor(2.0f)}};
  const std::vector<TensorRef> fetches{"j"};
  const std::vector<TensorRef> feed_names{"x", "y"};
  for (auto _ : state) {
    auto h = session->partial_run_setup(fetches, feed_names);
    if (!h.is_ok()) {
      state.SkipWithError("setup failed");
      break;
    }
    auto out = session->partial_run(*h, feeds, fetches);
    if (!out.is_ok()) state.SkipWithError("call failed");
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSmall_SetupAndCall)->UseRealTime();

// Two calls: feed x, then feed y and fetch j.
void BM_PartialSmall_SetupAndTwoCalls(benchmark::State& state) {
  SmallGraph m;
  auto session = std::move(Session::create(m.g).value());
  const std::vector<TensorRef> fetches{"j"};
  const std::vector<TensorRef> feed_names{"x", "y"};
  const FeedList first{{"x", Tensor(1.5f)}};
  const FeedList second{{"y", Tensor(2.0f)}};
  for (auto _ : state) {
    auto h = session->partial_run_setup(fetches, feed_names);
    if (!h.is_ok()) {
      state.SkipWithError("setup failed");
      break;
    }
    auto a = session->partial_run(*h, first, {});
    auto out = session->partial_run(*h, second, fetches);
    if (!a.is_ok() || !out.is_ok()) state.SkipWithError("call failed");
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSmall_SetupAndTwoCalls)->UseRealTime();

void BM_PartialSmall_SetupAndCancel(benchmark::State& state) {
  SmallGraph m;
  auto session = std::move(Session::create(m.g).value());
  const std::vector<TensorRef> fetches{"j"};
  const std::vector<TensorRef> feed_names{"x", "y"};
  for (auto _ : state) {
    auto h = session->partial_run_setup(fetches, feed_names);
    if (!h.is_ok()) {
      state.SkipWithError("setup failed");
      break;
    }
    // The handle's destruction cancels and drains the run.
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSmall_SetupAndCancel)->UseRealTime();

void BM_PartialSmall_ColdRun(benchmark::State& state) {
  SmallGraph m;
  const FeedList feeds{{"x", Tensor(1.5f)}, {"y", Tensor(2.0f)}};
  const std::vector<TensorRef> fetches{"j"};
  for (auto _ : state) {
    auto session = std::move(Session::create(m.g).value());
    auto out = session->run(feeds, fetches);
    if (!out.is_ok()) state.SkipWithError("run failed");
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PartialSmall_ColdRun)->UseRealTime();

}  // namespace
}  // namespace graphrun::bench
