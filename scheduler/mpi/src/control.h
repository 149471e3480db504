// The distributed session's control messages (docs/distributed.md, Driver
// and workers): a fixed-size envelope (kind, step, payload size) and, when
// there is a payload, a second message of its bytes, both on the control
// communicator with the tag of their direction, so MPI keeps them in order.
// Payloads are written and read by Writer and Reader.
#pragma once

#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "scheduler/mpi/src/engine.h"

namespace graphrun::mpi::internal {

enum class Kind : uint32_t {
  kHello = 1,     // driver -> worker: the graph's fingerprint
  kReady,         // worker -> driver: the status of its hello (same graph?)
  kStart,         // driver -> worker: one step of a signature
  kAbort,         // driver -> worker: end a step now
  kDone,          // worker -> driver: the status of its part of a step
  kClose,         // driver -> worker: the session closes
  kClosed,        // worker -> driver: closed, serve() returns
  kPartialSetup,  // driver -> worker: start its part of a partial run
  kPartialCall,   // driver -> worker: the feeds and targets of one partial_run call
  kCallDone,      // worker -> driver: the status of a partial setup or call
  kNeedPart,      // worker -> driver: its answer to the hello when it has no graph
  kPart,          // driver -> worker: its part of the graph (step name, seed, GraphDef)
  kPing,          // driver -> worker: the heartbeat
  kPong,          // worker -> driver: its answer, sent from the worker's progress thread
  kExtend,        // driver -> worker: its delta of an extend (stubs, GraphDef)
  kExtended,      // worker -> driver: the status of its extend
};

inline constexpr int kToWorker = 1;  // tags on the control communicator (3: engine.cc's farewell)
inline constexpr int kToDriver = 2;

struct Envelope {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  uint64_t step = 0;
  uint64_t bytes = 0;  // the payload's size
};

// A message as received.
struct Message {
  Kind kind{};
  int source = 0;
  uint64_t step = 0;
  std::string payload;
};

class Writer {
 public:
  Writer& u64(uint64_t v);
  Writer& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Writer& str(std::string_view s);
  Writer& tensor(const Tensor& t);
  Writer& status(const Status& s);
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Reads what a Writer wrote; a short or malformed payload is Internal.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  Result<uint64_t> u64();
  Result<int64_t> i64();
  Result<std::string> str();
  Result<Tensor> tensor();
  // The status written (a malformed one: Internal).
  Status status();

 private:
  Status need(std::size_t n) const;
  std::string_view bytes_;
  std::size_t at_ = 0;
};

// Sends one message to `dest` with `tag` on the control communicator,
// without waiting (the engine completes it).
void send_message(Engine& engine, int dest, int tag, Kind kind, uint64_t step, std::string payload);

// Receives messages from `source` with `tag` on the control communicator
// and hands each to `deliver` (on the progress thread: it must not block)
// until stop() is called.
class Listener {
 public:
  using Deliver = std::function<void(Message)>;
  Listener(Engine& engine, int source, int tag, Deliver deliver);
  ~Listener() { stop(); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  // Cancels the receive and returns once `deliver` is called no more (the
  // progress thread noticed the stop). Not on the progress thread.
  void stop();

  struct State {
    std::atomic<bool> stopped{false};
    std::mutex mu;
    std::condition_variable cv;
    bool ended = false;  // guarded by mu
  };

 private:
  std::shared_ptr<State> state_;
};

}  // namespace graphrun::mpi::internal
