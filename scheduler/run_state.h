// RunState: the mutable state of one step over a Plan: output slots, the
// first error, the cancellation flag, reader counts for early release, and
// optional step statistics. Pooled with its flow-graph instance and reused
// run after run, so a prepared run allocates nothing here.
#pragma once

#include <graphrun/op_kernel.h>
#include <graphrun/session.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <utility>
#include <vector>

#include "scheduler/plan.h"
#include "scheduler/prefetch.h"

namespace graphrun::sched {

// The status of every call a closed session cuts short (TF's words).
inline Status session_closed_status() { return cancelled("Session has been closed."); }

// Runs `fn` once a stop is requested on `token` (at once if it already
// was), until the returned registration is destroyed; destroying it waits
// for a running `fn`. Nothing is registered for a token that cannot be
// stopped (RunOptions' default).
template <typename F>
std::optional<std::stop_callback<F>> on_stop_requested(const std::stop_token& token, F fn) {
  if (!token.stop_possible()) return std::nullopt;
  return std::optional<std::stop_callback<F>>(std::in_place, token, std::move(fn));
}

// What a step is run under: set by the session before each run.
struct StepControl {
  int64_t step_id = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  const std::atomic<bool>* session_closed = nullptr;
  // The pool whose arena runs the step (marks kernel threads as inside it).
  ThreadPool::Impl* pool = nullptr;
  // The step's nodes run on threads of one of the pool's arenas (an
  // asynchronous step on its workers): kernels' intra-op loops stay there.
  bool in_pool_arena = false;
  bool trace = false;
  std::chrono::steady_clock::time_point epoch;  // zero of trace times
};

// Told about a partial run's progress by node bodies (any thread).
class StepListener {
 public:
  virtual ~StepListener() = default;
  // Sink `k` fired: fetch k (k < number of fetches) or target k - fetches
  // has its value / has run.
  virtual void on_ready(int k) = 0;
  // The step failed or was cancelled: wake every waiter.
  virtual void on_error() = 0;
};

// Thread safety: thread-safe during a step. Each slot is written once by its
// producer before the flow-graph edge releases its consumers (the
// happens-before); reader counts and the cancel flag are atomics; the first
// error is kept under mu_.
class RunState {
 public:
  RunState(const Plan& plan, const KernelRuntime& runtime);

  // Prepares a step: reader counts reset, feeds placed in their slots.
  void begin(const StepControl& control, std::span<const Tensor> feeds);
  // Entries a node prefetches ahead of itself (prefetch_ahead).
  static constexpr std::ptrdiff_t kPrefetchAhead = 3;
  // Per plan node, the address of its flow-graph body; owned by the
  // caller (the FlowInstance), which outlives the steps.
  // A plan run as flow-graph tasks prefetches at any size.
  void set_prefetch(const void* const* bodies) {
    bodies_ = bodies;
    prefetch_limit_ = std::ssize(plan_.nodes);
  }
  // Runs plan node `i` (the flow-graph node body). Never throws.
  void execute(int32_t i) noexcept { execute(plan_.nodes[static_cast<std::size_t>(i)]); }
  // The same for the plan's entry `item` (a flow-graph body holds it: the
  // node's fields load without first loading the plan's array).
  void execute(const NodeItem& item) noexcept { execute_node<false>(item); }
  // Runs every node in plan order on the calling thread (a full step of a
  // plan that runs inline): as execute() on each, the kernel marks set once
  // for the whole step rather than around each kernel.
  void execute_all() noexcept;
  // Asynchronous nodes (NodeItem::async), in two parts. execute_async
  // starts node `i`'s kernel and returns at once: true when it started,
  // and then `notify(arg, i)` runs once, on whatever thread the kernel
  // finished on; false when the node is skipped (a stopped step), and
  // notify is not called. Either way finish_async(i) then ends the node, on
  // a thread of the step (FlowInstance's finisher). Never throw.
  using AsyncNotify = void (*)(void* arg, int32_t i);
  bool execute_async(int32_t i, AsyncNotify notify, void* arg) noexcept;
  void finish_async(int32_t i) noexcept;
  // Keeps the first error and cancels the rest of the step.
  void record_error(Status s);
  Status status();
  // Moves each fetched slot's value into `out` (a slot fetched twice is
  // copied for all but its last fetch); finish() then clears every slot.
  void take_fetches(std::span<Tensor> out);
  void finish();
  // Step statistics of the nodes that ran (tracing only).
  void collect_stats(RunMetadata& metadata) const;

  // Partial runs.
  void set_listener(StepListener* listener) { listener_ = listener; }
  void sink_fired(int k) {
    if (listener_ != nullptr) listener_->on_ready(k);
  }
  // Places feed `f`'s value; publish it with the entry node's try_put.
  void set_feed(int f, Tensor value) {
    slots_[static_cast<std::size_t>(plan_.feed_slots[static_cast<std::size_t>(f)])] =
        std::move(value);
  }
  const Tensor& fetch_value(int k) const {
    return slots_[static_cast<std::size_t>(plan_.fetch_slots[static_cast<std::size_t>(k)])];
  }
  // Turns step statistics on or off for the nodes that start from now on.
  void set_trace(bool on);
  // Statistics of nodes finished since the last call (partial runs).
  void collect_new_stats(RunMetadata& metadata);
  bool failed() const { return failed_.load(); }

  const Plan& plan() const { return plan_; }

 private:
  void release_inputs(const NodeItem& item);
  // Records why the step must stop if the session was closed or the
  // deadline passed (`checks` has kCheckInterrupts bits; checked before and
  // after each kernel); true if so.
  [[gnu::noinline]] bool interrupted(const NodeItem& item, uint8_t checks, const char* when);
  // The inline part: a deadline to read the clock for, or the session
  // closed.
  bool may_be_interrupted(uint8_t checks) const {
    return (checks & kCheckDeadline) != 0 ||
           ((checks & kCheckClosed) != 0 &&
            control_.session_closed->load(std::memory_order_relaxed));  // relaxed: advisory
  }
  // Starts loading the kernel of the entry kPrefetchAhead after `item`,
  // and its flow-graph body when set_prefetch gave them: on one thread the
  // plan's order is the run order (build_plan), and these two objects
  // missing the cache were the costliest loads of a node that is a task (a
  // wavefront of 65,536 Call nodes). Not in a small inline plan
  // (prefetch_limit_).
  void prefetch_ahead(const NodeItem& item) const {
    if (prefetch_limit_ == 0) return;
    const std::ptrdiff_t ahead = (&item - plan_.nodes.data()) + kPrefetchAhead;
    if (ahead >= prefetch_limit_) return;
    const auto* k =
        reinterpret_cast<const char*>(plan_.nodes[static_cast<std::size_t>(ahead)].kernel);
    prefetch(k);
    prefetch(k + 63);  // an object that straddles two lines
    if (bodies_ != nullptr) prefetch(bodies_[ahead]);
  }
  Status call_kernel(const NodeItem& item) noexcept;
  // The kernel inside the pool's marks (kMarked: the caller set them).
  template <bool kMarked>
  Status call_in_pool(const NodeItem& item) noexcept;
  // execute(), inside the pool's marks when kMarked.
  template <bool kMarked>
  void execute_node(const NodeItem& item) noexcept;
  // execute() for a node with more to do than call its kernel: a deadline,
  // statistics, a cost sample, or no kernel at all.
  [[gnu::noinline]] void execute_checked(const NodeItem& item, uint8_t checks) noexcept;
  // Internal unless every output of `item` was produced.
  Status check_outputs(const NodeItem& item) const;
  OpKernelContext make_context(const NodeItem& item);
  // The end of a node whose kernel ran: the interrupt check, its error, its
  // statistics, its inputs released.
  void end_node(const NodeItem& item, uint8_t checks, int64_t start_ns, const Status& s) noexcept;
  int64_t trace_now() const;
  // Cold paths, out of line.
  [[gnu::noinline, gnu::cold]] void fail_node(const NodeItem& item, const Status& s);
  [[gnu::noinline]] void record_stats(const NodeItem& item, NodeExecStats& stat, int64_t start_ns);

  static constexpr uint8_t kCheckClosed = 1;
  static constexpr uint8_t kCheckDeadline = 2;
  static constexpr uint8_t kCheckTrace = 4;
  static constexpr uint8_t kCheckMeasure = 8;  // measure_, for execute's one test

  const Plan& plan_;
  const KernelRuntime& runtime_;
  // Nodes that prefetch ahead: plan_.nodes.size() for a plan run as tasks
  // (set_prefetch) or of at least kPrefetchFrom nodes, else 0. Kept as a
  // member: deriving the node count in prefetch_ahead cost 4 more
  // instructions a node (callgrind, a chain of 1,000 tasks). A smaller
  // plan run inline keeps its nodes in the core's cache from run to run,
  // and the prefetches are instructions spent for nothing: a chain of
  // 1,000 Call nodes inline took 0.55-0.58x of raw oneTBB's time without
  // them against 0.60-0.67x (4 interleaved runs each). As tasks the same
  // chain is 20 instructions a node cheaper without them (468 against 488,
  // callgrind) but measured 1.19x of raw oneTBB with them, 1.23x without,
  // on the AVX-512 machines of this kind (README, Performance).
  static constexpr std::ptrdiff_t kPrefetchFrom = 2048;
  std::ptrdiff_t prefetch_limit_;
  const void* const* bodies_ = nullptr;  // set_prefetch
  StepControl control_;
  // kCheck* bits for this step, set in begin() (partial runs switch tracing
  // while nodes run: relaxed, a node sees the old or the new value).
  std::atomic<uint8_t> checks_{0};
  StepListener* listener_ = nullptr;
  // Kernel cycles are counted for the plan's cost model this step (the
  // first kLearnSteps of this state, then one in kSampleEvery).
  bool measure_ = false;
  uint32_t steps_ = 0;
  bool traced_ = false;  // stats_ holds entries of this step
  // Per node: 1 once its statistics are written (release), 2 once reported.
  std::unique_ptr<std::atomic<uint8_t>[]> stat_state_;
  std::vector<Tensor> slots_;
  std::unique_ptr<std::atomic<int32_t>[]> readers_;
  // The step's cancel flag plus the closed flag and deadline, as kernels
  // poll them.
  StepCancellation cancellation_;
  std::atomic<bool> failed_{false};  // relaxed reads: a hint; status_ under mu_ decides
  std::mutex mu_;
  Status status_;
  std::vector<NodeExecStats> stats_;  // sized to the plan when tracing
  // Per node of a plan with asynchronous nodes (null otherwise): the
  // context and outcome of a started kernel, from execute_async to
  // finish_async. `done` is set by the kernel's first done call; its
  // status then reaches finish_async through the finisher's task
  // submission (the happens-before).
  // `notify(arg, index)` reports the end; kept here so that the kernel's
  // done holds one pointer (no allocation in std::function).
  struct AsyncSlot {
    std::optional<OpKernelContext> ctx;
    Status status;
    AsyncNotify notify = nullptr;
    void* arg = nullptr;
    int64_t start_ns = 0;
    int32_t index = 0;
    uint8_t checks = 0;
    bool started = false;
    std::atomic<bool> done{false};
  };
  std::unique_ptr<AsyncSlot[]> async_;
};

}  // namespace graphrun::sched
