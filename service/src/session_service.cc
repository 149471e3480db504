#include <fmt/format.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <graphrun/session_service.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "service/src/request_handler.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
#include <utility>

namespace graphrun {
namespace {

using service_internal::CallContext;
using service_internal::Method;
using service_internal::RequestHandler;

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

// The call's answer as a grpc::Status for an exception that escaped
// (bad_alloc: the server ran out of memory).
grpc::Status exception_status(Method method) noexcept {
  try {
    throw;
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

// Parses `request` and hands it to the handler: `answer_with(handler,
// stream, size)` for a payload, or over an empty message when there is
// none. The unreadable request's status, else OK.
template <typename F>
grpc::Status with_request(Method method, const grpc::ByteBuffer* request, F&& answer_with) {
  if (!request->Valid()) {
    // No payload at all: an empty message.
    google::protobuf::io::ArrayInputStream empty(nullptr, 0);
    answer_with(empty, int64_t{0});
    return grpc::Status::OK;
  }
  grpc::ByteBuffer copy(*request);  // ProtoBufferReader wants a mutable buffer; shares slices
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok()) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("the {} request could not be read: {}",
                        service_internal::method_name(method), reader.status().error_message())};
  }
  answer_with(reader, static_cast<int64_t>(request->Length()));
  return grpc::Status::OK;
}

// Parses, handles and answers one call; `response` is the call's buffer.
// Never throws.
grpc::Status answer(RequestHandler& handler, Method method, const grpc::ByteBuffer* request,
                    grpc::ByteBuffer* response, const CallContext& call) noexcept {
  try {
    grpc::Status status;
    grpc::Status read = with_request(
        method, request, [&](google::protobuf::io::ZeroCopyInputStream& in, int64_t size) {
          status = finish_answer(method, handler.handle(method, in, size, call), response);
        });
    return read.ok() ? status : read;
  } catch (...) {
    return exception_status(method);
  }
}

// The reactor of a Run or PartialRun call: a client's cancellation (or its
// deadline passing) requests a stop on the step's RunOptions::stop_token;
// the step's done finishes it. It holds the call's session (so that the
// session is never destroyed from its own done) until gRPC is done with
// the call (OnDone), and its place among the calls in flight until it is
// answered: an answered call (or a refused one) no longer counts, though
// gRPC may take a while to clean it up (counting it until OnDone refused
// calls while fewer than the limit ran, and refusals fed the count).
class StepReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit StepReactor(std::atomic<std::size_t>& in_flight) : in_flight_(in_flight) {}
  std::stop_token stop_token() const { return stop_.get_token(); }
  // Called once.
  void finish(const grpc::Status& status, std::shared_ptr<void> hold) {
    hold_ = std::move(hold);
    // release: pairs with the acquire of the next call's increment. Before
    // Finish, after which OnDone may delete this at any moment.
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    Finish(status);
  }
  void OnCancel() override { stop_.request_stop(); }
  void OnDone() override {
    delete this;  // after Finish; the call is over
  }

 private:
  std::atomic<std::size_t>& in_flight_;  // not owned; the service's
  std::stop_source stop_;
  std::shared_ptr<void> hold_;  // the call's session, from its done to OnDone
};

// A short RPC, answered on the gRPC callback thread.
grpc::ServerUnaryReactor* answer_now(RequestHandler& handler, Method method,
                                     grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(answer(handler, method, request, response, call_context(*context, {})));
  return reactor;
}

// Run and PartialRun, without a thread waiting for the step: the handler
// starts the step, whose done encodes the response into `response` and
// finishes the reactor (on a pool thread, or on this one when the call
// fails before its step or a quick step ran inline). The reactor is
// returned at once so that gRPC can deliver the client's cancellation
// while the step runs; the context, request and response live until the
// reactor's OnDone, which comes after Finish. Past `max_in_flight` calls
// in flight, a call is RESOURCE_EXHAUSTED.
grpc::ServerUnaryReactor* answer_async(RequestHandler& handler, std::atomic<std::size_t>& in_flight,
                                       std::size_t max_in_flight, Method method,
                                       grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) {
  // acquire: pairs with OnDone's release
  const std::size_t before = in_flight.fetch_add(1, std::memory_order_acq_rel);
  auto* reactor = new StepReactor(in_flight);
  if (before >= max_in_flight) {
    reactor->finish({grpc::StatusCode::RESOURCE_EXHAUSTED,
                     fmt::format("{}: the server has {} Run and PartialRun calls in flight (limit "
                                 "max_calls_in_flight = {})",
                                 service_internal::method_name(method), before, max_in_flight)},
                    nullptr);
    return reactor;
  }
  try {
    const CallContext call = call_context(*context, reactor->stop_token());
    grpc::Status read = with_request(
        method, request, [&](google::protobuf::io::ZeroCopyInputStream& in, int64_t size) {
          handler.handle_async(
              method, in, size, call,
              [method, reactor, response](Result<std::unique_ptr<google::protobuf::Message>> out,
                                          std::shared_ptr<void> hold) {
                grpc::Status status;
                try {
                  status = finish_answer(method, out, response);
                } catch (...) {
                  status = exception_status(method);
                }
                reactor->finish(status, std::move(hold));
              });
        });
    if (!read.ok()) reactor->finish(read, nullptr);
  } catch (...) {
    // Only before the handler took the call (handle_async never throws).
    reactor->finish(exception_status(method), nullptr);
  }
  return reactor;
}

}  // namespace

namespace {
// Bytes a status message takes in metadata: gRPC percent-encodes every byte
// outside printable ASCII, and '%' itself, as three ("%C3%A9" for "é").
std::size_t encoded_size(unsigned char c) { return c < 0x20 || c > 0x7E || c == '%' ? 3 : 1; }
}  // namespace

std::size_t encoded_message_size(std::string_view message) {
  std::size_t n = 0;
  for (const char c : message) n += encoded_size(static_cast<unsigned char>(c));
  return n;
}

std::string cap_status_message(std::string_view message, std::size_t max_bytes) {
  if (encoded_message_size(message) <= max_bytes) return std::string(message);
  // The suffix's digits depend on the cut, which depends on the suffix:
  // start from the longest suffix, then keep more while the count shrinks
  // (keep only grows, so this ends within a few rounds). The suffix is
  // plain ASCII: its encoded size is its size.
  const auto suffix_size = [&](std::size_t keep) {
    return fmt::formatted_size("... ({} bytes cut)", message.size() - keep);
  };
  // The longest head whose encoded size is at most `budget`.
  const auto head_within = [&](std::size_t budget) {
    std::size_t used = 0;
    std::size_t k = 0;
    while (k < message.size()) {
      const std::size_t c = encoded_size(static_cast<unsigned char>(message[k]));
      if (used + c > budget) break;
      used += c;
      ++k;
    }
    return k;
  };
  std::size_t keep = 0;
  for (;;) {
    const std::size_t suffix = suffix_size(keep);
    const std::size_t next = max_bytes > suffix ? head_within(max_bytes - suffix) : 0;
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

SessionServiceImpl::SessionServiceImpl(SessionRegistry& registry, std::size_t max_calls_in_flight,
                                       int max_response_bytes)
    : handler_(std::make_unique<RequestHandler>(registry, max_response_bytes)),
      max_calls_in_flight_(max_calls_in_flight == 0 ? 1 : max_calls_in_flight) {}

SessionServiceImpl::~SessionServiceImpl() = default;

std::size_t SessionServiceImpl::calls_in_flight() const {
  return calls_in_flight_.load(std::memory_order_acquire);  // pairs with OnDone's release
}

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
  return answer_async(*handler_, calls_in_flight_, max_calls_in_flight_, Method::kRun, context,
                      request, response);
}

grpc::ServerUnaryReactor* SessionServiceImpl::PartialRun(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return answer_async(*handler_, calls_in_flight_, max_calls_in_flight_, Method::kPartialRun,
                      context, request, response);
}

}  // namespace graphrun
