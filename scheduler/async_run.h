// AsyncRun: one asynchronous step of a full run (Session::run_async,
// Callable::run_async). It holds no thread while it waits: queued for a
// permit of the pool, it is an entry in the pool's Permits queue (with a
// timer for its deadline and a stop registration); running, it is the
// flow graph's pending tasks; its last node submits the finisher, which
// hands the permit on and calls `done`. See docs/async.md.
#pragma once

#include <graphrun/session.h>

#include <atomic>
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

// Thread safety: internal. Created by SessionImpl::execute_async and owned
// by itself: it deletes itself after `done` returns. Exactly one of grant
// (on_granted), the queued deadline, a stop while queued and close
// (on_closed) takes it out of the queue; Permits decides which.
class AsyncRun final : public AsyncPermitWaiter {
 public:
  // `entry` is the plan to run (kept alive by `lease` or `shared`).
  AsyncRun(SessionImpl* session, PlanEntry* entry, PlanLease lease,
           std::shared_ptr<PlanEntry> shared, std::vector<Tensor> feeds, std::size_t num_fetches,
           const RunOptions& options, RunDone done);
  AsyncRun(const AsyncRun&) = delete;
  AsyncRun& operator=(const AsyncRun&) = delete;

  // Takes a permit or queues; returns at once (a run_inline plan given a
  // permit at once may run to its end here first). Call once.
  void start();

  void on_granted() override;
  void on_closed() override;

 private:
  ~AsyncRun();
  // Runs the step in the arena (a permit held).
  void run();
  // The last node ended (inside its body): submit the finisher.
  static void on_complete(void* self);
  // Collects the step's result, hands the permit on, calls done, deletes
  // this (inside the arena or on the thread that ran an inline step).
  void finish();
  // Taken out of the queue by a deadline, a stop or close: done with
  // `why`, delete this.
  void fail_queued(Status why);
  // Calls done, then lets the session go and deletes this.
  void complete(Result<std::vector<Tensor>> result);
  void on_queue_deadline();
  void on_stop();

  struct Stop {
    AsyncRun* run;
    void operator()() const { run->on_stop(); }
  };

  SessionImpl* const session_;
  ThreadPool::Impl* const pool_;
  PlanEntry* const entry_;
  PlanLease lease_;
  std::shared_ptr<PlanEntry> shared_;
  std::vector<Tensor> feeds_;
  std::vector<Tensor> out_;
  StepControl control_;
  std::stop_token stop_token_;
  RunDone done_;
  std::optional<RunMetadata> metadata_;  // when traced
  std::size_t call_stripe_;              // the session's count of calls in flight

  // While queued: the deadline's timer (0: none). Written by start()
  // under mu_, before the run can be granted.
  std::mutex mu_;
  Timer::Id queue_timer_ = 0;
  // The step: set up by run(), ended by finish() (both under mu_), so a
  // stop records its error only into a running step.
  std::unique_ptr<FlowInstance> inst_;
  bool running_ = false;  // guarded by mu_
  std::optional<std::stop_callback<Stop>> on_stop_;
};

}  // namespace graphrun::sched
