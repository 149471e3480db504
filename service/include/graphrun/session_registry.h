/// @file graphrun/session_registry.h
/// The transport-free core of the session service: sessions by handle, their
/// graph versions and open partial runs, and the server's limits. The gRPC
/// layer (graphrun/session_service.h) decodes a request, calls one method
/// here and encodes the answer; tests drive the registry directly.
///
/// @code
///   SessionRegistry registry(ServiceLimits{.max_sessions = 8});
///   GRAPHRUN_ASSIGN_OR_RETURN(auto created, registry.create(graph_def));
///   GRAPHRUN_ASSIGN_OR_RETURN(auto out, registry.run(created.handle, {{"x", x}}, {"y"}));
/// @endcode
///
/// Every failure is a Status with the code the wire carries: an unknown
/// session or partial-run handle is NotFound naming it; a limit is
/// ResourceExhausted naming the limit; a stale graph version in extend() is
/// FailedPrecondition (as TensorFlow's master).
///
/// Link graphrun::service_core (protobuf only), or graphrun::service, which
/// brings it with the gRPC layer above.
#pragma once

#include <graphrun/session.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>
#include <graphrun/v1/graph.pb.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace graphrun {

/// What one server allows. Each limit, when hit, is a ResourceExhausted whose
/// message names the field ("... (limit max_sessions = 64)").
struct ServiceLimits {
  /// Sessions open at once.
  std::size_t max_sessions = 64;
  /// Partial runs open at once in one session (also caps the session's own
  /// SessionOptions::max_open_partial_runs).
  std::size_t max_partial_runs_per_session = 64;
  /// Sum of the fed tensors' byte sizes in one request.
  int64_t max_tensor_bytes_per_request = int64_t{256} << 20;
  /// Nodes in one session's graph (at create and after each extend).
  int64_t max_graph_nodes = 1'000'000;
  /// Largest tensor a kernel of a session may make at run time
  /// (SessionOptions::max_tensor_bytes): a Fill of fed dims, a broadcast.
  int64_t max_output_tensor_bytes = int64_t{1} << 30;
  /// Estimated memory one session may hold: the tensors its GraphDefs make
  /// the server materialize (Const values) plus kEstimatedBytesPerNode per
  /// node (graph, kernels, plans, the kept GraphDef). Checked at create and
  /// at each extend; ResourceExhausted naming the field past it.
  int64_t max_session_bytes = int64_t{1} << 30;
  /// The same estimate summed over every open session.
  int64_t max_total_session_bytes = int64_t{4} << 30;
  /// Threads one session may ask for (SessionOptions::inter_op_threads,
  /// SessionConfig.inter_op_threads). 0: one per core
  /// (ThreadPool::default_threads()). At most ThreadPool::max_threads().
  int max_inter_op_threads = 0;
  /// A session with no call in progress and none for this long is closed
  /// (a later call with its handle is NotFound saying so). 0: never.
  std::chrono::milliseconds session_idle_timeout{0};
  /// A partial run with no call for this long is cancelled: the default for
  /// sessions whose SessionOptions set none, and a cap on those that do.
  /// 0: sessions keep their own setting.
  std::chrono::milliseconds partial_run_idle_timeout{0};
};

/// What one graph node costs a server's session, measured (bench: the
/// memory_per_node test in tests/service/memory_test.cc): the node, its
/// kernel, its share of plans and flow graphs, and its NodeDef kept for
/// extend, about 1.3 KB for a small node; rounded up.
inline constexpr int64_t kEstimatedBytesPerNode = 1536;

/// A fed tensor by name ("node" or "node:k").
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// One open session, as ListSessions reports it.
struct SessionInfo {
  std::string handle;                 ///< "s-" + 32 hex digits
  int64_t graph_version = 0;          ///< 0 at creation, one more per extend
  int64_t num_nodes = 0;              ///< nodes in the session's graph
  int64_t open_partial_runs = 0;      ///< partial runs not yet done
  std::chrono::milliseconds idle{0};  ///< since the session's last call
};

/// Sessions by handle.
///
/// Thread safety: thread-safe; every method may be called from any number of
/// threads (one per RPC) at once. Calls on one session run concurrently as
/// Session allows; close() cancels the calls in flight, and the session is
/// destroyed when the last of them returns. With a session_idle_timeout, a
/// sweeper thread of the registry closes idle sessions. Destroying the
/// registry stops the sweeper and closes every session; no call may be in
/// progress then.
class SessionRegistry {
 public:
  /// An empty registry enforcing `limits`; starts the idle sweeper when
  /// limits.session_idle_timeout is set.
  explicit SessionRegistry(ServiceLimits limits = {});
  ~SessionRegistry();
  SessionRegistry(const SessionRegistry&) = delete;
  SessionRegistry& operator=(const SessionRegistry&) = delete;

  /// The limits given at construction.
  const ServiceLimits& limits() const { return limits_; }
  /// limits().max_inter_op_threads resolved: 0 becomes the core count, and
  /// the result is at most ThreadPool::max_threads().
  int max_inter_op_threads() const;

  /// What create() returns.
  struct Created {
    std::string handle;         ///< "s-" + 32 hex digits (128 bits from getrandom)
    int64_t graph_version = 0;  ///< 0
  };
  /// Imports `graph_def` (graph_from_graph_def's rules and errors) and opens
  /// a session on it with `options` (max_open_partial_runs capped by the
  /// limit). ResourceExhausted when max_sessions are open, when the tensors
  /// the GraphDef makes the server materialize (Const values, and the
  /// outputs of Fill nodes whose shapes are known at build time) exceed
  /// max_tensor_bytes_per_request (checked before any is made), or when the
  /// session's estimated memory exceeds max_session_bytes or, with the other
  /// sessions', max_total_session_bytes. InvalidArgument when
  /// options.inter_op_threads is above max_inter_op_threads().
  Result<Created> create(const v1::GraphDef& graph_def, SessionOptions options = {});

  /// The session behind `handle`, kept alive by the returned pointer even if
  /// it is closed meanwhile (its calls then return Cancelled). NotFound
  /// naming the handle when no open session has it.
  Result<std::shared_ptr<Session>> get(std::string_view handle) const;

  /// Appends `new_nodes` (a GraphDef of only the nodes to add; they may name
  /// the session's nodes as inputs) when `current_graph_version` is the
  /// session's version; returns the new version (one more). A stale version
  /// is FailedPrecondition naming both versions; a bad node is the import's
  /// InvalidArgument naming it; the new nodes' tensors and the grown
  /// session's memory are checked as at create. Extends of one session are
  /// serialized.
  Result<int64_t> extend(std::string_view handle, const v1::GraphDef& new_nodes,
                         int64_t current_graph_version);

  /// Session::run with names. Fetches come back in the order of `fetches`.
  /// ResourceExhausted when the feeds exceed max_tensor_bytes_per_request.
  Result<std::vector<Tensor>> run(std::string_view handle, const NamedTensors& feeds,
                                  const std::vector<std::string>& fetches,
                                  const std::vector<std::string>& targets,
                                  const RunOptions& options = {}, RunMetadata* metadata = nullptr);

  /// What run_async() and partial_run_async() report: Session's RunDone
  /// (the fetches or the status; the step statistics when tracing, valid
  /// only during the call) and `hold`, which keeps the session alive (null
  /// when the call failed before it reached a session). `done` must not
  /// drop the last copy of `hold` itself, because a session cannot be
  /// destroyed from its own done: keep it past `done` (the gRPC layer drops
  /// it when gRPC is done with the call). `done` follows RunDone's contract
  /// (exactly once; on the calling thread when the call fails before it
  /// starts).
  using StepDone = std::function<void(Result<std::vector<Tensor>> result, RunMetadata* metadata,
                                      std::shared_ptr<void> hold)>;
  /// run() without waiting: Session::run_async with names. The session is
  /// kept alive, and counts as in use (never idle), until `done`.
  void run_async(std::string_view handle, const NamedTensors& feeds,
                 const std::vector<std::string>& fetches, const std::vector<std::string>& targets,
                 const RunOptions& options, StepDone done);

  /// Session::partial_run_setup with names; returns the partial run's id
  /// ("pr-" + 32 hex digits), kept by the session until it completes or is
  /// cancelled. ResourceExhausted when max_partial_runs_per_session are open.
  Result<std::string> partial_run_setup(std::string_view handle,
                                        const std::vector<std::string>& feeds,
                                        const std::vector<std::string>& fetches,
                                        const std::vector<std::string>& targets,
                                        const RunOptions& options = {});
  /// Session::partial_run on the partial run `partial_run_id` of the session.
  /// Calls on one partial run take turns: a call waits for the one in
  /// progress (DeadlineExceeded or Cancelled when its own deadline or stop
  /// comes first), so that a call whose client went away never makes the
  /// next one fail as "in use".
  /// NotFound naming the id when the session has no such open partial run
  /// (a completed, failed or cancelled one is forgotten after the call that
  /// ended it). ResourceExhausted as run() for the feeds.
  Result<std::vector<Tensor>> partial_run(std::string_view handle, std::string_view partial_run_id,
                                          const NamedTensors& feeds,
                                          const std::vector<std::string>& fetches,
                                          const std::vector<std::string>& targets,
                                          const RunOptions& options = {},
                                          RunMetadata* metadata = nullptr);
  /// partial_run() without waiting: Session::partial_run_async. A call that
  /// finds another in progress on the same partial run queues behind it
  /// (in order) holding no thread; its stop ends the wait at once
  /// (Cancelled), and its timeout, counted from its arrival, is checked
  /// when its turn comes (DeadlineExceeded).
  void partial_run_async(std::string_view handle, std::string_view partial_run_id,
                         const NamedTensors& feeds, const std::vector<std::string>& fetches,
                         const std::vector<std::string>& targets, const RunOptions& options,
                         StepDone done);
  /// Cancels the partial run and forgets it. NotFound as partial_run().
  Status cancel_partial_run(std::string_view handle, std::string_view partial_run_id);

  /// Closes the session (its calls in flight return Cancelled) and forgets
  /// the handle: later calls with it are NotFound.
  Status close(std::string_view handle);
  /// Closes every session (server shutdown).
  void close_all();
  /// Closes the sessions idle for longer than limits().session_idle_timeout
  /// (with no call in progress) and returns how many. The sweeper calls it
  /// periodically; tests may call it directly. No-op without the limit.
  std::size_t close_idle_sessions();

  /// The open sessions, ordered by handle.
  std::vector<SessionInfo> list() const;
  /// The number of open sessions.
  std::size_t size() const;
  /// The estimated memory of the open sessions (see max_session_bytes).
  int64_t held_bytes() const;

  /// The limit check run() and partial_run() apply to decoded feeds, for
  /// callers that can count bytes before decoding (the gRPC layer).
  Status check_request_bytes(int64_t bytes) const;

 private:
  struct Entry;
  Result<std::shared_ptr<Entry>> find(std::string_view handle) const;

  Status check_graph_nodes(int64_t nodes) const;
  // The limit checks on a GraphDef before it is imported (its tensors).
  Status check_graph_def_tensors(const v1::GraphDef& def) const;
  // The tensors of nodes [first, end) of `graph` that every run makes at a
  // size known now (Fill), plus `constants`, against
  // max_tensor_bytes_per_request.
  Status check_materialized(const Graph& graph, int first, int64_t constants) const;
  // Reserves `bytes` more of the session budgets for a session that holds
  // `current` already; ResourceExhausted naming the limit.
  Status reserve_bytes(int64_t current, int64_t bytes);
  void sweep_until_stopped();

  const ServiceLimits limits_;
  mutable std::mutex mu_;
  // Guarded by mu_. Entries are shared with the calls using them.
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> sessions_;
  // Guarded by mu_. The handles the sweeper closed most recently, so that
  // a late call learns why its session is gone (bounded, oldest dropped).
  std::deque<std::string> expired_;
  // The estimated memory of open sessions; shared with the entries, which
  // give their part back when destroyed.
  std::shared_ptr<std::atomic<int64_t>> held_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  // The sweeper (only with a session_idle_timeout).
  std::condition_variable sweeper_cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread sweeper_;
};

/// "s-" or "pr-"-style ids: `prefix` + 32 lowercase hex digits of 128 random
/// bits from getrandom(2). Thread-safe.
std::string random_handle(std::string_view prefix);

}  // namespace graphrun
