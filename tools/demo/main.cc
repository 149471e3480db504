// graphrun-demo: the README's example. A two-stage graph, as in a model's
// forward pass: an expensive first stage (a stack of dense layers) feeding a
// cheap second stage (a head that reduces to a score). Runs it, prints what
// it computed, how many times each stage's nodes executed (from step
// statistics), and how long each run took.
#include <fmt/format.h>
#include <graphrun/graphrun.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

using graphrun::DType;
using graphrun::Graph;
using graphrun::Output;
using graphrun::RunMetadata;
using graphrun::RunOptions;
using graphrun::Session;
using graphrun::Shape;
using graphrun::Tensor;
namespace ops = graphrun::ops;

namespace {

constexpr int64_t kBatch = 64;
constexpr int64_t kWidth = 256;
constexpr int kLayers = 4;

struct Model {
  Output x;       // the input batch
  Output hidden;  // end of stage 1
  Output score;   // end of stage 2
};

Model build(Graph& g) {
  g.set_seed(42);
  Model m;
  m.x = ops::Placeholder(g, DType::kFloat32, Shape{kBatch, kWidth}, "x");
  {
    auto scope = g.name_scope("stage1");
    Output h = m.x;
    for (int i = 0; i < kLayers; ++i) {
      const std::string name = fmt::format("w{}", i);
      Output w = ops::Variable(
          g, ops::RandomNormal(g, Shape{kWidth, kWidth}, DType::kFloat32, 0.0, 0.06), name);
      h = ops::Relu(g, ops::MatMul(g, h, w));
    }
    m.hidden = ops::Identity(g, h, "hidden");
  }
  {
    auto scope = g.name_scope("stage2");
    Output w =
        ops::Variable(g, ops::RandomNormal(g, Shape{kWidth, 1}, DType::kFloat32, 0.0, 0.06), "w");
    Output logits = ops::MatMul(g, m.hidden, w);
    m.score = ops::Mean(g, ops::Sigmoid(g, logits), {0, 1}, false, "score");
  }
  return m;
}

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

  // One run fetching both stages: each stage executes once.
  auto run_timed = [&](std::vector<graphrun::TensorRef> fetches, const char* label) {
    RunMetadata md;
    const auto t0 = std::chrono::steady_clock::now();
    auto out = session.run({{m.x, batch}}, fetches, {}, traced, &md);
    const auto us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (!out.is_ok()) {
      std::fprintf(stderr, "run failed: %s\n", out.status().to_string().c_str());
      std::exit(1);
    }
    const auto counts = executions(md);
    std::printf("%-34s %9.1f us   MatMuls executed: stage1=%d stage2=%d\n", label, us,
                counts.count("stage1") ? counts.at("stage1") : 0,
                counts.count("stage2") ? counts.at("stage2") : 0);
    return std::move(*out);
  };

  run_timed({m.score}, "warm-up run(score)");
  auto both = run_timed({m.hidden, m.score}, "run(hidden, score)");
  std::printf("\n  score = %.6f   hidden: %s, mean activation %.6f\n\n", both[1].scalar<float>(),
              both[0].debug_type().c_str(), [&] {
                double sum = 0;
                for (float v : both[0].flat<float>()) sum += v;
                return sum / static_cast<double>(both[0].num_elements());
              }());

  // The same two results from two separate runs: stage 1 executes twice.
  std::printf("Two separate runs (what partial runs will avoid):\n");
  auto h = run_timed({m.hidden}, "  run(hidden)");
  auto s = run_timed({m.score}, "  run(score)");
  std::printf("  same score as the joint run: %s\n", s[0].equals(both[1]) ? "yes" : "NO");
  return s[0].equals(both[1]) && h[0].equals(both[0]) ? 0 : 1;
}
