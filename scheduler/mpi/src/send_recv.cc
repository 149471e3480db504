// MpiSend and MpiRecv: one tensor from one rank to another, as asynchronous
// kernels over the progress engine. A one-element tensor travels as a
// compact message (a word of dtype, rank and checks, then its value: see
// wire.h). Any other transfer is a header (dtype, shape, byte size, the
// tensor name's hash and the invocation) with, for a tensor of at most
// internal::kInlineBytes, its bytes in the same message; a
// larger tensor's raw bytes follow as a second message, sent straight from
// the tensor's buffer and received into a tensor allocated from the header,
// so MPI copies it once. Both go with the same tag from the same rank, and
// MPI keeps two such messages in order. The n-th Send of a tensor name to a
// rank meets the n-th Recv of that name from that rank.
#include <graphrun/mpi.h>
#include <mpi.h>

#include <fmt/format.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "scheduler/mpi/src/engine.h"
#include "scheduler/mpi/src/wire.h"

namespace graphrun::mpi {

namespace {

using internal::kInlineBytes;
using internal::Packet;

// Sends and receives of one tensor name count their invocations apart per
// peer and direction.
uint64_t counter_of(uint64_t hash, int peer, bool send) {
  return hash ^ (0x9e3779b97f4a7c15ull * (2 * static_cast<uint64_t>(peer) + (send ? 1 : 0) + 1));
}

// The memory of Sends and Recvs in flight: each thread keeps a few freed
// blocks for its next transfers. A transfer allocates one operation of
// about 700 bytes; reusing it took a step that sends a float to its own
// rank from 5,810 to 5,560 instructions (callgrind) and from 0.50 to
// 0.47-0.49 us.
using BlockCache = internal::BlockCache<1024>;

// The shared part of both kernels: the peer and the tag.
class Transfer : public internal::KernelOperation {
 public:
  Transfer(OpKernelContext& ctx, AsyncOpKernel::Done done, int peer, int tag, MPI_Comm comm)
      : KernelOperation(ctx, std::move(done)), peer_(peer), tag_(tag), comm_(comm) {}

  static void* operator new(std::size_t bytes) {
    GRAPHRUN_CHECK(bytes <= BlockCache::kSize);
    return BlockCache::take();
  }
  static void operator delete(void* p) { BlockCache::give(p); }

 protected:
  const int peer_;
  const int tag_;
  const MPI_Comm comm_;
};

class SendOp final : public Transfer {
 public:
  // A message of at most kInlineBytes is written into the packet here,
  // while the input is certainly alive; a larger tensor is kept (its bytes
  // are sent from its buffer).
  SendOp(OpKernelContext& ctx, AsyncOpKernel::Done done, int peer, uint64_t hash,
         uint64_t invocation, int tag, MPI_Comm comm)
      : Transfer(ctx, std::move(done), peer, tag, comm) {
    const Tensor& input = ctx.input(0);
    message_bytes_ = internal::write_packet(packet_, input, hash, invocation);
    if (input.byte_size() > kInlineBytes) large_ = input;
  }

  bool advance(internal::Round& round) override {
    if (posted_) return finish(Status::ok());
    posted_ = true;
    Status s = round.send(&packet_, message_bytes_, peer_, tag_, comm_);
    // A large tensor's bytes go at once after their header: the receiver
    // posts its receive of them as soon as the header is in, and nothing
    // it waits for depends on this round.
    if (s.is_ok() && large_.is_initialized()) {
      s = round.send(large_.raw_data(), large_.byte_size(), peer_, tag_, comm_);
    }
    if (!s.is_ok()) return finish(std::move(s));
    return false;
  }

 private:
  Packet packet_;  // a compact message, or a header and any inline bytes
  std::size_t message_bytes_ = 0;
  Tensor large_;  // past kInlineBytes: keeps the sent bytes alive
  bool posted_ = false;
};

class RecvOp final : public Transfer {
 public:
  RecvOp(OpKernelContext& ctx, AsyncOpKernel::Done done, int peer, uint64_t hash,
         uint64_t invocation, int tag, MPI_Comm comm, DType dtype, const Shape* shape)
      : Transfer(ctx, std::move(done), peer, tag, comm),
        expect_{.key_hash = hash,
                .invocation = invocation,
                .dtype = dtype,
                .shape = shape,
                .peer = peer} {}

  bool advance(internal::Round& round) override {
    switch (stage_) {
      case 0:
        stage_ = 1;
        // Still there once the message is in: it was a compact one.
        packet_.header.bytes = internal::kCompactMarker;
        if (Status s = round.recv(&packet_, sizeof(Packet), peer_, tag_, comm_); !s.is_ok()) {
          return finish(std::move(s));
        }
        return false;
      case 1: {
        internal::Arrival a = internal::read_arrival(packet_, expect_);
        using Kind = internal::Arrival::Kind;
        if (a.kind == Kind::kValue) return finish(ctx_->set_output(0, std::move(a.value)));
        if (a.kind == Kind::kStale && a.follows == 0) {
          // A transfer no Recv took: this Recv waits on.
          stage_ = 0;
          return advance(round);
        }
        Status s;
        if (a.kind == Kind::kFollows) {
          stage_ = 2;
          value_ = std::move(a.value);
          s = round.recv_arriving(value_.raw_data(), value_.byte_size(), peer_, tag_, comm_);
        } else {
          if (a.kind == Kind::kRefused && a.follows == 0) return finish(std::move(a.status));
          // The bytes after a stale or refused header are received and
          // dropped (a stop lets them arrive rather than leave them for a
          // later Recv of the same tag); then a stale one's Recv waits on.
          stage_ = a.kind == Kind::kStale ? 3 : 2;
          status_ = std::move(a.status);
          drain_.resize(static_cast<std::size_t>(a.follows));
          s = round.recv_arriving(drain_.data(), drain_.size(), peer_, tag_, comm_);
        }
        if (!s.is_ok()) return finish(std::move(s));
        return false;
      }
      case 3:  // a stale transfer's bytes are in: wait for this one's header
        drain_.clear();
        stage_ = 0;
        return advance(round);
      default: {
        if (!status_.is_ok()) return finish(std::move(status_));
        internal::settle_bools(value_);
        return finish(ctx_->set_output(0, std::move(value_)));
      }
    }
  }

 private:
  const internal::RecvExpectation expect_;
  int stage_ = 0;
  Status status_;  // a refused header's, once its bytes are drained
  Packet packet_;
  Tensor value_;  // a tensor whose bytes follow its header
  std::vector<char> drain_;
};

// A Send or a Recv. Of a tensor name (MpiSend, MpiRecv): the n-th
// invocation of the name meets the n-th on the peer. Of a partitioned
// graph's edge (MpiPartitionSend, MpiPartitionRecv; `edge` >= 0): the
// step id, the kernel's last input, is the invocation, so that concurrent
// steps never mix.
class TransferKernel final : public AsyncOpKernel {
 public:
  TransferKernel(std::shared_ptr<World> world, bool send, int peer, uint64_t hash, int edge,
                 DType dtype, Shape shape)
      : world_(std::move(world)),
        send_(send),
        peer_(peer),
        hash_(hash),
        counter_(world_->invocation_counter(counter_of(hash, peer, send))),
        edge_(edge),
        dtype_(dtype),
        shape_(std::move(shape)) {}

  void compute_async(OpKernelContext& ctx, Done done) override {
    uint64_t invocation = 0;
    int tag = 0;
    if (edge_ >= 0) {
      invocation = static_cast<uint64_t>(ctx.input(ctx.num_inputs() - 1).scalar<int64_t>());
      tag = internal::edge_tag(edge_, invocation);
    } else {
      invocation = counter_.fetch_add(1, std::memory_order_relaxed);
      tag = internal::tag_of(hash_, invocation);
    }
    internal::Engine& engine = world_->engine();
    if (send_) {
      engine.start(std::make_unique<SendOp>(ctx, std::move(done), peer_, hash_, invocation, tag,
                                            engine.comm()),
                   &ctx);
    } else {
      engine.start(std::make_unique<RecvOp>(ctx, std::move(done), peer_, hash_, invocation, tag,
                                            engine.comm(), dtype_, &shape_),
                   &ctx);
    }
  }

 private:
  std::shared_ptr<World> world_;  // the progress thread outlives every kernel
  const bool send_;
  const int peer_;
  const uint64_t hash_;
  std::atomic<uint64_t>& counter_;  // this name's invocations to or from peer_
  const int edge_;                  // -1: matched by tensor name and invocation count
  const DType dtype_;
  const Shape shape_;
};

static_assert(sizeof(SendOp) <= BlockCache::kSize && sizeof(RecvOp) <= BlockCache::kSize);

Result<std::unique_ptr<OpKernel>> make_transfer(OpKernelConstruction& c, bool send,
                                                bool partition) {
  const Node& node = c.node();
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<World> world, internal::world_for(node));
  GRAPHRUN_ASSIGN_OR_RETURN(int64_t peer, c.attr<int64_t>(send ? "dest" : "source"));
  if (peer < 0 || peer >= world->size()) {
    return invalid_argument("{}: {} {} is not a rank of this world of {}", node.describe(),
                            send ? "dest" : "source", peer, world->size());
  }
  std::string key;
  int64_t edge = -1;
  if (partition) {
    GRAPHRUN_ASSIGN_OR_RETURN(edge, c.attr<int64_t>("edge"));
    if (edge < 0 || edge >= internal::kMaxEdges) {
      return invalid_argument("{}: edge {} is outside [0, {})", node.describe(), edge,
                              internal::kMaxEdges);
    }
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t session, c.attr<int64_t>("session"));
    // In the header only (edges have tags of their own): tells this
    // session's transfers from another's on the same edge and step.
    key = fmt::format("edge {} session {:x}", edge, session);
  } else {
    GRAPHRUN_ASSIGN_OR_RETURN(std::string name, c.attr<std::string>("tensor_name"));
    if (name.empty()) {
      return invalid_argument("{}: tensor_name is empty; a Send and its Recv meet by it",
                              node.describe());
    }
    // Tensor names and collective keys share the tag space, apart by prefix.
    key = "tensor " + name;
  }
  const uint64_t hash = internal::hash_key(key);
  if (!partition) GRAPHRUN_RETURN_IF_ERROR(internal::claim_key_id(key, hash, "key"));
  DType dtype = DType::kFloat32;
  Shape shape = Shape::unknown();
  if (!send) {
    GRAPHRUN_ASSIGN_OR_RETURN(dtype, c.attr<DType>("T"));
    GRAPHRUN_ASSIGN_OR_RETURN(shape, c.attr<Shape>("shape"));
  }
  return std::make_unique<TransferKernel>(std::move(world), send, static_cast<int>(peer), hash,
                                          static_cast<int>(edge), dtype, std::move(shape));
}

Status recv_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, c.attr<Shape>("shape"));
  c.set_output(0, shape);
  return Status::ok();
}

}  // namespace

namespace internal {

void register_transfer_ops(OpRegistry& registry) {
  static_cast<void>(
      registry.add(OpDef("MpiSend")
                       .input("x", "T")
                       .type_attr("T", all_dtypes())
                       .attr("tensor_name", std::string())
                       .attr("dest", int64_t{0})
                       .stateful()
                       .doc("Sends x to MPI rank `dest`, to the MpiRecv of the same "
                            "tensor_name there."),
                   [](OpKernelConstruction& c) { return make_transfer(c, true, false); }));
  static_cast<void>(
      registry.add(OpDef("MpiRecv")
                       .output("y", "T")
                       .type_attr("T", all_dtypes())
                       .attr("tensor_name", std::string())
                       .attr("source", int64_t{0})
                       .attr("shape", Shape::unknown())
                       .stateful()
                       .shape_fn(recv_shape)
                       .doc("The tensor MPI rank `source` sent with the same "
                            "tensor_name."),
                   [](OpKernelConstruction& c) { return make_transfer(c, false, false); }));
  // The pairs a partitioned graph's cross-rank edges become: keyed by edge
  // and step id (the int64 `step` input, the same on every rank of a step).
  static_cast<void>(
      registry.add(OpDef("MpiPartitionSend")
                       .input("x", "T")
                       .input("step", DType::kInt64)
                       .type_attr("T", all_dtypes())
                       .attr("edge", int64_t{0})
                       .attr("session", int64_t{0})
                       .attr("dest", int64_t{0})
                       .stateful()
                       .doc("Sends x over cross-rank edge `edge` of a partitioned "
                            "graph to rank `dest` in step `step`."),
                   [](OpKernelConstruction& c) { return make_transfer(c, true, true); }));
  static_cast<void>(
      registry.add(OpDef("MpiPartitionRecv")
                       .input("step", DType::kInt64)
                       .output("y", "T")
                       .type_attr("T", all_dtypes())
                       .attr("edge", int64_t{0})
                       .attr("session", int64_t{0})
                       .attr("source", int64_t{0})
                       .attr("shape", Shape::unknown())
                       .stateful()
                       .shape_fn(recv_shape)
                       .doc("The tensor rank `source` sends over cross-rank edge "
                            "`edge` of a partitioned graph in step `step`."),
                   [](OpKernelConstruction& c) { return make_transfer(c, false, true); }));
}

}  // namespace internal

}  // namespace graphrun::mpi
