// The demo's model (README, "A complete example"; and "Across processes"):
// a stack of dense layers (stage 1) feeding a head that reduces to a score
// scaled by a temperature fed at run time (stage 2). With devices given,
// each stage is placed there ("/rank:1"); the stage-1 counter (a variable
// of stage 1, bumped once per execution of the stage) shows how often it
// ran on whichever rank holds it.
#pragma once

#include <fmt/format.h>
#include <graphrun/graphrun.h>

#include <optional>
#include <string>
#include <string_view>

namespace graphrun::demo {

inline constexpr int64_t kBatch = 64;
inline constexpr int64_t kWidth = 256;
inline constexpr int kLayers = 4;

struct Model {
  Output x;            // the input batch
  Output temperature;  // stage 2's scale, fed at run time
  Output hidden;       // end of stage 1
  Output score;        // end of stage 2
  Output stage1_runs;  // how many times stage 1 ran (with count_stage1)
};

inline Model build(Graph& g, std::string_view stage1_device = {},
                   std::string_view stage2_device = {}, bool count_stage1 = false) {
  g.set_seed(42);
  Model m;
  m.x = ops::Placeholder(g, DType::kFloat32, Shape{kBatch, kWidth}, "x");
  {
    auto scope = g.name_scope("stage1");
    std::optional<Graph::ScopeGuard> placed;
    if (!stage1_device.empty()) placed.emplace(g.device(stage1_device));
    Output h = m.x;
    for (int i = 0; i < kLayers; ++i) {
      const std::string name = fmt::format("w{}", i);
      Output w = ops::Variable(
          g, ops::RandomNormal(g, Shape{kWidth, kWidth}, DType::kFloat32, 0.0, 0.06), name);
      h = ops::Relu(g, ops::MatMul(g, h, w));
    }
    if (count_stage1) {
      Output runs = ops::Variable(g, Tensor(int64_t{0}), "runs");
      Output bump = ops::AssignAdd(g, runs, ops::Const(g, Tensor(int64_t{1})), {}, "bump");
      m.stage1_runs = ops::ReadVariable(g, runs, "runs_read");
      auto deps = g.control_dependencies({bump.node()});
      m.hidden = ops::Identity(g, h, "hidden");
    } else {
      m.hidden = ops::Identity(g, h, "hidden");
    }
  }
  {
    auto scope = g.name_scope("stage2");
    std::optional<Graph::ScopeGuard> placed;
    if (!stage2_device.empty()) placed.emplace(g.device(stage2_device));
    Output w =
        ops::Variable(g, ops::RandomNormal(g, Shape{kWidth, 1}, DType::kFloat32, 0.0, 0.06), "w");
    m.temperature = ops::Placeholder(g, DType::kFloat32, Shape{}, "temperature");
    Output logits = ops::Mul(g, ops::MatMul(g, m.hidden, w), m.temperature);
    m.score = ops::Mean(g, ops::Sigmoid(g, logits), {0, 1}, false, "score");
  }
  return m;
}

}  // namespace graphrun::demo
