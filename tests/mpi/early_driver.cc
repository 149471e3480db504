// A driver that returns before it makes a DistributedSession (tests/mpi/
// CMakeLists.txt runs it under mpirun on 2 ranks, and with graphrun-server
// --mpi-worker on rank 1): the worker's serve() must end, Aborted, instead
// of waiting for ever for a driver that is gone.
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  using namespace graphrun;
  auto world = mpi::World::init(&argc, &argv).value();
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  {
    auto scope = g.device("/rank:1");
    ops::Neg(g, x, "y");
  }
  if (world->rank() != 0) {
    const Status s = mpi::serve(g);
    std::printf("rank %d: serve returned %s\n", world->rank(), s.to_string().c_str());
    std::fflush(stdout);
    return s.code() == StatusCode::kAborted ? 0 : 1;
  }
  std::printf("rank 0: returns without a DistributedSession\n");
  std::fflush(stdout);
  return 0;
}
