#include "scheduler/mpi/src/ship.h"

#include <graphrun/graph_def.h>
#include <graphrun/op_kernel.h>

#include <utility>

#include "scheduler/mpi/src/control.h"

namespace graphrun::mpi::internal {

Result<std::string> encode_part(const Graph& graph, int ranks, int rank, int64_t session) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Partition> part,
                            Partition::make(graph, ranks, rank, session));
  Result<v1::GraphDef> def = graph_to_graph_def(part->local());
  if (!def.is_ok()) {
    return def.status().with_prefix(
        "this rank has no graph of its own (serve_without_graph, graphrun-server --mpi-worker) "
        "and its part cannot be sent to it");
  }
  std::string bytes;
  if (!def->SerializeToString(&bytes)) {
    return internal_error("rank {}'s part of the graph did not serialize", rank);
  }
  Writer w;
  w.str(part->step_name());
  w.u64(graph.seed().has_value() ? 1 : 0).i64(graph.seed().value_or(0));
  w.str(bytes);
  return w.take();
}

Result<std::unique_ptr<Partition>> decode_part(std::string_view payload, int rank,
                                               int64_t session) {
  Reader r(payload);
  GRAPHRUN_ASSIGN_OR_RETURN(std::string step_name, r.str());
  GRAPHRUN_ASSIGN_OR_RETURN(uint64_t has_seed, r.u64());
  GRAPHRUN_ASSIGN_OR_RETURN(int64_t seed, r.i64());
  GRAPHRUN_ASSIGN_OR_RETURN(std::string bytes, r.str());
  v1::GraphDef def;
  if (!def.ParseFromString(bytes)) {
    return invalid_argument("the driver's part of the graph for rank {} is not a GraphDef", rank);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Graph local, graph_from_graph_def(def, OpRegistry::global()));
  if (has_seed != 0) local.set_seed(seed);
  return Partition::adopt(std::move(local), rank, session, step_name);
}

}  // namespace graphrun::mpi::internal
