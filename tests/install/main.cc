// An outside user of an installed graphrun: builds y = x + 2, feeds x = 3
// and checks that y is 5. Exits 0 on success, 1 otherwise.
#include <graphrun/graphrun.h>

#include <cstdio>
#include <memory>
#include <vector>

int main() {
  using graphrun::DType;
  using graphrun::Graph;
  using graphrun::Output;
  using graphrun::Session;
  using graphrun::Shape;
  using graphrun::Tensor;
  namespace ops = graphrun::ops;

  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output two = ops::Const(g, Tensor(2.0f), "two");
  Output y = ops::Add(g, x, two, "y");
  if (!g.status().is_ok()) {
    std::fprintf(stderr, "graph: %s\n", g.status().to_string().c_str());
    return 1;
  }

  auto session = Session::create(g);
  if (!session.is_ok()) {
    std::fprintf(stderr, "Session::create: %s\n", session.status().to_string().c_str());
    return 1;
  }
  auto out = (*session)->run({{x, Tensor(3.0f)}}, {y});
  if (!out.is_ok()) {
    std::fprintf(stderr, "run: %s\n", out.status().to_string().c_str());
    return 1;
  }
  if (out->size() != 1 || out->front().dtype() != DType::kFloat32 ||
      out->front().scalar<float>() != 5.0f) {
    std::fprintf(stderr, "expected y = 5\n");
    return 1;
  }
  std::printf("graphrun install consumer: y = %g\n",
              static_cast<double>(out->front().scalar<float>()));
  return 0;
}
