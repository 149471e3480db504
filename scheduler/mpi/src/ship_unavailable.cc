// ship.h without graphrun::graphdef (GRAPHRUN_GRAPHDEF=OFF): a worker
// without a graph cannot get its part, and extend() cannot send a worker
// its new nodes.
#include "scheduler/mpi/src/ship.h"

namespace graphrun::mpi::internal {

Result<std::string> encode_part(const Graph&, int, int rank, int64_t) {
  return unimplemented(
      "rank {} has no graph of its own and this graphrun was built without GraphDef support "
      "(GRAPHRUN_GRAPHDEF=OFF) to send it its part",
      rank);
}

Result<std::unique_ptr<Partition>> decode_part(std::string_view, int, int64_t) {
  return unimplemented(
      "this graphrun was built without GraphDef support (GRAPHRUN_GRAPHDEF=OFF): a worker "
      "without a graph cannot take its part from the driver");
}

Result<std::string> encode_delta(const Graph&, const std::vector<Stub>&) {
  return unimplemented(
      "this graphrun was built without GraphDef support (GRAPHRUN_GRAPHDEF=OFF): extend() cannot "
      "send the workers their new nodes");
}

Result<std::pair<Graph, std::vector<Stub>>> decode_delta(std::string_view) {
  return unimplemented(
      "this graphrun was built without GraphDef support (GRAPHRUN_GRAPHDEF=OFF): a worker cannot "
      "take the driver's extension");
}

}  // namespace graphrun::mpi::internal
