// SessionImpl: the engine behind graphrun::Session. Resolves names, finds or
// compiles the plan of a signature, borrows a flow-graph instance and drives
// one step on the session's arena.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/session.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scheduler/flow_graph.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cache.h"
#include "scheduler/striped.h"
#include "scheduler/thread_pool.h"
#include "scheduler/timer.h"

namespace graphrun::sched {

class AsyncRun;
class PartialRun;
class QueuedCall;

// Thread safety: thread-safe. Kernels are created once per node under
// kernels_mu_ and shared by every plan of the session.
class SessionImpl {
 public:
  SessionImpl(Graph graph, SessionOptions options);
  ~SessionImpl();

  // Counts a public call in flight for its scope: the destructor waits for
  // the count to drop to zero.
  class CallScope {
   public:
    explicit CallScope(SessionImpl* s) : s_(s), stripe_(s->calls_in_flight_.add()) {}
    ~CallScope() { s_->calls_in_flight_.remove(stripe_); }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    SessionImpl* s_;
    std::size_t stripe_;
  };

  Result<std::vector<Tensor>> run(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                  const std::vector<TargetRef>& targets, const RunOptions& options,
                                  RunMetadata* metadata);
  // Asynchronous full runs (scheduler/async_run.h): `done` runs once, on
  // this thread when the call fails before it starts.
  void run_async(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                 const std::vector<TargetRef>& targets, const RunOptions& options, RunDone done);
  // One asynchronous step of `entry` (kept alive by `lease` or `shared`).
  void execute_async(PlanEntry& entry, PlanLease lease, std::shared_ptr<PlanEntry> shared,
                     std::vector<Tensor> feeds, const RunOptions& options, RunDone done);
  Result<Callable> make_callable(const std::vector<TensorRef>& feeds,
                                 const std::vector<TensorRef>& fetches,
                                 const std::vector<TargetRef>& targets);
  Status close();
  // Appends the nodes `grown` has beyond the session's graph.
  Status extend(const Graph& grown);

  // Partial runs (scheduler/partial_run.{h,cc}).
  Result<PartialRunHandle> partial_run_setup(const std::vector<TensorRef>& fetches,
                                             const std::vector<TensorRef>& feeds,
                                             const std::vector<TargetRef>& targets,
                                             const RunOptions& options);
  std::size_t num_open_partial_runs() const;
  void unregister_partial_run(const std::string& id);

  // One step of `entry` with positional feeds; fetches written to `out`.
  Status execute(PlanEntry& entry, std::span<const Tensor> feeds, std::span<Tensor> out,
                 const RunOptions& options, RunMetadata* metadata);
  // execute() for a plan with asynchronous kernels (Recvs, collectives)
  // called from a thread outside every arena: an asynchronous step, waited
  // for outside the arena. Waiting inside, the caller could be handed
  // another caller's step (oneTBB runs an arena-entering caller's functor
  // on a thread already inside when the workers took its slots) and stay
  // nested in it while that step waits for another process, which may wait
  // for this caller's next step: a deadlock across processes.
  Status execute_waiting_outside(PlanEntry& entry, std::span<const Tensor> feeds,
                                 std::span<Tensor> out, const RunOptions& options,
                                 RunMetadata* metadata);
  // Checks feed values against the tensors they replace. Inline: each
  // prepared run checks its feeds; a mismatch takes the out-of-line path
  // that says what is wrong.
  static Status check_feeds(const Plan& plan, std::span<const Tensor> feeds) {
    if (feeds.size() != plan.feed_slots.size()) return feed_count_error(plan, feeds.size());
    for (std::size_t f = 0; f < feeds.size(); ++f) {
      GRAPHRUN_RETURN_IF_ERROR(check_feed(plan, f, feeds[f]));
    }
    return Status::ok();
  }
  // Checks one value against feed `f` of `plan` (dtype, static shape).
  static Status check_feed(const Plan& plan, std::size_t f, const Tensor& value) {
    // An empty tensor's dtype is kInvalid, never a feed's.
    if (value.dtype() == plan.feed_dtypes[f] &&
        value.shape().is_compatible_with(plan.feed_shapes[f])) {
      return Status::ok();
    }
    return feed_error(plan, f, value);
  }
  [[gnu::cold]] static Status feed_count_error(const Plan& plan, std::size_t given);
  // What is wrong with feed `f`'s value (check_feed found it wrong).
  [[gnu::cold]] static Status feed_error(const Plan& plan, std::size_t f, const Tensor& value);

  const Graph& graph() const { return graph_; }
  std::size_t num_cached_plans() const { return cache_.size(); }
  Status check_open() const;

  // Name or handle -> the session graph's node (takes graph_mu_ shared).
  Result<Output> resolve_tensor(const TensorRef& ref) const;
  Result<const Node*> resolve_target(const TargetRef& ref) const;
  // Runs fn inside the session's arena (see ThreadPool::Impl::execute).
  template <typename F>
  void in_arena(F&& fn) {
    pool_->impl().execute(std::forward<F>(fn));
  }
  // Runs fn inside the arena the pool's partial runs live in
  // (ThreadPool::Impl::partial_runs_in_async_arena).
  template <typename F>
  void in_partial_run_arena(F&& fn) {
    pool_->impl().execute_for_partial_run(std::forward<F>(fn));
  }
  // Runs fn, which drives a step: on the caller without entering the arena
  // when the plan's policy was read as run_inline (unless traced: step
  // statistics name arena slots), else inside the arena. A caller from outside the
  // arena first waits for a permit of the pool; that wait gives up at
  // `limits` (the run's deadline, stop token, the session's close()) and
  // fn does not run: the status says why (DeadlineExceeded, Cancelled).
  template <typename F>
  Status run_step(bool run_inline, bool trace, const WaitLimits& limits, F&& fn) {
    auto body = [&] {
      // acquire: pairs with finish_ended_run's release.
      if (has_ended_runs_.load(std::memory_order_acquire)) finish_ended_runs();
      fn();
    };
    const Permits::Outcome outcome = run_inline && !trace ? pool_->impl().run_inline(limits, body)
                                                          : pool_->impl().execute(limits, body);
    return admission_status(outcome);
  }

  // What a partial run leaves when it ends: its instance, to be drained
  // (the feeds never given put, so every pending node fires, skipped),
  // waited for and handed back to its plan's pool.
  struct EndedRun {
    std::unique_ptr<FlowInstance> inst;
    std::shared_ptr<PlanEntry> entry;
    std::vector<int> unfed;          // feeds to put to drain a run that did not complete
    std::shared_ptr<void> listener;  // the run its nodes report to, kept alive
  };
  // Cleans `run` up now when a thread of the pool is free at once (or the
  // caller is inside the arena), else keeps it for the next step of this
  // session that gets a thread, or for the destructor. Never waits for a
  // busy pool.
  void finish_ended_run(const Plan& plan, EndedRun run);
  // The same for a run whose session is gone (no arena to enter).
  static void finish_detached(EndedRun& run);
  // The same with no limit on the wait (cleanup that must run).
  template <typename F>
  void run_step(const Plan& plan, bool trace, F&& fn) {
    static_cast<void>(run_step(plan, trace, WaitLimits{}, std::forward<F>(fn)));
  }
  // The limits of a step's wait for a permit: its deadline, `stop`, and
  // this session's closed flag.
  WaitLimits wait_limits(std::optional<std::chrono::steady_clock::time_point> deadline,
                         const std::stop_token& stop) const {
    return WaitLimits{deadline, stop, &closed_};
  }
  // Asynchronous calls count as calls in flight from their start to the
  // return of their done (the destructor waits for them).
  std::size_t add_call() { return calls_in_flight_.add(); }
  void remove_call(std::size_t stripe) { calls_in_flight_.remove(stripe); }
  // Cleans up ended partial runs kept for a free thread (call inside the
  // arena, a permit held), as every step does first.
  void finish_kept_runs() {
    // acquire: pairs with finish_ended_run's release.
    if (has_ended_runs_.load(std::memory_order_acquire)) finish_ended_runs();
  }
  const KernelRuntime& runtime() const { return runtime_; }
  Timer& timer() { return timer_; }

 private:
  friend class AsyncRun;
  friend class QueuedCall;
  // Sets the closed flag and ends what waits or runs: calls waiting for a
  // permit, queued asynchronous calls (their done fires here), open
  // partial runs (detached when `destroying`, else cancelled).
  void shut(bool destroying);
  // The same with graph_mu_ held by the caller.
  Result<Output> resolve_tensor_locked(const TensorRef& ref) const;
  Result<const Node*> resolve_target_locked(const TargetRef& ref) const;
  // Resolves a signature and finds or compiles its plan, under graph_mu_.
  template <typename FeedRefs>
  Result<std::pair<Signature, PlanLease>> prepare(const FeedRefs& feeds,
                                                  const std::vector<TensorRef>& fetches,
                                                  const std::vector<TargetRef>& targets,
                                                  bool partial);
  std::string new_partial_run_id();
  void schedule_idle_sweep();
  void sweep_idle_partial_runs();
  std::vector<std::shared_ptr<PartialRun>> open_partial_runs() const;
  Result<Signature> resolve(const std::vector<TensorRef>& feeds,
                            const std::vector<TensorRef>& fetches,
                            const std::vector<TargetRef>& targets) const;
  Result<Signature> resolve(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                            const std::vector<TargetRef>& targets) const;
  template <typename FeedRefs, typename RefOf>
  Result<Signature> resolve_impl(const FeedRefs& feeds, RefOf ref_of,
                                 const std::vector<TensorRef>& fetches,
                                 const std::vector<TargetRef>& targets) const;
  Result<PlanLease> plan_for(const Signature& sig);
  Result<OpKernel*> kernel_for(const Node& node);
  // `entry`'s unfused twin for traced runs (compiled at the first).
  Result<PlanEntry*> unfused_entry(PlanEntry& entry);
  // Why a wait for a permit gave up, as the step's status (OK: it did not).
  Status admission_status(Permits::Outcome outcome) const;
  // Cleans up `run` inside the arena (a permit held).
  void finish_in_arena(EndedRun& run);
  // Cleans up the runs finish_ended_run kept (inside the arena).
  void finish_ended_runs();
  // A new step's control: a fresh step id, this session's flags and pool,
  // and a deadline `timeout` from now if given.
  StepControl step_control(bool trace, std::optional<std::chrono::milliseconds> timeout);

  // The graph grows (extend) while runs resolve names and compile plans:
  // those hold graph_mu_ shared, extend holds it exclusive. Nodes are never
  // changed or removed, so compiled plans and running steps need no lock.
  mutable StripedSharedMutex graph_mu_;
  Graph graph_;  // guarded by graph_mu_
  SessionOptions options_;
  std::shared_ptr<ThreadPool> pool_;  // outlives everything built in its arena
  KernelRuntime runtime_;
  ResourceManager resources_;
  PlanCache cache_;
  std::mutex kernels_mu_;
  // The kernels by node id, owned here (8 bytes a node): null until made
  // under kernels_mu_; read lock-free under graph_mu_ shared, reallocated
  // by extend under it exclusive.
  class KernelTable {
   public:
    explicit KernelTable(std::size_t n) : size_(n), ptrs_(new std::atomic<OpKernel*>[n]()) {}
    KernelTable(const KernelTable&) = delete;
    KernelTable& operator=(const KernelTable&) = delete;
    ~KernelTable() {
      for (std::size_t i = 0; i < size_; ++i) delete ptrs_[i].load(std::memory_order_relaxed);
    }
    std::atomic<OpKernel*>& operator[](std::size_t i) { return ptrs_[i]; }
    // Room for `n` nodes, keeping the kernels made; no reader may run.
    void grow(std::size_t n);

   private:
    std::size_t size_;
    std::unique_ptr<std::atomic<OpKernel*>[]> ptrs_;
  };
  KernelTable kernels_;
  std::atomic<bool> closed_{false};
  StripedCounter calls_in_flight_;           // public calls inside the session
  std::atomic<int64_t> next_run_serial_{1};  // relaxed: uniqueness only
  std::chrono::steady_clock::time_point epoch_;

  // Ended partial runs waiting for a thread to clean them up.
  std::mutex ended_mu_;
  std::vector<EndedRun> ended_runs_;  // guarded by ended_mu_
  std::atomic<bool> has_ended_runs_{false};

  mutable std::mutex runs_mu_;
  std::unordered_map<std::string, std::shared_ptr<PartialRun>> open_runs_;  // guarded by runs_mu_
  bool idle_sweep_scheduled_ = false;                                       // guarded by runs_mu_
  // Last member: destroyed (its thread joined) before anything its
  // callbacks touch.
  Timer timer_;
};

// A Callable's state: the session and a pinned plan.
class CallableImpl {
 public:
  CallableImpl(SessionImpl* session, std::shared_ptr<PlanEntry> entry)
      : session_(session), entry_(std::move(entry)) {}
  SessionImpl* session_;
  std::shared_ptr<PlanEntry> entry_;
};

}  // namespace graphrun::sched
