// A worker killed in the middle of a step (tests/mpi/CMakeLists.txt runs
// it under mpirun on 2 ranks): rank 1's kernel kills its own process with
// SIGKILL during the second step. Open MPI 4.1 (Debian's, without the
// fault-tolerance extensions) then ends the whole job: mpirun reports the
// signal and kills rank 0, whose step is waiting. The ctest entry checks
// that the job ends (no hang) and how; graphrun cannot keep rank 0 alive
// past a lost process on this MPI (docs/distributed.md, Faults).
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>

int main(int argc, char** argv) {
  using namespace graphrun;
  auto world = mpi::World::init(&argc, &argv).value();
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y;
  {
    auto scope = g.device("/rank:1");
    y = ops::Call(
        g, {x}, {DType::kFloat32},
        [](OpKernelContext& ctx) -> Status {
          if (ctx.input(0).scalar<float>() > 0) std::raise(SIGKILL);
          return ctx.set_output(0, ctx.input(0));
        },
        {}, "dies")[0];
  }
  auto back = g.device("/rank:0");
  Output z = ops::Add(g, y, x, "z");
  if (world->rank() != 0) return mpi::serve(g).is_ok() ? 0 : 1;
  auto session = mpi::DistributedSession::create(g).value();
  RunOptions options;
  options.timeout = std::chrono::seconds(30);
  std::printf("first step: %s\n",
              session->run({{x, Tensor(0.0f)}}, {z}, {}, options).status().to_string().c_str());
  std::fflush(stdout);
  auto r = session->run({{x, Tensor(1.0f)}}, {z}, {}, options);
  std::printf("second step returned: %s\n", r.status().to_string().c_str());
  return 1;
}
