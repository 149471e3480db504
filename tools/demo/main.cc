// graphrun-demo: the README's example. A two-stage graph, as in a model's
// forward pass: an expensive first stage (a stack of dense layers) feeding a
// cheap second stage (a head that reduces to a score, scaled by a
// temperature fed at run time). Runs it, prints what it computed, how many
// times each stage's nodes executed (from step statistics), and how long
// each way took: two separate runs (stage 1 executes twice) against one
// partial run whose second input is computed outside the graph from the
// first call's output (stage 1 executes once). First it prints the level the
// kernels run at (GRAPHRUN_CPU_ISA=baseline|avx2|avx512 lowers it) and the
// session's thread count.
#include <fmt/format.h>
#include <graphrun/graphrun.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

// Relative: this target does not have the repository root on its include
// path; the header is self-contained (public API and fmt only).
#include "../graphrun/build_info.h"
#include "model.h"

using graphrun::DType;
using graphrun::Graph;
using graphrun::Output;
using graphrun::RunMetadata;
using graphrun::RunOptions;
using graphrun::Session;
using graphrun::Shape;
using graphrun::Tensor;
namespace ops = graphrun::ops;
using graphrun::demo::build;
using graphrun::demo::kBatch;
using graphrun::demo::kLayers;
using graphrun::demo::kWidth;
using graphrun::demo::Model;

namespace {

// Node executions per stage, from the step statistics of one run.
std::map<std::string, int> executions(const RunMetadata& md) {
  std::map<std::string, int> per_stage;
  for (const auto& s : md.step_stats) {
    const auto slash = s.node.find('/');
    const std::string stage = slash == std::string::npos ? "(inputs)" : s.node.substr(0, slash);
    if (s.op == "MatMul") ++per_stage[stage];
  }
  return per_stage;
}

}  // namespace

int main() {
  // "kernels: avx512 (AVX-512 F/BW/DQ/VL), 2 threads"; an invalid
  // GRAPHRUN_CPU_ISA is named here, and Session::create below fails with it.
  if (const graphrun::Status& isa = graphrun::cpu_isa_status(); isa.is_ok()) {
    const graphrun::CpuIsa level = graphrun::cpu_isa();
    fmt::print("kernels: {} ({}), {} threads\n", graphrun::cpu_isa_name(level),
               graphrun::tools::cpu_isa_features(level), graphrun::ThreadPool::default_threads());
  } else {
    fmt::print("kernels: error: {}\n", isa.message());
  }
  std::fflush(stdout);
  Graph g;
  const Model m = build(g);
  const graphrun::Node* init = ops::GlobalVariablesInitializer(g);
  if (!g.status().is_ok()) {
    std::fprintf(stderr, "graph build failed: %s\n", g.status().to_string().c_str());
    return 1;
  }
  auto session_or = Session::create(g);
  if (!session_or.is_ok()) {
    std::fprintf(stderr, "%s\n", session_or.status().to_string().c_str());
    return 1;
  }
  Session& session = **session_or;
  if (auto r = session.run({}, {}, {init}); !r.is_ok()) {
    std::fprintf(stderr, "init failed: %s\n", r.status().to_string().c_str());
    return 1;
  }

  Tensor batch = Tensor::filled<float>(Shape{kBatch, kWidth}, 0.5f);
  RunOptions traced;
  traced.trace = true;

  std::printf(
      "graphrun demo: %d dense layers of %lldx%lld (stage 1) feeding a sigmoid head (stage 2)\n",
      kLayers, static_cast<long long>(kWidth), static_cast<long long>(kWidth));
  std::printf("graph: %d nodes\n\n", g.num_nodes());

  struct Counts {
    int stage1 = 0;
    int stage2 = 0;
    void add(const RunMetadata& md) {
      const auto c = executions(md);
      stage1 += c.count("stage1") ? c.at("stage1") : 0;
      stage2 += c.count("stage2") ? c.at("stage2") : 0;
    }
  };
  auto fail = [](const graphrun::Status& s) {
    std::fprintf(stderr, "failed: %s\n", s.to_string().c_str());
    std::exit(1);
  };
  auto mean_of = [](const Tensor& t) {
    double sum = 0;
    for (float v : t.flat<float>()) sum += v;
    return static_cast<float>(sum / static_cast<double>(t.num_elements()));
  };
  using Clock = std::chrono::steady_clock;
  auto us_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };

  // Warm-up: compiles both signatures' plans once.
  if (auto r = session.run({{m.x, batch}, {m.temperature, Tensor(1.0f)}}, {m.hidden, m.score});
      !r.is_ok()) {
    fail(r.status());
  }

  // Way 1: two separate runs. The temperature is computed outside the graph
  // from stage 1's output, so stage 1 must run again for the score.
  Counts two_runs;
  const auto t1 = Clock::now();
  RunMetadata md1;
  auto hidden = session.run({{m.x, batch}}, {m.hidden}, {}, traced, &md1);
  if (!hidden.is_ok()) fail(hidden.status());
  two_runs.add(md1);
  const float temperature = 1.0f / (1.0f + mean_of((*hidden)[0]));
  RunMetadata md2;
  auto score = session.run({{m.x, batch}, {m.temperature, Tensor(temperature)}}, {m.score}, {},
                           traced, &md2);
  if (!score.is_ok()) fail(score.status());
  two_runs.add(md2);
  const double two_runs_us = us_since(t1);

  // Way 2: one partial run over two calls. Stage 1 runs once; the second
  // call feeds the temperature and runs only stage 2.
  Counts partial;
  const auto t2 = Clock::now();
  auto handle = session.partial_run_setup({m.hidden, m.score}, {m.x, m.temperature});
  if (!handle.is_ok()) fail(handle.status());
  RunMetadata pm1;
  auto p_hidden = session.partial_run(*handle, {{m.x, batch}}, {m.hidden}, {}, traced, &pm1);
  if (!p_hidden.is_ok()) fail(p_hidden.status());
  partial.add(pm1);
  const float p_temperature = 1.0f / (1.0f + mean_of((*p_hidden)[0]));
  RunMetadata pm2;
  auto p_score = session.partial_run(*handle, {{m.temperature, Tensor(p_temperature)}}, {m.score},
                                     {}, traced, &pm2);
  if (!p_score.is_ok()) fail(p_score.status());
  partial.add(pm2);
  const double partial_us = us_since(t2);

  std::printf("hidden: %s, mean activation %.6f -> temperature %.6f (computed outside the graph)\n",
              (*hidden)[0].debug_type().c_str(), mean_of((*hidden)[0]), temperature);
  std::printf("score = %.6f\n\n", (*score)[0].scalar<float>());
  std::printf("%-44s %10s %16s %16s\n", "", "time (us)", "stage-1 MatMuls", "stage-2 MatMuls");
  std::printf("%-44s %10.1f %16d %16d\n", "two runs: run(hidden), run(score)", two_runs_us,
              two_runs.stage1, two_runs.stage2);
  std::printf("%-44s %10.1f %16d %16d\n", "one partial run: setup + 2 partial_run calls",
              partial_us, partial.stage1, partial.stage2);
  std::printf("\npartial run: %.2fx faster, stage 1 executed %d time(s) instead of %d\n",
              two_runs_us / partial_us, partial.stage1 / kLayers, two_runs.stage1 / kLayers);
  const bool same = (*p_score)[0].equals((*score)[0]) && (*p_hidden)[0].equals((*hidden)[0]);
  std::printf("same results both ways: %s\n", same ? "yes" : "NO");
  return same && partial.stage1 == kLayers && two_runs.stage1 == 2 * kLayers ? 0 : 1;
}
