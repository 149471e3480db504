// graphrun-mpi-across: the demo's model across two processes (README,
// "Across processes"). Every rank builds the same graph, with stage 1 (the
// dense layers and their variables) on rank 1 and stage 2 (the head) on
// rank 0. Rank 0 drives it with a DistributedSession: one partial run over
// two calls, where the second call's temperature is computed outside the
// graph from the first call's output, as in the one-process demo. Rank 0
// then checks the results against an ordinary Session over the same graph
// in its own process, and reads stage 1's run counter from rank 1: stage 1
// ran once for the partial run. Ranks past 1 serve without work.
//
//   mpirun -np 2 build/release/tools/mpi-example/graphrun-mpi-across
#include <fmt/format.h>
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "../demo/model.h"

namespace mpi = graphrun::mpi;
using graphrun::Graph;
using graphrun::Session;
using graphrun::Shape;
using graphrun::Status;
using graphrun::Tensor;

namespace {

[[noreturn]] void fail(const Status& s) {
  std::fprintf(stderr, "failed: %s\n", s.to_string().c_str());
  std::exit(1);
}

float mean_of(const Tensor& t) {
  double sum = 0;
  for (float v : t.flat<float>()) sum += v;
  return static_cast<float>(sum / static_cast<double>(t.num_elements()));
}

}  // namespace

int main(int argc, char** argv) {
  auto world_or = mpi::World::init(&argc, &argv);
  if (!world_or.is_ok()) fail(world_or.status());
  const std::shared_ptr<mpi::World> world = *world_or;
  const bool split = world->size() > 1;
  Graph g;
  const graphrun::demo::Model m =
      graphrun::demo::build(g, split ? "/rank:1" : "", split ? "/rank:0" : "", true);
  const graphrun::Node* init = graphrun::ops::GlobalVariablesInitializer(g);
  if (!g.status().is_ok()) fail(g.status());

  if (world->rank() != 0) {
    // A worker: runs its part of each of rank 0's steps until it closes.
    if (Status s = mpi::serve(g); !s.is_ok()) fail(s);
    return 0;
  }
  auto session_or = mpi::DistributedSession::create(g);
  if (!session_or.is_ok()) fail(session_or.status());
  mpi::DistributedSession& session = **session_or;
  if (auto r = session.run({}, {}, {init}); !r.is_ok()) fail(r.status());

  const Tensor batch =
      Tensor::filled<float>(Shape{graphrun::demo::kBatch, graphrun::demo::kWidth}, 0.5f);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto run = session.partial_run_setup({m.hidden, m.score}, {m.x, m.temperature});
  if (!run.is_ok()) fail(run.status());
  auto hidden = session.partial_run(*run, {{m.x, batch}}, {m.hidden});  // stage 1, on rank 1
  if (!hidden.is_ok()) fail(hidden.status());
  const float temperature = 1.0f / (1.0f + mean_of((*hidden)[0]));
  auto score = session.partial_run(*run, {{m.temperature, Tensor(temperature)}}, {m.score});
  if (!score.is_ok()) fail(score.status());
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  auto runs = session.run({}, {m.stage1_runs});
  if (!runs.is_ok()) fail(runs.status());

  // The same partial run in one process, over the same graph.
  auto local = Session::create(g).value();
  if (auto r = local->run({}, {}, {init}); !r.is_ok()) fail(r.status());
  auto handle = local->partial_run_setup({m.hidden, m.score}, {m.x, m.temperature}).value();
  auto h1 = local->partial_run(handle, {{m.x, batch}}, {m.hidden});
  auto s1 = local->partial_run(handle, {{m.temperature, Tensor(temperature)}}, {m.score});
  if (!h1.is_ok() || !s1.is_ok()) fail(!h1.is_ok() ? h1.status() : s1.status());

  fmt::print("{} ranks: stage 1 ({} dense layers of {}x{}) on rank {}, stage 2 on rank 0\n",
             world->size(), graphrun::demo::kLayers, graphrun::demo::kWidth, graphrun::demo::kWidth,
             split ? 1 : 0);
  fmt::print("one partial run, 2 calls, {:.0f} us: mean activation {:.6f} -> temperature {:.6f}\n",
             us, mean_of((*hidden)[0]), temperature);
  fmt::print("score = {:.6f}\n", (*score)[0].scalar<float>());
  const int64_t stage1 = (*runs)[0].scalar<int64_t>();
  fmt::print("stage 1 ran {} time(s) on rank {}\n", stage1, split ? 1 : 0);
  const bool same = (*score)[0].equals((*s1)[0]) && (*hidden)[0].equals((*h1)[0]);
  fmt::print("same results as one process: {}\n", same ? "yes" : "NO");
  if (Status s = session.close(); !s.is_ok()) fail(s);
  return same && stage1 == 1 ? 0 : 1;
}
