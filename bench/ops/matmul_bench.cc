// Case 4: 64 independent 256x256 float MatMuls summed into one fetched
// tensor. Measures how much of the machine a Session uses on a wide graph
// of heavy kernels (inter-op parallelism plus MatMul's intra-op
// parallel_for), against the same Eigen products in a plain loop.
//
// Graph (143 nodes): 8 Consts A0..A7 and 8 Consts B0..B7 of random
// [256,256] floats; P(i,j) = MatMul(Ai, Bj) for all 64 pairs; a balanced
// tree of 63 Adds over the 64 products, fetched.
//
// Variants:
//   _Session         Session::run (default options: one thread per core).
//   _Session1Thread  inter_op_threads = 1: the scheduler's overhead without
//                    parallel speedup.
//   _RawFlowGraph    a prebuilt tbb::flow::graph running the same kernels
//                    (same intra-op parallel_for) in an arena of the same size.
//   _RawFlowGraphNoIntraOp  the same, each kernel's parallel_for inline:
//                    inter-op parallelism only.
//   _Sequential      the same kernels' GEMM (on B0..B7 packed once, as
//                    the MatMul kernel keeps Const operands) and Add of the
//                    chosen instruction-set level (ops/cpu), called in a loop
//                    on one thread: the fastest plain form of the work.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <graphrun/graphrun.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>

#include "bench/common/raw_graph.h"
#include "ops/cpu/kernels.h"

namespace graphrun::bench {
namespace {

constexpr int64_t kDim = 256;
constexpr int kSide = 8;  // 8 x 8 = 64 products
constexpr int kProducts = kSide * kSide;
constexpr double kFlopsPerRun =
    2.0 * kDim * kDim * kDim * kProducts + static_cast<double>(kDim * kDim) * (kProducts - 1);

Tensor random_matrix(std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(kDim * kDim));
  for (float& v : values) v = dist(rng);
  return Tensor::from_span(Shape{kDim, kDim}, std::span<const float>(values));
}

struct MatMulGraph {
  std::vector<Tensor> a, b;
  Graph g;
  Output sum;

  MatMulGraph() {
    std::mt19937 rng(7);
    for (int i = 0; i < kSide; ++i) a.push_back(random_matrix(rng));
    for (int i = 0; i < kSide; ++i) b.push_back(random_matrix(rng));
    std::vector<Output> ca, cb;
    for (int i = 0; i < kSide; ++i)
      ca.push_back(ops::Const(g, a[static_cast<std::size_t>(i)], fmt::format("A{}", i)));
    for (int i = 0; i < kSide; ++i)
      cb.push_back(ops::Const(g, b[static_cast<std::size_t>(i)], fmt::format("B{}", i)));
    std::vector<Output> level;
    for (int i = 0; i < kSide; ++i) {
      for (int j = 0; j < kSide; ++j) {
        level.push_back(ops::MatMul(g, ca[static_cast<std::size_t>(i)],
                                    cb[static_cast<std::size_t>(j)], {},
                                    fmt::format("P{}_{}", i, j)));
      }
    }
    while (level.size() > 1) {
      std::vector<Output> next;
      for (std::size_t k = 0; k + 1 < level.size(); k += 2)
        next.push_back(ops::Add(g, level[k], level[k + 1]));
      level = std::move(next);
    }
    sum = level[0];
    check_ok(g.status(), "building the matmul graph");
  }
};

const MatMulGraph& matmul_graph() {
  static const MatMulGraph* g = new MatMulGraph();
  return *g;
}

using PackedBs = std::vector<std::unique_ptr<cpu::PackedGemmB<float>>>;

// B0..B7 packed once for the chosen level's GEMM, as the MatMul kernel
// keeps a Const operand.
PackedBs pack_bs(const MatMulGraph& mg) {
  PackedBs packed;
  for (const Tensor& b : mg.b) {
    packed.push_back(
        cpu::kernels().f32.pack_b(b.flat<float>().data(), kDim, false, kDim, kDim, kDim, 0));
  }
  return packed;
}

// The reference result, computed sequentially (packed == nullptr); also the
// Sequential body: the MatMul kernel's GEMM on the packed Bs and the Add
// kernel's loop of the chosen level (cpu::kernels()), called directly in a
// loop on one thread.
Tensor sequential_sum(const MatMulGraph& mg, const PackedBs* packed) {
  const cpu::TypedKernels<float>& k = cpu::kernels().f32;
  std::vector<Tensor> level;
  level.reserve(kProducts);
  for (int i = 0; i < kSide; ++i) {
    for (int j = 0; j < kSide; ++j) {
      Tensor p = Tensor::allocate_uninitialized(DType::kFloat32, Shape{kDim, kDim}).value();
      cpu::GemmArgs<float> g;
      g.a = mg.a[static_cast<std::size_t>(i)].flat<float>().data();
      g.b = mg.b[static_cast<std::size_t>(j)].flat<float>().data();
      g.c = p.flat<float>().data();
      g.lda = g.ldb = g.ldc = g.m = g.n = g.k = kDim;
      if (packed != nullptr) {
        const cpu::PackedGemmB<float>& b = *(*packed)[static_cast<std::size_t>(j)];
        k.gemm_packed(g, b, 0, kDim, 0, b.blocks());
      } else {
        k.gemm(g, 0, kDim, 0, kDim);
      }
      level.push_back(std::move(p));
    }
  }
  while (level.size() > 1) {
    std::vector<Tensor> next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2) {
      Tensor s = Tensor::allocate_uninitialized(DType::kFloat32, Shape{kDim, kDim}).value();
      k.binary(cpu::BinaryOp::kAdd, cpu::Operands::kBothVectors, level[i].flat<float>().data(),
               level[i + 1].flat<float>().data(), s.flat<float>().data(), kDim * kDim);
      next.push_back(std::move(s));
    }
    level = std::move(next);
  }
  return level[0];
}

void check_result(benchmark::State& state, const Tensor& t) {
  static const Tensor* expected = new Tensor(sequential_sum(matmul_graph(), nullptr));
  if (!t.is_initialized() || !t.all_close(*expected, 1e-3, 1e-3))
    state.SkipWithError("wrong result");
}

void set_counters(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations() * kProducts);  // MatMuls
  state.counters["GFLOPS"] =
      benchmark::Counter(kFlopsPerRun * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["nodes"] = static_cast<double>(matmul_graph().g.num_nodes());
}

void session_bench(benchmark::State& state, int threads) {
  const MatMulGraph& mg = matmul_graph();
  SessionOptions options;
  options.inter_op_threads = threads;
  auto session = std::move(Session::create(mg.g, options).value());
  const std::vector<TensorRef> fetches{mg.sum};
  Result<std::vector<Tensor>> out = session->run({}, fetches);
  check_ok(out.status(), "warm-up run");
  for (auto _ : state) {
    out = session->run({}, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  check_result(state, (*out)[0]);
  state.counters["threads"] = threads == 0 ? session_threads() : threads;
  set_counters(state);
}
void BM_MatMul64_Session(benchmark::State& state) { session_bench(state, 0); }
void BM_MatMul64_Session1Thread(benchmark::State& state) { session_bench(state, 1); }
BENCHMARK(BM_MatMul64_Session)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MatMul64_Session1Thread)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

void raw_flow_graph(benchmark::State& state, KernelRuntime runtime) {
  const MatMulGraph& mg = matmul_graph();
  KernelTable kernels(mg.g);
  const std::array<Output, 1> fetch_outputs{mg.sum};
  RawLayout layout = RawLayout::make(mg.g, kernels, {}, fetch_outputs, {});
  tbb::task_arena arena(session_threads());
  std::unique_ptr<RawFlowGraph> raw;
  arena.execute([&] { raw = std::make_unique<RawFlowGraph>(layout, runtime); });
  std::array<Tensor, 1> fetches;
  bool ok = raw->run(arena, {}, fetches);
  for (auto _ : state) {
    ok &= raw->run(arena, {}, fetches);
    benchmark::DoNotOptimize(fetches);
  }
  if (!ok) state.SkipWithError("kernel failed");
  check_result(state, fetches[0]);
  arena.execute([&] { raw.reset(); });
  state.counters["threads"] = session_threads();
  set_counters(state);
}
void BM_MatMul64_RawFlowGraph(benchmark::State& state) { raw_flow_graph(state, tbb_runtime()); }
// Inter-op parallelism only: each kernel's parallel_for runs inline (one
// Eigen call per product), as if MatMulOp did not split.
void BM_MatMul64_RawFlowGraphNoIntraOp(benchmark::State& state) {
  raw_flow_graph(state, serial_runtime());
}
BENCHMARK(BM_MatMul64_RawFlowGraph)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_MatMul64_RawFlowGraphNoIntraOp)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

void BM_MatMul64_Sequential(benchmark::State& state) {
  const MatMulGraph& mg = matmul_graph();
  const PackedBs packed = pack_bs(mg);
  Tensor out;
  for (auto _ : state) {
    out = sequential_sum(mg, &packed);
    benchmark::DoNotOptimize(out);
  }
  check_result(state, out);
  state.counters["threads"] = 1;
  set_counters(state);
}
BENCHMARK(BM_MatMul64_Sequential)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace
}  // namespace graphrun::bench
