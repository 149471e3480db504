#include "scheduler/mpi/src/partition.h"

#include <graphrun/ops.h>

#include <fmt/format.h>

#include <map>
#include <tuple>
#include <utility>

#include "scheduler/mpi/src/wire.h"

namespace graphrun::mpi::internal {

namespace {
const std::string kNone;
}  // namespace

Result<std::unique_ptr<Partition>> Partition::make(const Graph& global, int num_ranks, int rank,
                                                   int64_t session) {
  GRAPHRUN_RETURN_IF_ERROR(global.status());
  std::unique_ptr<Partition> p(new Partition(&global, rank, session));
  GRAPHRUN_RETURN_IF_ERROR(p->build(num_ranks));
  return p;
}

Result<std::unique_ptr<Partition>> Partition::adopt(Graph local, int rank, int64_t session,
                                                    const std::string& step_name) {
  GRAPHRUN_RETURN_IF_ERROR(local.status());
  std::unique_ptr<Partition> p(new Partition(nullptr, rank, session));
  p->local_ = std::move(local);
  GRAPHRUN_ASSIGN_OR_RETURN(p->step_, p->local_.find_output(step_name));
  p->step_name_ = p->step_.node()->name();
  for (int id = 0; id < p->local_.num_nodes(); ++id) {
    const Node& n = *p->local_.node(id);
    const bool send = n.op() == "MpiPartitionSend";
    if (!send && n.op() != "MpiPartitionRecv") continue;
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t edge, n.attr<int64_t>("edge"));
    if (edge < 0 || edge >= kMaxEdges) {
      return invalid_argument("{}: edge {} is out of range", n.describe(), edge);
    }
    if (send) {
      p->sends_[static_cast<int>(edge)] = n.name();
    } else {
      p->recvs_[static_cast<int>(edge)] = n.output(0).name();
    }
    p->next_edge_ = std::max(p->next_edge_, static_cast<int>(edge) + 1);
  }
  return p;
}

uint64_t Partition::fingerprint(const Graph& g) {
  uint64_t h = hash_key(fmt::format("{} nodes", g.num_nodes()));
  auto mix = [&h](std::string_view s) { h = (h ^ hash_key(s)) * 0x100000001b3ull; };
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node& n = *g.node(id);
    mix(n.name());
    mix(n.op());
    mix(n.device());
    for (const Output& in : n.inputs()) mix(fmt::format("{}:{}", in.node()->id(), in.index()));
    for (const Node* dep : n.control_inputs()) mix(fmt::format("^{}", dep->id()));
  }
  return h;
}

std::string Partition::fresh_name(const std::string& base) const {
  std::string name = base;
  auto taken = [&](const std::string& n) {
    return (global_ != nullptr && global_->find_node(n) != nullptr) ||
           local_.find_node(n) != nullptr;
  };
  for (int k = 1; taken(name); ++k) {
    name = fmt::format("{}_{}", base, k);
  }
  return name;
}

const std::string& Partition::send_name(int id) const {
  auto it = sends_.find(id);
  return it == sends_.end() ? kNone : it->second;
}

const std::string& Partition::recv_name(int id) const {
  auto it = recvs_.find(id);
  return it == recvs_.end() ? kNone : it->second;
}

Status Partition::add_send(const CrossEdge& e, Output x) {
  NodeSpec spec{.op = "MpiPartitionSend",
                .name = fresh_name(fmt::format("mpi_partition/send_{}", e.id)),
                .inputs = {x, step_},
                .attrs = {{"edge", int64_t{e.id}}, {"session", session_}, {"dest", int64_t{e.to}}}};
  if (e.output < 0) spec.control_inputs.push_back(local_of_[static_cast<std::size_t>(e.node)]);
  GRAPHRUN_ASSIGN_OR_RETURN(Node * send, local_.add_node(std::move(spec)));
  sends_[e.id] = send->name();
  return Status::ok();
}

Status Partition::add_recv(const CrossEdge& e, DType dtype, const Shape& shape) {
  GRAPHRUN_ASSIGN_OR_RETURN(
      Node * recv,
      local_.add_node(NodeSpec{.op = "MpiPartitionRecv",
                               .name = fresh_name(fmt::format("mpi_partition/recv_{}", e.id)),
                               .inputs = {step_},
                               .attrs = {{"T", dtype},
                                         {"edge", int64_t{e.id}},
                                         {"session", session_},
                                         {"source", int64_t{e.from}},
                                         {"shape", shape}}}));
  recvs_[e.id] = recv->output(0).name();
  return Status::ok();
}

Status Partition::build(int num_ranks) {
  GRAPHRUN_ASSIGN_OR_RETURN(ranks_, place(*global_, num_ranks));
  local_ = Graph(global_->registry());
  if (global_->seed().has_value()) local_.set_seed(*global_->seed());
  if (global_->registry().find("MpiPartitionSend") == nullptr) {
    return failed_precondition(
        "the graph's op registry lacks MpiPartitionSend and MpiPartitionRecv: call "
        "graphrun::mpi::register_ops() on it");
  }
  step_ = ops::Placeholder(local_, DType::kInt64, Shape{}, fresh_name("mpi_partition/step"));
  GRAPHRUN_RETURN_IF_ERROR(local_.status());
  step_name_ = step_.node()->name();

  // Every rank numbers the edges alike: by consumer id, then input order.
  std::map<std::tuple<int, int, int>, std::size_t> index;  // (node, output, to) -> edge
  auto edge_for = [&](int node, int output, int to) -> CrossEdge& {
    auto [it, added] = index.emplace(std::make_tuple(node, output, to), edges_.size());
    if (added) {
      edges_.push_back(CrossEdge{.id = static_cast<int>(edges_.size()),
                                 .from = ranks_[static_cast<std::size_t>(node)],
                                 .to = to,
                                 .node = node,
                                 .output = output});
    }
    return edges_[it->second];
  };
  for (int id = 0; id < global_->num_nodes(); ++id) {
    const Node& n = *global_->node(id);
    const int to = ranks_[static_cast<std::size_t>(id)];
    for (const Output& in : n.inputs()) {
      if (ranks_[static_cast<std::size_t>(in.node()->id())] != to) {
        edge_for(in.node()->id(), in.index(), to).consumers.push_back(id);
      }
    }
    for (const Node* dep : n.control_inputs()) {
      if (ranks_[static_cast<std::size_t>(dep->id())] != to) {
        edge_for(dep->id(), -1, to).consumers.push_back(id);
      }
    }
  }
  if (edges_.size() >= static_cast<std::size_t>(kMaxEdges)) {
    return unimplemented("the placed graph has {} cross-rank edges; graphrun handles up to {}",
                         edges_.size(), kMaxEdges - 1);
  }
  next_edge_ = static_cast<int>(edges_.size());

  // This rank's Recvs first (they need only the step), then its nodes in
  // id order (inputs come before their consumers), then its Sends.
  for (const CrossEdge& e : edges_) {
    if (e.to != rank_) continue;
    if (e.output < 0) {
      GRAPHRUN_RETURN_IF_ERROR(add_recv(e, DType::kInt64, Shape{}));
    } else {
      const Node& src = *global_->node(e.node);
      GRAPHRUN_RETURN_IF_ERROR(add_recv(e, src.output_dtype(e.output), src.output_shape(e.output)));
    }
  }
  local_of_.assign(static_cast<std::size_t>(global_->num_nodes()), nullptr);
  std::vector<std::pair<Node*, const Node*>> later;  // control inputs added after
  for (int id = 0; id < global_->num_nodes(); ++id) {
    if (ranks_[static_cast<std::size_t>(id)] != rank_) continue;
    const Node& n = *global_->node(id);
    NodeSpec spec{.op = n.op(),
                  .name = n.name(),
                  .attrs = n.attrs(),
                  .kernel = n.kernel_override(),
                  .device = n.device()};
    for (const Output& in : n.inputs()) {
      const int from = in.node()->id();
      if (ranks_[static_cast<std::size_t>(from)] == rank_) {
        spec.inputs.push_back(local_of_[static_cast<std::size_t>(from)]->output(in.index()));
      } else {
        const CrossEdge& e = edges_[index.at(std::make_tuple(from, in.index(), rank_))];
        GRAPHRUN_ASSIGN_OR_RETURN(Output recv, local_.find_output(recvs_.at(e.id)));
        spec.inputs.push_back(recv);
      }
    }
    std::vector<const Node*> deps;
    for (const Node* dep : n.control_inputs()) {
      if (ranks_[static_cast<std::size_t>(dep->id())] != rank_) {
        const CrossEdge& e = edges_[index.at(std::make_tuple(dep->id(), -1, rank_))];
        GRAPHRUN_ASSIGN_OR_RETURN(Output recv, local_.find_output(recvs_.at(e.id)));
        spec.control_inputs.push_back(recv.node());
      } else if (dep->id() < id) {
        spec.control_inputs.push_back(local_of_[static_cast<std::size_t>(dep->id())]);
      } else {
        deps.push_back(dep);
      }
    }
    Result<Node*> added = local_.add_node(std::move(spec));
    if (!added.is_ok()) {
      return added.status().with_prefix(
          fmt::format("cutting the graph for rank {}: {}", rank_, n.describe()));
    }
    if ((*added)->name() != n.name()) {
      return internal_error("cutting the graph for rank {}: {} was renamed '{}'", rank_,
                            n.describe(), (*added)->name());
    }
    local_of_[static_cast<std::size_t>(id)] = *added;
    for (const Node* dep : deps) later.emplace_back(*added, dep);
  }
  for (auto [node, dep] : later) {
    GRAPHRUN_RETURN_IF_ERROR(
        local_.add_control_input(node, local_of_[static_cast<std::size_t>(dep->id())]));
  }
  for (const CrossEdge& e : edges_) {
    if (e.from != rank_) continue;
    const Output x =
        e.output < 0 ? step_ : local_of_[static_cast<std::size_t>(e.node)]->output(e.output);
    GRAPHRUN_RETURN_IF_ERROR(add_send(e, x));
  }
  return local_.status();
}

Status Partition::add_fetch_edge(int id, const std::string& tensor, int from, int to) {
  if (id < next_edge_) {
    // Known edges: a repeated fetch edge of another signature.
    if ((from == rank_ && !send_name(id).empty()) || (to == rank_ && !recv_name(id).empty()) ||
        (from != rank_ && to != rank_)) {
      return Status::ok();
    }
  }
  if (id >= kMaxEdges) {
    return unimplemented("more than {} cross-rank edges (static and fetched)", kMaxEdges - 1);
  }
  next_edge_ = std::max(next_edge_, id + 1);
  if (global_ == nullptr) {
    // An adopted part: its own nodes keep their global names; a fetch
    // edge always leaves a worker for rank 0.
    if (from != rank_ || to == rank_) {
      return internal_error("fetch edge {} from rank {} to rank {} on adopted rank {}", id, from,
                            to, rank_);
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Output out, local_.find_output(tensor));
    return add_send(CrossEdge{.id = id, .from = from, .to = to, .node = -1, .output = out.index()},
                    out);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Output global_out, global_->find_output(tensor));
  CrossEdge e{.id = id,
              .from = from,
              .to = to,
              .node = global_out.node()->id(),
              .output = global_out.index()};
  if (from == rank_) {
    const Node* local = local_of_[static_cast<std::size_t>(e.node)];
    if (local == nullptr) {
      return internal_error("fetch edge {}: {} is not on rank {}", id, tensor, rank_);
    }
    return add_send(e, local->output(e.output));
  }
  if (to == rank_) return add_recv(e, global_out.dtype(), global_out.shape());
  return Status::ok();
}

}  // namespace graphrun::mpi::internal
