#include "scheduler/mpi/src/control.h"

#include <cstring>
#include <mutex>
#include <utility>

#include "scheduler/mpi/src/wire.h"

namespace graphrun::mpi::internal {

namespace {

// One message out: its envelope and payload, owned until MPI has them.
class SendMessage final : public StepFreeOperation {
 public:
  SendMessage(int dest, int tag, MPI_Comm comm, Envelope envelope, std::string payload)
      : dest_(dest), tag_(tag), comm_(comm), envelope_(envelope), payload_(std::move(payload)) {}
  bool advance(Round& round) override {
    if (posted_) return true;
    posted_ = true;
    // Envelope and payload of one message must be posted back to back:
    // two threads sending to the same rank would otherwise interleave
    // them, and the receiver would take one's envelope as the other's
    // payload (the concurrent partial-run test caught this under ASan).
    static std::mutex posting;
    const std::lock_guard lock(posting);
    Status s = round.send(&envelope_, sizeof(Envelope), dest_, tag_, comm_);
    if (s.is_ok() && !payload_.empty()) {
      s = round.send(payload_.data(), payload_.size(), dest_, tag_, comm_);
    }
    return !s.is_ok();  // an error: nobody waits for this message
  }

 private:
  const int dest_;
  const int tag_;
  const MPI_Comm comm_;
  const Envelope envelope_;
  const std::string payload_;
  bool posted_ = false;
};

// Receives envelope, payload, envelope, ... until stopped.
class ReceiveMessages final : public Operation {
 public:
  ReceiveMessages(int source, int tag, MPI_Comm comm, Listener::Deliver deliver,
                  std::shared_ptr<Listener::State> state)
      : source_(source),
        tag_(tag),
        comm_(comm),
        deliver_(std::move(deliver)),
        state_(std::move(state)) {}
  bool advance(Round& round) override {
    if (payload_pending_) {
      payload_pending_ = false;
      deliver();
    } else if (posted_) {
      if (envelope_.bytes != 0) {
        message_.payload.resize(envelope_.bytes);
        payload_pending_ = true;
        return ended(round.recv_arriving(message_.payload.data(), message_.payload.size(), source_,
                                         tag_, comm_));
      }
      message_.payload.clear();
      deliver();
    }
    posted_ = true;
    return ended(round.recv(&envelope_, sizeof(Envelope), source_, tag_, comm_));
  }
  bool stopped() const override { return state_->stopped.load(); }
  // An MPI error ends the listener (true) as a stop would.
  bool ended(const Status& posted) {
    if (posted.is_ok()) return false;
    abandon(posted);
    return true;
  }
  // After this, advance() is never called again.
  void abandon(Status /*why*/) override {
    {
      const std::lock_guard lock(state_->mu);
      state_->ended = true;
    }
    state_->cv.notify_all();
  }

 private:
  void deliver() {
    message_.kind = static_cast<Kind>(envelope_.kind);
    message_.source = source_;
    message_.step = envelope_.step;
    deliver_(std::move(message_));
    message_ = Message{};
  }
  const int source_;
  const int tag_;
  const MPI_Comm comm_;
  Listener::Deliver deliver_;
  std::shared_ptr<Listener::State> state_;
  Envelope envelope_;
  Message message_;
  bool posted_ = false;
  bool payload_pending_ = false;
};

}  // namespace

Writer& Writer::u64(uint64_t v) {
  bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
  return *this;
}

Writer& Writer::str(std::string_view s) {
  u64(s.size());
  bytes_.append(s);
  return *this;
}

Writer& Writer::tensor(const Tensor& t) {
  const Header h = header_of(t, 0, 0);
  bytes_.append(reinterpret_cast<const char*>(&h), sizeof h);
  bytes_.append(static_cast<const char*>(t.raw_data()), t.byte_size());
  return *this;
}

Writer& Writer::status(const Status& s) {
  u64(static_cast<uint64_t>(s.code()));
  return str(s.message());
}

Status Reader::need(std::size_t n) const {
  if (bytes_.size() - at_ < n) {
    return internal_error("a control message ends after {} bytes, {} more expected", at_, n);
  }
  return Status::ok();
}

Result<uint64_t> Reader::u64() {
  GRAPHRUN_RETURN_IF_ERROR(need(sizeof(uint64_t)));
  uint64_t v = 0;
  std::memcpy(&v, bytes_.data() + at_, sizeof v);
  at_ += sizeof v;
  return v;
}

Result<int64_t> Reader::i64() {
  GRAPHRUN_ASSIGN_OR_RETURN(uint64_t v, u64());
  return static_cast<int64_t>(v);
}

Result<std::string> Reader::str() {
  GRAPHRUN_ASSIGN_OR_RETURN(uint64_t n, u64());
  GRAPHRUN_RETURN_IF_ERROR(need(n));
  std::string s(bytes_.substr(at_, n));
  at_ += n;
  return s;
}

Result<Tensor> Reader::tensor() {
  GRAPHRUN_RETURN_IF_ERROR(need(sizeof(Header)));
  Header h;
  std::memcpy(&h, bytes_.data() + at_, sizeof h);
  at_ += sizeof h;
  // The bytes must be in the message before a tensor of their size is
  // allocated (tensor_for then checks them against the shape).
  GRAPHRUN_RETURN_IF_ERROR(need(h.bytes));
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, tensor_for(h));
  if (t.byte_size() != 0) std::memcpy(t.raw_data(), bytes_.data() + at_, t.byte_size());
  settle_bools(t);
  at_ += t.byte_size();
  return t;
}

Status Reader::status() {
  Result<uint64_t> code_or = u64();
  if (!code_or.is_ok()) return code_or.status();
  const uint64_t code = *code_or;
  Result<std::string> message = str();
  if (!message.is_ok()) return message.status();
  if (code > static_cast<uint64_t>(StatusCode::kUnauthenticated)) {
    return internal_error("a control message carries status code {}", code);
  }
  if (code == 0) return Status::ok();
  return Status(static_cast<StatusCode>(code), std::move(*message));
}

void send_message(Engine& engine, int dest, int tag, Kind kind, uint64_t step,
                  std::string payload) {
  Envelope e{.kind = static_cast<uint32_t>(kind), .step = step, .bytes = payload.size()};
  engine.start(
      std::make_unique<SendMessage>(dest, tag, engine.control_comm(), e, std::move(payload)));
}

Listener::Listener(Engine& engine, int source, int tag, Deliver deliver)
    : state_(std::make_shared<State>()) {
  engine.submit(std::make_unique<ReceiveMessages>(source, tag, engine.control_comm(),
                                                  std::move(deliver), state_));
}

void Listener::stop() {
  state_->stopped.store(true);
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->ended; });
}

}  // namespace graphrun::mpi::internal
