// Graphs whose parts are real control payloads, for the payload tests
// (control_payload_test.cc) and the fuzz seeds (tests/fuzz/make_mpi_seeds.cc).
//
// Thread safety: plain builders; no state.
#pragma once

#include <graphrun/graphrun.h>

namespace graphrun::testing {

// x (a placeholder) and y (a Const) on rank 0, their product on rank 1.
inline Graph product_across_two_ranks() {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
  Output y = ops::Const(g, Tensor{1.0f, 2.0f}, "y");
  {
    auto scope = g.device("/rank:1");
    ops::Mul(g, x, y, "product");
  }
  return g;
}

}  // namespace graphrun::testing
