// A rank's part of the graph as data, for a worker that has no graph of its
// own (serve_without_graph, graphrun-server --mpi-worker): the driver cuts
// the part (Partition::make) and sends it as a binary GraphDef with its
// step placeholder's name and the graph's seed; the worker adopts it
// (Partition::adopt). Built with graphrun::graphdef (ship.cc); without it
// (GRAPHRUN_GRAPHDEF=OFF) both calls are Unimplemented (ship_unavailable.cc).
//
// extend() sends a worker its delta the same way (encode_delta,
// decode_delta).
//
// Thread safety: thread-safe for distinct arguments.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/status.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "scheduler/mpi/src/partition.h"

namespace graphrun::mpi::internal {

// Rank `rank`'s part of `graph` (a world of `ranks`, session `session`): the
// payload of a kPart message. Every node of the part must be writable as a
// NodeDef (a Call's kernel is code of the driver's program: InvalidArgument
// naming it).
Result<std::string> encode_part(const Graph& graph, int ranks, int rank, int64_t session);

// The part encode_part() made, over OpRegistry::global().
Result<std::unique_ptr<Partition>> decode_part(std::string_view payload, int rank, int64_t session);

// A worker's delta of an extend (Partition::delta) and its stubs: the
// payload of a kExtend message. Every node must be writable as a NodeDef.
Result<std::string> encode_delta(const Graph& delta, const std::vector<Stub>& stubs);

// The delta encode_delta() made, over OpRegistry::global(), and its stubs.
Result<std::pair<Graph, std::vector<Stub>>> decode_delta(std::string_view payload);

}  // namespace graphrun::mpi::internal
