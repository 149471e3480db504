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
//
// Given-up invocations. A rank that ends an invocation without completing
// it (its step's deadline, a stop, close()) tells every other rank, on the
// control communicator, which invocation it gave up and what it had sent
// that rank (its header, its tensor's bytes). A rank that has not started
// that invocation skips it (its next invocation of the key takes the
// number after), so the ranks' next invocations meet again; a rank running
// it ends it too (Aborted, naming the rank); and every rank receives what
// the others sent it for that invocation and it did not receive (it
// cancels its own receives as it gives up, and learns from their statuses
// what came), so that no message stays behind for a later invocation of
// the same tag. A rank that completed the invocation answers with what it
// sent. Without this, one rank's given-up invocation left the key's counts
// one apart for good, and every later step waited for its deadline.
#include <graphrun/mpi.h>
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

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

// What one rank sent another for one invocation.
struct Sent {
  bool header = false;
  int64_t payload = -1;  // the tensor's bytes, or -1 for none
};
// What one rank received from another for one invocation it gave up.
struct Got {
  bool header = false;
  bool payload = false;
};

// A rank's word to another about one invocation: it gave it up, or (the
// answer to a rank that gave it up) it completed it; and what it had sent
// the receiver.
struct Notice {
  uint64_t key_hash = 0;
  uint64_t invocation = 0;
  int64_t payload = -1;  // Sent::payload
  int32_t from = 0;
  uint8_t header = 0;  // Sent::header
  uint8_t gave_up = 0;
  char why[198] = {};  // why it gave up, cut to fit
};

// The notices' tag on the control communicator (control.h uses 1 and 2,
// engine.cc's farewell 3).
constexpr int kNoticeTag = 4;
// A given-up invocation's record is kept this long (in invocations of its
// key): a tag repeats after 2^kInvocationBits.
constexpr uint64_t kRecordSpan = uint64_t{1} << (internal::kInvocationBits - 1);
// Completed invocations whose sends a rank can still describe.
constexpr std::size_t kRecent = 64;

// An invocation in progress on this rank: a peer's notice stops it.
struct Slot {
  std::atomic<bool> aborted{false};
  Status why;  // written once, before `aborted` is set
};

// One notice to one rank.
class NoticeSend final : public internal::StepFreeOperation {
 public:
  NoticeSend(const Notice& notice, int dest, MPI_Comm comm)
      : notice_(notice), dest_(dest), comm_(comm) {}
  bool advance(internal::Round& round) override {
    if (posted_) return true;
    posted_ = true;
    return !round.send(&notice_, sizeof(Notice), dest_, kNoticeTag, comm_).is_ok();
  }

 private:
  const Notice notice_;
  const int dest_;
  const MPI_Comm comm_;
  bool posted_ = false;
};

// Receives what a peer sent for an invocation this rank did not complete,
// and drops it.
class Drain final : public internal::StepFreeOperation {
 public:
  Drain(int peer, int tag, MPI_Comm comm, bool header, int64_t payload)
      : peer_(peer), tag_(tag), comm_(comm), header_(header), payload_(payload) {}
  bool advance(internal::Round& round) override {
    if (posted_) return true;
    posted_ = true;
    // In the order the peer sent them: MPI matches a peer's messages of one
    // tag in order.
    if (header_) {
      header_bytes_.resize(sizeof(CollectiveHeader));
      if (!round.recv(header_bytes_.data(), header_bytes_.size(), peer_, tag_, comm_).is_ok()) {
        return true;
      }
    }
    if (payload_ >= 0) {
      payload_bytes_.resize(
          static_cast<std::size_t>(std::min<int64_t>(payload_, std::numeric_limits<int>::max())));
      static_cast<void>(
          round.recv(payload_bytes_.data(), payload_bytes_.size(), peer_, tag_, comm_));
    }
    return round.empty();
  }

 private:
  const int peer_;
  const int tag_;
  const MPI_Comm comm_;
  const bool header_;
  const int64_t payload_;
  bool posted_ = false;
  std::vector<char> header_bytes_;
  std::vector<char> payload_bytes_;
};

// The collectives' invocation numbers, and what the ranks owe each other
// for the invocations some rank gave up. One per World.
// Thread safety: every member is thread-safe.
class Book {
 public:
  Book(internal::Engine& engine, int rank, int size) : engine_(engine), rank_(rank), size_(size) {}

  // The number of this rank's next invocation of `key`: the next one no
  // peer gave up before it started here. `slot` is how a peer's notice
  // stops it.
  uint64_t begin(uint64_t key, std::shared_ptr<Slot> slot) {
    const std::lock_guard lock(mu_);
    Key& k = keys_[key];
    uint64_t n = k.next++;
    while (k.records.contains(n)) n = k.next++;  // given up by a peer before it started here
    while (!k.records.empty() && k.records.begin()->first + kRecordSpan < n) {
      k.records.erase(k.records.begin());
    }
    k.live.emplace(n, std::move(slot));
    return n;
  }

  // Invocation `n` ended here having sent `sent` (indexed by rank): the
  // peers that gave it up learn what to receive.
  void completed(uint64_t key, uint64_t n, std::span<const Sent> sent) {
    const std::lock_guard lock(mu_);
    Key& k = keys_[key];
    k.live.erase(n);
    Recent& recent = k.recent[n % kRecent];
    recent.n = n;
    recent.sent.assign(sent.begin(), sent.end());  // no allocation once its slot was used
    auto it = k.records.find(n);
    if (it == k.records.end()) return;
    for (const Notice& from : it->second.pending) {
      if (from.gave_up != 0) tell(key, n, from.from, sent[from.from], false, {});
    }
    k.records.erase(it);  // everything the peers sent came
  }

  // This rank gave up invocation `n` (`why`) having sent `sent`: every
  // peer learns of it.
  void gave_up(uint64_t key, uint64_t n, std::span<const Sent> sent, const Status& why) {
    const std::lock_guard lock(mu_);
    Key& k = keys_[key];
    k.live.erase(n);
    Record& r = k.records[n];
    if (r.told) return;
    r.told = true;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) tell(key, n, peer, sent[static_cast<std::size_t>(peer)], true, why);
    }
  }

  // What this rank received for the invocation it gave up is known: what
  // else the peers sent it can be received.
  void resolved(uint64_t key, uint64_t n, std::vector<Got> got) {
    const std::lock_guard lock(mu_);
    Key& k = keys_[key];
    auto it = k.records.find(n);
    if (it == k.records.end()) return;
    Record& r = it->second;
    r.resolved = true;
    r.got = std::move(got);
    for (const Notice& notice : r.pending) drain(key, n, r.got[notice.from], notice);
    r.pending.clear();
  }

  // A peer's notice, on the progress thread.
  void noticed(const Notice& notice) {
    if (notice.from < 0 || notice.from >= size_ || notice.from == rank_) return;
    const std::lock_guard lock(mu_);
    const uint64_t key = notice.key_hash;
    const uint64_t n = notice.invocation;
    Key& k = keys_[key];
    if (auto live = k.live.find(n); live != k.live.end()) {
      if (notice.gave_up != 0) {
        Slot& slot = *live->second;
        if (!slot.aborted.load(std::memory_order_relaxed)) {
          slot.why = aborted(
              "rank {} gave up invocation {} of this collective ({}): it ends on every rank, and "
              "the ranks' next invocations meet",
              notice.from, n, std::string_view(notice.why, strnlen(notice.why, sizeof notice.why)));
          slot.aborted.store(true, std::memory_order_release);
        }
      }
      k.records[n].pending.push_back(notice);
      return;
    }
    if (auto it = k.records.find(n); it != k.records.end()) {
      if (it->second.resolved) {
        drain(key, n, it->second.got[notice.from], notice);
      } else {
        it->second.pending.push_back(notice);
      }
      return;
    }
    if (notice.gave_up == 0) return;  // an answer to a record since forgotten
    if (n >= k.next) {
      // Not started here: skipped, and what the peer sent is received.
      Record& r = k.records[n];
      r.resolved = true;
      r.told = true;
      r.got.assign(static_cast<std::size_t>(size_), Got{});
      const Status why = aborted("it had not started it when rank {} gave it up", notice.from);
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank_) tell(key, n, peer, Sent{}, true, why);
      }
      drain(key, n, Got{}, notice);
      return;
    }
    // Completed here: the peer learns what this rank sent it.
    const Recent& recent = k.recent[n % kRecent];
    if (recent.n == n && !recent.sent.empty()) {
      tell(key, n, notice.from, recent.sent[static_cast<std::size_t>(notice.from)], false, {});
    }
  }

 private:
  struct Record {
    bool resolved = false;  // `got` is known
    bool told = false;      // this rank's notices went
    std::vector<Got> got;   // by rank
    std::vector<Notice> pending;
  };
  struct Recent {
    uint64_t n = std::numeric_limits<uint64_t>::max();
    std::vector<Sent> sent;
  };
  struct Key {
    uint64_t next = 0;
    std::unordered_map<uint64_t, std::shared_ptr<Slot>> live;
    std::map<uint64_t, Record> records;  // invocations given up here or by a peer
    std::array<Recent, kRecent> recent;
  };

  void tell(uint64_t key, uint64_t n, int peer, const Sent& sent, bool gave_up, const Status& why) {
    Notice notice;
    notice.key_hash = key;
    notice.invocation = n;
    notice.payload = sent.payload;
    notice.from = rank_;
    notice.header = sent.header ? 1 : 0;
    notice.gave_up = gave_up ? 1 : 0;
    const std::string text = why.message();
    std::memcpy(notice.why, text.data(), std::min(text.size(), sizeof notice.why - 1));
    engine_.submit(std::make_unique<NoticeSend>(notice, peer, engine_.control_comm()));
  }

  // Receives what `notice`'s sender sent this rank for `n` beyond `got`.
  void drain(uint64_t key, uint64_t n, const Got& got, const Notice& notice) {
    const bool header = notice.header != 0 && !got.header;
    const int64_t payload = got.payload ? -1 : notice.payload;
    if (!header && payload < 0) return;
    engine_.submit(std::make_unique<Drain>(notice.from, internal::tag_of(key, n), engine_.comm(),
                                           header, payload));
  }

  internal::Engine& engine_;
  const int rank_;
  const int size_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Key> keys_;  // guarded by mu_
};

// Receives the peers' notices, for as long as the engine runs.
class NoticeReceive final : public internal::StepFreeOperation {
 public:
  NoticeReceive(std::shared_ptr<Book> book, MPI_Comm comm) : book_(std::move(book)), comm_(comm) {}
  bool advance(internal::Round& round) override {
    if (posted_) book_->noticed(notice_);
    posted_ = true;
    return !round.recv(&notice_, sizeof(Notice), MPI_ANY_SOURCE, kNoticeTag, comm_).is_ok();
  }

 private:
  std::shared_ptr<Book> book_;
  const MPI_Comm comm_;
  Notice notice_;
  bool posted_ = false;
};

std::mutex g_book_mu;
std::shared_ptr<Book> g_book;  // guarded by g_book_mu: the live World's

std::shared_ptr<Book> book() {
  const std::lock_guard lock(g_book_mu);
  return g_book;
}

class Collective final : public internal::KernelOperation {
 public:
  Collective(Kind kind, Reduction reduction, int root, const World& world, MPI_Comm comm,
             OpKernelContext& ctx, AsyncOpKernel::Done done, uint64_t key_hash, uint64_t invocation,
             std::shared_ptr<Book> book, std::shared_ptr<Slot> slot)
      : KernelOperation(ctx, std::move(done)),
        book_(std::move(book)),
        slot_(std::move(slot)),
        key_hash_(key_hash),
        invocation_(invocation),
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
        drains_(static_cast<std::size_t>(size_)),
        sent_(static_cast<std::size_t>(size_)),
        received_at_(static_cast<std::size_t>(size_), kNone) {
    mine_.tensor = header_of(input_, key_hash, invocation);
    mine_.kind = static_cast<uint32_t>(kind);
    mine_.reduction = kind == Kind::kAllReduce ? static_cast<uint32_t>(reduction) : 0;
    mine_.root = kind == Kind::kBroadcast ? root : 0;
  }

  bool advance(internal::Round& round) override {
    switch (stage_) {
      case 0:
        stage_ = 1;
        if (Status s = post_headers(round); !s.is_ok()) return end(std::move(s));
        if (!round.empty()) return false;
        [[fallthrough]];
      case 1:
        stage_ = 2;
        status_ = check_headers();
        // A mismatch is found on every rank: none sends its bytes.
        if (!status_.is_ok()) return end(status_);
        if (Status s = post_payloads(round); !s.is_ok()) return end(std::move(s));
        if (!round.empty()) return false;
        [[fallthrough]];
      default: return end(status_.is_ok() ? produce() : status_);
    }
  }

  bool stopped() const override {
    return KernelOperation::stopped() || slot_->aborted.load(std::memory_order_acquire);
  }

  // Given up (a stop, a peer's notice): the peers learn what this rank
  // sent them; what it received is known once its receives are cancelled.
  void abandon(Status why) override {
    if (slot_->aborted.load(std::memory_order_acquire)) why = slot_->why;
    gave_up_ = true;
    book_->gave_up(key_hash_, invocation_, sent_, why);
    static_cast<void>(finish(std::move(why)));
  }

  void after_drain(std::span<const MPI_Status> statuses) override {
    if (!gave_up_) return;
    std::vector<Got> got(static_cast<std::size_t>(size_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      Got& g = got[static_cast<std::size_t>(peer)];
      const std::size_t at = received_at_[static_cast<std::size_t>(peer)];
      bool arrived = false;
      if (at < statuses.size()) {
        int cancelled = 0;
        MPI_Test_cancelled(&statuses[at], &cancelled);
        arrived = cancelled == 0;
      }
      // Round 2 went out after every header had come.
      g.header = stage_ == 2 || (stage_ == 1 && arrived);
      g.payload = stage_ == 2 && arrived;
    }
    book_->resolved(key_hash_, invocation_, std::move(got));
  }

 private:
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

  // Ends the invocation here (completed, or failed alike on every rank).
  bool end(Status s) {
    book_->completed(key_hash_, invocation_, sent_);
    return finish(std::move(s));
  }

  // Posts into `round`, keeping count of what went to whom.
  Status send(internal::Round& round, const void* data, std::size_t bytes, int peer, bool header) {
    GRAPHRUN_RETURN_IF_ERROR(round.send(data, bytes, peer, tag_, comm_));
    ++posted_;
    Sent& sent = sent_[static_cast<std::size_t>(peer)];
    if (header) {
      sent.header = true;
    } else {
      sent.payload = static_cast<int64_t>(bytes);
    }
    return Status::ok();
  }
  Status receive(internal::Round& round, void* data, std::size_t bytes, int peer) {
    GRAPHRUN_RETURN_IF_ERROR(round.recv(data, bytes, peer, tag_, comm_));
    received_at_[static_cast<std::size_t>(peer)] = posted_++;
    return Status::ok();
  }

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
    posted_ = 0;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      GRAPHRUN_RETURN_IF_ERROR(send(round, &mine_, sizeof(CollectiveHeader), peer, true));
      GRAPHRUN_RETURN_IF_ERROR(receive(round, &headers_[static_cast<std::size_t>(peer)],
                                       sizeof(CollectiveHeader), peer));
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
    posted_ = 0;
    std::fill(received_at_.begin(), received_at_.end(), kNone);
    for (int peer = 0; peer < size_; ++peer) {
      if (sends_to(peer)) {
        GRAPHRUN_RETURN_IF_ERROR(send(round, input_.raw_data(), input_.byte_size(), peer, false));
      }
      if (!receives_from(peer)) continue;
      const Header& h = headers_[static_cast<std::size_t>(peer)].tensor;
      Result<Tensor> part = internal::tensor_for(h);
      if (part.is_ok()) {
        parts_[static_cast<std::size_t>(peer)] = std::move(*part);
        Tensor& t = parts_[static_cast<std::size_t>(peer)];
        GRAPHRUN_RETURN_IF_ERROR(receive(round, t.raw_data(), t.byte_size(), peer));
      } else {
        // Received anyway, so that the peer's send completes.
        if (status_.is_ok()) status_ = internal_error("rank {} sent a malformed header", peer);
        std::vector<char>& drain = drains_[static_cast<std::size_t>(peer)];
        drain.resize(static_cast<std::size_t>(std::min<uint64_t>(h.bytes, INT32_MAX)));
        GRAPHRUN_RETURN_IF_ERROR(receive(round, drain.data(), drain.size(), peer));
      }
    }
    return Status::ok();
  }

  Status produce() {
    // What came from the peers (this rank's own input is shared: not
    // written).
    for (int peer = 0; peer < size_; ++peer) {
      if (receives_from(peer)) internal::settle_bools(parts_[static_cast<std::size_t>(peer)]);
    }
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

  std::shared_ptr<Book> book_;
  std::shared_ptr<Slot> slot_;
  const uint64_t key_hash_;
  const uint64_t invocation_;
  const Kind kind_;
  const Reduction reduction_;
  const int root_;
  const int rank_;
  const int size_;
  const MPI_Comm comm_;
  const Tensor input_;  // keeps the sent bytes alive
  const int tag_;
  int stage_ = 0;  // 1: the headers' round is out, 2: the tensors'
  Status status_;
  CollectiveHeader mine_;
  std::vector<CollectiveHeader> headers_;
  std::vector<Tensor> parts_;
  std::vector<std::vector<char>> drains_;
  std::vector<Sent> sent_;                // by rank
  std::vector<std::size_t> received_at_;  // by rank: its receive's place in the round out
  std::size_t posted_ = 0;                // requests in the round out
  bool gave_up_ = false;
};

class CollectiveKernel final : public AsyncOpKernel {
 public:
  CollectiveKernel(std::shared_ptr<World> world, std::shared_ptr<Book> book, Kind kind,
                   Reduction reduction, int root, uint64_t key_hash)
      : world_(std::move(world)),
        book_(std::move(book)),
        kind_(kind),
        reduction_(reduction),
        root_(root),
        key_hash_(key_hash) {}

  void compute_async(OpKernelContext& ctx, Done done) override {
    auto slot = std::make_shared<Slot>();
    const uint64_t invocation = book_->begin(key_hash_, slot);
    world_->engine().start(std::make_unique<Collective>(
                               kind_, reduction_, root_, *world_, world_->engine().comm(), ctx,
                               std::move(done), key_hash_, invocation, book_, std::move(slot)),
                           &ctx);
  }

 private:
  std::shared_ptr<World> world_;  // the progress thread outlives every kernel
  std::shared_ptr<Book> book_;    // the key's invocations in this process
  const Kind kind_;
  const Reduction reduction_;
  const int root_;
  const uint64_t key_hash_;
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
  std::shared_ptr<Book> book = mpi::book();
  if (book == nullptr) {
    return failed_precondition("{} needs graphrun::mpi::World::init() first", node.describe());
  }
  return std::make_unique<CollectiveKernel>(std::move(world), std::move(book), kind, reduction,
                                            root, hash);
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

namespace internal {

void open_collective_book(World& world) {
  auto book = std::make_shared<Book>(world.engine(), world.rank(), world.size());
  if (world.size() > 1) {
    world.engine().submit(std::make_unique<NoticeReceive>(book, world.engine().control_comm()));
  }
  const std::lock_guard lock(g_book_mu);
  g_book = std::move(book);
}

}  // namespace internal

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
