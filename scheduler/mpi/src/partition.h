// A graph cut by rank (docs/distributed.md, Partitioning). Every rank
// builds the same Partition from the same graph: place() gives each node a
// rank, and every data or control edge between ranks becomes an edge with
// an id, numbered in the same order everywhere. A rank's local graph holds
// its own nodes (same names, attributes and kernels), an MpiPartitionRecv
// for each edge into it and an MpiPartitionSend for each edge out of it,
// all keyed by the step id fed into the "step" placeholder. A control edge
// sends the step id itself. Fetches of tensors on other ranks add fetch
// edges later (add_fetch_edge), with ids the driver hands out. extend()
// grows the cut: the driver works out the new edges (grow), applies them to
// its own part (apply) and cuts each worker's delta (delta), which the
// worker adds to its part (import).
//
// Thread safety: thread-compatible; the session serialises changes.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/status.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace graphrun::mpi::internal {

struct CrossEdge {
  int id = 0;
  int from = 0;                // the sending rank
  int to = 0;                  // the receiving rank
  int node = 0;                // the source node's id in the global graph
  int output = 0;              // its output, -1 for a control edge
  std::vector<int> consumers;  // global ids of the nodes on `to` that read it
};

// What DistributedSession::extend adds to the cut, worked out on the driver
// before anything changes (Partition::grow).
struct Growth {
  std::vector<int> ranks;                      // every node's rank; the nodes so far keep theirs
  int first_node = 0;                          // the first new node's id
  std::vector<CrossEdge> edges;                // the new edges, ids from next_edge_id()
  std::vector<std::pair<int, int>> consumers;  // (edge id so far, its new consumer)
};

// A node of a worker's part that the nodes of its delta read: the delta
// holds a Placeholder named `name` in its place, which the worker resolves.
struct Stub {
  enum Kind : uint64_t { kTensor = 0, kNode = 1, kRecv = 2, kStep = 3 };
  std::string name;  // the stand-in's name in the delta
  Kind kind = kTensor;
  std::string ref;  // kTensor: "node:k" of the part; kNode: a node's name
  int edge = 0;     // kRecv: the edge whose Recv it is
};

class Partition {
 public:
  // Cuts `global` (which must outlive the partition) for `rank` of a world
  // of `num_ranks`, for the session `session` (a nonce the driver picks:
  // the transfers' headers carry it, so that a transfer a stopped step
  // left behind is never taken for one of another session).
  static Result<std::unique_ptr<Partition>> make(const Graph& global, int num_ranks, int rank,
                                                 int64_t session);

  // A part cut elsewhere (by the driver, for a worker that has no graph
  // of its own): `local` as Partition::make built it for `rank`, whose
  // step placeholder is `step_name`. Its Sends and Recvs are found by op
  // and edge attribute; rank_of(), ranks() and edges() are empty, and
  // add_fetch_edge only adds Sends of its own tensors.
  static Result<std::unique_ptr<Partition>> adopt(Graph local, int rank, int64_t session,
                                                  const std::string& step_name);

  // This rank's graph; grows with add_fetch_edge.
  const Graph& local() const { return local_; }
  int rank() const { return rank_; }
  int rank_of(int node) const { return ranks_[static_cast<std::size_t>(node)]; }
  const std::vector<int>& ranks() const { return ranks_; }
  const std::vector<CrossEdge>& edges() const { return edges_; }
  // The name of the step-id placeholder in local().
  const std::string& step_name() const { return step_name_; }
  // The local Send node of edge `id` from this rank ("" if none).
  const std::string& send_name(int id) const;
  // The local Recv output ("name:0") of edge `id` into this rank.
  const std::string& recv_name(int id) const;

  // Edge `id` carrying `tensor` (a global "node:index" produced on
  // `from`) to `to`: adds its Send or Recv when this rank is one end and
  // the edge is new. Idempotent.
  Status add_fetch_edge(int id, const std::string& tensor, int from, int to);
  // The id after every edge so far (static and fetch edges).
  int next_edge_id() const { return next_edge_; }

  // extend() on the driver. `grown` is the global graph with nodes added
  // (the first ranks().size() nodes being the graph's so far): places it,
  // refuses a new node that would move a placed one (InvalidArgument naming
  // both), and numbers the new cross edges after every edge so far.
  // Changes nothing.
  Result<Growth> grow(const Graph& grown, int num_ranks) const;
  // Worker `rank`'s delta of `growth`: its new nodes, the Sends and Recvs
  // of the new edges it ends, and a Placeholder stub for each node of its
  // part they read (`stubs`). No nodes: nothing for that rank.
  Result<Graph> delta(const Graph& grown, const Growth& growth, int rank,
                      std::vector<Stub>& stubs) const;
  // Applies `growth` to this (the driver's) partition once the global
  // graph holds the new nodes: its ranks and edges, and this rank's new
  // Recvs, nodes and Sends.
  Status apply(const Growth& growth);
  // A worker: adds `delta` (from delta(), through a GraphDef) to its part.
  Status import(const Graph& delta, const std::vector<Stub>& stubs);

  // A fingerprint of the global graph (names, ops, devices, inputs): ranks
  // that built different graphs are told apart before a step runs.
  static uint64_t fingerprint(const Graph& g);

 private:
  Partition(const Graph* global, int rank, int64_t session)
      : global_(global), rank_(rank), session_(session) {}
  Status build(int num_ranks);
  Status add_send(const CrossEdge& e, Output x);
  Status add_recv(const CrossEdge& e, DType dtype, const Shape& shape);
  // This rank's nodes of the global graph from id `first` on.
  Status add_own_nodes(int first);
  // The local Recv output of the static edge (node, output) into this rank.
  Result<Output> recv_of(int node, int output) const;
  // Records `n`, a node of the local graph, when it is a partition Send or
  // Recv (by its op and `edge` attribute); other nodes are left alone.
  Status note_transfer(const Node& n);
  std::string fresh_name(const std::string& base) const;

  const Graph* global_;  // null for an adopted part
  int rank_;
  int64_t session_;
  Graph local_;
  std::vector<int> ranks_;
  std::vector<CrossEdge> edges_;
  std::map<std::tuple<int, int, int>, std::size_t> index_;  // (node, output, to) -> edge
  std::vector<const Node*> local_of_;                       // global id -> local node (this rank's)
  Output step_;
  std::string step_name_;
  std::map<int, std::string> sends_;  // edge id -> local Send node
  std::map<int, std::string> recvs_;  // edge id -> local Recv output
  int next_edge_ = 0;
};

}  // namespace graphrun::mpi::internal
