#include "tools/graphrun/bench.h"

#include <fmt/format.h>
#include <graphrun/graph_def.h>
#include <graphrun/session.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "tools/graphrun/cli.h"

namespace graphrun::cli {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// One client thread's results: written only by that thread while it runs
// (`done` is also read by the progress reporter), read by main after join.
// Thread safety: see above. Cache-line aligned so counters do not share lines.
struct alignas(64) Worker {
  std::vector<int64_t> latencies_ns;
  std::atomic<int64_t> done{0};
  Status status;
};

// Draws "[#####     ] 512/1000 runs" (or seconds) on a terminal until told
// to stop; at most 10 updates a second.
// Thread safety: start/finish from one thread; the reporter thread only
// reads the workers' `done` counters.
class Progress {
 public:
  Progress(std::FILE* err, const std::vector<Worker>& workers, int64_t runs, double seconds)
      : err_(err), workers_(workers), runs_(runs), seconds_(seconds) {}
  void start() {
    t0_ = Clock::now();
    thread_ = std::thread([this] { loop(); });
  }
  void finish() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    cv_.notify_one();
    thread_.join();
    fmt::print(err_, "\r\033[2K");
    std::fflush(err_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return finished_; })) {
      int64_t done = 0;
      // relaxed: a progress display; exactness is not needed
      for (const Worker& w : workers_) done += w.done.load(std::memory_order_relaxed);
      const double elapsed = static_cast<double>(ns_since(t0_)) / 1e9;
      const double fraction =
          runs_ > 0 ? static_cast<double>(done) / static_cast<double>(runs_) : elapsed / seconds_;
      constexpr int kWidth = 30;
      const int filled = std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth);
      const std::string bar = std::string(static_cast<std::size_t>(filled), '#') +
                              std::string(static_cast<std::size_t>(kWidth - filled), ' ');
      if (runs_ > 0) {
        fmt::print(err_, "\r[{}] {}/{} runs", bar, done, runs_);
      } else {
        fmt::print(err_, "\r[{}] {:.1f}/{:.1f} s, {} runs", bar, elapsed, seconds_, done);
      }
      std::fflush(err_);
    }
  }

  std::FILE* err_;
  const std::vector<Worker>& workers_;
  int64_t runs_;
  double seconds_;
  Clock::time_point t0_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
};

}  // namespace

LatencySummary summarize_latencies(std::span<const int64_t> sorted_ns) {
  LatencySummary s;
  if (sorted_ns.empty()) return s;
  const auto n = static_cast<double>(sorted_ns.size());
  auto us = [](int64_t ns) { return static_cast<double>(ns) / 1000.0; };
  auto rank = [&](double q) {
    const auto r = static_cast<std::size_t>(std::ceil(q * n));
    return us(sorted_ns[std::clamp<std::size_t>(r, 1, sorted_ns.size()) - 1]);
  };
  s.min_us = us(sorted_ns.front());
  s.p50_us = rank(0.50);
  s.p90_us = rank(0.90);
  s.p99_us = rank(0.99);
  s.max_us = us(sorted_ns.back());
  double total = 0;
  for (const int64_t v : sorted_ns) total += static_cast<double>(v);
  s.mean_us = total / n / 1000.0;
  return s;
}

int bench_command(const BenchArgs& args, std::FILE* out, std::FILE* err) {
  auto fail = [&](int code, const std::string& message) {
    std::fflush(out);
    fmt::print(err, "graphrun: {}\n", one_line(message));
    return code;
  };
  // Usage: what the command line alone shows to be wrong.
  if (args.threads < 1 || args.threads > kMaxBenchThreads) {
    return fail(kExitUsage,
                fmt::format("--threads {}: must be from 1 to {}", args.threads, kMaxBenchThreads));
  }
  if (args.runs < 0) return fail(kExitUsage, fmt::format("--runs {}: must be >= 1", args.runs));
  if (args.seconds < 0 || !std::isfinite(args.seconds) || args.seconds > kMaxBenchSeconds) {
    return fail(kExitUsage, fmt::format("--seconds {}: must be > 0 and at most {:g} (a week)",
                                        args.seconds, kMaxBenchSeconds));
  }
  if ((args.runs > 0) == (args.seconds > 0)) {
    return fail(kExitUsage,
                "give exactly one of --runs N (N >= 1) and --seconds S (S > 0); --runs 0 and "
                "--seconds 0 give neither");
  }
  if (args.warmup < 0 || args.warmup > kMaxBenchWarmup) {
    return fail(kExitUsage,
                fmt::format("--warmup {}: must be from 0 to {}", args.warmup, kMaxBenchWarmup));
  }
  if (args.inter_op_threads < 0) {
    return fail(kExitUsage,
                fmt::format("--inter-op-threads {}: must be >= 0", args.inter_op_threads));
  }
  if (args.inter_op_threads > ThreadPool::max_threads()) {
    return fail(kExitUsage,
                fmt::format("--inter-op-threads {}: at most {} (ThreadPool::max_threads(): {} per "
                            "core)",
                            args.inter_op_threads, ThreadPool::max_threads(),
                            ThreadPool::kMaxThreadsPerCore));
  }
  if (args.fetches.empty() && args.targets.empty()) {
    return fail(kExitUsage, "nothing to run: give at least one --fetch or --target");
  }
  std::vector<FeedArg> feed_args;
  for (const std::string& f : args.feeds) {
    auto parsed = parse_feed_arg(f);
    if (!parsed.is_ok()) return fail(kExitUsage, parsed.status().message());
    feed_args.push_back(std::move(*parsed));
  }

  // Runtime: the graph, the signature, the runs.
  auto graph = load_graph_file(args.graph);
  if (!graph.is_ok()) return fail(kExitRuntime, graph_file_error(args.graph, graph.status()));
  std::vector<TensorRef> feed_names;
  std::vector<Tensor> feed_values;
  for (const FeedArg& a : feed_args) {
    auto feed = resolve_feed(*graph, a);
    if (!feed.is_ok()) return fail(kExitRuntime, feed.status().message());
    feed_names.emplace_back(a.name);
    feed_values.push_back(std::move(feed->value));
  }
  for (const std::string& f : args.fetches) {
    Status s = check_fetch(*graph, f);
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
  }
  for (const std::string& t : args.targets) {
    Status s = check_target(*graph, t);
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
  }
  for (const std::string& t : args.init) {
    Status s = check_target(*graph, t);
    if (!s.is_ok()) return fail(kExitRuntime, fmt::format("--init: {}", s.message()));
  }
  SessionOptions options;
  options.inter_op_threads = args.inter_op_threads;
  auto session = Session::create(*graph, options);
  if (!session.is_ok()) {
    return fail(kExitRuntime, fmt::format("session: {}", session.status().to_string()));
  }
  if (!args.init.empty()) {
    auto init = (*session)->run({}, {}, std::vector<TargetRef>(args.init.begin(), args.init.end()));
    if (!init.is_ok()) {
      return fail(kExitRuntime, fmt::format("--init failed: {}", init.status().to_string()));
    }
  }
  auto callable = (*session)->make_callable(
      feed_names, std::vector<TensorRef>(args.fetches.begin(), args.fetches.end()),
      std::vector<TargetRef>(args.targets.begin(), args.targets.end()));
  if (!callable.is_ok()) {
    return fail(kExitRuntime, fmt::format("signature: {}", callable.status().to_string()));
  }

  const auto threads = static_cast<std::size_t>(args.threads);
  std::vector<Worker> workers(threads);
  // Run tickets (--runs): exactly args.runs successful runs in total.
  std::atomic<int64_t> next_run{0};
  std::atomic<bool> stop{false};
  std::barrier start_line(static_cast<std::ptrdiff_t>(threads + 1));
  const auto budget =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(args.seconds));
  // The timed loop of one client thread.
  auto timed_runs = [&](Worker& w, std::vector<Tensor>& feeds, std::vector<Tensor>& fetches) {
    if (args.runs > 0) {
      // Bounded: --runs may be far more than the runs this thread makes
      // (the vector grows past it as needed).
      constexpr std::size_t kMaxReserve = std::size_t{1} << 16;
      w.latencies_ns.reserve(
          std::min(static_cast<std::size_t>(args.runs) / threads + 1, kMaxReserve));
    }
    const Clock::time_point deadline = Clock::now() + budget;
    // relaxed (stop, next_run): a flag and a ticket counter; no data is
    // published through them
    while (w.status.is_ok() && !stop.load(std::memory_order_relaxed)) {
      if (args.runs > 0) {
        if (next_run.fetch_add(1, std::memory_order_relaxed) >= args.runs) break;
      } else if (Clock::now() >= deadline) {
        break;
      }
      const Clock::time_point t0 = Clock::now();
      w.status = callable->run(feeds, fetches);
      const int64_t ns = ns_since(t0);
      if (!w.status.is_ok()) {
        stop.store(true);
        break;
      }
      w.latencies_ns.push_back(ns);
      // relaxed: read only by the progress display
      w.done.store(w.done.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  };
  auto client = [&](Worker& w) {
    std::vector<Tensor> feeds = feed_values;  // shares the parsed buffers (read-only)
    std::vector<Tensor> fetches(callable->num_fetches());
    for (int64_t i = 0; i < args.warmup && w.status.is_ok(); ++i) {
      w.status = callable->run(feeds, fetches);
    }
    if (!w.status.is_ok()) stop.store(true);
    // Not kept through the wait at the start line: 1024 threads each
    // holding a 4 MB warm-up fetch took 4 GB.
    for (Tensor& t : fetches) t = Tensor();
    start_line.arrive_and_wait();
    // No exception may leave a client thread (std::terminate): running out
    // of memory for the latencies is this thread's error.
    try {
      timed_runs(w, feeds, fetches);
    } catch (const std::bad_alloc&) {
      w.status =
          resource_exhausted("client thread out of memory after {} runs", w.latencies_ns.size());
      stop.store(true);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads);
  std::string spawn_error;
  for (Worker& w : workers) {
    try {
      pool.emplace_back(client, std::ref(w));
    } catch (const std::system_error& e) {
      // The system refused a thread (a process or memory limit): the
      // started ones are stopped and joined, the missing ones' arrivals
      // made for them so that the barrier opens.
      spawn_error = fmt::format("--threads {}: cannot start client thread {}: {}", args.threads,
                                pool.size() + 1, e.what());
      stop.store(true);
      (void)start_line.arrive(static_cast<std::ptrdiff_t>(threads - pool.size()));
      break;
    }
  }
  start_line.arrive_and_wait();
  const Clock::time_point t0 = Clock::now();
  std::optional<Progress> progress;
  if (!args.no_progress && ::isatty(::fileno(err)) == 1) {
    progress.emplace(err, workers, args.runs, args.seconds);
    progress->start();
  }
  for (std::thread& t : pool) t.join();
  const double seconds = static_cast<double>(ns_since(t0)) / 1e9;
  if (progress) progress->finish();
  if (!spawn_error.empty()) return fail(kExitRuntime, spawn_error);
  for (const Worker& w : workers) {
    if (!w.status.is_ok()) {
      return fail(kExitRuntime, fmt::format("run failed: {}", w.status.to_string()));
    }
  }

  std::vector<int64_t> all;
  for (const Worker& w : workers) {
    all.insert(all.end(), w.latencies_ns.begin(), w.latencies_ns.end());
  }
  if (all.empty()) {
    // Statistics of no run would read as zero latencies.
    return fail(kExitRuntime,
                fmt::format("no run completed in --seconds {:g}: give more seconds", args.seconds));
  }
  std::sort(all.begin(), all.end());
  const LatencySummary lat = summarize_latencies(all);
  const auto runs = static_cast<int64_t>(all.size());
  const double rate = seconds > 0 ? static_cast<double>(runs) / seconds : 0;
  if (args.json) {
    fmt::print(out,
               "{{\"graph\": {}, \"threads\": {}, \"runs\": {}, \"warmup_runs_per_thread\": {}, "
               "\"seconds\": {:.6f}, \"runs_per_second\": {:.1f}, \"latency_us\": {{\"min\": "
               "{:.3f}, \"p50\": {:.3f}, \"p90\": {:.3f}, \"p99\": {:.3f}, \"max\": {:.3f}, "
               "\"mean\": {:.3f}}}}}\n",
               json_escape(args.graph), args.threads, runs, args.warmup, seconds, rate, lat.min_us,
               lat.p50_us, lat.p90_us, lat.p99_us, lat.max_us, lat.mean_us);
  } else {
    fmt::print(out, "{} runs on {} threads in {:.3f} s: {:.1f} runs/s\n", runs, args.threads,
               seconds, rate);
    fmt::print(out, "latency (us): p50 {:.1f}  p90 {:.1f}  p99 {:.1f}  max {:.1f}  mean {:.1f}\n",
               lat.p50_us, lat.p90_us, lat.p99_us, lat.max_us, lat.mean_us);
  }
  std::fflush(out);
  return kExitOk;
}

}  // namespace graphrun::cli
