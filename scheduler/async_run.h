// AsyncRun: one asynchronous step of a full run (Session::run_async,
// Callable::run_async). It holds no thread while it waits: queued for a
// permit of the pool, it is an entry in the pool's Permits queue (with a
// timer for its deadline and a stop registration); running, it is the
// flow graph's pending tasks; its last node submits the finisher, which
// hands the permit on and calls `done`. See docs/async.md.
#pragma once

#include <graphrun/session.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <vector>

#include "scheduler/flow_graph.h"
#include "scheduler/permits.h"
#include "scheduler/plan_cache.h"
#include "scheduler/run_state.h"
#include "scheduler/timer.h"

namespace graphrun::sched {

class SessionImpl;

// A call that waits for a permit of its pool without a thread: an entry
// in the pool's Permits queue, a timer for its deadline and a stop
// registration. Exactly one of the grant, the deadline, a stop and the
// session's close takes it out of the queue (Permits decides which).
// Thread safety: internal; subclasses own themselves and delete
// themselves once they have reported.
class QueuedCall : public AsyncPermitWaiter {
 public:
  QueuedCall(const QueuedCall&) = delete;
  QueuedCall& operator=(const QueuedCall&) = delete;

  // Takes a permit (then admitted(true) runs here) or queues (later
  // admitted(false) on the releasing thread, or rejected()). Call once.
  void admit();

  void on_granted() final;
  void on_closed() final;

  // For an owner that must end a queued call (a partial run cancelled
  // while its asynchronous call waits for a thread): leave_queue() takes
  // the call out of the queue (true) or finds it admitted or gone (false);
  // after true, reject_left() reports `why` (and deletes the call).
  bool leave_queue();
  void reject_left(Status why);

 protected:
  QueuedCall(SessionImpl* session, std::optional<std::chrono::steady_clock::time_point> deadline,
             std::stop_token stop);
  ~QueuedCall() = default;

  // The call holds a permit (`at_once`: on the calling thread, in admit()).
  virtual void admitted(bool at_once) = 0;
  // The call left the queue without a permit (DeadlineExceeded, Cancelled,
  // the session closed): report `why` and delete this.
  virtual void rejected(Status why) = 0;
  // A stop was requested after the call got its permit (under mu()).
  virtual void stopped_while_admitted() {}
  // Ends the stop registration (waits for a callback in flight, unless it
  // is this thread's). Call before deleting this, without mu() held.
  void drop_stop() { on_stop_.reset(); }
  // Hands the call's permit on (to the queue's head), if it took one.
  void release_permit();
  std::mutex& mu() { return mu_; }

  SessionImpl* const session_;
  ThreadPool::Impl* const pool_;
  const std::stop_token stop_token_;

 private:
  void on_queue_deadline();
  void on_stop();
  // The deadline timer, cancelled (0 after).
  void cancel_queue_timer();
  void reject(Status why);

  struct Stop {
    QueuedCall* call;
    void operator()() const { call->on_stop(); }
  };

  const std::optional<std::chrono::steady_clock::time_point> deadline_;
  // Held by admit() until the call is queued and its timer set: whoever
  // takes the call out of the queue waits for it.
  std::mutex mu_;
  Timer::Id queue_timer_ = 0;  // guarded by mu_
  std::optional<std::stop_callback<Stop>> on_stop_;
};

// One asynchronous step of a full run. Created by
// SessionImpl::execute_async; deletes itself after `done` returns.
class AsyncRun final : public QueuedCall {
 public:
  // `entry` is the plan to run (kept alive by `lease` or `shared`).
  AsyncRun(SessionImpl* session, PlanEntry* entry, PlanLease lease,
           std::shared_ptr<PlanEntry> shared, std::vector<Tensor> feeds, std::size_t num_fetches,
           const RunOptions& options, StepControl control, RunDone done);

 private:
  ~AsyncRun() = default;
  void admitted(bool at_once) override;
  void rejected(Status why) override;
  void stopped_while_admitted() override;
  // Runs the step in the arena (a permit held).
  void run();
  // The last node ended (inside its body): submit the finisher.
  static void on_complete(void* self);
  // Collects the step's result, hands the permit on, calls done, deletes
  // this (inside the arena or on the thread that ran an inline step).
  void finish();
  // Calls done, then lets the session go and deletes this.
  void complete(Result<std::vector<Tensor>> result);

  PlanEntry* const entry_;
  PlanLease lease_;
  std::shared_ptr<PlanEntry> shared_;
  std::vector<Tensor> feeds_;
  std::vector<Tensor> out_;
  StepControl control_;
  RunDone done_;
  std::optional<RunMetadata> metadata_;  // when traced
  std::size_t call_stripe_;              // the session's count of calls in flight
  // The step: set up by run(), ended by finish() (running_ under mu()), so
  // a stop records its error only into a running step.
  std::unique_ptr<FlowInstance> inst_;
  bool running_ = false;
};

}  // namespace graphrun::sched
