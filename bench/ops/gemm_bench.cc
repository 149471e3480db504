// One MatMul, one thread, against the fastest plain form of the same work:
// OpenBLAS's single-threaded sgemm (Debian's libopenblas-serial-dev, a
// bench-only dependency). Shapes: 256x256x256 and the seed model's
// [64,256]x[256,256]. docs/kernels.md has the plan these figures measure.
//
// Variants (BM_Gemm<M>x<K>x<N>_<Variant>):
//   _Callable   graphrun's MatMul op through a prepared Callable on a
//               1-thread session (what a user's graph runs), at the level
//               chosen for this CPU (or GRAPHRUN_CPU_ISA).
//   _Baseline, _Avx2, _Avx512
//               the MatMul kernel's GEMM of one level, called directly
//               through that level's table (skipped when the CPU lacks it).
//   _OpenBlas   cblas_sgemm, row-major, the same inputs.
// Counters: GFLOP/s (2*M*K*N per iteration).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <graphrun/graphrun.h>

#include <random>
#include <vector>

#include "ops/cpu/kernels.h"

namespace graphrun::bench {
namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return Tensor::from_span(Shape{rows, cols}, std::span<const float>(values));
}

void set_flops(benchmark::State& state, int64_t m, int64_t k, int64_t n) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(m * k * n) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void gemm_callable(benchmark::State& state, int64_t m, int64_t k, int64_t n) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{m, k}, "a");
  Output b = ops::Placeholder(g, DType::kFloat32, Shape{k, n}, "b");
  Output c = ops::MatMul(g, a, b, {}, "c");
  SessionOptions options;
  options.inter_op_threads = 1;
  auto session = Session::create(g, options).value();
  Callable callable = session->make_callable({a, b}, {c}).value();
  const Tensor feeds[] = {random_matrix(m, k, 1), random_matrix(k, n, 2)};
  Tensor out[1];
  for (auto _ : state) {
    if (!callable.run(feeds, out).is_ok()) state.SkipWithError("run failed");
    benchmark::DoNotOptimize(out[0].raw_data());
  }
  set_flops(state, m, k, n);
}

void gemm_level(benchmark::State& state, CpuIsa isa, int64_t m, int64_t k, int64_t n) {
  const cpu::KernelTable* table = cpu::kernels_for(isa);
  if (table == nullptr || static_cast<int>(isa) > static_cast<int>(cpu_isa_supported())) {
    state.SkipWithError("this CPU lacks the level");
    return;
  }
  const Tensor a = random_matrix(m, k, 1);
  const Tensor b = random_matrix(k, n, 2);
  Tensor c = Tensor::allocate_uninitialized(DType::kFloat32, Shape{m, n}).value();
  cpu::GemmArgs<float> g;
  g.a = a.flat<float>().data();
  g.lda = k;
  g.b = b.flat<float>().data();
  g.ldb = n;
  g.c = c.flat<float>().data();
  g.ldc = n;
  g.m = m;
  g.n = n;
  g.k = k;
  for (auto _ : state) {
    table->f32.gemm(g, 0, m, 0, n);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_flops(state, m, k, n);
}

void gemm_openblas(benchmark::State& state, int64_t m, int64_t k, int64_t n) {
  const Tensor a = random_matrix(m, k, 1);
  const Tensor b = random_matrix(k, n, 2);
  Tensor c = Tensor::allocate_uninitialized(DType::kFloat32, Shape{m, n}).value();
  const auto mi = static_cast<blasint>(m);
  const auto ki = static_cast<blasint>(k);
  const auto ni = static_cast<blasint>(n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mi, ni, ki, 1.0f, a.flat<float>().data(),
                ki, b.flat<float>().data(), ni, 0.0f, c.flat<float>().data(), ni);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_flops(state, m, k, n);
}

#define GRAPHRUN_GEMM_BENCH(M, K, N)                                                         \
  void BM_Gemm##M##x##K##x##N##_Callable(benchmark::State& s) { gemm_callable(s, M, K, N); } \
  void BM_Gemm##M##x##K##x##N##_Baseline(benchmark::State& s) {                              \
    gemm_level(s, CpuIsa::kBaseline, M, K, N);                                               \
  }                                                                                          \
  void BM_Gemm##M##x##K##x##N##_Avx2(benchmark::State& s) {                                  \
    gemm_level(s, CpuIsa::kAvx2, M, K, N);                                                   \
  }                                                                                          \
  void BM_Gemm##M##x##K##x##N##_Avx512(benchmark::State& s) {                                \
    gemm_level(s, CpuIsa::kAvx512, M, K, N);                                                 \
  }                                                                                          \
  void BM_Gemm##M##x##K##x##N##_OpenBlas(benchmark::State& s) { gemm_openblas(s, M, K, N); } \
  BENCHMARK(BM_Gemm##M##x##K##x##N##_Callable)->Unit(benchmark::kMicrosecond);               \
  BENCHMARK(BM_Gemm##M##x##K##x##N##_Baseline)->Unit(benchmark::kMicrosecond);               \
  BENCHMARK(BM_Gemm##M##x##K##x##N##_Avx2)->Unit(benchmark::kMicrosecond);                   \
  BENCHMARK(BM_Gemm##M##x##K##x##N##_Avx512)->Unit(benchmark::kMicrosecond);                 \
  BENCHMARK(BM_Gemm##M##x##K##x##N##_OpenBlas)->Unit(benchmark::kMicrosecond);

GRAPHRUN_GEMM_BENCH(256, 256, 256)
GRAPHRUN_GEMM_BENCH(64, 256, 256)
#undef GRAPHRUN_GEMM_BENCH

}  // namespace
}  // namespace graphrun::bench
