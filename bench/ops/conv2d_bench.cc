// Case 7: one Conv2D node (a ResNet-style 3x3 layer), through a Session
// against the same kernel called in a plain loop, and the kernel against a
// naive seven-loop convolution at a small size.
//
// Workloads:
//   Conv2D       input [4,56,56,64] float, filter [3,3,64,64], SAME,
//                stride 1 (462M multiply-adds, 0.92 GFLOP per run).
//   Conv2DSmall  input [1,28,28,16], filter [3,3,16,16], SAME (1.8M).
//
// Variants:
//   _Session         Session::run of Const -> Conv2D (default options: one
//                    thread per core; the kernel splits batch x output rows
//                    with parallel_for).
//   _Session1Thread  inter_op_threads = 1: the scheduler's overhead without
//                    parallel speedup.
//   _KernelLoop      the same Conv2D kernel (made by the factory a Session
//                    uses) called through an OpKernelContext in a loop on
//                    one thread, parallel_for inline: the baseline.
//   _NaiveLoop       (small only) the definition as seven nested loops.
#include <benchmark/benchmark.h>

#include <graphrun/graphrun.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "bench/common/raw_graph.h"

namespace graphrun::bench {
namespace {

struct ConvShape {
  Shape input;
  Shape filter;
};
const ConvShape kLarge{Shape{4, 56, 56, 64}, Shape{3, 3, 64, 64}};
const ConvShape kSmall{Shape{1, 28, 28, 16}, Shape{3, 3, 16, 16}};

Tensor random_tensor(const Shape& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor t(DType::kFloat32, shape);
  for (float& v : t.flat<float>()) v = dist(rng);
  return t;
}

// SAME, stride 1: the output has the input's spatial size.
double macs(const ConvShape& s) {
  return static_cast<double>(s.input.num_elements() / s.input.dim(3)) *
         static_cast<double>(s.filter.num_elements());
}

struct ConvGraph {
  Tensor input, filter;
  Graph g;
  Output y;

  explicit ConvGraph(const ConvShape& s) {
    std::mt19937 rng(7);
    input = random_tensor(s.input, rng);
    filter = random_tensor(s.filter, rng);
    y = ops::Conv2D(g, ops::Const(g, input, "input"), ops::Const(g, filter, "filter"),
                    {.padding = "SAME"}, "conv");
    check_ok(g.status(), "building the conv graph");
  }
};

const ConvGraph& conv_graph(const ConvShape& s) {
  static const ConvGraph* large = new ConvGraph(kLarge);
  static const ConvGraph* small = new ConvGraph(kSmall);
  return &s == &kLarge ? *large : *small;
}

void set_counters(benchmark::State& state, const ConvShape& s) {
  state.SetItemsProcessed(state.iterations());  // convolutions
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * macs(s) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The kernel once, as a node body does, with parallel_for inline.
Tensor run_kernel(const ConvGraph& cg, OpKernel& kernel) {
  static const KernelRuntime runtime = serial_runtime();
  const Tensor slots[2] = {cg.input, cg.filter};
  const int32_t input_slots[2] = {0, 1};
  Tensor out;
  OpKernelContext ctx(*cg.y.node(), slots, input_slots, &out, runtime, nullptr, 1);
  check_ok(kernel.compute(ctx), "Conv2D kernel");
  return out;
}

void check_same(benchmark::State& state, const Tensor& got, const Tensor& expected) {
  if (!got.is_initialized() || !got.all_close(expected, 1e-3, 1e-3)) {
    state.SkipWithError("wrong result");
  }
}

void session_bench(benchmark::State& state, const ConvShape& s, int threads) {
  const ConvGraph& cg = conv_graph(s);
  SessionOptions options;
  options.inter_op_threads = threads;
  auto session = std::move(Session::create(cg.g, options).value());
  const std::vector<TensorRef> fetches{cg.y};
  Result<std::vector<Tensor>> out = session->run({}, fetches);
  check_ok(out.status(), "warm-up run");
  for (auto _ : state) {
    out = session->run({}, fetches);
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run");
  KernelTable kernels(cg.g);
  check_same(state, (*out)[0], run_kernel(cg, *kernels.get(*cg.y.node())));
  state.counters["threads"] = threads == 0 ? session_threads() : threads;
  set_counters(state, s);
}

void kernel_loop_bench(benchmark::State& state, const ConvShape& s) {
  const ConvGraph& cg = conv_graph(s);
  KernelTable kernels(cg.g);
  OpKernel& kernel = *kernels.get(*cg.y.node());
  Tensor out;
  for (auto _ : state) {
    out = run_kernel(cg, kernel);
    benchmark::DoNotOptimize(out);
  }
  state.counters["threads"] = 1;
  set_counters(state, s);
}

void BM_Conv2D_Session(benchmark::State& state) { session_bench(state, kLarge, 0); }
void BM_Conv2D_Session1Thread(benchmark::State& state) { session_bench(state, kLarge, 1); }
void BM_Conv2D_KernelLoop(benchmark::State& state) { kernel_loop_bench(state, kLarge); }
void BM_Conv2DSmall_Session(benchmark::State& state) { session_bench(state, kSmall, 0); }
void BM_Conv2DSmall_KernelLoop(benchmark::State& state) { kernel_loop_bench(state, kSmall); }

// output[b,y,x,o] = sum over ky, kx, c; SAME, stride 1, odd square filter.
Tensor naive_conv(const ConvGraph& cg) {
  const Shape& is = cg.input.shape();
  const Shape& fs = cg.filter.shape();
  const int64_t n = is.dim(0), h = is.dim(1), w = is.dim(2), ic = is.dim(3);
  const int64_t k = fs.dim(0), oc = fs.dim(3), pad = (k - 1) / 2;
  Tensor out(DType::kFloat32, Shape{n, h, w, oc});
  auto in = cg.input.flat<float>();
  auto f = cg.filter.flat<float>();
  auto o = out.flat<float>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t q = 0; q < oc; ++q) {
          float acc = 0;
          for (int64_t ky = 0; ky < k; ++ky)
            for (int64_t kx = 0; kx < k; ++kx)
              for (int64_t c = 0; c < ic; ++c) {
                const int64_t iy = y - pad + ky, ix = x - pad + kx;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                acc += in[((b * h + iy) * w + ix) * ic + c] * f[((ky * k + kx) * ic + c) * oc + q];
              }
          o[((b * h + y) * w + x) * oc + q] = acc;
        }
  return out;
}

void BM_Conv2DSmall_NaiveLoop(benchmark::State& state) {
  const ConvGraph& cg = conv_graph(kSmall);
  Tensor out;
  for (auto _ : state) {
    out = naive_conv(cg);
    benchmark::DoNotOptimize(out);
  }
  KernelTable kernels(cg.g);
  check_same(state, out, run_kernel(cg, *kernels.get(*cg.y.node())));
  state.counters["threads"] = 1;
  set_counters(state, kSmall);
}

BENCHMARK(BM_Conv2D_Session)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Conv2D_Session1Thread)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Conv2D_KernelLoop)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Conv2DSmall_Session)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2DSmall_KernelLoop)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2DSmall_NaiveLoop)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace graphrun::bench
