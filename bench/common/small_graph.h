// The 10-node scalar graph shared by the small-graph benches
// (bench/scheduler/small_graph_bench.cc, partial_run_bench.cc):
//
//   a = x + y        b = x * y
//   c = a - b        d = -a        e = b^2
//   f = c * d        g = e + c
//   h = f - g        i = h^2       j = i + f   (fetched)
#pragma once

#include <graphrun/graphrun.h>

#include <array>
#include <vector>

#include "bench/common/raw_graph.h"

namespace graphrun::bench {

struct SmallGraph {
  Graph g;
  Output x, y, j;
  std::vector<const Node*> compute;  // the 10 nodes

  SmallGraph() {
    x = ops::Placeholder(g, DType::kFloat32, Shape(), "x");
    y = ops::Placeholder(g, DType::kFloat32, Shape(), "y");
    Output a = ops::Add(g, x, y, "a");
    Output b = ops::Mul(g, x, y, "b");
    Output c = ops::Sub(g, a, b, "c");
    Output d = ops::Neg(g, a, "d");
    Output e = ops::Square(g, b, "e");
    Output f = ops::Mul(g, c, d, "f");
    Output gg = ops::Add(g, e, c, "g");
    Output h = ops::Sub(g, f, gg, "h");
    Output i = ops::Square(g, h, "i");
    j = ops::Add(g, i, f, "j");
    check_ok(g.status(), "building the small graph");
  }

  // The raw baselines' layout of the 10 nodes: x and y fed, j fetched.
  RawLayout raw_layout(KernelTable& kernels) const {
    const std::array<Output, 2> feeds{x, y};
    const std::array<Output, 1> fetches{j};
    return RawLayout::make(g, kernels, feeds, fetches, {});
  }
};

}  // namespace graphrun::bench
