// An outside user of an installed graphrun: builds y = x + 2, feeds x = 3
// and checks that y is 5. With graphrun::graphdef, the same graph goes
// through a GraphDef; with graphrun::service, a session of the registry of a
// server listening on 127.0.0.1:0 runs it; with graphrun::mpi, an AllReduce
// builds and, MPI not being initialised here, reports what to call first.
// Prints what it checked; exits 0 on success, 1 otherwise.
#include <graphrun/graphrun.h>
#ifdef CONSUMER_GRAPHDEF
#include <graphrun/graph_def.h>
#endif
#ifdef CONSUMER_SERVICE
#include <graphrun/server.h>
#endif
#ifdef CONSUMER_MPI
#include <graphrun/mpi.h>
#endif

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

#ifdef CONSUMER_GRAPHDEF
  auto graph_def = graphrun::graph_to_graph_def(g);
  auto bytes = graph_def.is_ok()
                   ? graphrun::serialize_graph_def(*graph_def, graphrun::GraphDefFormat::kBinary)
                   : graphrun::Result<std::string>(graph_def.status());
  auto parsed = bytes.is_ok() ? graphrun::parse_graph_def(*bytes, graphrun::GraphDefFormat::kBinary)
                              : graphrun::Result<graphrun::v1::GraphDef>(bytes.status());
  auto imported = parsed.is_ok() ? graphrun::graph_from_graph_def(*parsed)
                                 : graphrun::Result<Graph>(parsed.status());
  if (!imported.is_ok() || imported->num_nodes() != g.num_nodes()) {
    std::fprintf(stderr, "graphdef round trip: %s\n", imported.status().to_string().c_str());
    return 1;
  }
  std::printf("graphrun install consumer: graphdef ok (%zu bytes)\n", bytes->size());
#endif

#ifdef CONSUMER_SERVICE
  auto server = graphrun::Server::start();
  if (!server.is_ok() || (*server)->port() <= 0) {
    std::fprintf(stderr, "Server::start: %s\n", server.status().to_string().c_str());
    return 1;
  }
  auto created = (*server)->registry().create(*parsed);
  auto remote = created.is_ok()
                    ? (*server)->registry().run(created->handle, {{"x", Tensor(4.0f)}}, {"y"}, {})
                    : graphrun::Result<std::vector<Tensor>>(created.status());
  if (!remote.is_ok() || remote->front().scalar<float>() != 6.0f) {
    std::fprintf(stderr, "service: %s\n", remote.status().to_string().c_str());
    return 1;
  }
  (*server)->shutdown();
  std::printf("graphrun install consumer: service ok (listened on %s)\n",
              (*server)->address().c_str());
#endif

#ifdef CONSUMER_MPI
  Output sum = graphrun::ops::AllReduce(g, y, graphrun::mpi::Reduction::kSum, "sum");
  auto mpi_session = Session::create(g);
  auto mpi_out = mpi_session.is_ok() ? (*mpi_session)->run({{x, Tensor(3.0f)}}, {sum})
                                     : graphrun::Result<std::vector<Tensor>>(mpi_session.status());
  if (mpi_out.is_ok() ||
      mpi_out.status().message().find("World::init() first") == std::string::npos) {
    std::fprintf(stderr, "mpi: expected the no-world error, got %s\n",
                 mpi_out.status().to_string().c_str());
    return 1;
  }
  std::printf("graphrun install consumer: mpi ok\n");
#endif
  return 0;
}
