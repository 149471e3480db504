// AllReduce, Broadcast and AllGather as asynchronous kernels over the
// progress engine.
//
// MPI's own collectives must be started in the same order on every rank of
// a communicator; independent collective nodes of a dataflow graph become
// ready in any order on different ranks (Horovod negotiates an order through
// a coordinator for that reason). These match instead by a key and an
// invocation number: each message's tag is the key's 20-bit id and the
// invocation's low 10 bits, and its header carries the full key hash and
// invocation, checked on receipt. Each collective is one exchange of
// point-to-point messages (a header, then the tensor's bytes straight from
// its buffer): every rank sends its tensor to every other (AllReduce,
// AllGather) or the root to all (Broadcast). Headers go from every rank to
// every other, Broadcast's too, and carry the collective (kind, reduction,
// root) as well as the tensor's dtype and shape: every rank sees every
// header, so a mismatch (shapes, or AllReduce on one rank and Broadcast on
// another under one key) is found on every rank alike, and then no rank
// sends its bytes, which leaves no message behind for the key's next
// invocation. Every rank adds in rank order, so all get the same bits. That costs
// (ranks - 1) copies of the tensor per rank: fine for the few ranks of one
// machine, and the place for a ring algorithm when bandwidth matters.
#include <graphrun/mpi.h>
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "scheduler/mpi/src/engine.h"
#include "scheduler/mpi/src/wire.h"

namespace graphrun::mpi {

namespace {

enum class Kind : uint8_t { kAllReduce, kBroadcast, kAllGather };

// A collective's header: the tensor's, and which collective it is part of.
struct CollectiveHeader {
  internal::Header tensor;
  uint32_t kind = 0;
  uint32_t reduction = 0;  // AllReduce's; 0 otherwise
  int32_t root = 0;        // Broadcast's; 0 otherwise
  int32_t reserved = 0;
};

// "AllReduce (sum)", "Broadcast from rank 1", "AllGather"; any other word
// (a malformed header) as its number.
std::string describe(const CollectiveHeader& h) {
  switch (static_cast<Kind>(h.kind)) {
    case Kind::kAllReduce:
      return h.reduction == static_cast<uint32_t>(Reduction::kMean) ? "AllReduce (mean)"
                                                                    : "AllReduce (sum)";
    case Kind::kBroadcast: return fmt::format("Broadcast from rank {}", h.root);
    case Kind::kAllGather: return "AllGather";
  }
  return fmt::format("collective kind {}", h.kind);
}

using internal::check_dtype;
using internal::Header;
using internal::header_of;
using internal::shape_of;

class Collective final : public internal::KernelOperation {
 public:
  Collective(Kind kind, Reduction reduction, int root, const World& world, MPI_Comm comm,
             OpKernelContext& ctx, AsyncOpKernel::Done done, uint64_t key_hash, uint64_t invocation)
      : KernelOperation(ctx, std::move(done)),
        kind_(kind),
        reduction_(reduction),
        root_(root),
        rank_(world.rank()),
        size_(world.size()),
        comm_(comm),
        input_(ctx.input(0)),
        tag_(internal::tag_of(key_hash, invocation)),
        headers_(static_cast<std::size_t>(size_)),
        parts_(static_cast<std::size_t>(size_)),
        drains_(static_cast<std::size_t>(size_)) {
    mine_.tensor = header_of(input_, key_hash, invocation);
    mine_.kind = static_cast<uint32_t>(kind);
    mine_.reduction = kind == Kind::kAllReduce ? static_cast<uint32_t>(reduction) : 0;
    mine_.root = kind == Kind::kBroadcast ? root : 0;
  }

  bool advance(internal::Round& round) override {
    switch (stage_) {
      case 0:
        stage_ = 1;
        if (Status s = post_headers(round); !s.is_ok()) return finish(std::move(s));
        if (!round.empty()) return false;
        [[fallthrough]];
      case 1:
        stage_ = 2;
        status_ = check_headers();
        // A mismatch is found on every rank: none sends its bytes.
        if (!status_.is_ok()) return finish(status_);
        if (Status s = post_payloads(round); !s.is_ok()) return finish(std::move(s));
        if (!round.empty()) return false;
        [[fallthrough]];
      default: return finish(status_.is_ok() ? produce() : status_);
    }
  }

 private:
  bool sends_to(int peer) const {
    return peer != rank_ && (kind_ != Kind::kBroadcast || rank_ == root_);
  }
  bool receives_from(int peer) const {
    return peer != rank_ && (kind_ != Kind::kBroadcast || peer == root_);
  }

  // Round 1 exchanges only headers, every rank's with every other (also
  // for Broadcast, whose bytes go from the root only). A tensor's bytes go
  // in round 2: a large send completes only once its peer has posted the
  // receive, which the peer does in its round 2, after its round 1
  // (sending the bytes in round 1 would make each rank's round 1 wait for
  // the other's round 2).
  Status post_headers(internal::Round& round) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      GRAPHRUN_RETURN_IF_ERROR(round.send(&mine_, sizeof(CollectiveHeader), peer, tag_, comm_));
      GRAPHRUN_RETURN_IF_ERROR(round.recv(&headers_[static_cast<std::size_t>(peer)],
                                          sizeof(CollectiveHeader), peer, tag_, comm_));
    }
    return Status::ok();
  }

  // Every other rank's header against this rank's. Each check is an
  // equivalence (the same collective, dtype and shape, or for AllGather
  // the same shape past dimension 0), so when any two ranks differ every
  // rank finds a difference, and all fail together.
  Status check_headers() {
    if (kind_ == Kind::kAllGather && input_.shape().rank() == 0) {
      // Every rank's header says so (its rank): the others fail on it.
      return invalid_argument("AllGather needs a tensor of rank >= 1, not a scalar");
    }
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      const CollectiveHeader& c = headers_[static_cast<std::size_t>(peer)];
      const Header& h = c.tensor;
      if (h.key_hash != mine_.tensor.key_hash || h.invocation != mine_.tensor.invocation) {
        return internal_error(
            "rank {} sent invocation {} of another collective (key hash {:x}) where this rank "
            "waited for invocation {} (key hash {:x})",
            peer, h.invocation, h.key_hash, mine_.tensor.invocation, mine_.tensor.key_hash);
      }
      if (c.kind != mine_.kind || c.reduction != mine_.reduction || c.root != mine_.root) {
        return invalid_argument(
            "rank {} runs {} under this key, rank {} runs {}: every rank must run the same "
            "collective on one key",
            peer, describe(c), rank_, describe(mine_));
      }
      GRAPHRUN_RETURN_IF_ERROR(check_dtype(h));
      GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, shape_of(h));
      if (h.dtype != mine_.tensor.dtype) {
        return invalid_argument("rank {} has {}, rank {} has {}", peer, static_cast<DType>(h.dtype),
                                rank_, input_.dtype());
      }
      if (kind_ == Kind::kAllGather) {
        if (shape.rank() == 0 || input_.shape().rank() == 0 ||
            shape.rank() != input_.shape().rank() ||
            !std::equal(h.dims + 1, h.dims + h.rank, mine_.tensor.dims + 1)) {
          return invalid_argument(
              "rank {} has shape {}, rank {} has {}: all but the first dimension must agree", peer,
              shape, rank_, input_.shape());
        }
      } else if (!(shape == input_.shape())) {
        return invalid_argument("rank {} has shape {}, rank {} has {}", peer, shape, rank_,
                                input_.shape());
      }
    }
    return Status::ok();
  }

  // The peers' tensors, into buffers of their own (kept until the last
  // receive is over, also when the operation is abandoned).
  Status post_payloads(internal::Round& round) {
    for (int peer = 0; peer < size_; ++peer) {
      if (sends_to(peer)) {
        GRAPHRUN_RETURN_IF_ERROR(
            round.send(input_.raw_data(), input_.byte_size(), peer, tag_, comm_));
      }
      if (!receives_from(peer)) continue;
      const Header& h = headers_[static_cast<std::size_t>(peer)].tensor;
      Result<Tensor> part = internal::tensor_for(h);
      if (part.is_ok()) {
        parts_[static_cast<std::size_t>(peer)] = std::move(*part);
        Tensor& t = parts_[static_cast<std::size_t>(peer)];
        GRAPHRUN_RETURN_IF_ERROR(round.recv(t.raw_data(), t.byte_size(), peer, tag_, comm_));
      } else {
        // Received anyway, so that the peer's send completes.
        if (status_.is_ok()) status_ = internal_error("rank {} sent a malformed header", peer);
        std::vector<char>& drain = drains_[static_cast<std::size_t>(peer)];
        drain.resize(static_cast<std::size_t>(std::min<uint64_t>(h.bytes, INT32_MAX)));
        GRAPHRUN_RETURN_IF_ERROR(round.recv(drain.data(), drain.size(), peer, tag_, comm_));
      }
    }
    return Status::ok();
  }

  Status produce() {
    parts_[static_cast<std::size_t>(rank_)] = input_;
    switch (kind_) {
      case Kind::kBroadcast: return ctx_->set_output(0, parts_[static_cast<std::size_t>(root_)]);
      case Kind::kAllGather: {
        Shape shape = input_.shape();
        int64_t rows = 0;
        for (const Tensor& t : parts_) rows += t.shape().dim(0);
        Shape out_shape;
        out_shape.add_dim(rows);
        for (int i = 1; i < shape.rank(); ++i) out_shape.add_dim(shape.dim(i));
        GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx_->allocate_output_uninitialized(0, out_shape));
        auto* dst = static_cast<char*>(out->raw_data());
        for (const Tensor& t : parts_) {
          if (t.byte_size() != 0) std::memcpy(dst, t.raw_data(), t.byte_size());
          dst += t.byte_size();
        }
        return Status::ok();
      }
      case Kind::kAllReduce: break;
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx_->allocate_output_uninitialized(0, input_.shape()));
    return visit_dtype(input_.dtype(), [&](auto zero) -> Status {
      using T = decltype(zero);
      if constexpr (std::is_same_v<T, bool>) {
        return invalid_argument("AllReduce of bool");
      } else {
        T* y = out->flat<T>().data();
        const auto n = static_cast<std::size_t>(input_.num_elements());
        const T* first = parts_[0].flat<T>().data();
        std::copy(first, first + n, y);
        for (std::size_t r = 1; r < parts_.size(); ++r) {
          const T* x = parts_[r].flat<T>().data();
          for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
        }
        if constexpr (std::is_floating_point_v<T>) {
          if (reduction_ == Reduction::kMean) {
            const auto ranks = static_cast<T>(size_);
            for (std::size_t i = 0; i < n; ++i) y[i] /= ranks;
          }
        }
        return Status::ok();
      }
    });
  }

  const Kind kind_;
  const Reduction reduction_;
  const int root_;
  const int rank_;
  const int size_;
  const MPI_Comm comm_;
  const Tensor input_;  // keeps the sent bytes alive
  const int tag_;
  int stage_ = 0;
  Status status_;
  CollectiveHeader mine_;
  std::vector<CollectiveHeader> headers_;
  std::vector<Tensor> parts_;
  std::vector<std::vector<char>> drains_;
};

class CollectiveKernel final : public AsyncOpKernel {
 public:
  CollectiveKernel(std::shared_ptr<World> world, Kind kind, Reduction reduction, int root,
                   uint64_t key_hash)
      : world_(std::move(world)),
        kind_(kind),
        reduction_(reduction),
        root_(root),
        key_hash_(key_hash),
        counter_(world_->invocation_counter(key_hash)) {}

  void compute_async(OpKernelContext& ctx, Done done) override {
    const uint64_t invocation = counter_.fetch_add(1, std::memory_order_relaxed);
    world_->engine().start(
        std::make_unique<Collective>(kind_, reduction_, root_, *world_, world_->engine().comm(),
                                     ctx, std::move(done), key_hash_, invocation),
        &ctx);
  }

 private:
  std::shared_ptr<World> world_;  // the progress thread outlives every kernel
  const Kind kind_;
  const Reduction reduction_;
  const int root_;
  const uint64_t key_hash_;
  std::atomic<uint64_t>& counter_;  // the key's invocations in this process
};

Result<std::unique_ptr<OpKernel>> make_kernel(OpKernelConstruction& c, Kind kind) {
  const Node& node = c.node();
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<World> world, internal::world_for(node));
  GRAPHRUN_ASSIGN_OR_RETURN(std::string key, c.attr<std::string>("key"));
  if (key.empty()) key = node.name();
  const uint64_t hash = internal::hash_key(key);
  GRAPHRUN_RETURN_IF_ERROR(internal::claim_key_id(key, hash, "collective key"));
  Reduction reduction = Reduction::kSum;
  int root = 0;
  if (kind == Kind::kAllReduce) {
    GRAPHRUN_ASSIGN_OR_RETURN(std::string r, c.attr<std::string>("reduction"));
    if (r == "mean") {
      reduction = Reduction::kMean;
      const DType d = node.output_dtype(0);
      if (d != DType::kFloat32 && d != DType::kFloat64) {
        return invalid_argument("{}: reduction 'mean' needs float32 or float64, not {}",
                                node.describe(), d);
      }
    } else if (r != "sum") {
      return invalid_argument("{}: reduction must be 'sum' or 'mean', not '{}'", node.describe(),
                              r);
    }
  }
  if (kind == Kind::kBroadcast) {
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t r, c.attr<int64_t>("root"));
    if (r < 0 || r >= world->size()) {
      return invalid_argument("{}: root {} is not a rank of this world of {}", node.describe(), r,
                              world->size());
    }
    root = static_cast<int>(r);
  }
  return std::make_unique<CollectiveKernel>(std::move(world), kind, reduction, root, hash);
}

Status gather_shape(InferenceContext& ic) {
  const Shape& in = ic.input_shape(0);
  if (in.is_unknown_rank()) {
    ic.set_output(0, in);
    return Status::ok();
  }
  if (in.rank() == 0)
    return invalid_argument("AllGather needs a tensor of rank >= 1, not a scalar");
  Shape out;
  out.add_dim(-1);  // the ranks' first dimensions summed
  for (int i = 1; i < in.rank(); ++i) out.add_dim(in.dim(i));
  ic.set_output(0, out);
  return Status::ok();
}

void add(OpRegistry& registry, OpDef def, Kind kind) {
  // Already there (a second World, or a registry filled twice): keep it.
  static_cast<void>(registry.add(std::move(def),
                                 [kind](OpKernelConstruction& c) { return make_kernel(c, kind); }));
}

// Graphs may be built before World::init.
void register_global_ops() {
  static const bool registered = [] {
    register_ops(OpRegistry::global());
    return true;
  }();
  static_cast<void>(registered);
}

Output collective_node(Graph& g, std::string_view op, Output x, AttrMap attrs,
                       std::string_view name, std::string_view key) {
  register_global_ops();
  attrs.emplace("key", std::string(key));
  Result<Node*> node = g.add_node(NodeSpec{.op = std::string(op),
                                           .name = std::string(name.empty() ? op : name),
                                           .inputs = {x},
                                           .attrs = std::move(attrs)});
  if (!node.is_ok()) return Output{};
  return (*node)->output(0);
}

}  // namespace

void register_ops(OpRegistry& registry) {
  internal::register_transfer_ops(registry);
  add(registry,
      OpDef("MpiAllReduce")
          .input("x", "T")
          .output("y", "T")
          .type_attr("T", numeric_dtypes())
          .attr("reduction", std::string("sum"))
          .attr("key", std::string())
          .stateful()
          .shape_fn(shape_fns::unchanged)
          .doc("Every MPI rank's x, summed (or averaged) elementwise, on every rank."),
      Kind::kAllReduce);
  add(registry,
      OpDef("MpiBroadcast")
          .input("x", "T")
          .output("y", "T")
          .type_attr("T", all_dtypes())
          .attr("root", int64_t{0})
          .attr("key", std::string())
          .stateful()
          .shape_fn(shape_fns::unchanged)
          .doc("The root rank's x on every MPI rank."),
      Kind::kBroadcast);
  add(registry,
      OpDef("MpiAllGather")
          .input("x", "T")
          .output("y", "T")
          .type_attr("T", all_dtypes())
          .attr("key", std::string())
          .stateful()
          .shape_fn(gather_shape)
          .doc("Every MPI rank's x concatenated along dimension 0 in rank order."),
      Kind::kAllGather);
}

}  // namespace graphrun::mpi

namespace graphrun::ops {

Output AllReduce(Graph& g, Output x, mpi::Reduction reduction, std::string_view name,
                 std::string_view key) {
  return mpi::collective_node(
      g, "MpiAllReduce", x,
      {{"reduction", std::string(reduction == mpi::Reduction::kMean ? "mean" : "sum")}}, name, key);
}

Output Broadcast(Graph& g, Output x, int root, std::string_view name, std::string_view key) {
  return mpi::collective_node(g, "MpiBroadcast", x, {{"root", int64_t{root}}}, name, key);
}

Output AllGather(Graph& g, Output x, std::string_view name, std::string_view key) {
  return mpi::collective_node(g, "MpiAllGather", x, {}, name, key);
}

const Node* Send(Graph& g, Output x, int dest, std::string_view tensor_name,
                 std::string_view name) {
  mpi::register_global_ops();
  Result<Node*> node = g.add_node(
      NodeSpec{.op = "MpiSend",
               .name = std::string(name.empty() ? "MpiSend" : name),
               .inputs = {x},
               .attrs = {{"tensor_name", std::string(tensor_name)}, {"dest", int64_t{dest}}}});
  return node.is_ok() ? *node : nullptr;
}

Output Recv(Graph& g, DType dtype, int source, std::string_view tensor_name, Shape shape,
            std::string_view name) {
  mpi::register_global_ops();
  Result<Node*> node = g.add_node(NodeSpec{.op = "MpiRecv",
                                           .name = std::string(name.empty() ? "MpiRecv" : name),
                                           .attrs = {{"T", dtype},
                                                     {"tensor_name", std::string(tensor_name)},
                                                     {"source", int64_t{source}},
                                                     {"shape", std::move(shape)}}});
  if (!node.is_ok()) return Output{};
  return (*node)->output(0);
}

}  // namespace graphrun::ops
