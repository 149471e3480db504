// graphrun's MPI component (graphrun::mpi): the MPI world a process runs
// in, Send/Recv between ranks, and collective ops for data parallelism
// (Horovod's model: every rank runs its own replica of the graph in an
// ordinary Session, and the collectives combine the ranks' tensors).
// Design: docs/distributed.md.
//
//   int main(int argc, char** argv) {
//     auto world = graphrun::mpi::World::init(&argc, &argv).value();
//     Graph g;
//     Output grad = ...;                                   // this rank's gradient
//     Output avg = graphrun::ops::AllReduce(g, grad, graphrun::mpi::Reduction::kMean);
//     auto session = Session::create(g).value();          // on every rank
//     session->run({...}, {avg});                         // the ranks' mean
//   }
//
// Launch with `mpirun -np N program`. The collectives are asynchronous
// kernels (AsyncOpKernel): a rank waiting for its peers holds none of its
// session's threads.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/session.h>
#include <graphrun/status.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace graphrun::mpi {

namespace internal {
class Engine;
}  // namespace internal

/// The MPI world of this process: MPI initialised (or joined, when the
/// program initialised it first), a communicator of graphrun's own (a
/// duplicate of MPI_COMM_WORLD) and the progress thread, which waits on
/// MPI for graphrun's kernels. One per process; kernels that use it keep it
/// alive.
///
/// Thread safety: thread-safe. Ownership: shared (init() and current()
/// hand out the same object).
class World {
 public:
  /// Initialises MPI with MPI_Init_thread (asking for MPI_THREAD_MULTIPLE;
  /// at least MPI_THREAD_SERIALIZED is required) unless it already is,
  /// registers the collective ops in OpRegistry::global(), and starts the
  /// progress thread. Calls while the world lives return it. MPI cannot be
  /// initialised twice in a process: after the world was destroyed, init()
  /// is FailedPrecondition.
  static Result<std::shared_ptr<World>> init(int* argc = nullptr, char*** argv = nullptr);
  /// The live world, or null before init() and after its end.
  static std::shared_ptr<World> current();

  World(const World&) = delete;
  World& operator=(const World&) = delete;
  /// Stops the progress thread (collectives still waiting end with
  /// Cancelled) and, if init() initialised MPI, finalises it. On rank 0 it
  /// first tells every other rank that it ends (a worker's serve() then
  /// returns Aborted); elsewhere, before finalising, it waits up to 10 s
  /// for that word.
  ~World();

  /// This process's rank in MPI_COMM_WORLD, from 0.
  int rank() const { return rank_; }
  /// The number of ranks.
  int size() const { return size_; }
  /// The thread level MPI granted (MPI_THREAD_SERIALIZED or _MULTIPLE).
  int thread_level() const { return thread_level_; }

  /// The next invocation number of `key` in this process, as Send and Recv
  /// count their transfers: the n-th on one rank meets the n-th on every
  /// other. (The collectives keep a count of their own, which skips the
  /// invocations a peer gave up.)
  uint64_t next_invocation(uint64_t key_hash) {
    return invocation_counter(key_hash).fetch_add(1, std::memory_order_relaxed);
  }
  /// The counter next_invocation() advances for `key`, for a kernel to keep
  /// (no lookup per invocation): it lives as long as the World.
  std::atomic<uint64_t>& invocation_counter(uint64_t key_hash);

  /// The progress engine (the MPI component's kernels submit to it).
  internal::Engine& engine() { return *engine_; }

 private:
  World() = default;
  int rank_ = 0;
  int size_ = 1;
  int thread_level_ = 0;
  bool finalize_ = false;  // init() initialised MPI
  std::unique_ptr<internal::Engine> engine_;
  struct Invocations;
  std::unique_ptr<Invocations> invocations_;
};

/// How AllReduce combines the ranks' tensors.
enum class Reduction : uint8_t {
  kSum,   ///< the elementwise sum
  kMean,  ///< the sum divided by the number of ranks (float dtypes only)
};

/// Registers MpiAllReduce, MpiBroadcast, MpiAllGather, MpiSend and MpiRecv into `registry`
/// (World::init does so for OpRegistry::global()). AlreadyExists-safe:
/// registering twice keeps the first.
void register_ops(OpRegistry& registry);

/// How a DistributedSession meets its workers.
struct ClusterOptions {
  /// How long create() waits for every worker to answer (a rank that is
  /// not in serve() yet, or never will be, makes create() Unavailable).
  std::chrono::milliseconds connect_timeout{60000};
  /// How long close() waits for every worker to confirm it stopped (with
  /// the heartbeat on, not for one silent past heartbeat_timeout).
  std::chrono::milliseconds close_timeout{30000};
  /// How often the driver asks every worker for a sign of life (a worker
  /// answers on its MPI progress thread, whatever its kernels do); zero
  /// turns the heartbeat off.
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A worker that has sent nothing for this long is lost: every step and
  /// partial run with a part on it fails with Unavailable naming the rank,
  /// with or without a deadline. It counts again once it answers.
  std::chrono::milliseconds heartbeat_timeout{10000};
};

/// One graph across the ranks of the World, driven from rank 0 (TF1's
/// distributed Session): every rank builds the same graph; rank 0 makes a
/// DistributedSession, ranks 1..n-1 call serve() with it. The graph is
/// placed (place(): device strings, variables with their users, other
/// nodes with their first input) and cut by rank; each cross-rank edge
/// becomes a Send/Recv pair keyed by edge and step, so concurrent steps
/// never mix. run() computes what the fetches need on whichever ranks it
/// lives, feeds a tensor on the rank that produces it and returns the
/// fetches to rank 0; results are those of one process. Every rank's part
/// of a step runs as an asynchronous step of that rank's own Session (its
/// nodes, a Recv waiting holds no thread).
///
///   auto world = mpi::World::init(&argc, &argv).value();
///   Graph g = build();                                 // the same on every rank
///   if (world->rank() == 0) {
///     auto session = mpi::DistributedSession::create(g).value();
///     auto y = session->run({{"x", x}}, {"y"});          // Result<std::vector<Tensor>>
///     Status closed = session->close();                // the workers' serve() return OK
///   } else {
///     if (Status s = mpi::serve(g); !s.is_ok()) return 1;  // e.g. a different graph
///   }
///
/// Thread safety: thread-safe (runs from many threads at once). Ownership:
/// the session copies the graph; destroying it closes it.
class DistributedSession {
 public:
  /// On rank 0 of a live World: places and cuts `graph`, and waits until
  /// every other rank's serve() confirmed it holds the same graph
  /// (FailedPrecondition naming the rank otherwise, Unavailable when one
  /// does not answer within options.connect_timeout). One at a time per
  /// process: FailedPrecondition while another is open (the workers serve
  /// one session; close() frees them for the next).
  static Result<std::unique_ptr<DistributedSession>> create(const Graph& graph,
                                                            SessionOptions options = {},
                                                            ClusterOptions cluster = {});
  ~DistributedSession();
  DistributedSession(const DistributedSession&) = delete;
  DistributedSession& operator=(const DistributedSession&) = delete;

  /// Session::run across the ranks: the fetched tensors in order, or the
  /// first error of any rank (prefixed "rank N: " when it comes from a
  /// worker); an error ends the step on every rank. RunOptions::timeout
  /// and stop_token reach every rank's part; tracing is not collected.
  Result<std::vector<Tensor>> run(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                  const std::vector<TargetRef>& targets = {},
                                  const RunOptions& options = {});
  /// A prepared signature across the ranks (make_callable): positional
  /// feeds and fetches, planned once; rank 0's part runs through a
  /// Callable of its own session. Movable.
  ///
  /// Thread safety: run() may be called from many threads at once.
  /// Ownership: shares the session's state; after close() runs are
  /// Cancelled.
  class Callable {
   public:
    /// An empty Callable (run() is FailedPrecondition).
    Callable();
    ///@{
    /// Moving leaves the source empty.
    Callable(Callable&&) noexcept;
    Callable& operator=(Callable&&) noexcept;
    ///@}
    ~Callable();
    /// One step: `feeds` in the order given to make_callable, `fetches`
    /// with one slot per declared fetch (InvalidArgument otherwise);
    /// errors as DistributedSession::run.
    Status run(std::span<const Tensor> feeds, std::span<Tensor> fetches,
               const RunOptions& options = {}) const;
    /// The number of declared feeds.
    std::size_t num_feeds() const;
    /// The number of declared fetches.
    std::size_t num_fetches() const;
    /// False for a default-constructed or moved-from Callable.
    bool is_valid() const { return state_ != nullptr; }
    /// The prepared signature (internal).
    struct State;

   private:
    friend class DistributedSession;
    std::shared_ptr<const State> state_;
  };

  /// Session::make_callable across the ranks: resolves and plans the
  /// signature once (unknown names are NotFound here, not at run()).
  Result<Callable> make_callable(const std::vector<TensorRef>& feeds,
                                 const std::vector<TensorRef>& fetches,
                                 const std::vector<TargetRef>& targets = {});

  /// A partial run spanning ranks (partial_run_setup); destroying or
  /// assigning over it cancels the run. Movable.
  ///
  /// Thread safety: one call at a time per handle (a second concurrent
  /// call is FailedPrecondition).
  class PartialRun {
   public:
    /// An empty handle.
    PartialRun();
    ///@{
    /// Moving leaves the source empty; assigning over a handle cancels the
    /// run it held.
    PartialRun(PartialRun&&) noexcept;
    PartialRun& operator=(PartialRun&&) noexcept;
    ///@}
    /// Cancels the run unless it is done.
    ~PartialRun();
    /// False for a default-constructed or moved-from handle.
    bool is_valid() const { return state_ != nullptr; }
    /// Every declared fetch was fetched and every target ran, or the run
    /// ended in error or was cancelled.
    bool is_done() const;
    /// The run's state on rank 0 (internal).
    struct State;

   private:
    friend class DistributedSession;
    std::shared_ptr<State> state_;
  };

  /// Session::partial_run_setup across the ranks: every rank with a part
  /// starts a partial run of its own, which runs as far as the feeds allow
  /// and stays suspended there; nodes run once per partial run on the rank
  /// that holds them, stateful ones included.
  Result<PartialRun> partial_run_setup(const std::vector<TensorRef>& fetches,
                                       const std::vector<TensorRef>& feeds,
                                       const std::vector<TargetRef>& targets = {},
                                       const RunOptions& options = {});
  /// Session::partial_run across the ranks: forwards each feed to the rank
  /// that makes the tensor, returns the requested fetches once they reach
  /// rank 0, and waits for the listed targets wherever they run. Misuse
  /// (undeclared, repeated, not yet computable) is refused with one
  /// process's messages and leaves the run usable; a kernel error on any
  /// rank ends the run everywhere (prefixed "rank N: ").
  Result<std::vector<Tensor>> partial_run(PartialRun& handle, const FeedList& feeds,
                                          const std::vector<TensorRef>& fetches,
                                          const std::vector<TargetRef>& targets = {},
                                          const RunOptions& options = {});
  /// Cancels an open partial run on every rank. OK if it was done.
  Status cancel_partial_run(PartialRun& handle);

  /// Session::extend across the ranks: adds the nodes `grown` has beyond
  /// the session's graph (`grown` is that graph with nodes added; an
  /// existing node changed, its device included, is InvalidArgument naming
  /// the first that differs). New nodes are placed as create() places; the
  /// nodes so far keep their ranks (a new node that would move one, such as
  /// a placed Assign of an unplaced variable, is InvalidArgument naming
  /// both). Each worker that gets new nodes or new Sends/Recvs is sent them
  /// as a GraphDef (also a worker that holds the graph: its serve() graph
  /// is the old one), so a Call node placed on a worker rank is
  /// InvalidArgument naming node and rank, and a build without GraphDef
  /// support is Unimplemented when a worker has something to take. Nothing
  /// changes on these errors. No step starts until every worker took its
  /// part; steps in flight go on. If a worker fails to take its part (or
  /// does not answer within ClusterOptions::connect_timeout) the error is
  /// returned prefixed with its rank, later extends are
  /// FailedPrecondition, and the signatures so far keep running. Cancelled
  /// after close().
  ///
  /// Thread safety: safe while other threads run, make Callables and drive
  /// partial runs; placement() must not be used while extend() runs.
  Status extend(const Graph& grown);

  /// Ends the steps in flight (Cancelled) and every worker's serve();
  /// later runs are Cancelled. Idempotent. A worker that does not confirm
  /// (silent past heartbeat_timeout, or past close_timeout) makes it
  /// Unavailable naming the rank.
  Status close();
  /// The rank of every node of the graph (by id), as placed (extend()
  /// appends the new nodes'; not to be used while extend() runs).
  const std::vector<int>& placement() const;

 private:
  struct Impl;
  explicit DistributedSession(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the partial runs' handles
};

/// A worker's loop, on ranks 1..n-1: answers the driver's DistributedSession
/// over `graph` (which must be the driver's: the same nodes built in the
/// same order), runs this rank's part of each step on a Session of its own
/// made with `options`, and returns OK when the driver closes. Errors: no
/// World, rank 0, or a graph different from the driver's; Aborted when
/// rank 0's World ends without a session with this rank (its program
/// returned before DistributedSession::create). One thread is enough
/// (options.queue_async_calls is set false: the driver admits the steps).
Status serve(const Graph& graph, SessionOptions options = {});

/// serve() for a rank that has no graph of its own (`graphrun-server
/// --mpi-worker`): the driver cuts this rank's part and sends it as a
/// GraphDef at create(). Its nodes must be ops of OpRegistry::global() (a
/// Call node placed here fails the driver's create() with InvalidArgument
/// naming it: its kernel is code of the driver's program). Returns OK when
/// the driver closes, Aborted when the driver's create() failed first or
/// rank 0 ended without one.
Status serve_without_graph(SessionOptions options = {});

}  // namespace graphrun::mpi

namespace graphrun::ops {

/// Every rank's `x` combined elementwise; every rank gets the same result,
/// bit for bit (the ranks add in rank order). Shapes and dtypes must agree
/// across ranks (an InvalidArgument on every rank names both otherwise).
/// Ranks pair their invocations by `key` (default: the node's name), so
/// independent collectives in one graph may become ready in any order on
/// different ranks. An invocation one rank gives up (its step's deadline,
/// a stop, close()) is skipped by the ranks that had not started it and
/// ends Aborted on those running it, so the next invocations meet (this
/// holds for Broadcast and AllGather too). float32/float64/int32/int64;
/// kMean needs a float dtype.
Output AllReduce(Graph& g, Output x, mpi::Reduction reduction = mpi::Reduction::kSum,
                 std::string_view name = {}, std::string_view key = {});
/// Rank `root`'s `x` on every rank (the others' values are ignored; their
/// dtype and shape must be the root's, or every rank fails).
Output Broadcast(Graph& g, Output x, int root = 0, std::string_view name = {},
                 std::string_view key = {});
/// Every rank's `x` concatenated along dimension 0 in rank order; the ranks'
/// first dimensions may differ, the other dimensions and the dtype must
/// agree.
Output AllGather(Graph& g, Output x, std::string_view name = {}, std::string_view key = {});

/// Sends `x` to rank `dest`, to the Recv of the same `tensor_name` there: a
/// node without outputs (run it as a target), done once MPI has the bytes.
/// The n-th Send of a tensor name to a rank meets the n-th Recv of that
/// name from this rank. Null when the graph refuses the node (g.status()).
/// A step waiting for a Recv keeps its place among the at most
/// inter_op_threads steps its session runs at once: steps of different
/// ranks that wait for each other must fit there together.
const Node* Send(Graph& g, Output x, int dest, std::string_view tensor_name,
                 std::string_view name = {});
/// The tensor rank `source` sends with the same `tensor_name`. `dtype` must
/// be what is sent, and the sent shape compatible with `shape` (a mismatch
/// fails the step with InvalidArgument naming the rank).
Output Recv(Graph& g, DType dtype, int source, std::string_view tensor_name,
            Shape shape = Shape::unknown(), std::string_view name = {});

}  // namespace graphrun::ops
