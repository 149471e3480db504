#include <fmt/format.h>
#include <graphrun/session_service.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "service/src/call_executor.h"
#include "service/src/request_handler.h"

#include <chrono>
#include <memory>
#include <optional>
#include <stop_token>
#include <utility>

namespace graphrun {
namespace {

using service_internal::CallContext;
using service_internal::Method;
using service_internal::RequestHandler;

// The reactor of a call: a client's cancellation (or its deadline passing)
// requests a stop on the step's RunOptions::stop_token.
class StopReactor final : public grpc::ServerUnaryReactor {
 public:
  std::stop_token stop_token() const { return stop_.get_token(); }
  void OnCancel() override { stop_.request_stop(); }
  void OnDone() override { delete this; }  // after Finish; the call is over

 private:
  std::stop_source stop_;
};

CallContext call_context(const grpc::CallbackServerContext& context, std::stop_token stop) {
  CallContext call;
  const auto deadline = context.deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) call.deadline = deadline;
  call.stop = std::move(stop);
  return call;
}

// The handler's answer as the call's status, the response serialized into
// `response` when OK.
grpc::Status finish_answer(Method method,
                           const Result<std::unique_ptr<google::protobuf::Message>>& out,
                           grpc::ByteBuffer* response) {
  if (!out.is_ok()) return to_grpc_status(out.status());
  bool own_buffer = false;
  grpc::Status serialized =
      grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(**out, response,
                                                                                 &own_buffer);
  if (!serialized.ok()) {
    return {grpc::StatusCode::INTERNAL,
            fmt::format("the {} response could not be serialized: {}",
                        service_internal::method_name(method), serialized.error_message())};
  }
  return grpc::Status::OK;
}

// Parses, handles and answers one call; `response` is the call's buffer.
// Never throws.
grpc::Status answer(RequestHandler& handler, Method method, const grpc::ByteBuffer* request,
                    grpc::ByteBuffer* response, const CallContext& call) noexcept {
  try {
    Result<std::unique_ptr<google::protobuf::Message>> out = internal_error("not handled");
    if (!request->Valid()) {
      // No payload at all: an empty message.
      out = handler.handle(method, std::string_view(), call);
      return finish_answer(method, out, response);
    }
    grpc::ByteBuffer copy(*request);  // ProtoBufferReader wants a mutable buffer; shares slices
    grpc::ProtoBufferReader reader(&copy);
    if (!reader.status().ok()) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              fmt::format("the {} request could not be read: {}",
                          service_internal::method_name(method), reader.status().error_message())};
    }
    out = handler.handle(method, reader, static_cast<int64_t>(request->Length()), call);
    return finish_answer(method, out, response);
  } catch (const std::bad_alloc&) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            fmt::format("{}: the server ran out of memory", service_internal::method_name(method))};
  } catch (const std::exception& e) {
    return {grpc::StatusCode::INTERNAL,
            fmt::format("{}: {}", service_internal::method_name(method), e.what())};
  } catch (...) {
    return {grpc::StatusCode::INTERNAL,
            fmt::format("{}: an unknown exception", service_internal::method_name(method))};
  }
}

// A short RPC, answered on the gRPC callback thread.
grpc::ServerUnaryReactor* answer_now(RequestHandler& handler, Method method,
                                     grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(answer(handler, method, request, response, call_context(*context, {})));
  return reactor;
}

// Run and PartialRun, on an executor thread. The reactor is returned at
// once so that gRPC can deliver the client's cancellation while the step
// runs; the context, request and response live until the reactor's OnDone,
// which comes after Finish.
grpc::ServerUnaryReactor* answer_later(RequestHandler& handler,
                                       service_internal::CallExecutor& executor, Method method,
                                       grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) {
  auto* reactor = new StopReactor();
  try {
    executor.submit([&handler, method, context, request, response, reactor] {
      reactor->Finish(answer(handler, method, request, response,
                             call_context(*context, reactor->stop_token())));
    });
  } catch (const std::exception& e) {
    reactor->Finish({grpc::StatusCode::RESOURCE_EXHAUSTED,
                     fmt::format("{}: the server could not queue the call: {}",
                                 service_internal::method_name(method), e.what())});
  }
  return reactor;
}

}  // namespace

std::string cap_status_message(std::string_view message, std::size_t max_bytes) {
  if (message.size() <= max_bytes) return std::string(message);
  // The suffix's digits depend on the cut, which depends on the suffix:
  // start from the longest suffix, then keep more while the count shrinks
  // (keep only grows, so this ends within a few rounds).
  const auto suffix_size = [&](std::size_t keep) {
    return fmt::formatted_size("... ({} bytes cut)", message.size() - keep);
  };
  std::size_t keep = 0;
  for (;;) {
    const std::size_t suffix = suffix_size(keep);
    const std::size_t next = max_bytes > suffix ? max_bytes - suffix : 0;
    if (next <= keep) break;
    keep = next;
  }
  // Do not split a UTF-8 sequence: back up over continuation bytes.
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  std::string out(message.substr(0, keep));
  out += fmt::format("... ({} bytes cut)", message.size() - keep);
  return out;
}

grpc::Status to_grpc_status(const Status& status) {
  if (status.is_ok()) return grpc::Status::OK;
  return {static_cast<grpc::StatusCode>(status.code()), cap_status_message(status.message())};
}

SessionServiceImpl::SessionServiceImpl(SessionRegistry& registry, std::size_t max_step_threads)
    : handler_(std::make_unique<RequestHandler>(registry)),
      executor_(std::make_unique<service_internal::CallExecutor>(max_step_threads)) {}

// The executor first: its destructor runs and waits for the queued steps,
// which use the handler.
SessionServiceImpl::~SessionServiceImpl() { executor_.reset(); }

#define GRAPHRUN_ANSWER_NOW(Name)                                                          \
  grpc::ServerUnaryReactor* SessionServiceImpl::Name(grpc::CallbackServerContext* context, \
                                                     const grpc::ByteBuffer* request,      \
                                                     grpc::ByteBuffer* response) {         \
    return answer_now(*handler_, Method::k##Name, context, request, response);             \
  }
GRAPHRUN_ANSWER_NOW(CreateSession)
GRAPHRUN_ANSWER_NOW(ExtendSession)
GRAPHRUN_ANSWER_NOW(PartialRunSetup)
GRAPHRUN_ANSWER_NOW(CancelPartialRun)
GRAPHRUN_ANSWER_NOW(CloseSession)
GRAPHRUN_ANSWER_NOW(ListSessions)
#undef GRAPHRUN_ANSWER_NOW

grpc::ServerUnaryReactor* SessionServiceImpl::Run(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return answer_later(*handler_, *executor_, Method::kRun, context, request, response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::PartialRun(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return answer_later(*handler_, *executor_, Method::kPartialRun, context, request, response);
}

}  // namespace graphrun
