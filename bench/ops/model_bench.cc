// The seed model: X [64,256] through 4 dense layers Relu(h W + b) (W
// 256x256, b 256) and a sigmoid head Sigmoid(h w + c) (w 256x1), the
// weights constants. The work ONNX Runtime is compared with.
//
// Variants (BM_SeedModel_<Variant>, wall time per forward pass):
//   _Callable1Thread, _Callable2Threads
//               a prepared Callable on a 1- and a 2-thread session (fusion
//               on, the default).
//   _Unfused1Thread, _Unfused2Threads
//               the same with SessionOptions::fuse_kernels = false.
//   _Async1Thread, _Async2Threads
//               the Callable through Callable::run_async, one call at a
//               time (the caller waits on a future): the step runs on the
//               pool's workers only, none of them a waiting caller.
//   _PlainLoop  the fastest plain form of the same work on one thread: the
//               chosen level's GEMM with its bias and activation epilogue
//               (ops/cpu) on weights packed once, called directly, into
//               preallocated buffers.
//   _PlainLoop2Threads
//               the same, each layer's product split in two row halves by
//               tbb::parallel_for in a 2-thread task_arena.
#include <benchmark/benchmark.h>

#include <graphrun/graphrun.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <memory>
#include <random>
#include <vector>

#include "bench/common/raw_graph.h"
#include "ops/cpu/kernels.h"

namespace graphrun::bench {
namespace {

constexpr int64_t kBatch = 64;
constexpr int64_t kWidth = 256;
constexpr int kLayers = 4;

Tensor random_tensor(Shape shape, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  Tensor t = Tensor::allocate_uninitialized(DType::kFloat32, shape).value();
  for (float& v : t.flat<float>()) v = dist(rng);
  return t;
}

struct SeedModel {
  Tensor x = random_tensor(Shape{kBatch, kWidth}, 1, 1.0f);
  std::vector<Tensor> w, b;  // kLayers dense layers, then the head
  Graph g;
  Output input, score;

  SeedModel() {
    for (int i = 0; i < kLayers; ++i) {
      w.push_back(random_tensor(Shape{kWidth, kWidth}, 10 + i, 0.1f));
      b.push_back(random_tensor(Shape{kWidth}, 20 + i, 0.1f));
    }
    w.push_back(random_tensor(Shape{kWidth, 1}, 30, 0.1f));
    b.push_back(random_tensor(Shape{1}, 31, 0.1f));
    input = ops::Placeholder(g, DType::kFloat32, Shape{kBatch, kWidth}, "x");
    Output h = input;
    for (int i = 0; i < kLayers; ++i) {
      h = ops::Relu(g, ops::Add(g, ops::MatMul(g, h, ops::Const(g, w[i])), ops::Const(g, b[i])));
    }
    score = ops::Sigmoid(
        g, ops::Add(g, ops::MatMul(g, h, ops::Const(g, w[kLayers])), ops::Const(g, b[kLayers])));
    check_ok(g.status(), "building the seed model");
  }
};

const SeedModel& seed_model() {
  static const SeedModel* m = new SeedModel();
  return *m;
}

// The plain loop's weights, packed once for the chosen level's GEMM (as
// graphrun's MatMul keeps a Const operand), in blocks of at most
// `max_block` columns (0: the kernel's choice).
struct PackedWeights {
  std::vector<std::unique_ptr<cpu::PackedGemmB<float>>> w;
  PackedWeights(const SeedModel& m, int64_t max_block) {
    const cpu::TypedKernels<float>& k = cpu::kernels().f32;
    for (int i = 0; i < kLayers; ++i) {
      w.push_back(k.pack_b(m.w[static_cast<std::size_t>(i)].flat<float>().data(), kWidth, false,
                           kWidth, kWidth, kBatch, max_block));
    }
  }
};

// Layer i's product (i == kLayers: the head) from `in` into `h0`/`h1`
// (ping-pong) or, for the head, `out`, with its bias and activation.
cpu::GemmArgs<float> layer_args(const SeedModel& m, int i, const float* in, Tensor& h0, Tensor& h1,
                                Tensor& out) {
  const bool head = i == kLayers;
  cpu::GemmArgs<float> g;
  g.a = in;
  g.lda = kWidth;
  g.b = m.w[static_cast<std::size_t>(i)].flat<float>().data();
  g.n = head ? 1 : kWidth;
  g.ldb = g.n;
  g.c = head ? out.flat<float>().data() : (i % 2 == 0 ? h0 : h1).flat<float>().data();
  g.ldc = g.n;
  g.m = kBatch;
  g.k = kWidth;
  g.bias = m.b[static_cast<std::size_t>(i)].flat<float>().data();
  g.activation = head ? cpu::Activation::kSigmoid : cpu::Activation::kRelu;
  return g;
}

// The plain loop's forward pass into `h0`/`h1` and `out`: the level's GEMM
// with its bias and activation epilogue, each dense layer on packed
// weights. `split(rows, piece)` runs piece(begin, end) over the rows
// [0, rows), whole or in parts.
template <typename Split>
void plain_forward(const SeedModel& m, const PackedWeights& packed, Tensor& h0, Tensor& h1,
                   Tensor& out, Split&& split) {
  const cpu::TypedKernels<float>& k = cpu::kernels().f32;
  const float* in = m.x.flat<float>().data();
  for (int i = 0; i <= kLayers; ++i) {
    const cpu::GemmArgs<float> g = layer_args(m, i, in, h0, h1, out);
    if (i == kLayers) {  // [64,256] x [256,1]: a matrix-vector product, nothing to pack
      k.gemm(g, 0, g.m, 0, g.n);
    } else {
      const cpu::PackedGemmB<float>& b = *packed.w[static_cast<std::size_t>(i)];
      split(g.m,
            [&](int64_t begin, int64_t end) { k.gemm_packed(g, b, begin, end, 0, b.blocks()); });
    }
    in = g.c;
  }
}

const Tensor& reference() {
  static const Tensor* r = [] {
    const SeedModel& m = seed_model();
    Tensor h0(DType::kFloat32, Shape{kBatch, kWidth});
    Tensor h1(DType::kFloat32, Shape{kBatch, kWidth});
    auto* out = new Tensor(DType::kFloat32, Shape{kBatch, 1});
    // Unpacked, unsplit: the reference all variants must match.
    const cpu::TypedKernels<float>& k = cpu::kernels().f32;
    const float* in = m.x.flat<float>().data();
    for (int i = 0; i <= kLayers; ++i) {
      const cpu::GemmArgs<float> g = layer_args(m, i, in, h0, h1, *out);
      k.gemm(g, 0, g.m, 0, g.n);
      in = g.c;
    }
    return out;
  }();
  return *r;
}

void callable_bench(benchmark::State& state, int threads, bool fuse) {
  const SeedModel& m = seed_model();
  SessionOptions options;
  options.inter_op_threads = threads;
  options.fuse_kernels = fuse;
  auto session = std::move(Session::create(m.g, options).value());
  Callable callable = session->make_callable({m.input}, {m.score}).value();
  const Tensor feeds[] = {m.x};
  Tensor out[1];
  Status s = callable.run(feeds, out);
  for (auto _ : state) {
    s = callable.run(feeds, out);
    benchmark::DoNotOptimize(out[0].raw_data());
  }
  check_ok(s, "run");
  if (!out[0].all_close(reference(), 1e-4, 1e-4)) state.SkipWithError("wrong result");
  state.counters["threads"] = threads;
  state.SetLabel(std::string(cpu_isa_name(cpu_isa())));
}

void async_bench(benchmark::State& state, int threads) {
  const SeedModel& m = seed_model();
  SessionOptions options;
  options.inter_op_threads = threads;
  auto session = std::move(Session::create(m.g, options).value());
  Callable callable = session->make_callable({m.input}, {m.score}).value();
  Result<std::vector<Tensor>> out = callable.run_async({m.x}).get();
  for (auto _ : state) {
    out = callable.run_async({m.x}).get();
    benchmark::DoNotOptimize(out);
  }
  check_ok(out.status(), "run_async");
  if (!(*out)[0].all_close(reference(), 1e-4, 1e-4)) state.SkipWithError("wrong result");
  state.counters["threads"] = threads;
  state.SetLabel(std::string(cpu_isa_name(cpu_isa())));
}

void BM_SeedModel_Callable1Thread(benchmark::State& s) { callable_bench(s, 1, true); }
void BM_SeedModel_Async1Thread(benchmark::State& s) { async_bench(s, 1); }
void BM_SeedModel_Async2Threads(benchmark::State& s) { async_bench(s, 2); }
BENCHMARK(BM_SeedModel_Async1Thread)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SeedModel_Async2Threads)->UseRealTime()->Unit(benchmark::kMicrosecond);
void BM_SeedModel_Callable2Threads(benchmark::State& s) { callable_bench(s, 2, true); }
void BM_SeedModel_Unfused1Thread(benchmark::State& s) { callable_bench(s, 1, false); }
void BM_SeedModel_Unfused2Threads(benchmark::State& s) { callable_bench(s, 2, false); }
BENCHMARK(BM_SeedModel_Callable1Thread)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SeedModel_Callable2Threads)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SeedModel_Unfused1Thread)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SeedModel_Unfused2Threads)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_SeedModel_PlainLoop(benchmark::State& state) {
  const SeedModel& m = seed_model();
  Tensor h0(DType::kFloat32, Shape{kBatch, kWidth});
  Tensor h1(DType::kFloat32, Shape{kBatch, kWidth});
  Tensor out(DType::kFloat32, Shape{kBatch, 1});
  const PackedWeights packed(m, 0);
  auto whole = [](int64_t rows, auto&& piece) { piece(0, rows); };
  for (auto _ : state) {
    plain_forward(m, packed, h0, h1, out, whole);
    benchmark::DoNotOptimize(out.raw_data());
  }
  if (!out.all_close(reference(), 1e-4, 1e-4)) state.SkipWithError("wrong result");
  state.counters["threads"] = 1;
  state.SetLabel(std::string(cpu_isa_name(cpu_isa())));
}
BENCHMARK(BM_SeedModel_PlainLoop)->UseRealTime()->Unit(benchmark::kMicrosecond);

// The fastest plain form on two threads: the same loop, each layer's
// product split in two row halves by tbb::parallel_for inside a 2-thread
// task_arena entered once per pass (the head stays whole).
void BM_SeedModel_PlainLoop2Threads(benchmark::State& state) {
  const SeedModel& m = seed_model();
  Tensor h0(DType::kFloat32, Shape{kBatch, kWidth});
  Tensor h1(DType::kFloat32, Shape{kBatch, kWidth});
  Tensor out(DType::kFloat32, Shape{kBatch, 1});
  const PackedWeights packed(m, 0);
  tbb::task_arena arena(2);
  auto halves = [](int64_t rows, auto&& piece) {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, 2, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t i = r.begin(); i < r.end(); ++i) piece(i * rows / 2, (i + 1) * rows / 2);
        },
        tbb::simple_partitioner());
  };
  for (auto _ : state) {
    arena.execute([&] { plain_forward(m, packed, h0, h1, out, halves); });
    benchmark::DoNotOptimize(out.raw_data());
  }
  if (!out.all_close(reference(), 1e-4, 1e-4)) state.SkipWithError("wrong result");
  state.counters["threads"] = 2;
  state.SetLabel(std::string(cpu_isa_name(cpu_isa())));
}
BENCHMARK(BM_SeedModel_PlainLoop2Threads)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace graphrun::bench
