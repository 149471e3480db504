// graphrun-mpi-example: data-parallel training across MPI ranks.
//
//   mpirun -np 2 build/release/tools/mpi-example/graphrun-mpi-example
//
// Every rank holds its own shard of a linear-regression problem
// (y = 3 x0 - 2 x1 + 0.5 plus noise) and runs the same graph in its own
// session: its gradient, averaged over the ranks with AllReduce, updates its
// copy of the weights. Rank 0 prints the loss as it falls; at the end the
// ranks gather their weights and check that every replica holds the same
// bits. Exits 0 when they do.
#include <fmt/format.h>
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>

#include <cstring>
#include <random>
#include <vector>

using graphrun::DType;
using graphrun::Graph;
using graphrun::Output;
using graphrun::Session;
using graphrun::Shape;
using graphrun::Tensor;
namespace ops = graphrun::ops;
namespace mpi = graphrun::mpi;

namespace {

constexpr int64_t kRows = 256;  // per rank
constexpr int64_t kFeatures = 3;
constexpr int kSteps = 60;

// This rank's shard: features (x0, x1, 1) and targets.
std::pair<Tensor, Tensor> shard(int rank) {
  std::mt19937 gen(1234u + static_cast<unsigned>(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kRows * kFeatures);
  std::vector<float> y(kRows);
  for (int64_t i = 0; i < kRows; ++i) {
    const float x0 = normal(gen);
    const float x1 = normal(gen);
    x[static_cast<std::size_t>(i * kFeatures)] = x0;
    x[static_cast<std::size_t>(i * kFeatures + 1)] = x1;
    x[static_cast<std::size_t>(i * kFeatures + 2)] = 1.0f;
    y[static_cast<std::size_t>(i)] = 3.0f * x0 - 2.0f * x1 + 0.5f + 0.1f * normal(gen);
  }
  return {Tensor::from_span<float>(Shape{kRows, kFeatures}, x),
          Tensor::from_span<float>(Shape{kRows, 1}, y)};
}

int fail(const graphrun::Status& s) {
  fmt::print(stderr, "graphrun-mpi-example: {}\n", s.to_string());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto world = mpi::World::init(&argc, &argv);
  if (!world.is_ok()) return fail(world.status());
  const int rank = (*world)->rank();
  const int ranks = (*world)->size();

  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{kRows, kFeatures}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{kRows, 1}, "y");
  Output w = ops::Variable(g, Tensor::filled<float>(Shape{kFeatures, 1}, 0.0f), "w");
  const graphrun::Node* init = ops::GlobalVariablesInitializer(g);
  Output residual = ops::Sub(g, ops::MatMul(g, x, w), y, "residual");
  // The mean squared error and its gradient, X^T r * 2 / rows, on this shard.
  Output loss = ops::Mean(g, ops::Square(g, residual), std::vector<int64_t>{0, 1}, false, "loss");
  Output grad = ops::Mul(g, ops::MatMul(g, x, residual, {.transpose_a = true}),
                         ops::Const(g, Tensor(2.0f / static_cast<float>(kRows))), "grad");
  // The ranks' mean gradient and loss: every replica takes the same step.
  Output avg_grad = ops::AllReduce(g, grad, mpi::Reduction::kMean, "avg_grad");
  Output avg_loss = ops::AllReduce(g, loss, mpi::Reduction::kMean, "avg_loss");
  Output step =
      ops::AssignSub(g, w, ops::Mul(g, avg_grad, ops::Const(g, Tensor(0.1f))), {}, "step");
  Output replicas = ops::AllGather(g, ops::Reshape(g, w, {1, kFeatures}), "replicas");
  if (!g.status().is_ok()) return fail(g.status());

  auto session = Session::create(g);
  if (!session.is_ok()) return fail(session.status());
  if (auto s = (*session)->run({}, {}, {init}); !s.is_ok()) return fail(s.status());
  auto [xs, ys] = shard(rank);
  if (rank == 0) fmt::print("{} ranks, {} rows each\n", ranks, kRows);
  for (int i = 0; i < kSteps; ++i) {
    auto out = (*session)->run({{x, xs}, {y, ys}}, {avg_loss, step});
    if (!out.is_ok()) return fail(out.status());
    if (rank == 0 && (i % 10 == 0 || i == kSteps - 1)) {
      fmt::print("step {:2}: mean loss {:.5f}\n", i, (*out)[0].scalar<float>());
    }
  }
  auto all = (*session)->run({}, {replicas});
  if (!all.is_ok()) return fail(all.status());
  const Tensor& every = (*all)[0];
  bool agree = true;
  const auto* bytes = static_cast<const char*>(every.raw_data());
  const std::size_t row = kFeatures * sizeof(float);
  for (int r = 1; r < ranks; ++r) agree = agree && std::memcmp(bytes, bytes + r * row, row) == 0;
  if (rank == 0) {
    const auto wf = every.flat<float>();
    fmt::print("w = ({:.3f}, {:.3f}, {:.3f}); every replica {}\n", wf[0], wf[1], wf[2],
               agree ? "holds the same bits" : "DIFFERS");
  }
  return agree ? 0 : 1;
}
