// Case 14: graphrun's MPI ops against MPI's own calls, the same tensors on
// the same ranks in the same processes. Run under mpirun:
//
//   mpirun -np 2 build/release/bench/graphrun_mpi_bench
//
// (Open MPI binds each of 2 ranks to a core by default: every case here
// runs 1-thread sessions.)
//
// * AllReduce: `Graphrun` is a prepared Callable of one MpiAllReduce node
//   (feed x, fetch the sum) on a 1-thread session of each rank; `Mpi` is
//   MPI_Allreduce on MPI_COMM_WORLD over the same floats (the fastest plain
//   form of the same work). Sizes: 1 float, 1024 floats (4 KiB), 262144
//   floats (1 MiB).
// * PingPong: a round trip between ranks 0 and 1. `Graphrun`: rank 0's
//   Callable feeds x to a Send and fetches the Recv of the answer; rank 1's
//   Callable receives it and sends it back (one step on each rank per
//   round trip, 1-thread sessions). `Mpi`: MPI_Send then MPI_Recv on rank
//   0, MPI_Recv then MPI_Send on rank 1, over the same bytes. 4 bytes
//   (latency) and 1 MiB (bandwidth: 2 MiB moved per round trip). Both
//   forms first make kWarmUp untimed round trips, as the OSU latency
//   benchmarks do: a new Callable's first steps learn its kernels' costs
//   and take a slower path meanwhile, and neither side's first messages
//   should count in a steady-state latency.
// * FanOut64: 64 independent 256x256 float MatMuls summed (case 4's
//   graph), built as two halves of 32 MatMuls and their partial sum, each
//   half with its own copies of the constant inputs, and a final Add.
//   `TwoRanks`: a DistributedSession with the second half on rank 1, one
//   thread per rank (one 256 KiB tensor crosses per step); `OneRank`: the
//   same graph in an ordinary 1-thread Session on rank 0 (the other ranks
//   wait): the baseline the issue's >= 1.8x is against. `Halves`: ranks 0
//   and 1 each run their own half locally at the same time, nothing
//   crossing (the best split this machine allows: two busy cores of a VM
//   may each be slower than one); TwoRanks / Halves is what distributing
//   the graph costs beyond that.
// Every rank runs the same fixed number of iterations (each needs its
// peers); only rank 0 reports; ranks past 1 sit the ping-pongs out.
#include <benchmark/benchmark.h>
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
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
// Untimed round trips before a ping-pong's timed ones.
constexpr int kWarmUp = 200;

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

// Rank 0's step sends x and fetches the answer; rank 1's receives and
// sends back.
void graphrun_ping_pong(benchmark::State& state, int64_t n) {
  const int rank = graphrun::mpi::World::current()->rank();
  if (rank > 1) {
    for (auto _ : state) {
    }
    return;
  }
  Graph g;
  SessionOptions options;
  options.inter_op_threads = 1;
  std::vector<Tensor> out(1);
  if (rank == 0) {
    Output x = graphrun::ops::Placeholder(g, DType::kFloat32, Shape{n}, "x");
    const graphrun::Node* ping = graphrun::ops::Send(g, x, 1, "ping");
    Output pong = graphrun::ops::Recv(g, DType::kFloat32, 1, "pong", Shape{n});
    auto session = Session::create(g, options).value();
    auto callable = session->make_callable({x}, {pong}, {ping}).value();
    const Tensor feed = Tensor::filled<float>(Shape{n}, 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < kWarmUp; ++i) {
      if (!callable.run({&feed, 1}, out).is_ok()) break;  // the timed loop reports it
    }
    for (auto _ : state) {
      if (graphrun::Status st = callable.run({&feed, 1}, out); !st.is_ok()) {
        std::fprintf(stderr, "rank 0: %s\n", st.to_string().c_str());
        state.SkipWithError("ping-pong failed");
        break;
      }
    }
  } else {
    Output got = graphrun::ops::Recv(g, DType::kFloat32, 0, "ping", Shape{n});
    const graphrun::Node* back = graphrun::ops::Send(g, got, 0, "pong");
    auto session = Session::create(g, options).value();
    auto callable = session->make_callable({}, {}, {back}).value();
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < kWarmUp; ++i) {
      if (!callable.run({}, {}).is_ok()) break;
    }
    for (auto _ : state) {
      if (graphrun::Status st = callable.run({}, {}); !st.is_ok()) {
        std::fprintf(stderr, "rank 1: %s\n", st.to_string().c_str());
        state.SkipWithError("ping-pong failed");
        break;
      }
    }
  }
  state.SetBytesProcessed(state.iterations() * 2 * n * static_cast<int64_t>(sizeof(float)));
}

// One step sending x to this rank and fetching it back: the cost of a
// step with a Send and a Recv that MPI completes at once (no peer).
void graphrun_to_self(benchmark::State& state) {
  const int rank = graphrun::mpi::World::current()->rank();
  Graph g;
  Output x = graphrun::ops::Placeholder(g, DType::kFloat32, Shape{1}, "x");
  const graphrun::Node* send = graphrun::ops::Send(g, x, rank, "self");
  Output back = graphrun::ops::Recv(g, DType::kFloat32, rank, "self", Shape{1});
  SessionOptions options;
  options.inter_op_threads = 1;
  auto session = Session::create(g, options).value();
  auto callable = session->make_callable({x}, {back}, {send}).value();
  const Tensor feed = Tensor::filled<float>(Shape{1}, 1.0f);
  std::vector<Tensor> out(1);
  for (int i = 0; i < kWarmUp; ++i) {
    if (!callable.run({&feed, 1}, out).is_ok()) break;
  }
  for (auto _ : state) {
    if (graphrun::Status st = callable.run({&feed, 1}, out); !st.is_ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
}

void mpi_ping_pong(benchmark::State& state, int64_t n) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<float> buffer(static_cast<std::size_t>(n), 1.0f);
  const int count = static_cast<int>(n);
  auto round_trip = [&] {
    if (rank == 0) {
      MPI_Send(buffer.data(), count, MPI_FLOAT, 1, 7, MPI_COMM_WORLD);
      MPI_Recv(buffer.data(), count, MPI_FLOAT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buffer.data(), count, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), count, MPI_FLOAT, 0, 8, MPI_COMM_WORLD);
    }
  };
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < kWarmUp; ++i) round_trip();
  for (auto _ : state) {
    round_trip();
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * n * static_cast<int64_t>(sizeof(float)));
}

// Case 4's 64 MatMuls as two halves; `split`: the second half on rank 1.
struct FanOut {
  Graph g;
  Output halves[2];  // each half's sum of 32 MatMuls
  Output sum;
  explicit FanOut(bool split) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto matrix = [&] {
      std::vector<float> v(256 * 256);
      for (float& x : v) x = dist(rng);
      return Tensor::from_span(Shape{256, 256}, std::span<const float>(v));
    };
    for (int h = 0; h < 2; ++h) {
      auto scope = g.device(split && h == 1 ? "/rank:1" : "/rank:0");
      std::vector<Output> a, b, level;
      for (int i = 0; i < 4; ++i) a.push_back(graphrun::ops::Const(g, matrix()));
      for (int j = 0; j < 8; ++j) b.push_back(graphrun::ops::Const(g, matrix()));
      for (const Output& x : a) {
        for (const Output& y : b) level.push_back(graphrun::ops::MatMul(g, x, y));
      }
      while (level.size() > 1) {
        std::vector<Output> next;
        for (std::size_t k = 0; k + 1 < level.size(); k += 2) {
          next.push_back(graphrun::ops::Add(g, level[k], level[k + 1]));
        }
        level = std::move(next);
      }
      halves[h] = level[0];
    }
    auto scope = g.device("/rank:0");
    sum = graphrun::ops::Add(g, halves[0], halves[1], "sum");
  }
};

constexpr int kFanOutIterations = 40;

void fan_out_one_rank(benchmark::State& state) {
  const int rank = graphrun::mpi::World::current()->rank();
  FanOut f(false);
  std::unique_ptr<Session> session;
  if (rank == 0) {
    SessionOptions options;
    options.inter_op_threads = 1;
    session = Session::create(f.g, options).value();
    if (!session->run({}, {f.sum}).is_ok()) state.SkipWithError("warm-up failed");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    if (rank == 0 && !session->run({}, {f.sum}).is_ok()) state.SkipWithError("run failed");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  state.SetItemsProcessed(state.iterations() * 64);
}

// The best a 2-rank split can do on this machine: ranks 0 and 1 each run
// their own half (32 MatMuls and their sum) in a local 1-thread Session at
// the same time, with a barrier after each step (the slower half ends it);
// nothing crosses. Two busy cores of a VM may each run slower than one busy
// core does (shared caches, memory bandwidth, frequency, the host).
void fan_out_halves(benchmark::State& state) {
  const int rank = graphrun::mpi::World::current()->rank();
  FanOut f(false);
  std::unique_ptr<Session> session;
  const Output half = rank == 0 ? f.halves[0] : f.halves[1];
  if (rank < 2) {
    SessionOptions options;
    options.inter_op_threads = 1;
    session = Session::create(f.g, options).value();
    if (!session->run({}, {half}).is_ok()) state.SkipWithError("warm-up failed");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    if (session != nullptr && !session->run({}, {half}).is_ok()) state.SkipWithError("run failed");
    MPI_Barrier(MPI_COMM_WORLD);
  }
  state.SetItemsProcessed(state.iterations() * 64);
}

void fan_out_two_ranks(benchmark::State& state) {
  const int rank = graphrun::mpi::World::current()->rank();
  FanOut f(true);
  SessionOptions options;
  options.inter_op_threads = 1;
  if (rank != 0) {
    // Serves the whole case, then runs the loop empty (rank 0 times it).
    if (!graphrun::mpi::serve(f.g, options).is_ok()) state.SkipWithError("serve failed");
    for (auto _ : state) {
    }
    return;
  }
  auto session = graphrun::mpi::DistributedSession::create(f.g, options).value();
  if (!session->run({}, {f.sum}).is_ok()) state.SkipWithError("warm-up failed");
  for (auto _ : state) {
    if (!session->run({}, {f.sum}).is_ok()) state.SkipWithError("run failed");
  }
  if (!session->close().is_ok()) state.SkipWithError("close failed");
  state.SetItemsProcessed(state.iterations() * 64);
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
  benchmark::RegisterBenchmark("BM_SendRecvToSelf4B_Graphrun", graphrun_to_self)
      ->Iterations(20000)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  if (graphrun::mpi::World::current()->size() < 2) return;
  benchmark::RegisterBenchmark("BM_FanOut64_OneRank", fan_out_one_rank)
      ->Iterations(kFanOutIterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_FanOut64_Halves", fan_out_halves)
      ->Iterations(kFanOutIterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_FanOut64_TwoRanks", fan_out_two_ranks)
      ->Iterations(kFanOutIterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  const std::tuple<const char*, int64_t, int> pings[] = {{"4B", 1, 20000}, {"1M", 262144, 300}};
  for (const auto& [label, n, iterations] : pings) {
    const int64_t count = n;
    benchmark::RegisterBenchmark((std::string("BM_PingPong") + label + "_Graphrun").c_str(),
                                 [count](benchmark::State& s) { graphrun_ping_pong(s, count); })
        ->Iterations(iterations)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("BM_PingPong") + label + "_Mpi").c_str(),
                                 [count](benchmark::State& s) { mpi_ping_pong(s, count); })
        ->Iterations(iterations)
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
  // Only rank 0 writes a --benchmark_out file.
  if ((*world)->rank() != 0) {
    argc =
        static_cast<int>(std::remove_if(argv + 1, argv + argc,
                                        [](const char* a) {
                                          return std::string_view(a).starts_with("--benchmark_out");
                                        }) -
                         argv);
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  if ((*world)->rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  world->reset();
  return 0;
}
