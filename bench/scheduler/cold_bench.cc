// Case 13: cold paths and memory, each measured in a fresh process
// (bench/scheduler/cold_probe.cc) per size: a chain of N nodes built, run
// once, with the process's peak resident memory. One benchmark per engine
// and size: BM_ColdChain<N>_{Raw,Call,CallMoved,NoOp} (Raw: default-policy
// continue_nodes built, run and destroyed; Call/NoOp: Graph building, then
// Session::create and the first run; CallMoved: the graph moved into the
// session instead of copied).
//
// Time (manual): build + first run of the probe. Counters per node:
// build_ns (Raw: nodes + edges; graphrun: Graph::add_node and the control
// edge), first_run_ns (Raw: run + destroy; graphrun: Session::create + the
// first run), bytes (peak RSS growth / N).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace graphrun::bench {
namespace {

struct ProbeResult {
  long long build_ns = 0;
  long long first_run_ns = 0;
  long long peak_bytes = 0;
};

bool run_probe(const char* kind, int nodes, ProbeResult& out) {
  const std::string cmd = fmt::format("'{}' {} {}", GRAPHRUN_COLD_PROBE, kind, nodes);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  const int got = std::fscanf(p, "build_ns=%lld first_run_ns=%lld peak_bytes=%lld", &out.build_ns,
                              &out.first_run_ns, &out.peak_bytes);
  return pclose(p) == 0 && got == 3;
}

void BM_Cold(benchmark::State& state, const char* kind, int nodes) {
  ProbeResult sum;
  int64_t runs = 0;
  for (auto _ : state) {
    ProbeResult r;
    if (!run_probe(kind, nodes, r)) {
      state.SkipWithError("graphrun_cold_probe failed");
      return;
    }
    state.SetIterationTime(static_cast<double>(r.build_ns + r.first_run_ns) * 1e-9);
    sum.build_ns += r.build_ns;
    sum.first_run_ns += r.first_run_ns;
    sum.peak_bytes += r.peak_bytes;
    ++runs;
  }
  const double per = static_cast<double>(runs) * nodes;
  state.counters["nodes"] = nodes;
  state.counters["build_ns"] = static_cast<double>(sum.build_ns) / per;
  state.counters["first_run_ns"] = static_cast<double>(sum.first_run_ns) / per;
  state.counters["bytes"] = static_cast<double>(sum.peak_bytes) / per;
}

const bool registered = [] {
  const struct {
    const char* name;
    int nodes;
  } sizes[] = {{"1k", 1000}, {"10k", 10000}, {"100k", 100000}, {"1M", 1000000}};
  for (const auto& size : sizes) {
    const struct {
      const char* name;
      const char* arg;
    } kinds[] = {{"Raw", "raw"}, {"Call", "call"}, {"CallMoved", "callmoved"}, {"NoOp", "noop"}};
    for (const auto& kind : kinds) {
      const int n = size.nodes;
      const char* arg = kind.arg;
      benchmark::RegisterBenchmark(fmt::format("BM_ColdChain{}_{}", size.name, kind.name).c_str(),
                                   [arg, n](benchmark::State& s) { BM_Cold(s, arg, n); })
          ->UseManualTime()
          ->Iterations(n >= 1000000 ? 1 : 3)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace graphrun::bench
