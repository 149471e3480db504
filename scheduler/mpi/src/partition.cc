#include "scheduler/mpi/src/partition.h"

#include <graphrun/ops.h>

#include <fmt/format.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <variant>

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
    GRAPHRUN_RETURN_IF_ERROR(p->note_transfer(*p->local_.node(id)));
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

namespace {
// The name of a cross-rank edge's Send or Recv: "mpi_partition/" and what
// it carries ("<node>_<output>", "<node>_control" for a control edge, of
// the node `source` names) "_to_rank_<r>" or "_from_rank_<r>", so that a
// deadline or an error naming the node says which tensor and which rank it
// waited for.
std::string edge_node_name(const Node* source, const CrossEdge& e, bool send) {
  const std::string what = source == nullptr ? fmt::format("edge_{}", e.id)
                           : e.output >= 0   ? fmt::format("{}_{}", source->name(), e.output)
                                             : fmt::format("{}_control", source->name());
  return send ? fmt::format("mpi_partition/{}_to_rank_{}", what, e.to)
              : fmt::format("mpi_partition/{}_from_rank_{}", what, e.from);
}
}  // namespace

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

namespace {

NodeSpec send_spec(std::string name, const CrossEdge& e, Output x, Output step, int64_t session) {
  return NodeSpec{
      .op = "MpiPartitionSend",
      .name = std::move(name),
      .inputs = {x, step},
      .attrs = {{"edge", int64_t{e.id}}, {"session", session}, {"dest", int64_t{e.to}}}};
}

NodeSpec recv_spec(std::string name, const CrossEdge& e, DType dtype, const Shape& shape,
                   Output step, int64_t session) {
  return NodeSpec{.op = "MpiPartitionRecv",
                  .name = std::move(name),
                  .inputs = {step},
                  .attrs = {{"T", dtype},
                            {"edge", int64_t{e.id}},
                            {"session", session},
                            {"source", int64_t{e.from}},
                            {"shape", shape}}};
}

// What an edge carries: the source output's dtype and shape, or the step
// id for a control edge.
std::pair<DType, Shape> carried(const Graph& g, const CrossEdge& e) {
  if (e.output < 0) return {DType::kInt64, Shape{}};
  const Node& src = *g.node(e.node);
  return {src.output_dtype(e.output), src.output_shape(e.output)};
}

// The variable a node belongs with (placement's groups), or null.
const std::string* variable_of(const Node& node) {
  if (node.op() == "Variable") return &node.name();
  if (const AttrValue* var = node.find_attr("var")) return std::get_if<std::string>(var);
  return nullptr;
}

}  // namespace

Status Partition::note_transfer(const Node& n) {
  const bool send = n.op() == "MpiPartitionSend";
  if (!send && n.op() != "MpiPartitionRecv") return Status::ok();
  GRAPHRUN_ASSIGN_OR_RETURN(int64_t edge, n.attr<int64_t>("edge"));
  if (edge < 0 || edge >= kMaxEdges) {
    return invalid_argument("{}: edge {} is out of range", n.describe(), edge);
  }
  if (send) {
    sends_[static_cast<int>(edge)] = n.name();
  } else {
    recvs_[static_cast<int>(edge)] = n.output(0).name();
  }
  next_edge_ = std::max(next_edge_, static_cast<int>(edge) + 1);
  return Status::ok();
}

Status Partition::add_send(const CrossEdge& e, Output x) {
  const Node* source = e.output >= 0 ? x.node() : local_of_[static_cast<std::size_t>(e.node)];
  NodeSpec spec = send_spec(fresh_name(edge_node_name(source, e, true)), e, x, step_, session_);
  if (e.output < 0) spec.control_inputs.push_back(local_of_[static_cast<std::size_t>(e.node)]);
  GRAPHRUN_ASSIGN_OR_RETURN(Node * send, local_.add_node(std::move(spec)));
  sends_[e.id] = send->name();
  return Status::ok();
}

Status Partition::add_recv(const CrossEdge& e, DType dtype, const Shape& shape) {
  const Node* source = global_ != nullptr && e.node >= 0 ? global_->node(e.node) : nullptr;
  GRAPHRUN_ASSIGN_OR_RETURN(
      Node * recv, local_.add_node(recv_spec(fresh_name(edge_node_name(source, e, false)), e, dtype,
                                             shape, step_, session_)));
  recvs_[e.id] = recv->output(0).name();
  return Status::ok();
}

Result<Output> Partition::recv_of(int node, int output) const {
  auto it = index_.find(std::make_tuple(node, output, rank_));
  if (it == index_.end()) {
    return internal_error("rank {} has no edge of node {} output {}", rank_, node, output);
  }
  return local_.find_output(recv_name(edges_[it->second].id));
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
  auto edge_for = [&](int node, int output, int to) -> CrossEdge& {
    auto [it, added] = index_.emplace(std::make_tuple(node, output, to), edges_.size());
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
    auto [dtype, shape] = carried(*global_, e);
    GRAPHRUN_RETURN_IF_ERROR(add_recv(e, dtype, shape));
  }
  GRAPHRUN_RETURN_IF_ERROR(add_own_nodes(0));
  for (const CrossEdge& e : edges_) {
    if (e.from != rank_) continue;
    const Output x =
        e.output < 0 ? step_ : local_of_[static_cast<std::size_t>(e.node)]->output(e.output);
    GRAPHRUN_RETURN_IF_ERROR(add_send(e, x));
  }
  return local_.status();
}

Status Partition::add_own_nodes(int first) {
  local_of_.resize(static_cast<std::size_t>(global_->num_nodes()), nullptr);
  std::vector<std::pair<Node*, const Node*>> later;  // control inputs added after
  for (int id = first; id < global_->num_nodes(); ++id) {
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
        GRAPHRUN_ASSIGN_OR_RETURN(Output recv, recv_of(from, in.index()));
        spec.inputs.push_back(recv);
      }
    }
    std::vector<const Node*> deps;
    for (const Node* dep : n.control_inputs()) {
      if (ranks_[static_cast<std::size_t>(dep->id())] != rank_) {
        GRAPHRUN_ASSIGN_OR_RETURN(Output recv, recv_of(dep->id(), -1));
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
  return Status::ok();
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
  if (from == rank_) {
    // This rank's own nodes keep their global names in its part (also in
    // an adopted part, and for nodes an extend added).
    GRAPHRUN_ASSIGN_OR_RETURN(Output out, local_.find_output(tensor));
    return add_send(CrossEdge{.id = id, .from = from, .to = to, .node = -1, .output = out.index()},
                    out);
  }
  if (to != rank_) return Status::ok();
  if (global_ == nullptr) {
    // An adopted part: a fetch edge always leaves a worker for rank 0.
    return internal_error("fetch edge {} from rank {} to rank {} on adopted rank {}", id, from, to,
                          rank_);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Output global_out, global_->find_output(tensor));
  return add_recv(CrossEdge{.id = id,
                            .from = from,
                            .to = to,
                            .node = global_out.node()->id(),
                            .output = global_out.index()},
                  global_out.dtype(), global_out.shape());
}

Result<Growth> Partition::grow(const Graph& grown, int num_ranks) const {
  if (global_ == nullptr) return internal_error("only the driver grows the cut");
  Growth out;
  GRAPHRUN_ASSIGN_OR_RETURN(out.ranks, place(grown, num_ranks));
  const int old = static_cast<int>(ranks_.size());
  out.first_node = old;
  for (int id = 0; id < old; ++id) {
    const int was = ranks_[static_cast<std::size_t>(id)];
    const int now = out.ranks[static_cast<std::size_t>(id)];
    if (was == now) continue;
    // Only a variable's group moves a placed node (every other node
    // follows earlier nodes): the new member placed elsewhere is named.
    const Node& moved = *grown.node(id);
    const std::string* var = variable_of(moved);
    const Node* culprit = nullptr;
    for (int k = old; k < grown.num_nodes() && culprit == nullptr; ++k) {
      const Node& n = *grown.node(k);
      const std::string* other = variable_of(n);
      if (var != nullptr && other != nullptr && *other == *var &&
          out.ranks[static_cast<std::size_t>(k)] == now) {
        culprit = &n;
      }
    }
    if (culprit == nullptr) culprit = grown.node(old);
    return invalid_argument(
        "{} would move {} from rank {} to rank {}: nodes already placed keep their ranks (place "
        "the new node on rank {})",
        culprit->describe(), moved.describe(), was, now, was);
  }
  std::map<std::tuple<int, int, int>, std::size_t> fresh;  // (node, output, to) -> new edge
  int next = next_edge_;
  auto cross = [&](int node, int output, int to, int consumer) {
    const auto key = std::make_tuple(node, output, to);
    if (auto it = index_.find(key); it != index_.end()) {
      out.consumers.emplace_back(edges_[it->second].id, consumer);
      return;
    }
    auto [it, added] = fresh.emplace(key, out.edges.size());
    if (added) {
      out.edges.push_back(CrossEdge{.id = next++,
                                    .from = out.ranks[static_cast<std::size_t>(node)],
                                    .to = to,
                                    .node = node,
                                    .output = output});
    }
    out.edges[it->second].consumers.push_back(consumer);
  };
  // The new edges numbered as build() numbers: by consumer id, then input order.
  for (int id = old; id < grown.num_nodes(); ++id) {
    const Node& n = *grown.node(id);
    const int to = out.ranks[static_cast<std::size_t>(id)];
    for (const Output& in : n.inputs()) {
      if (out.ranks[static_cast<std::size_t>(in.node()->id())] != to) {
        cross(in.node()->id(), in.index(), to, id);
      }
    }
    for (const Node* dep : n.control_inputs()) {
      if (out.ranks[static_cast<std::size_t>(dep->id())] != to) cross(dep->id(), -1, to, id);
    }
  }
  if (next >= kMaxEdges) {
    return unimplemented("more than {} cross-rank edges (static and fetched)", kMaxEdges - 1);
  }
  // A new node of this rank may not take a name this rank's part gave a
  // Send, Recv or the step.
  for (int id = old; id < grown.num_nodes(); ++id) {
    const Node& n = *grown.node(id);
    if (out.ranks[static_cast<std::size_t>(id)] == rank_ && local_.find_node(n.name()) != nullptr) {
      return invalid_argument("{}: rank {}'s part of the graph has a node of that name",
                              n.describe(), rank_);
    }
  }
  return out;
}

Result<Graph> Partition::delta(const Graph& grown, const Growth& growth, int rank,
                               std::vector<Stub>& stubs) const {
  Graph d(grown.registry());
  const auto at = [&](int id) { return growth.ranks[static_cast<std::size_t>(id)]; };
  auto taken = [&](const std::string& name) {
    return grown.find_node(name) != nullptr || d.find_node(name) != nullptr;
  };
  auto fresh = [&](const std::string& base) {
    std::string name = base;
    for (int k = 1; taken(name); ++k) name = fmt::format("{}_{}", base, k);
    return name;
  };
  std::map<std::string, Output> stub_of;  // stub key -> its Placeholder
  auto stub = [&](Stub s, DType dtype, const Shape& shape) -> Result<Output> {
    const std::string key = fmt::format("{}|{}|{}", static_cast<uint64_t>(s.kind), s.ref, s.edge);
    if (auto it = stub_of.find(key); it != stub_of.end()) return it->second;
    s.name = fresh(fmt::format("mpi_partition/stub_{}", stubs.size()));
    Output o = ops::Placeholder(d, dtype, shape, s.name);
    GRAPHRUN_RETURN_IF_ERROR(d.status());
    if (o.node()->name() != s.name) return internal_error("stub '{}' was renamed", s.name);
    stubs.push_back(std::move(s));
    stub_of.emplace(key, o);
    return o;
  };
  auto step = [&]() { return stub(Stub{.kind = Stub::kStep}, DType::kInt64, Shape{}); };
  std::map<int, Output> recv_of_new;             // new edge id -> its Recv in the delta
  std::map<std::tuple<int, int>, int> new_into;  // (node, output) -> new edge into `rank`
  for (const CrossEdge& e : growth.edges) {
    if (e.to != rank) continue;
    GRAPHRUN_ASSIGN_OR_RETURN(Output s, step());
    auto [dtype, shape] = carried(grown, e);
    GRAPHRUN_ASSIGN_OR_RETURN(
        Node * recv, d.add_node(recv_spec(fresh(edge_node_name(grown.node(e.node), e, false)), e,
                                          dtype, shape, s, session_)));
    recv_of_new.emplace(e.id, recv->output(0));
    new_into.emplace(std::make_tuple(e.node, e.output), e.id);
  }
  // An input of a node of `rank`: a new node of the delta, a stub of a node
  // of its part, or the Recv of an edge (new, or a stub of one so far).
  std::map<int, Node*> made;  // new global id -> delta node
  auto input = [&](int node, int output) -> Result<Output> {
    if (at(node) == rank) {
      if (node >= growth.first_node) {
        if (output < 0) return made.at(node)->output(0);  // unused for control
        return made.at(node)->output(output);
      }
      const Node& n = *grown.node(node);
      if (output < 0) return stub(Stub{.kind = Stub::kNode, .ref = n.name()}, DType::kInt64, {});
      return stub(Stub{.kind = Stub::kTensor, .ref = n.output(output).name()},
                  n.output_dtype(output), n.output_shape(output));
    }
    if (auto it = new_into.find(std::make_tuple(node, output)); it != new_into.end()) {
      return recv_of_new.at(it->second);
    }
    auto it = index_.find(std::make_tuple(node, output, rank));
    if (it == index_.end()) {
      return internal_error("no edge of node {} output {} into rank {}", node, output, rank);
    }
    const CrossEdge& e = edges_[it->second];
    auto [dtype, shape] = carried(grown, e);
    return stub(Stub{.kind = Stub::kRecv, .edge = e.id}, dtype, shape);
  };
  auto control = [&](const Node* dep) -> Result<const Node*> {
    const int id = dep->id();
    if (at(id) == rank && id >= growth.first_node) return made.at(id);
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, input(id, -1));
    return o.node();
  };
  std::vector<std::pair<Node*, const Node*>> later;
  for (int id = growth.first_node; id < grown.num_nodes(); ++id) {
    if (at(id) != rank) continue;
    const Node& n = *grown.node(id);
    NodeSpec spec{.op = n.op(), .name = n.name(), .attrs = n.attrs(), .device = n.device()};
    for (const Output& in : n.inputs()) {
      GRAPHRUN_ASSIGN_OR_RETURN(Output o, input(in.node()->id(), in.index()));
      spec.inputs.push_back(o);
    }
    std::vector<const Node*> deps;
    for (const Node* dep : n.control_inputs()) {
      if (at(dep->id()) == rank && dep->id() >= id) {
        deps.push_back(dep);
        continue;
      }
      GRAPHRUN_ASSIGN_OR_RETURN(const Node* c, control(dep));
      spec.control_inputs.push_back(c);
    }
    Result<Node*> added = d.add_node(std::move(spec));
    if (!added.is_ok()) return added.status().with_prefix(n.describe());
    if ((*added)->name() != n.name()) {
      return internal_error("{} was renamed '{}' in rank {}'s delta", n.describe(),
                            (*added)->name(), rank);
    }
    made.emplace(id, *added);
    for (const Node* dep : deps) later.emplace_back(*added, dep);
  }
  for (auto [node, dep] : later)
    GRAPHRUN_RETURN_IF_ERROR(d.add_control_input(node, made.at(dep->id())));
  for (const CrossEdge& e : growth.edges) {
    if (e.from != rank) continue;
    Output x;
    if (e.output < 0) {
      GRAPHRUN_ASSIGN_OR_RETURN(x, step());
    } else {
      GRAPHRUN_ASSIGN_OR_RETURN(x, input(e.node, e.output));
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Output s, step());
    NodeSpec spec =
        send_spec(fresh(edge_node_name(grown.node(e.node), e, true)), e, x, s, session_);
    if (e.output < 0) {
      GRAPHRUN_ASSIGN_OR_RETURN(const Node* c, control(grown.node(e.node)));
      spec.control_inputs.push_back(c);
    }
    GRAPHRUN_RETURN_IF_ERROR(d.add_node(std::move(spec)).status());
  }
  GRAPHRUN_RETURN_IF_ERROR(d.status());
  if (d.num_nodes() == static_cast<int>(stubs.size())) {
    stubs.clear();
    return Graph(grown.registry());  // nothing for this rank
  }
  return d;
}

Status Partition::apply(const Growth& growth) {
  if (global_ == nullptr || global_->num_nodes() != static_cast<int>(growth.ranks.size())) {
    return internal_error("the global graph does not hold the growth's nodes");
  }
  ranks_ = growth.ranks;
  for (auto [id, consumer] : growth.consumers) {
    for (CrossEdge& e : edges_) {
      if (e.id == id) e.consumers.push_back(consumer);
    }
  }
  const std::size_t first_edge = edges_.size();
  for (const CrossEdge& e : growth.edges) {
    index_.emplace(std::make_tuple(e.node, e.output, e.to), edges_.size());
    edges_.push_back(e);
    next_edge_ = std::max(next_edge_, e.id + 1);
  }
  for (std::size_t k = first_edge; k < edges_.size(); ++k) {
    const CrossEdge& e = edges_[k];
    if (e.to != rank_) continue;
    auto [dtype, shape] = carried(*global_, e);
    GRAPHRUN_RETURN_IF_ERROR(add_recv(e, dtype, shape));
  }
  GRAPHRUN_RETURN_IF_ERROR(add_own_nodes(growth.first_node));
  for (std::size_t k = first_edge; k < edges_.size(); ++k) {
    const CrossEdge e = edges_[k];
    if (e.from != rank_) continue;
    const Output x =
        e.output < 0 ? step_ : local_of_[static_cast<std::size_t>(e.node)]->output(e.output);
    GRAPHRUN_RETURN_IF_ERROR(add_send(e, x));
  }
  return local_.status();
}

Status Partition::import(const Graph& delta, const std::vector<Stub>& stubs) {
  GRAPHRUN_RETURN_IF_ERROR(delta.status());
  std::map<std::string, Output> resolved;  // stub name -> the part's tensor or node
  for (const Stub& s : stubs) {
    Result<Output> o = internal_error("stub '{}' of an unknown kind", s.name);
    switch (s.kind) {
      case Stub::kTensor: o = local_.find_output(s.ref); break;
      case Stub::kNode: {
        const Node* n = local_.find_node(s.ref);
        o = n == nullptr
                ? Result<Output>(not_found("rank {}'s part has no node '{}'", rank_, s.ref))
                : Result<Output>(Output(n, 0));
        break;
      }
      case Stub::kRecv: {
        const std::string& recv = recv_name(s.edge);
        o = recv.empty()
                ? Result<Output>(internal_error("rank {} has no Recv of edge {}", rank_, s.edge))
                : local_.find_output(recv);
        break;
      }
      case Stub::kStep: o = step_; break;
    }
    if (!o.is_ok()) return o.status().with_prefix(fmt::format("extending rank {}'s part", rank_));
    resolved.emplace(s.name, *o);
  }
  std::map<const Node*, Node*> mine;  // delta node -> the part's copy
  auto source = [&](const Node* n) -> Result<const Node*> {
    if (auto it = resolved.find(n->name()); it != resolved.end()) return it->second.node();
    auto it = mine.find(n);
    if (it == mine.end()) return internal_error("{} comes before its input", n->describe());
    return it->second;
  };
  for (int id = 0; id < delta.num_nodes(); ++id) {
    const Node& n = *delta.node(id);
    if (resolved.count(n.name()) != 0) continue;
    NodeSpec spec{.op = n.op(), .name = n.name(), .attrs = n.attrs(), .device = n.device()};
    for (const Output& in : n.inputs()) {
      if (auto it = resolved.find(in.node()->name()); it != resolved.end()) {
        spec.inputs.push_back(it->second);
      } else {
        GRAPHRUN_ASSIGN_OR_RETURN(const Node* src, source(in.node()));
        spec.inputs.push_back(src->output(in.index()));
      }
    }
    for (const Node* dep : n.control_inputs()) {
      GRAPHRUN_ASSIGN_OR_RETURN(const Node* src, source(dep));
      spec.control_inputs.push_back(src);
    }
    Result<Node*> added = local_.add_node(std::move(spec));
    if (!added.is_ok()) {
      return added.status().with_prefix(fmt::format("extending rank {}'s part", rank_));
    }
    if ((*added)->name() != n.name()) {
      return invalid_argument(
          "extending rank {}'s part: {} cannot keep its name, which a node of the part has", rank_,
          n.describe());
    }
    mine.emplace(&n, *added);
    GRAPHRUN_RETURN_IF_ERROR(note_transfer(**added));
  }
  return local_.status();
}

}  // namespace graphrun::mpi::internal
