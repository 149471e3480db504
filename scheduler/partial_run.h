// PartialRun: one execution of a plan spread over several partial_run()
// calls (docs/partial-runs.md). Owns a flow-graph instance from the
// plan's pool for its whole life; nodes run as soon as their inputs exist;
// a node that needs a feed not yet given stays pending in its continue_node.
#pragma once

#include <graphrun/session.h>

#include <oneapi/tbb/task_group.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <stop_token>
#include <string>
#include <vector>

#include "scheduler/flow_graph.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cache.h"
#include "scheduler/run_state.h"
#include "scheduler/timer.h"

namespace graphrun::sched {

class QueuedCall;
class SessionImpl;

// Thread safety: thread-safe. Calls (call()) are serialized by call_mu_ (a
// second concurrent call gets FailedPrecondition); cancel() may come from
// any thread at any time; node bodies report through the StepListener.
// Always owned by shared_ptr (an ended run's instance, cleaned up later,
// keeps its listener alive).
class PartialRun final : public StepListener, public std::enable_shared_from_this<PartialRun> {
 public:
  PartialRun(SessionImpl* session, std::shared_ptr<PlanEntry> entry, Signature signature,
             std::string id);
  ~PartialRun() override;

  const std::string& id() const { return id_; }
  // Complete, or failed or cancelled (also while the call that failed is
  // still finishing the run's nodes).
  bool is_done() const { return ended_.load(std::memory_order_acquire) || failing_.load(); }
  // The run has ended and let go of its instance.
  bool is_ended() const { return ended_.load(std::memory_order_acquire); }

  // Borrows an instance and starts every node that needs no feed. Called
  // once, through SessionImpl::run_step.
  void start(const StepControl& control);

  Result<std::vector<Tensor>> call(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                   const std::vector<TargetRef>& targets, const RunOptions& options,
                                   RunMetadata* metadata);
  // The same, asynchronously (Session::partial_run_async): misuse is
  // reported on the calling thread; the call holds the run's call lock
  // until its done.
  void call_async(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                  const std::vector<TargetRef>& targets, const RunOptions& options, RunDone done);

  // Ends the run with `why` (Cancelled, DeadlineExceeded, ...) from any
  // thread. A call in progress returns `why`.
  void cancel(const Status& why);
  // Fails the run with Cancelled when a stop is requested on `token`
  // (partial_run_setup's RunOptions::stop_token): the nodes not started do
  // not run, a call in progress returns Cancelled and ends the run, or the
  // next call does. Called once, before the handle is returned.
  void watch(const std::stop_token& token);
  // The session is being destroyed: end the run and never touch the session
  // again.
  void detach();

  std::chrono::steady_clock::time_point last_used() const;
  // Whether `session` started this run (and is still alive).
  bool belongs_to(const SessionImpl* session) const {
    std::lock_guard lock(session_mu_);
    return session_ == session;
  }

  // StepListener.
  void on_ready(int k) override;
  void on_error() override;

 private:
  // Serializes calls. A semaphore, not a mutex: an asynchronous call takes
  // it on the calling thread and lets go of it on the one that reports.
  class CallLock {
   public:
    void lock() { sem_.acquire(); }
    bool try_lock() { return sem_.try_acquire(); }
    void unlock() { sem_.release(); }

   private:
    std::binary_semaphore sem_{1};
  };
  // A call's stop registration (cancels the run).
  struct StopCall {
    PartialRun* run;
    void operator()() const;
  };
  // One call, resolved and checked; then its deadline timer and stop
  // registration while it acts.
  struct CallSteps {
    std::vector<int> feed_ids;
    std::vector<Tensor> feed_values;
    std::vector<int> fetch_ids;
    std::vector<int> awaited;  // fetches, then fetches + target, to wait for
    bool traced = false;
    std::chrono::milliseconds timeout{0};
    std::optional<std::chrono::steady_clock::time_point> deadline;
    Timer::Id deadline_timer = 0;
    std::unique_ptr<std::stop_callback<StopCall>> on_stop;  // not movable: behind a pointer
  };
  class AsyncCall;

  // Takes the call lock (misuse and a run that ended fail), returns the
  // session.
  Result<SessionImpl*> lock_for_call(std::unique_lock<CallLock>& call_lock);
  Result<CallSteps> resolve_call(SessionImpl* session, const FeedList& feeds,
                                 const std::vector<TensorRef>& fetches,
                                 const std::vector<TargetRef>& targets, const RunOptions& options,
                                 bool traced);
  // Puts the feeds and waits, helping, for what the call awaits (inside
  // the arena, a permit held). With `resume_to` (an asynchronous call on
  // the asynchronous arena's worker) it does not wait: true when it will
  // call resume_to->resume() (on whichever thread releases the call's last
  // awaited fetch or target, or here when none is left); false for an
  // inline plan, whose nodes ran before act returned.
  bool act(SessionImpl* session, CallSteps& steps, const std::stop_token& stop,
           AsyncCall* resume_to = nullptr);
  // After act (or an admission that failed with `admitted`): the fetches,
  // or the error that ended the run.
  Result<std::vector<Tensor>> conclude(SessionImpl* session, CallSteps& steps,
                                       const Status& admitted, RunMetadata* metadata);
  // Ends a run that failed while the caller held the call lock.
  void end_if_failed();

  // Ends the run (status OK: complete): drains pending nodes when it did not
  // complete, returns the instance, unregisters. Requires call_mu_.
  void end(const Status& status);
  void install_waiter(int k);
  // One awaited fetch or target of a resumable call is released; the last
  // resumes the call.
  void count_down_awaited();
  // Records `why` in the step, if it still has an instance (any thread).
  void record_error(const Status& why);
  void release_waiter(int k);
  Status check_usable() const;
  void touch();

  SessionImpl* session_;  // null once detached; guarded by session_mu_
  mutable std::mutex session_mu_;
  std::shared_ptr<PlanEntry> entry_;
  const Plan& plan_;
  Signature signature_;
  std::string id_;
  // Null once ended. Written under instance_mu_ (start, end); the calling
  // thread (holding call_mu_) reads it without the lock; other threads
  // (cancel, deadline timer) read it under the lock.
  std::unique_ptr<FlowInstance> instance_;
  std::mutex instance_mu_;

  CallLock call_mu_;
  std::vector<char> fed_;      // per feed; guarded by call_mu_
  std::vector<char> fetched_;  // per fetch; guarded by call_mu_
  Status end_status_;          // guarded by call_mu_; why the run ended
  std::atomic<bool> ended_{false};
  // An error or a cancellation was recorded in the step: the run will end
  // (by the call in progress, or the next call or cancel()).
  std::atomic<bool> failing_{false};
  // The asynchronous call holding call_mu_, while it may wait for a
  // thread: cancel() takes it out of the pool's queue instead of waiting
  // for it to be served.
  std::mutex pending_mu_;
  QueuedCall* pending_call_ = nullptr;  // guarded by pending_mu_
  // cancel() calls taking call_mu_ to end the run.
  std::atomic<int> cancels_pending_{0};

  // Per fetch, then per target: 0 pending, 1 a waiter is installed, 2 ready.
  // seq_cst throughout (see RunState::record_error).
  std::unique_ptr<std::atomic<int>[]> ready_;
  std::vector<tbb::task_handle> waiters_;
  // A call that does not wait on group_ (act's resume_to): its awaited
  // fetches and targets count down awaited_ (plus one, dropped when act is
  // done installing). A nested wait inside a oneTBB task does not take
  // tasks submitted from outside its arena (a Recv's finisher): waiting
  // there, the 1-thread pool's only worker would never run them.
  std::atomic<AsyncCall*> resume_to_{nullptr};
  std::atomic<int> awaited_{0};
  tbb::task_group_context group_context_{tbb::task_group_context::isolated};
  // Behind a pointer: ~task_group is noexcept(false), StepListener's is not.
  std::unique_ptr<tbb::task_group> group_ = std::make_unique<tbb::task_group>(group_context_);
  std::atomic<int64_t> last_used_ns_{0};  // relaxed: an idle-timeout hint

  // The setup's stop registration (watch()); reset first in the destructor.
  struct StopRun {
    PartialRun* run;
    void operator()() const;
  };
  std::optional<std::stop_callback<StopRun>> setup_stop_;
};

}  // namespace graphrun::sched
