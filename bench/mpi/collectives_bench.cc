// Case 14: graphrun's AllReduce against MPI's own MPI_Allreduce, the same
// tensor on the same ranks in the same processes. Run under mpirun:
//
//   mpirun -np 2 build/release/bench/graphrun_mpi_bench
//
// Variants: `Graphrun` is a prepared Callable of one MpiAllReduce node
// (feed x, fetch the sum) on a 1-thread session of each rank; `Mpi` is
// MPI_Allreduce on MPI_COMM_WORLD over the same floats (the fastest plain
// form of the same work). Sizes: 1 float, 1024 floats (4 KiB), 262144
// floats (1 MiB). Every rank runs the same fixed number of iterations (a
// collective needs every rank in each); only rank 0 reports.
#include <benchmark/benchmark.h>
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <mpi.h>

#include <memory>
#include <vector>

namespace {

using graphrun::DType;
using graphrun::Graph;
using graphrun::Output;
using graphrun::Session;
using graphrun::SessionOptions;
using graphrun::Shape;
using graphrun::Tensor;

constexpr int kIterations = 300;

void graphrun_allreduce(benchmark::State& state, int64_t n) {
  Graph g;
  Output x = graphrun::ops::Placeholder(g, DType::kFloat32, Shape{n}, "x");
  Output sum = graphrun::ops::AllReduce(g, x, graphrun::mpi::Reduction::kSum, "sum");
  SessionOptions options;
  options.inter_op_threads = 1;
  auto session = Session::create(g, options).value();
  auto callable = session->make_callable({x}, {sum}).value();
  const Tensor feed = Tensor::filled<float>(Shape{n}, 1.0f);
  std::vector<Tensor> out(1);
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    if (!callable.run({&feed, 1}, out).is_ok()) state.SkipWithError("AllReduce failed");
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
}

void mpi_allreduce(benchmark::State& state, int64_t n) {
  std::vector<float> in(static_cast<std::size_t>(n), 1.0f);
  std::vector<float> out(static_cast<std::size_t>(n));
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
}

void register_all() {
  const std::pair<const char*, int64_t> sizes[] = {{"4B", 1}, {"4K", 1024}, {"1M", 262144}};
  for (const auto& [label, n] : sizes) {
    const int64_t count = n;
    benchmark::RegisterBenchmark((std::string("BM_AllReduce") + label + "_Graphrun").c_str(),
                                 [count](benchmark::State& s) { graphrun_allreduce(s, count); })
        ->Iterations(kIterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("BM_AllReduce") + label + "_Mpi").c_str(),
                                 [count](benchmark::State& s) { mpi_allreduce(s, count); })
        ->Iterations(kIterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

// Ranks other than 0 run every benchmark (each collective needs them) and
// report nothing.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  auto world = graphrun::mpi::World::init(&argc, &argv);
  if (!world.is_ok()) {
    std::fprintf(stderr, "%s\n", world.status().to_string().c_str());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  if ((*world)->rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent, &silent);
  }
  benchmark::Shutdown();
  world->reset();
  return 0;
}
