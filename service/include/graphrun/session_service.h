/// @file graphrun/session_service.h
/// The gRPC SessionService (proto/graphrun/v1/session_service.proto) over a
/// SessionRegistry, on gRPC's callback API. Each RPC decodes its request,
/// makes one registry call and encodes the answer:
/// * feeds are decoded by name with tensor_from_proto (an error names the
///   feed); fetches are returned in request order with tensor_to_proto;
/// * the call's gRPC deadline becomes RunOptions::timeout (the smaller of it
///   and the request's timeout_ms), so a step past it is DEADLINE_EXCEEDED;
/// * a client's cancellation (or its deadline passing) stops the step at the
///   next node boundary (RunOptions::stop_token): a partial run is then
///   cancelled as a whole;
/// * a graphrun Status becomes a grpc::Status with the same code and its
///   message capped at kMaxStatusMessageBytes (cap_status_message).
/// Run and PartialRun start their step with the session's asynchronous
/// calls (Session::run_async, partial_run_async) and return their reactor at
/// once, so that gRPC can deliver a cancellation and no thread waits for a
/// step: the step's done encodes the response and finishes the call (a
/// quick step may run to its end on the gRPC thread). A call that finds the
/// session's pool busy waits in the pool's queue holding no thread. The
/// other RPCs are short and run on the gRPC callback thread. The handling itself (parsing with
/// limits, checks, the registry call) is transport-free (service/src/request_handler.h).
///
/// Most users want graphrun/server.h, which builds a configured server
/// around this service.
#pragma once

#include <graphrun/session_registry.h>
#include <graphrun/status.h>
#include <graphrun/v1/session_service.grpc.pb.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace graphrun {

namespace service_internal {
class RequestHandler;
}  // namespace service_internal

/// Longest status message sent to a client. gRPC carries the message in
/// metadata; a client's default metadata limit turns a longer one into
/// RESOURCE_EXHAUSTED "received initial metadata size exceeds limit" and the
/// real code and text are lost (docs/service.md).
inline constexpr std::size_t kMaxStatusMessageBytes = 4096;

/// `message` if it fits in `max_bytes` once percent-encoded as gRPC sends
/// it (encoded_message_size); else its head (which names the node and op)
/// followed by "... (N bytes cut)", at most `max_bytes` encoded in all, cut
/// at a UTF-8 character boundary. Thread-safe.
std::string cap_status_message(std::string_view message,
                               std::size_t max_bytes = kMaxStatusMessageBytes);

/// The size of `message` in gRPC's metadata: every byte outside printable
/// ASCII, and '%', is percent-encoded as three bytes. Thread-safe.
std::size_t encoded_message_size(std::string_view message);

/// `status` as a grpc::Status: the same code, the capped message.
/// Thread-safe.
grpc::Status to_grpc_status(const Status& status);

/// The SessionService with every method on raw bytes (grpc::ByteBuffer):
/// requests are parsed by the service itself, with explicit limits, so that
/// an unparseable request is INVALID_ARGUMENT saying why (gRPC's own
/// deserialization answers UNIMPLEMENTED with no message).
using RawSessionService = v1::SessionService::WithRawCallbackMethod_CreateSession<
    v1::SessionService::WithRawCallbackMethod_ExtendSession<
        v1::SessionService::WithRawCallbackMethod_Run<
            v1::SessionService::WithRawCallbackMethod_PartialRunSetup<
                v1::SessionService::WithRawCallbackMethod_PartialRun<
                    v1::SessionService::WithRawCallbackMethod_CancelPartialRun<
                        v1::SessionService::WithRawCallbackMethod_CloseSession<
                            v1::SessionService::WithRawCallbackMethod_ListSessions<
                                v1::SessionService::Service>>>>>>>>;

/// The service. Register it with a grpc::ServerBuilder (RegisterService).
/// Every request is parsed with a nesting limit of 100 (and the server's
/// message size limit); a request that does not parse is INVALID_ARGUMENT
/// naming the message and, when protobuf says it, the reason (a string
/// field with invalid UTF-8 names the field). No exception leaves a
/// handler: each becomes a status with a message.
///
/// Thread safety: thread-safe; gRPC calls its methods from many threads at
/// once. Borrows `registry`, which must outlive the server it is registered
/// with. Destroy the service after the server (its destructor waits for the
/// steps still running).
class SessionServiceImpl final : public RawSessionService {
 public:
  /// At most `max_calls_in_flight` Run and PartialRun calls are in flight at
  /// once (from their arrival until they are answered); a call past it
  /// is RESOURCE_EXHAUSTED naming the limit, so that clients cannot queue
  /// unbounded work. No thread is held per call: the bound is on queued
  /// work (requests, feeds), not on threads.
  ///
  /// A Run or PartialRun response larger than `max_response_bytes` (the
  /// server's max message size; protobuf's 2 GiB at most) is
  /// RESOURCE_EXHAUSTED naming the limit, its size and the largest fetch,
  /// found before the fetched tensors are copied into the response.
  explicit SessionServiceImpl(SessionRegistry& registry,
                              std::size_t max_calls_in_flight = kDefaultMaxCallsInFlight,
                              int max_response_bytes = INT_MAX);
  /// The default of max_calls_in_flight.
  static constexpr std::size_t kDefaultMaxCallsInFlight = 4096;
  ~SessionServiceImpl() override;
  SessionServiceImpl(const SessionServiceImpl&) = delete;
  SessionServiceImpl& operator=(const SessionServiceImpl&) = delete;

  using Reactor = grpc::ServerUnaryReactor;     ///< gRPC's unary callback reactor
  using Context = grpc::CallbackServerContext;  ///< gRPC's per-call context
  using Bytes = grpc::ByteBuffer;               ///< a serialized message
  ///@{
  /// An RPC handler, called by gRPC: parses `request`, makes one registry
  /// call and writes `response`. Run and PartialRun return their reactor at
  /// once and finish it from the step's done (no thread waits for the step).
  Reactor* CreateSession(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* ExtendSession(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* Run(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* PartialRunSetup(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* PartialRun(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* CancelPartialRun(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* CloseSession(Context* context, const Bytes* request, Bytes* response) override;
  Reactor* ListSessions(Context* context, const Bytes* request, Bytes* response) override;
  ///@}

  /// Run and PartialRun calls in flight now. Thread-safe.
  std::size_t calls_in_flight() const;

 private:
  std::unique_ptr<service_internal::RequestHandler> handler_;  // borrows the registry
  const std::size_t max_calls_in_flight_;
  std::atomic<std::size_t> calls_in_flight_{0};
};

}  // namespace graphrun
