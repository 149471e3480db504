// The progress engine: one thread does graphrun's waiting on MPI. Kernels
// submit Operations (state machines over non-blocking requests), or start
// them and test their first rounds briefly on their own thread (with
// MPI_THREAD_MULTIPLE); the thread takes over what is still out, tests
// their requests and advances them round by round, and ends each by
// calling its kernel's done. No oneTBB worker ever blocks in MPI.
#pragma once

#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "api/src/block_cache.h"

namespace graphrun::mpi::internal {

using graphrun::internal::BlockCache;

// The requests of one round of an operation. Receives are told apart from
// sends: a stopped operation cancels its receives, and its sends (which
// MPI cannot take back) finish in the background.
class Round {
 public:
  // Start a non-blocking send/receive of `bytes` bytes (< 2^31) with `tag`
  // on `comm`; the buffer must stay valid until the round is over.
  Status send(const void* data, std::size_t bytes, int dest, int tag, MPI_Comm comm) {
    // MPI_Isend only reads the buffer.
    return post(false, const_cast<void*>(data), bytes, dest, tag, comm);
  }
  Status recv(void* data, std::size_t bytes, int source, int tag, MPI_Comm comm) {
    return post(true, data, bytes, source, tag, comm);
  }
  // A receive of a message that is already on its way (the bytes after
  // their header): a stop lets it complete instead of cancelling it, so
  // that it never stays behind for a later receive of the same tag.
  Status recv_arriving(void* data, std::size_t bytes, int source, int tag, MPI_Comm comm) {
    return post(false, data, bytes, source, tag, comm, true);
  }
  bool empty() const { return size_ == 0; }

 private:
  friend class Engine;
  Status post(bool cancellable_receive, void* data, std::size_t bytes, int peer, int tag,
              MPI_Comm comm, bool receive = false);
  // The requests, contiguous (for MPI_Testall), and per request whether it
  // is a cancellable receive. A Send's or a Recv's round (at most two)
  // stays in the object: no allocation per transfer.
  std::size_t size() const { return size_; }
  MPI_Request* requests() { return size_ <= kInline ? inline_requests_ : heap_requests_.data(); }
  bool cancellable(std::size_t k) const {
    return (size_ <= kInline ? inline_receives_[k] : heap_receives_[k]) != 0;
  }
  void clear() {
    size_ = 0;
    heap_requests_.clear();
    heap_receives_.clear();
  }
  static constexpr std::size_t kInline = 4;
  std::size_t size_ = 0;
  MPI_Request inline_requests_[kInline] = {};
  uint8_t inline_receives_[kInline] = {};
  std::vector<MPI_Request> heap_requests_;  // all of them, past kInline
  std::vector<uint8_t> heap_receives_;
};

// One collective (later also a Send or a Recv) in flight.
// Thread safety: used by the progress thread only, after submit().
class Operation {
 public:
  virtual ~Operation() = default;
  // Starts or advances the operation once every request of the previous
  // round has completed (the first call has none): posts the next round's
  // requests into `round` and returns false, or finishes (having called
  // its kernel's done) and returns true.
  virtual bool advance(Round& round) = 0;
  // The operation's step stopped (it is polled between rounds).
  virtual bool stopped() const = 0;
  // Ends the operation with `why` (a stop, an MPI error, the engine's
  // end); called once, instead of finishing. The object stays alive until
  // its sends complete.
  virtual void abandon(Status why) = 0;
  // After abandon(), once every request of the round that was out has
  // completed (its receives cancelled or received), with their statuses
  // in the order they were posted (empty if none was out). Not called when
  // MPI fails; at the engine's end, what it submits goes unsent.
  virtual void after_drain(std::span<const MPI_Status> /*statuses*/) {}
};

// An operation that belongs to no step (a control message, a notice, a
// drain): never stopped, and nothing of its own to end when abandoned.
class StepFreeOperation : public Operation {
 public:
  bool stopped() const override { return false; }
  void abandon(Status /*why*/) override {}
};

// An operation that ends an asynchronous kernel: it holds the step's
// context and the kernel's done, calls done once (finish), and counts as
// stopped when the step is.
class KernelOperation : public Operation {
 public:
  KernelOperation(OpKernelContext& ctx, AsyncOpKernel::Done done)
      : ctx_(&ctx), done_(std::move(done)) {}
  bool stopped() const override { return ctx_ != nullptr && ctx_->is_cancelled(); }
  void abandon(Status why) override { static_cast<void>(finish(std::move(why))); }

 protected:
  // Calls done with `s` unless it was called; returns true (finished).
  // done is called in place: its owner (this operation) outlives the call.
  bool finish(Status s) {
    if (ctx_ != nullptr) {
      ctx_ = nullptr;
      done_(std::move(s));
    }
    return true;
  }
  OpKernelContext* ctx_;  // null once done was called
  AsyncOpKernel::Done done_;
};

// Thread safety: submit() and start() are thread-safe; the rest runs on
// its thread.
class Engine {
 public:
  // `multiple`: MPI granted MPI_THREAD_MULTIPLE, so start() may make MPI
  // calls on the kernel's thread too. `comm` carries the kernels' tensors,
  // `control` the distributed session's control messages.
  Engine(MPI_Comm comm, MPI_Comm control, bool multiple);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Abandons what is still in flight (Cancelled) and joins the thread.
  ~Engine();

  // Hands `op` to the progress thread.
  void submit(std::unique_ptr<Operation> op);
  // Starts `op` on the calling thread and, while its rounds complete within
  // a few microseconds of testing, advances it there (a message already on
  // its way, an eager send, costs no thread switch); what is still out then
  // goes to the progress thread, unless `ctx` (the kernel's context) has a
  // thread that waits for the step: that thread keeps testing it while it
  // waits (OpKernelContext::lend_to_waiter), and hands it to the progress
  // thread before it sleeps. Without MPI_THREAD_MULTIPLE: submit().
  void start(std::unique_ptr<Operation> op, OpKernelContext* ctx = nullptr);
  MPI_Comm comm() const { return comm_; }
  MPI_Comm control_comm() const { return control_; }

  // Rank 0's farewell (docs/distributed.md, "When rank 0 ends"): rank 0's
  // World says it to every other rank as it ends; the others' Worlds
  // listen for it from their start, so that a worker in serve() learns
  // that no driver will come, and wait for it (at most `timeout`) before
  // they finalise MPI, so that it never stays unreceived.
  void say_farewell(int size);
  void expect_farewell();
  bool farewell_received() const { return farewell_.load(std::memory_order_acquire); }
  bool wait_for_farewell(std::chrono::milliseconds timeout) const;

 private:
  struct Active {
    std::unique_ptr<Operation> op;
    Round round;
    bool finished = false;   // done was called; only the round is left
    bool abandoned = false;  // after_drain is due once the round completes
  };
  class Lent;
  // One test of `a` on a kernel's or a waiting thread, advancing it if its
  // round completed: still out, finished (what it posted and left out went
  // to the progress thread), or a stop or an MPI error for the progress
  // thread to deal with (`a` untouched).
  enum class Here { kOut, kFinished, kTrouble };
  Here advance_here(Active& a);
  // `a` finished: hands it over if requests it posted are still out.
  void finished_here(Active& a);
  void hand_over(Active a);
  void loop();
  // Tests `round`; an MPI error is returned, completion in `done`.
  static Status test(Round& round, bool& done);
  void drop(Active& a, Status why);
  // Cancels the round's receives and keeps `a` (done was called) until its
  // requests complete; an empty round is dropped at once.
  void drain(Active& a);
  // MPI_Cancel on the round's receives still out.
  static void cancel_receives(Round& round);
  // Forgets the abandoned operations whose requests have all completed.
  void test_draining();

  MPI_Comm comm_;
  MPI_Comm control_;
  std::mutex mu_;
  std::condition_variable cv_;
  const bool multiple_;
  std::deque<Active> queue_;  // guarded by mu_
  bool stopping_ = false;     // guarded by mu_
  // Progress thread only.
  std::vector<Active> active_;
  std::vector<Active> draining_;  // abandoned, sends still out
  std::atomic<bool> farewell_{false};
  std::thread thread_;
};

// "MPI_Isend: <MPI's error string>" as Unavailable.
Status mpi_error(int code, const char* call);

}  // namespace graphrun::mpi::internal
