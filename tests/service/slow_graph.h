// A graph whose run outlasts the tests that stop a step (deadline, client
// cancel, stop token, shutdown): a chain of `products` kSlowDim x kSlowDim
// MatMuls ending in "slow". Each product is ~1 ms optimised on one core at
// AVX-512 (0.5 ms on two; far more at the baseline level, in Debug or
// under a sanitizer: ~300 ms under ASan), so a step stops within about that
// of being told to, and 2000 products take seconds. A test that lets such a
// chain run to its end sizes it with slow_products_for. (Import and planning grow faster than
// linearly with the chain: 20 000 products cost ~20 s before the first one ran.)
#pragma once

#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace graphrun::testing {

inline constexpr int64_t kSlowDim = 512;

inline Graph slow_graph(int products = 2000) {
  Graph g;
  Output m = ops::Const(g, Tensor::filled(Shape{kSlowDim, kSlowDim}, 0.001f), "m");
  for (int i = 0; i < products; ++i) m = ops::MatMul(g, m, m);
  ops::Identity(g, m, "slow");
  return g;
}

inline v1::GraphDef slow_graph_def(int products = 2000) {
  return graph_to_graph_def(slow_graph(products)).value();
}

// A partial-run graph with a quick fetch and a slow one: "a" feeds "a2"
// (Identity), and "x" ([kSlowDim, kSlowDim] float) feeds a chain of `products`
// MatMuls ending in "slow". Declare feeds {a, x} and fetches {a2, slow}.
inline v1::GraphDef slow_partial_graph_def(int products) {
  Graph g;
  Output a = ops::Placeholder(g, DType::kFloat32, Shape{}, "a");
  ops::Identity(g, a, "a2");
  Output m = ops::Placeholder(g, DType::kFloat32, Shape{kSlowDim, kSlowDim}, "x");
  for (int i = 0; i < products; ++i) m = ops::MatMul(g, m, m);
  ops::Identity(g, m, "slow");
  return graph_to_graph_def(g).value();
}

// How many products make a chain last about `target` in this build on this
// machine: one product is ~4 ms optimised and ~300 ms under ASan, so a fixed
// count that is long enough optimised made ASan runs last minutes. Timed once
// per process on a chain of 2 products (first run excluded); at least 2,
// and at most 1000 (should a product ever time as nearly free, the chain
// must not grow without bound).
inline int slow_products_for(std::chrono::milliseconds target) {
  static const double per_product_ms = [] {
    auto session = Session::create(slow_graph(2)).value();
    (void)session->run({}, {"slow"}, {}).value();  // plans and warms up
    const auto start = std::chrono::steady_clock::now();
    (void)session->run({}, {"slow"}, {}).value();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    return std::max(took.count() / 2.0, 1e-3);
  }();
  const double products = std::ceil(static_cast<double>(target.count()) / per_product_ms);
  return static_cast<int>(std::clamp(products, 2.0, 1000.0));
}

}  // namespace graphrun::testing
