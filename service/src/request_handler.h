// RequestHandler: the SessionService's request handling without gRPC. Each
// RPC's serialized request is parsed here with explicit limits (size,
// nesting), checked, turned into one SessionRegistry call, and answered with
// a response message or a Status with a message. The gRPC layer
// (session_service.cc) only moves bytes; the service fuzzer
// (tests/fuzz/service_fuzz.cc) drives this class directly.
#pragma once

#include <google/protobuf/io/zero_copy_stream.h>
#include <google/protobuf/message.h>
#include <graphrun/session_registry.h>
#include <graphrun/status.h>
#include <graphrun/v1/session_service.pb.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string_view>

namespace graphrun::service_internal {

// The SessionService's RPCs, in the order of session_service.proto.
enum class Method {
  kCreateSession,
  kExtendSession,
  kRun,
  kPartialRunSetup,
  kPartialRun,
  kCancelPartialRun,
  kCloseSession,
  kListSessions,
};
inline constexpr int kNumMethods = 8;
std::string_view method_name(Method method);

// Deepest message nesting a request may have (protobuf's own default for
// binary parsing). GraphDefs nest a few levels (NodeDef, AttrValue, lists).
inline constexpr int kMaxRequestNesting = 100;

// What a call brings besides its request bytes.
struct CallContext {
  // The client's deadline (gRPC's); unset: none.
  std::optional<std::chrono::system_clock::time_point> deadline;
  // Stopped when the client cancels or goes away.
  std::stop_token stop;
};

// Parses `input` (`size` bytes) as `message`, nested at most
// kMaxRequestNesting deep and reading exactly `size` bytes. InvalidArgument
// naming `what` and, when protobuf said it, why (invalid UTF-8 in a string
// field names the field). Thread-safe.
Status parse_message(google::protobuf::io::ZeroCopyInputStream& input, int64_t size,
                     google::protobuf::Message& message, std::string_view what);

// Routes protobuf's log lines (one per rejected string field, for example)
// to stderr through a rate limit (a client cannot flood the server's log),
// and keeps the last one per thread for parse_message's errors. Idempotent;
// thread-safe.
void install_protobuf_log_handler();

// Thread safety: thread-safe (every method may be called from any number
// of threads at once). Borrows `registry`, which must outlive it. No method
// throws: an exception from below becomes Internal (ResourceExhausted for
// bad_alloc).
class RequestHandler {
 public:
  // The largest response any handler may send: protobuf's own limit (2 GiB
  // less one byte).
  static constexpr int64_t kMaxResponseBytes = INT_MAX;

  // A Run or PartialRun response that would exceed `max_response_bytes`
  // (the server's max_message_bytes; at most kMaxResponseBytes) is
  // ResourceExhausted naming the limit, the size and the largest fetch,
  // checked on the fetched tensors before any is copied into the response.
  explicit RequestHandler(SessionRegistry& registry,
                          int64_t max_response_bytes = kMaxResponseBytes);

  // Parses a serialized request of `method` and handles it. Returns the
  // response message, or the status to send.
  Result<std::unique_ptr<google::protobuf::Message>> handle(
      Method method, google::protobuf::io::ZeroCopyInputStream& request, int64_t request_size,
      const CallContext& call) noexcept;
  // The same over bytes in memory.
  Result<std::unique_ptr<google::protobuf::Message>> handle(Method method, std::string_view request,
                                                            const CallContext& call) noexcept;

  // What handle_async() answers with, exactly once: the response message or
  // the status to send, and `hold`, which keeps the call's session alive
  // (SessionRegistry::StepDone): keep it until the answer is sent, and do
  // not drop it inside `answer`. Must not throw.
  using Answer = std::function<void(Result<std::unique_ptr<google::protobuf::Message>> out,
                                    std::shared_ptr<void> hold)>;
  // Parses a serialized request of `method` and handles it without waiting
  // for its step: Run and PartialRun start their step through the
  // registry's asynchronous calls and return; `answer` then runs where the
  // step's done runs (a pool thread, or this one when the call fails before
  // its step or the step ran inline). The other methods are answered on
  // this thread before it returns. `request` is read before it returns.
  void handle_async(Method method, google::protobuf::io::ZeroCopyInputStream& request,
                    int64_t request_size, const CallContext& call, Answer answer) noexcept;

  // The typed handlers (requests already parsed).
  Status create_session(const v1::CreateSessionRequest& request,
                        v1::CreateSessionResponse& response);
  Status extend_session(const v1::ExtendSessionRequest& request,
                        v1::ExtendSessionResponse& response);
  Status run(const v1::RunRequest& request, const CallContext& call, v1::RunResponse& response);
  Status partial_run_setup(const v1::PartialRunSetupRequest& request, const CallContext& call,
                           v1::PartialRunSetupResponse& response);
  Status partial_run(const v1::PartialRunRequest& request, const CallContext& call,
                     v1::RunResponse& response);
  // Run and PartialRun without waiting (see handle_async): `answer` gets
  // the RunResponse or the status.
  void run_async(const v1::RunRequest& request, const CallContext& call, Answer answer);
  void partial_run_async(const v1::PartialRunRequest& request, const CallContext& call,
                         Answer answer);
  Status cancel_partial_run(const v1::CancelPartialRunRequest& request);
  Status close_session(const v1::CloseSessionRequest& request);
  Status list_sessions(v1::ListSessionsResponse& response);

  SessionRegistry& registry() { return registry_; }

 private:
  SessionRegistry& registry_;  // not owned
  const int64_t max_response_bytes_;
};

}  // namespace graphrun::service_internal
