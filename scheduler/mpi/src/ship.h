// A rank's part of the graph as data, for a worker that has no graph of its
// own (serve_without_graph, graphrun-server --mpi-worker): the driver cuts
// the part (Partition::make) and sends it as a binary GraphDef with its
// step placeholder's name and the graph's seed; the worker adopts it
// (Partition::adopt). Built with graphrun::graphdef (ship.cc); without it
// (GRAPHRUN_GRAPHDEF=OFF) both calls are Unimplemented (ship_unavailable.cc).
//
// Thread safety: thread-safe for distinct arguments.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/status.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "scheduler/mpi/src/partition.h"

namespace graphrun::mpi::internal {

// Rank `rank`'s part of `graph` (a world of `ranks`, session `session`): the
// payload of a kPart message. Every node of the part must be writable as a
// NodeDef (a Call's kernel is code of the driver's program: InvalidArgument
// naming it).
Result<std::string> encode_part(const Graph& graph, int ranks, int rank, int64_t session);

// The part encode_part() made, over OpRegistry::global().
Result<std::unique_ptr<Partition>> decode_part(std::string_view payload, int rank, int64_t session);

}  // namespace graphrun::mpi::internal
