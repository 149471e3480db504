/// @file graphrun/remote_session.h
/// RemoteSession: a Session on a graphrun SessionService over gRPC, with the
/// in-process Session's interface as far as it goes over the wire.
///
/// @code
///   Graph g;  ... build it ...
///   GRAPHRUN_ASSIGN_OR_RETURN(auto session, RemoteSession::create("127.0.0.1:7000", g));
///   GRAPHRUN_ASSIGN_OR_RETURN(auto out, session->run({{"x", Tensor(3.0f)}}, {"y"}));
/// @endcode
///
/// What is the same as Session (graphrun/session.h):
/// * run, partial_run_setup, partial_run, cancel_partial_run, extend and
///   close take the same arguments: FeedList, TensorRef and TargetRef. Tensors
///   and nodes travel by name: an Output is sent as "node:k", a Node as its
///   name, so an Output of any graph with a node of that name resolves to the
///   server's node (a local Session rejects Outputs of a foreign graph).
/// * The same Status codes and messages: the server runs a Session and maps
///   codes 1:1; messages longer than 4096 bytes arrive cut (the head, which
///   names the node, is kept). Where the server's registry answers NotFound
///   because it forgot a handle, this class answers what a local Session
///   would (see "Mapping" below).
/// * RunOptions::timeout is the request's timeout_ms and, plus
///   RemoteSessionOptions::deadline_margin, the call's gRPC deadline: the
///   server stops the step first and answers DeadlineExceeded with its
///   message; a server that does not answer at all still cannot hang the
///   client (gRPC's own DeadlineExceeded "Deadline Exceeded").
///   RunOptions::trace returns the server's step statistics in RunMetadata.
/// * RunOptions::stop_token: a stop cancels the call's RPC, and the server
///   stops the step (a partial-run call: the whole partial run); given to
///   partial_run_setup, a stop sends CancelPartialRun. The messages are the
///   local ones ("the run was cancelled by its caller", ...).
///
/// What differs:
/// * No make_callable, graph(), num_cached_plans() or num_open_partial_runs().
/// * SessionOptions::thread_pool cannot be sent (InvalidArgument); the other
///   SessionOptions fields become the server's SessionConfig.
/// * Transport failures have gRPC's codes: Unavailable when the server is
///   unreachable, DeadlineExceeded past a control call's deadline,
///   ResourceExhausted over a message size limit.
/// * A session the server collected on its own (idle sweeper, restart) is
///   NotFound naming the handle, as the server says.
///
/// Mapping (what a local Session says instead of the registry's NotFound):
/// * After close(), every call returns Cancelled "Session has been closed."
///   without a round trip; a call racing with close() that reaches the server
///   after the handle is gone gets the same.
/// * A partial run the server forgot because it ended: the next call on its
///   handle returns InvalidArgument "partial run <id> is complete: ..." when every
///   declared fetch was fetched and every target ran, Cancelled "partial run
///   <id> was cancelled" after cancel_partial_run, otherwise the error that
///   ended it (the handle remembers its last error) or, with a
///   partial_run_idle_timeout and no error, Cancelled "... was idle for more
///   than N ms and was cancelled".
///
/// Thread safety: thread-safe, like Session: every method may be called from
/// any number of threads at once (one gRPC channel and stub are shared);
/// calls on one partial-run handle are serialized by the server
/// (FailedPrecondition "... is in use by another call"). Destroying the
/// session closes it; no call may be in progress then.
#pragma once

#include <graphrun/graph.h>
#include <graphrun/session.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>
#include <graphrun/v1/graph.pb.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace graphrun {

/// How a RemoteSession reaches its server. gRPC types appear only as
/// forward-declared shared pointers: include <grpcpp/grpcpp.h> to make them.
struct RemoteSessionOptions {
  /// Channel credentials (e.g. grpc::SslCredentials(...)); null: insecure,
  /// for loopback and unix sockets.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  /// An existing channel to use instead of making one from the target,
  /// credentials and max_message_bytes (several sessions may share one).
  std::shared_ptr<grpc::Channel> channel;
  /// Sent as "authorization: Bearer <token>" metadata on every call when not
  /// empty (graphrun-server's --token-file).
  std::string bearer_token;
  /// Added to RunOptions::timeout for the gRPC deadline of Run and
  /// PartialRun, so that the server, not the transport, reports the deadline.
  std::chrono::milliseconds deadline_margin{1000};
  /// The gRPC deadline of CreateSession, ExtendSession, PartialRunSetup,
  /// CancelPartialRun and CloseSession.
  std::chrono::milliseconds control_timeout{60000};
  /// Largest message sent and received, bytes (gRPC's default receive limit
  /// is 4 MiB; the server's default is 64 MiB).
  int max_message_bytes = 64 << 20;
};

class RemoteSession;

/// One partial run on the server. Movable, not copyable. Destroying a handle
/// whose run is not known to be done cancels it (a CancelPartialRun call,
/// errors ignored), as a local handle cancels its run.
///
/// Thread safety: thread-compatible; the server serializes calls on one run.
/// A handle may outlive its session (it then holds only the channel).
class RemotePartialRunHandle {
 public:
  RemotePartialRunHandle() = default;  ///< an empty handle
  ///@{
  /// Moves the run; the moved-from handle is empty. Assigning over a handle
  /// whose run is not done cancels that run first.
  RemotePartialRunHandle(RemotePartialRunHandle&&) noexcept;
  RemotePartialRunHandle& operator=(RemotePartialRunHandle&&) noexcept;
  ///@}
  ~RemotePartialRunHandle();

  /// The server's id ("pr-<32 hex digits>"); empty for an empty handle.
  const std::string& id() const;
  /// False for an empty handle.
  bool is_valid() const { return state_ != nullptr; }
  /// As far as this client knows: every declared fetch was fetched and every
  /// target ran, it was cancelled, or the server reported it ended.
  bool is_done() const;

  struct State;

 private:
  friend class RemoteSession;
  explicit RemotePartialRunHandle(std::shared_ptr<State> state);
  void abandon();
  std::shared_ptr<State> state_;
};

/// A Session on a graphrun server: the file comment says what is the same as
/// an in-process Session and what differs.
///
/// Thread safety: thread-safe (see the file comment). Owns its server-side
/// session: destroying it closes that session.
class RemoteSession {
 public:
  /// Opens a session on the server at `target` ("host:port", "unix:path",
  /// any gRPC target) on `graph`, exported with graph_to_graph_def. Fails as
  /// Session::create for a graph with a build error, with the export's
  /// error for a graph holding C++ callables, and with the server's error
  /// otherwise (import, limits, transport).
  static Result<std::unique_ptr<RemoteSession>> create(std::string_view target, const Graph& graph,
                                                       const SessionOptions& options = {},
                                                       RemoteSessionOptions remote = {});
  /// The same from a GraphDef (imported here too, so that extend() can tell
  /// which nodes are new).
  static Result<std::unique_ptr<RemoteSession>> create(std::string_view target,
                                                       const v1::GraphDef& graph_def,
                                                       const SessionOptions& options = {},
                                                       RemoteSessionOptions remote = {});
  ~RemoteSession();
  RemoteSession(const RemoteSession&) = delete;
  RemoteSession& operator=(const RemoteSession&) = delete;

  /// Session::run by name; fetches in the order of `fetches`.
  Result<std::vector<Tensor>> run(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                  const std::vector<TargetRef>& targets = {},
                                  const RunOptions& options = {}, RunMetadata* metadata = nullptr);

  /// Session::partial_run_setup: one PartialRunSetup call.
  Result<RemotePartialRunHandle> partial_run_setup(const std::vector<TensorRef>& fetches,
                                                   const std::vector<TensorRef>& feeds,
                                                   const std::vector<TargetRef>& targets = {},
                                                   const RunOptions& options = {});
  /// Session::partial_run: one PartialRun call.
  Result<std::vector<Tensor>> partial_run(RemotePartialRunHandle& handle, const FeedList& feeds,
                                          const std::vector<TensorRef>& fetches,
                                          const std::vector<TargetRef>& targets = {},
                                          const RunOptions& options = {},
                                          RunMetadata* metadata = nullptr);
  /// Session::cancel_partial_run: OK if the run was already done.
  Status cancel_partial_run(RemotePartialRunHandle& handle);

  /// Session::extend: `grown` is the graph this session was created from
  /// (or last extended with) with nodes added. The check that existing nodes
  /// are unchanged runs here, with the local session's message; the new
  /// nodes go to the server in one ExtendSession call. Extends of one
  /// RemoteSession are serialized.
  Status extend(const Graph& grown);
  /// The same from a GraphDef of the whole grown graph.
  Status extend(const v1::GraphDef& grown);

  /// Closes the server's session (its calls in flight return Cancelled).
  /// Idempotent; the first call returns the CloseSession call's status (OK
  /// when the server had already forgotten the session).
  Status close();

  /// The server's session handle ("s-<32 hex digits>").
  const std::string& handle() const;
  /// The server's graph version: 0 at creation, one more per extend.
  int64_t graph_version() const;

  struct Core;

 private:
  explicit RemoteSession(std::shared_ptr<Core> core);
  static Result<std::unique_ptr<RemoteSession>> open(std::string_view target, Graph graph,
                                                     v1::GraphDef graph_def,
                                                     const SessionOptions& options,
                                                     RemoteSessionOptions remote);

  // Shared with the partial-run handles, which may outlive the session.
  std::shared_ptr<Core> core_;
};

}  // namespace graphrun
