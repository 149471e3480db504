/// @file graphrun/session.h
/// Session: runs a graph, TensorFlow-1 style, on a oneTBB flow graph.
///
/// @code
///   auto session = Session::create(graph).value();
///   Result<std::vector<Tensor>> out = session->run({{x, Tensor(3.0f)}}, {y});
/// @endcode
///
/// run(feeds, fetches, targets) computes only what the fetches and targets
/// need. Any tensor may be fed, not only a placeholder: the feed replaces the
/// tensor, and its producer runs only if something else needs it. Fetching a
/// fed tensor returns the fed value. Fetched tensors may share storage with
/// the session's state (a variable's value, a Const): treat them as read-only,
/// or deep_copy() before writing into them. Variables, random generators and
/// iterators keep their state across runs of one session.
///
/// Thread safety (the contract):
/// - Every method may be called from any number of threads at once: run,
///   make_callable and Callable::run, partial_run_setup, partial_run (on
///   different handles; one handle's calls are serialized), cancel_partial_run,
///   extend and close. graph() is the one exception: it must not be used while
///   extend() runs.
/// - Ordering: within one step, a node runs after its data and control
///   inputs, and sees their effects (a read ordered after a write by an edge
///   sees the write). Between concurrent steps there is no order; each
///   variable update (Assign*, use_locking) is atomic, each read a consistent
///   snapshot, random ops and iterators hand every step its own draws and
///   elements.
/// - close() makes later calls fail with Cancelled and cancels the calls in
///   flight: they return Cancelled at the next node boundary, or as soon as a
///   running kernel polls OpKernelContext::is_cancelled(). A run that
///   returns Cancelled or DeadlineExceeded may have run some of its nodes:
///   their effects on variables and iterators stay. Destroying a
///   session cancels its open partial runs and waits for the work they
///   started; every other call must have returned by then (as in TF,
///   destroying a session that a call is still using is a use-after-free).
/// - Callers may themselves be oneTBB worker threads (a kernel, a
///   parallel_for body, another arena): the session waits only by helping,
///   never by blocking a thread the work needs.
///
/// The session copies the graph at creation; later changes to the Graph
/// object do not affect it until extend().
#pragma once

#include <graphrun/graph.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

namespace graphrun {

namespace sched {
class SessionImpl;
class CallableImpl;
class PartialRun;
}  // namespace sched

/// A pool of threads (a oneTBB task arena) that sessions can share. At most
/// num_threads() steps of all sessions using one pool run at once, and
/// their kernels, inter-op and intra-op alike, run on num_threads() threads;
/// blocking callers help run their own work and count against that number
/// while they do. Callers that find every thread busy queue in arrival
/// order, blocking and asynchronous calls in one queue; a freed thread goes
/// to its head, but a blocking caller woken for it may lose it to a caller
/// arriving meanwhile. Asynchronous calls run on a second arena of the
/// pool, made at the first of them, on num_threads() workers of their own:
/// while blocking and asynchronous steps run at once, the blocking callers'
/// threads add to them.
///
/// Thread safety: thread-safe. Shared ownership: each session using the pool
/// keeps it alive.
class ThreadPool {
 public:
  /// `threads` = 0: one per core. InvalidArgument for a negative count or
  /// one above max_threads().
  static Result<std::shared_ptr<ThreadPool>> create(int threads = 0);
  /// The largest pool create() (and SessionOptions::inter_op_threads)
  /// accepts: kMaxThreadsPerCore per core the process may use (oneTBB's
  /// default concurrency), at least kMinMaxThreads. Each thread costs a
  /// stack and a oneTBB slot; far more threads than cores only add
  /// switching (kernels that block belong on fewer, longer steps).
  static int max_threads();
  /// The size of a pool created with 0 threads: one per core the process
  /// may use (oneTBB's default concurrency).
  static int default_threads();
  static constexpr int kMaxThreadsPerCore = 4;  ///< Pool threads per core max_threads() allows.
  static constexpr int kMinMaxThreads = 8;      ///< The least max_threads() returns.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  /// The pool's size (default_threads() for a pool created with 0).
  int num_threads() const;

  /// @cond INTERNAL
  struct Impl;
  Impl& impl() { return *impl_; }
  /// @endcond

 private:
  explicit ThreadPool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// How Session::create sets up a session: its threads, caches and limits.
struct SessionOptions {
  /// Threads executing kernels (inter- and intra-op share them); 0 = all
  /// cores; at most ThreadPool::max_threads(). The session owns a pool of
  /// this size unless `thread_pool` is set.
  int inter_op_threads = 0;
  /// A pool shared with other sessions (inter_op_threads is then ignored).
  std::shared_ptr<ThreadPool> thread_pool;
  /// Distinct (feeds, fetches, targets) signatures whose compiled plans are
  /// kept; the least recently used is dropped past this.
  std::size_t plan_cache_capacity = 128;
  /// Partial runs open at once; partial_run_setup past this returns
  /// ResourceExhausted.
  std::size_t max_open_partial_runs = 1024;
  /// A partial run with no call for this long is cancelled (its handle then
  /// reports Cancelled). Unset: never.
  std::optional<std::chrono::milliseconds> partial_run_idle_timeout;
  /// Largest tensor a kernel may allocate as an output (a Fill whose dims
  /// are fed, a broadcast, a MatMul of fed shapes): past it the node fails
  /// with ResourceExhausted naming it, before anything is allocated. 0: no
  /// limit. Servers set it (ServiceLimits::max_output_tensor_bytes).
  int64_t max_tensor_bytes = 0;
  /// Lets a plan fuse an elementwise chain into the kernel that feeds it
  /// (MatMul, then a bias Add or BiasAdd of its columns, then Relu, Sigmoid
  /// or Tanh) when the intermediate tensors are used nowhere else: not
  /// fetched, fed, read by another node, nor linked by a control edge.
  /// Traced runs (RunOptions::trace) and partial runs never fuse. Results
  /// differ from the unfused nodes' by float rounding at most.
  bool fuse_kernels = true;
  /// Runs a node whose kernel is cheap inline on the thread that completed
  /// its inputs, without a task, and a step of cheap nodes only on the
  /// calling thread without entering the pool. Cheap is measured: each plan
  /// counts its kernels' cycles over its first steps and then one step in
  /// 16, and a node below a few thousand cycles is cheap (OpKernel::is_cheap
  /// and CallAttrs::cheap are the estimate before the first measurement).
  /// false: every node gets a task of its own.
  bool inline_cheap_nodes = true;
  /// What cheap means for inline_cheap_nodes: a node whose kernel takes more
  /// than this many CPU cycles (the TSC on x86) in 3 measured steps in a row
  /// becomes expensive, one below half of it in 3 in a row cheap again.
  /// Must be > 0.
  int64_t inline_below_cycles = 8000;
  /// Asynchronous calls (run_async, Callable::run_async,
  /// partial_run_async) wait in the pool's queue until fewer than
  /// num_threads() steps run, as blocking calls do. false: they start at
  /// once, however many are in flight (their kernels still run on the
  /// pool's threads; a step waiting for an asynchronous kernel holds no
  /// thread). For steps that wait for each other across processes: two
  /// processes admitting the same steps in different orders would each
  /// hold their threads for steps the other has queued (an MPI worker's
  /// serve() sets it).
  bool queue_async_calls = true;
};

/// Options of one call (run, Callable::run, partial_run_setup, partial_run
/// and their asynchronous forms): its deadline, tracing and stop token.
struct RunOptions {
  /// The run fails with DeadlineExceeded (and is cancelled) past this. A
  /// timeout past the steady clock's range (about 292 years) is no deadline.
  std::optional<std::chrono::milliseconds> timeout;
  /// Collect per-node step statistics into RunMetadata.
  bool trace = false;
  /// Cancels the call from another thread (a client that went away, a stop
  /// button): once a stop is requested on this token's std::stop_source, no
  /// further node starts, kernels polling OpKernelContext::is_cancelled()
  /// stop early, and the call returns Cancelled. run() and Callable::run():
  /// the run. partial_run_setup(): the whole partial run, until it ends.
  /// partial_run(): the whole partial run, while that call is in progress.
  /// The default token cannot be stopped and costs nothing.
  /// A call that waits for a thread of its pool (all of them busy) gives up
  /// at its stop, its timeout or the session's close(), and returns
  /// Cancelled or DeadlineExceeded (a partial-run call then ends its
  /// partial run, as a stop or deadline during the step would).
  std::stop_token stop_token;
};

/// What one node execution did (when tracing).
struct NodeExecStats {
  std::string node;                  ///< The node's name.
  std::string op;                    ///< The node's op.
  int64_t start_ns = 0;              ///< steady clock, since the session's epoch
  int64_t end_ns = 0;                ///< the same clock, when the node finished
  int thread = 0;                    ///< oneTBB arena slot of the executing thread
  std::vector<Shape> output_shapes;  ///< The shapes of its outputs, in order.
  int64_t output_bytes = 0;          ///< The bytes of its outputs, summed.
};

/// What a traced call (RunOptions::trace) reports besides its fetches.
struct RunMetadata {
  /// One entry per node the step ran; a partial-run call adds the nodes no
  /// earlier call reported.
  std::vector<NodeExecStats> step_stats;
  /// The instruction-set level the built-in kernels ran at (cpu_isa_name of
  /// cpu_isa(): "baseline", "avx2" or "avx512"); set with the statistics.
  std::string cpu_isa;
};

/// A feed: the tensor to replace and its value.
struct Feed {
  TensorRef tensor;  ///< The tensor the feed replaces.
  Tensor value;      ///< Its value for this call.
};
/// The feeds of one call.
using FeedList = std::vector<Feed>;

/// What an asynchronous call (run_async, Callable::run_async,
/// partial_run_async) reports when it ends: the fetched tensors or why it
/// failed, and the step statistics when RunOptions::trace was set (else
/// null; valid only during the call: move what you keep).
///
/// The contract of `done`, for every asynchronous call:
/// - It is called exactly once, on some thread: the pool thread that
///   finished the step; the calling thread when the call fails before it
///   starts (a bad name or feed, a closed session), or when a step of
///   cheap kernels got a thread at once and ran to its end before the call
///   returned; the thread that requested the stop, called close(), or the
///   session's timer thread, when a queued call gives up.
/// - It never runs while the session holds a lock. It may call the session
///   again (another async call, even a blocking one), and it may destroy the
///   session (drop its last reference): the session then ends on a thread
///   of graphrun's own once every call in flight, this one included, has
///   returned. It must not block for long (it may be holding a thread of
///   the pool) and must not throw. An exception it throws anyway is caught,
///   reported on standard error and dropped; the call still ends cleanly.
/// - Empty `done`: nothing is called (fire and forget).
using RunDone = std::function<void(Result<std::vector<Tensor>> result, RunMetadata* metadata)>;

/// A prepared signature (TF's MakeCallable): run() with positional feeds and
/// fetches and no name resolution or plan lookup. A run through a Callable
/// allocates nothing beyond the tensors its kernels produce.
///
/// Thread safety: thread-safe; the session must outlive it.
class Callable {
 public:
  ///@{
  /// Movable, not copyable; a moved-from Callable may only be destroyed or
  /// assigned to.
  Callable(Callable&&) noexcept;
  Callable& operator=(Callable&&) noexcept;
  ///@}
  ~Callable();

  /// `feeds` in the order given to make_callable; `fetches` must have one
  /// slot per declared fetch and receives them in order.
  Status run(std::span<const Tensor> feeds, std::span<Tensor> fetches,
             const RunOptions& options = {}, RunMetadata* metadata = nullptr) const;
  ///@{
  /// The same, asynchronously: returns at once; `done` receives the fetches
  /// in order (see RunDone for its contract). The Callable may be destroyed
  /// before `done` runs; its session may not.
  void run_async(std::vector<Tensor> feeds, RunDone done) const;
  void run_async(std::vector<Tensor> feeds, const RunOptions& options, RunDone done) const;
  ///@}
  /// The same, with a future instead of `done`. Do not wait for it on a
  /// thread of the session's pool (inside a kernel or a done): the step may
  /// need that thread.
  std::future<Result<std::vector<Tensor>>> run_async(std::vector<Tensor> feeds,
                                                     const RunOptions& options = {}) const;
  /// The number of feeds the signature declares (the size of `feeds`).
  std::size_t num_feeds() const;
  /// The number of fetches the signature declares (the size of `fetches`).
  std::size_t num_fetches() const;

 private:
  friend class sched::SessionImpl;
  explicit Callable(std::unique_ptr<sched::CallableImpl> impl);
  std::unique_ptr<sched::CallableImpl> impl_;
};

/// One partial run: a single execution of the graph spread over several
/// partial_run() calls. Movable, not copyable. Destroying a handle whose run
/// is not complete cancels the run and frees everything it holds.
///
/// Thread safety: calls on one handle are serialized: a call made while
/// another is in progress on the same handle fails with FailedPrecondition.
/// The session must outlive its handles (a handle outliving its session is
/// inert: every call returns Cancelled).
class PartialRunHandle {
 public:
  PartialRunHandle() = default;
  ///@{
  /// Moving leaves the source empty; assigning to a handle cancels the run
  /// it held, as destroying it would.
  PartialRunHandle(PartialRunHandle&&) noexcept;
  PartialRunHandle& operator=(PartialRunHandle&&) noexcept;
  ///@}
  ~PartialRunHandle();

  /// A printable, unguessable id ("pr-<32 hex digits>").
  const std::string& id() const;
  /// False for a default-constructed or moved-from handle.
  bool is_valid() const { return run_ != nullptr; }
  /// True once every declared fetch was fetched and every target ran, or the
  /// run ended in error or was cancelled.
  bool is_done() const;

 private:
  friend class Session;
  friend class sched::SessionImpl;
  explicit PartialRunHandle(std::shared_ptr<sched::PartialRun> run);
  std::shared_ptr<sched::PartialRun> run_;
};

/// A graph ready to run: run() and its asynchronous and partial forms (see
/// the file comment of graphrun/session.h for what they compute).
///
/// Thread safety: thread-safe; graph() must not be used while extend() runs
/// (the full contract is in the file comment).
class Session {
 public:
  /// Copies `graph`; fails if graph.status() is not OK.
  static Result<std::unique_ptr<Session>> create(const Graph& graph, SessionOptions options = {});
  /// The same, taking the graph over instead of copying it
  /// (`Session::create(std::move(g))`): a big graph built only for this
  /// session then exists once, and Outputs and Node pointers into it stay
  /// valid (they now name the session's nodes). `graph` is left empty.
  static Result<std::unique_ptr<Session>> create(Graph&& graph, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Returns the fetched tensors in the order of `fetches` (duplicates
  /// repeated). At least one fetch or target is required.
  Result<std::vector<Tensor>> run(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                  const std::vector<TargetRef>& targets = {},
                                  const RunOptions& options = {}, RunMetadata* metadata = nullptr);

  /// The same, asynchronously: returns at once, without waiting for a
  /// thread of the pool; `done` receives what run() would return (see
  /// RunDone). Semantics are run()'s: pruning, errors, stateful ops once,
  /// RunOptions::timeout (counted from this call, time queued included) and
  /// stop_token, close(). When every thread of the pool is busy the call
  /// waits in the pool's queue (one queue with blocking callers: see
  /// ThreadPool), holding no thread; its deadline, stop and close()
  /// still end it there. Arguments are copied; nothing the caller passes
  /// must outlive the call.
  void run_async(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                 const std::vector<TargetRef>& targets, const RunOptions& options, RunDone done);
  /// The same, with a future instead of `done` (see Callable::run_async).
  std::future<Result<std::vector<Tensor>>> run_async(const FeedList& feeds,
                                                     const std::vector<TensorRef>& fetches,
                                                     const std::vector<TargetRef>& targets = {},
                                                     const RunOptions& options = {});
  /// Compiles the signature once for repeated runs.
  Result<Callable> make_callable(const std::vector<TensorRef>& feeds,
                                 const std::vector<TensorRef>& fetches,
                                 const std::vector<TargetRef>& targets = {});

  /// Starts a partial run: declares everything the run may fetch, feed and
  /// run as a target, compiles the pruned graph, starts every node that
  /// needs no declared feed, and returns without waiting for them. A declared
  /// fetch or target that needs an undeclared, unfed placeholder is an error
  /// here, never a hang.
  Result<PartialRunHandle> partial_run_setup(const std::vector<TensorRef>& fetches,
                                             const std::vector<TensorRef>& feeds,
                                             const std::vector<TargetRef>& targets = {},
                                             const RunOptions& options = {});
  /// Continues the run: feeds some of the declared feeds, returns the
  /// requested fetches (declared, not yet fetched) in order as soon as they
  /// are ready, and waits for the listed targets (declared) to have run. Every
  /// node runs at most once per partial run; values computed by an earlier
  /// call are returned without recomputation. The run completes (and frees
  /// its resources) when every declared fetch was fetched and every target
  /// ran. A kernel error or a deadline ends the run; misuse errors (unknown,
  /// already fed or fetched, not yet computable) leave it usable.
  Result<std::vector<Tensor>> partial_run(PartialRunHandle& handle, const FeedList& feeds,
                                          const std::vector<TensorRef>& fetches,
                                          const std::vector<TargetRef>& targets = {},
                                          const RunOptions& options = {},
                                          RunMetadata* metadata = nullptr);
  /// The same, asynchronously: returns at once; `done` receives what
  /// partial_run() would return (see RunDone). Misuse (an empty or foreign
  /// handle, unknown or repeated names, a fetch not yet computable, another
  /// call in progress on the handle) is reported on the calling thread and
  /// leaves the run usable. Until `done` runs, the call counts as in
  /// progress on the handle (a second call fails with FailedPrecondition);
  /// it may wait for a thread of the pool like run_async, holding none. The
  /// handle may be destroyed meanwhile (the run is then cancelled and
  /// `done` gets Cancelled).
  void partial_run_async(PartialRunHandle& handle, const FeedList& feeds,
                         const std::vector<TensorRef>& fetches,
                         const std::vector<TargetRef>& targets, const RunOptions& options,
                         RunDone done);
  /// The same, with a future instead of `done` (see Callable::run_async).
  std::future<Result<std::vector<Tensor>>> partial_run_async(
      PartialRunHandle& handle, const FeedList& feeds, const std::vector<TensorRef>& fetches,
      const std::vector<TargetRef>& targets = {}, const RunOptions& options = {});
  /// Cancels an open partial run (later calls return Cancelled). OK if it was
  /// already done.
  Status cancel_partial_run(PartialRunHandle& handle);
  /// Partial runs currently open.
  std::size_t num_open_partial_runs() const;

  /// Adds to the session's graph the nodes `grown` has beyond it (TF's
  /// Session::Extend): `grown` is the graph the session was created from,
  /// with nodes added since. Outputs and node pointers of `grown` then name
  /// the session's copies. Existing nodes must be unchanged (InvalidArgument
  /// naming the first one that differs). Safe while other threads run:
  /// compiled plans stay valid; new signatures may use the new nodes.
  Status extend(const Graph& grown);

  /// Cancels runs and partial runs in flight (they return Cancelled); later
  /// calls return Cancelled "Session has been closed.". Idempotent.
  Status close();

  /// The session's copy of the graph. Not to be used while extend() runs.
  const Graph& graph() const;
  /// Number of compiled plans currently cached.
  std::size_t num_cached_plans() const;

 private:
  explicit Session(std::unique_ptr<sched::SessionImpl> impl);
  std::unique_ptr<sched::SessionImpl> impl_;
};

}  // namespace graphrun
