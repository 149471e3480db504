// graphrun_cold_probe: one cold start in a process of its own, for
// bench/scheduler/cold_bench.cc (peak memory must come from a separate
// process per size: a process never gives its heap back).
//
//   graphrun_cold_probe <raw|call|callmoved|noop> <nodes>
//
// Builds a chain of <nodes> nodes, runs it once, and prints one line:
//   build_ns=<...> first_run_ns=<...> peak_bytes=<...> build_bytes=<...>
// raw:  default-policy continue_nodes calling one std::function, built in
//       a 1-thread arena, run once, destroyed (build_ns: construction and
//       edges; first_run_ns: the run plus the destruction).
// call: a Graph of ops::Call nodes with default attributes (build_ns:
//       Graph building), then Session::create (1 thread) and the first run
//       with the last node as target (first_run_ns: create + run).
// callmoved: the same, the graph moved into the session (no copy).
// noop: the same with ops::NoOp nodes.
// peak_bytes: the process's peak resident set (getrusage) minus its
// resident set before building anything; build_bytes: the resident set's
// growth while building (first touch of memory is a large part of a cold
// build's time).
#include <fmt/format.h>
#include <sys/resource.h>

#include <graphrun/graphrun.h>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "graphrun_cold_probe: %s\n", what.c_str());
  std::exit(1);
}

const std::function<void()>& work() {
  static const std::function<void()> fn = [] {};
  return fn;
}

void probe_raw(int n, int64_t& build_ns, int64_t& run_ns, int64_t& build_bytes) {
  using Node = tbb::flow::continue_node<tbb::flow::continue_msg>;
  tbb::task_arena arena(1);
  arena.execute([&] {
    const auto t0 = Clock::now();
    auto g = std::make_unique<tbb::flow::graph>();
    auto nodes = std::make_unique<std::deque<Node>>();
    const std::function<void()>* fn = &work();
    for (int i = 0; i < n; ++i) {
      nodes->emplace_back(*g, [fn](const tbb::flow::continue_msg&) {
        (*fn)();
        return tbb::flow::continue_msg();
      });
      if (i > 0) tbb::flow::make_edge((*nodes)[static_cast<std::size_t>(i - 1)], nodes->back());
    }
    build_ns = ns_since(t0);
    build_bytes = current_rss_bytes();
    const auto t1 = Clock::now();
    nodes->front().try_put(tbb::flow::continue_msg());
    g->wait_for_all();
    nodes.reset();
    g.reset();
    run_ns = ns_since(t1);
  });
}

void probe_graphrun(int n, bool call, bool move, int64_t& build_ns, int64_t& run_ns,
                    int64_t& build_bytes) {
  const std::function<void()>* fn = &work();
  const graphrun::ops::CallableFn body =
      [fn](std::span<const graphrun::Tensor>) -> graphrun::Result<std::vector<graphrun::Tensor>> {
    (*fn)();
    return std::vector<graphrun::Tensor>();
  };
  const auto t0 = Clock::now();
  graphrun::Graph g;
  graphrun::Node* prev = nullptr;
  for (int i = 0; i < n; ++i) {
    if (call) {
      graphrun::ops::Call(g, {}, {}, body, {}, fmt::format("n{}", i));
    } else {
      graphrun::ops::NoOp(g, fmt::format("n{}", i));
    }
    graphrun::Node* node = g.mutable_node(g.num_nodes() - 1);
    if (prev != nullptr && !g.add_control_input(node, prev).is_ok()) fail("add_control_input");
    prev = node;
  }
  if (!g.status().is_ok()) fail(g.status().to_string());
  build_ns = ns_since(t0);
  build_bytes = current_rss_bytes();
  const auto t1 = Clock::now();
  graphrun::SessionOptions options;
  options.inter_op_threads = 1;
  auto session = move ? graphrun::Session::create(std::move(g), options)
                      : graphrun::Session::create(g, options);
  if (!session.is_ok()) fail(session.status().to_string());
  auto r = (*session)->run({}, {}, {prev});
  if (!r.is_ok()) fail(r.status().to_string());
  run_ns = ns_since(t1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) fail("usage: graphrun_cold_probe <raw|call|callmoved|noop> <nodes>");
  const std::string kind = argv[1];
  const int n = std::atoi(argv[2]);
  if (n <= 0) fail("nodes must be positive");
  const int64_t before = current_rss_bytes();
  int64_t build_ns = 0;
  int64_t run_ns = 0;
  int64_t build_bytes = 0;
  if (kind == "raw") {
    probe_raw(n, build_ns, run_ns, build_bytes);
  } else if (kind == "call" || kind == "callmoved" || kind == "noop") {
    probe_graphrun(n, kind != "noop", kind == "callmoved", build_ns, run_ns, build_bytes);
  } else {
    fail("unknown kind " + kind);
  }
  std::printf("build_ns=%lld first_run_ns=%lld peak_bytes=%lld build_bytes=%lld\n",
              static_cast<long long>(build_ns), static_cast<long long>(run_ns),
              static_cast<long long>(peak_rss_bytes() - before),
              static_cast<long long>(build_bytes - before));
  return 0;
}
