// File: tools/graphrun/bench.h
// `graphrun bench`: one signature run from T client threads on one session
// through a Callable; runs/s and latency percentiles, as text or one JSON
// object. docs/cli.md is the user-facing specification.
//
// Thread safety: stateless functions; thread-safe for distinct arguments.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace graphrun::cli {

// Latency summary of a sorted (ascending) list of per-run latencies in ns.
// Percentiles are nearest-rank: pQ = sorted[ceil(Q/100 * n) - 1].
struct LatencySummary {
  double min_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double max_us = 0;
  double mean_us = 0;
};
LatencySummary summarize_latencies(std::span<const int64_t> sorted_ns);

// The most client threads `--threads` takes (one std::thread each).
inline constexpr int kMaxBenchThreads = 1024;
// The longest `--seconds` (a week): the deadline is computed on the steady
// clock in nanoseconds, which 1e300 s would overflow.
inline constexpr double kMaxBenchSeconds = 7 * 24 * 3600.0;
// Untimed runs per thread before timing, at most (a bound, as --threads and
// --seconds have: --warmup 2^63 ran until killed).
inline constexpr int64_t kMaxBenchWarmup = 1'000'000;

// `graphrun bench`'s arguments, as given on the command line.
struct BenchArgs {
  std::string graph;
  std::vector<std::string> feeds;  // NAME=VALUES or NAME=@FILE.npy
  std::vector<std::string> fetches;
  std::vector<std::string> targets;
  std::vector<std::string> init;
  int threads = 1;
  int64_t runs = 0;    // exact total across threads; 0: use seconds
  double seconds = 0;  // run for this long; 0: use runs
  int64_t warmup = 1;  // per thread, before timing, not counted
  int inter_op_threads = 0;
  bool json = false;
  bool no_progress = false;
};
// Runs the command: the report to `out`, a progress bar to `err` when it is
// a terminal, one error line to `err`; returns the exit code.
int bench_command(const BenchArgs& args, std::FILE* out, std::FILE* err);

}  // namespace graphrun::cli
