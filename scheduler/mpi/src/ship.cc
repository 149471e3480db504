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

Result<std::string> encode_delta(const Graph& delta, const std::vector<Stub>& stubs) {
  GRAPHRUN_ASSIGN_OR_RETURN(v1::GraphDef def, graph_to_graph_def(delta));
  std::string bytes;
  if (!def.SerializeToString(&bytes)) return internal_error("a delta did not serialize");
  Writer w;
  w.u64(stubs.size());
  for (const Stub& s : stubs) {
    w.str(s.name).u64(static_cast<uint64_t>(s.kind)).str(s.ref).i64(s.edge);
  }
  w.str(bytes);
  return w.take();
}

Result<std::pair<Graph, std::vector<Stub>>> decode_delta(std::string_view payload) {
  Reader r(payload);
  GRAPHRUN_ASSIGN_OR_RETURN(uint64_t n, r.u64());
  std::vector<Stub> stubs;
  for (uint64_t k = 0; k < n; ++k) {
    Stub s;
    GRAPHRUN_ASSIGN_OR_RETURN(s.name, r.str());
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t kind, r.u64());
    if (kind > Stub::kStep) return internal_error("a delta's stub of kind {}", kind);
    s.kind = static_cast<Stub::Kind>(kind);
    GRAPHRUN_ASSIGN_OR_RETURN(s.ref, r.str());
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t edge, r.i64());
    s.edge = static_cast<int>(edge);
    stubs.push_back(std::move(s));
  }
  GRAPHRUN_ASSIGN_OR_RETURN(std::string bytes, r.str());
  v1::GraphDef def;
  if (!def.ParseFromString(bytes)) return invalid_argument("the driver's delta is not a GraphDef");
  GRAPHRUN_ASSIGN_OR_RETURN(Graph delta, graph_from_graph_def(def, OpRegistry::global()));
  return std::make_pair(std::move(delta), std::move(stubs));
}

}  // namespace graphrun::mpi::internal
