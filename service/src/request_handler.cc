#include "service/src/request_handler.h"

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <graphrun/graph_def.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace graphrun::service_internal {
namespace {

// ---- protobuf's log lines ----

// The last line protobuf logged on this thread (parse_message clears it
// first, so after a failed parse it is that parse's reason, if any).
thread_local std::string t_last_protobuf_message;

// At most kLogBurst lines per kLogWindow reach stderr; the rest are
// counted and summed up in the next window's first line.
constexpr int kLogBurst = 10;
constexpr std::chrono::seconds kLogWindow(60);

void rate_limited_log(google::protobuf::LogLevel level, const char* /*filename*/, int /*line*/,
                      const std::string& message) {
  t_last_protobuf_message = message;
  static std::mutex mu;
  static std::chrono::steady_clock::time_point window_start;
  static int printed = 0;
  static int64_t suppressed = 0;
  const std::lock_guard lock(mu);
  const auto now = std::chrono::steady_clock::now();
  if (now - window_start >= kLogWindow) {
    if (suppressed > 0) {
      std::fprintf(stderr, "graphrun: %lld protobuf log lines suppressed in the last %lld s\n",
                   static_cast<long long>(suppressed), static_cast<long long>(kLogWindow.count()));
    }
    window_start = now;
    printed = 0;
    suppressed = 0;
  }
  if (printed >= kLogBurst && level < google::protobuf::LOGLEVEL_FATAL) {
    ++suppressed;
    return;
  }
  ++printed;
  static constexpr std::array<const char*, 4> kLevels = {"info", "warning", "error", "fatal"};
  const auto index = static_cast<std::size_t>(level);
  std::fprintf(stderr, "graphrun: protobuf %s: %s\n",
               index < kLevels.size() ? kLevels[index] : "log", message.c_str());
}

// ---- requests ----

template <typename Feeds>
Result<NamedTensors> decode_feeds(const SessionRegistry& registry, const Feeds& feeds) {
  int64_t bytes = 0;
  for (const v1::NamedTensorProto& feed : feeds) {
    bytes = std::min(bytes + tensor_proto_bytes(feed.tensor()), kMaxTensorProtoBytes + 1);
  }
  GRAPHRUN_RETURN_IF_ERROR(registry.check_request_bytes(bytes));
  NamedTensors out;
  out.reserve(static_cast<std::size_t>(feeds.size()));
  for (const v1::NamedTensorProto& feed : feeds) {
    Result<Tensor> value = tensor_from_proto(feed.tensor());
    if (!value.is_ok()) return value.status().with_prefix(fmt::format("feed '{}'", feed.name()));
    out.emplace_back(feed.name(), std::move(value).value());
  }
  return out;
}

std::vector<std::string> names(const google::protobuf::RepeatedPtrField<std::string>& field) {
  return {field.begin(), field.end()};
}

// The request's options, with the call's deadline as a timeout when it is
// sooner than the request's own.
Result<RunOptions> run_options(const CallContext& call, const v1::RunOptions& proto) {
  if (proto.timeout_ms() < 0) {
    return invalid_argument("RunOptions.timeout_ms must not be negative, got {}",
                            proto.timeout_ms());
  }
  RunOptions options;
  options.trace = proto.trace();
  if (proto.timeout_ms() > 0) options.timeout = std::chrono::milliseconds(proto.timeout_ms());
  if (call.deadline) {
    const auto left = std::max(std::chrono::ceil<std::chrono::milliseconds>(
                                   *call.deadline - std::chrono::system_clock::now()),
                               std::chrono::milliseconds(0));
    if (!options.timeout || left < *options.timeout) options.timeout = left;
  }
  options.stop_token = call.stop;
  return options;
}

v1::TensorShapeProto shape_to_proto(const Shape& shape) {
  v1::TensorShapeProto proto;
  if (shape.is_unknown_rank()) {
    proto.set_unknown_rank(true);
    return proto;
  }
  for (int i = 0; i < shape.rank(); ++i) proto.add_dim()->set_size(shape.dim(i));
  return proto;
}

// The encoded response against `max_bytes`: what the fetches' check cannot
// see (the framing, the trace's statistics).
Status check_encoded_bytes(std::string_view method, const v1::RunResponse& response,
                           int64_t max_bytes) {
  const auto bytes = static_cast<int64_t>(response.ByteSizeLong());
  if (bytes <= max_bytes) return Status::ok();
  return resource_exhausted(
      "the {} response would take {} bytes ({} fetched tensors{}), over the server's largest "
      "message of {} bytes (max_message_bytes)",
      method, bytes, response.tensor_size(),
      response.has_metadata() ? " and the step statistics" : "", max_bytes);
}

// The fetched tensors against the largest response the server may send,
// before anything is copied into a response: the sum of their bytes and
// names (a lower bound of the encoded size; the same tensor fetched N times
// counts N times, as it is encoded N times). ResourceExhausted naming the
// limit, the size and the largest fetch.
Status check_fetched_bytes(std::string_view method, const std::vector<std::string>& fetches,
                           const std::vector<Tensor>& values, int64_t max_bytes) {
  int64_t total = 0;
  std::size_t largest = 0;
  int64_t largest_bytes = -1;
  for (std::size_t i = 0; i < fetches.size() && i < values.size(); ++i) {
    const auto bytes = static_cast<int64_t>(values[i].byte_size());
    total += bytes + static_cast<int64_t>(fetches[i].size());
    if (bytes > largest_bytes) {
      largest_bytes = bytes;
      largest = i;
    }
  }
  if (total <= max_bytes) return Status::ok();
  return resource_exhausted(
      "the {} response would take at least {} bytes for its {} fetched tensors, the largest "
      "'{}' ({} bytes), over the server's largest message of {} bytes (max_message_bytes); "
      "fetch less (each fetch of a tensor is sent in full)",
      method, total, std::min(fetches.size(), values.size()), fetches[largest], largest_bytes,
      max_bytes);
}

// Fills `response` with the fetches (checked against `max_bytes` first:
// check_fetched_bytes) and, when tracing, the step statistics; then checks
// the encoded size itself, so that a response over the limit is
// ResourceExhausted here, never a failure to serialize.
Status encode_response(std::string_view method, const std::vector<std::string>& fetches,
                       const std::vector<Tensor>& values, const RunMetadata& metadata, bool trace,
                       int64_t max_bytes, v1::RunResponse& response) {
  GRAPHRUN_RETURN_IF_ERROR(check_fetched_bytes(method, fetches, values, max_bytes));
  for (std::size_t i = 0; i < fetches.size() && i < values.size(); ++i) {
    v1::NamedTensorProto* out = response.add_tensor();
    out->set_name(fetches[i]);
    *out->mutable_tensor() = tensor_to_proto(values[i]);
  }
  if (!trace) return check_encoded_bytes(method, response, max_bytes);
  response.mutable_metadata()->set_cpu_isa(metadata.cpu_isa);
  v1::StepStats* stats = response.mutable_metadata()->mutable_step_stats();
  for (const NodeExecStats& node : metadata.step_stats) {
    v1::NodeExecStats* out = stats->add_node_stats();
    out->set_node(node.node);
    out->set_op(node.op);
    out->set_start_ns(node.start_ns);
    out->set_end_ns(node.end_ns);
    out->set_thread(node.thread);
    for (const Shape& shape : node.output_shapes) *out->add_output_shapes() = shape_to_proto(shape);
    out->set_output_bytes(node.output_bytes);
  }
  return check_encoded_bytes(method, response, max_bytes);
}

// What Run and PartialRun take from their request before the step: the
// options (the call's deadline folded in), the decoded feeds and the fetch
// names, in request order.
struct StepArgs {
  RunOptions options;
  NamedTensors feeds;
  std::vector<std::string> fetches;
};

template <typename Request>
Result<StepArgs> decode_step(const SessionRegistry& registry, const Request& request,
                             const CallContext& call) {
  StepArgs args;
  GRAPHRUN_ASSIGN_OR_RETURN(args.options, run_options(call, request.options()));
  GRAPHRUN_ASSIGN_OR_RETURN(args.feeds, decode_feeds(registry, request.feed()));
  args.fetches = names(request.fetch());
  return args;
}

// Run and PartialRun: decode the request, run `step` (feeds, fetches,
// options, metadata or null), encode the fetches in request order and, when
// tracing, the step statistics.
template <typename Request, typename Step>
Status serve_step(const SessionRegistry& registry, std::string_view method, int64_t max_bytes,
                  const Request& request, const CallContext& call, v1::RunResponse& response,
                  Step step) {
  GRAPHRUN_ASSIGN_OR_RETURN(StepArgs args, decode_step(registry, request, call));
  RunMetadata metadata;
  GRAPHRUN_ASSIGN_OR_RETURN(
      std::vector<Tensor> out,
      step(args.feeds, args.fetches, args.options, args.options.trace ? &metadata : nullptr));
  return encode_response(method, args.fetches, out, metadata, args.options.trace, max_bytes,
                         response);
}

// An Answer called at most once: the first call goes through, later ones
// (an exception after the step was started) are dropped.
class AnswerOnce {
 public:
  explicit AnswerOnce(RequestHandler::Answer answer) : answer_(std::move(answer)) {}
  void operator()(Result<std::unique_ptr<google::protobuf::Message>> out,
                  std::shared_ptr<void> hold) {
    if (answered_.exchange(true, std::memory_order_acq_rel)) return;  // the first call wins
    answer_(std::move(out), std::move(hold));
  }

 private:
  RequestHandler::Answer answer_;
  std::atomic<bool> answered_{false};
};

// The step's done for Run and PartialRun: the RunResponse (fetches in
// request order, statistics when tracing) or the step's status.
SessionRegistry::StepDone answer_step(std::shared_ptr<AnswerOnce> answer, std::string_view method,
                                      int64_t max_bytes, std::vector<std::string> fetches,
                                      bool trace) {
  return [answer = std::move(answer), method, max_bytes, fetches = std::move(fetches), trace](
             Result<std::vector<Tensor>> out, RunMetadata* metadata, std::shared_ptr<void> hold) {
    if (!out.is_ok()) return (*answer)(out.status(), std::move(hold));
    try {
      auto response = std::make_unique<v1::RunResponse>();
      Status encoded =
          encode_response(method, fetches, *out, metadata != nullptr ? *metadata : RunMetadata{},
                          trace, max_bytes, *response);
      if (!encoded.is_ok()) return (*answer)(std::move(encoded), std::move(hold));
      (*answer)(std::unique_ptr<google::protobuf::Message>(std::move(response)), std::move(hold));
    } catch (const std::bad_alloc&) {
      (*answer)(resource_exhausted("the server ran out of memory encoding the response"),
                std::move(hold));
    } catch (const std::exception& e) {
      (*answer)(internal_error("encoding the response: {}", e.what()), std::move(hold));
    }
  };
}

Status check_not_negative(std::string_view field, int64_t value) {
  if (value < 0)
    return invalid_argument("SessionConfig.{} must not be negative, got {}", field, value);
  return Status::ok();
}

// Parses a `Request`, then answers it with `fn(request, response)`.
template <typename Request, typename Response, typename F>
Result<std::unique_ptr<google::protobuf::Message>> parse_and(
    google::protobuf::io::ZeroCopyInputStream& input, int64_t size, Method method, F&& fn) {
  Request request;
  GRAPHRUN_RETURN_IF_ERROR(
      parse_message(input, size, request, fmt::format("the {} request", method_name(method))));
  auto response = std::make_unique<Response>();
  GRAPHRUN_RETURN_IF_ERROR(fn(request, *response));
  return std::unique_ptr<google::protobuf::Message>(std::move(response));
}

}  // namespace

std::string_view method_name(Method method) {
  switch (method) {
    case Method::kCreateSession: return "CreateSession";
    case Method::kExtendSession: return "ExtendSession";
    case Method::kRun: return "Run";
    case Method::kPartialRunSetup: return "PartialRunSetup";
    case Method::kPartialRun: return "PartialRun";
    case Method::kCancelPartialRun: return "CancelPartialRun";
    case Method::kCloseSession: return "CloseSession";
    case Method::kListSessions: return "ListSessions";
  }
  return "?";
}

void install_protobuf_log_handler() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&rate_limited_log); });
}

Status parse_message(google::protobuf::io::ZeroCopyInputStream& input, int64_t size,
                     google::protobuf::Message& message, std::string_view what) {
  if (size > INT_MAX) {
    return invalid_argument("{} has {} bytes; protobuf's limit is 2 GiB", what, size);
  }
  t_last_protobuf_message.clear();
  bool parsed = false;
  {
    google::protobuf::io::CodedInputStream coded(&input);
    coded.SetRecursionLimit(kMaxRequestNesting);
    coded.SetTotalBytesLimit(static_cast<int>(size));
    parsed = message.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage() &&
             coded.CurrentPosition() == size;
  }
  if (parsed) return Status::ok();
  std::string reason = std::move(t_last_protobuf_message);
  if (reason.empty()) {
    reason = fmt::format(
        "not a valid {} (truncated or malformed protobuf data, or messages nested deeper than {})",
        message.GetTypeName(), kMaxRequestNesting);
  }
  return invalid_argument("{} ({} bytes) could not be parsed: {}", what, size, reason);
}

RequestHandler::RequestHandler(SessionRegistry& registry, int64_t max_response_bytes)
    : registry_(registry),
      max_response_bytes_(std::clamp<int64_t>(max_response_bytes, 0, kMaxResponseBytes)) {
  install_protobuf_log_handler();
}

Result<std::unique_ptr<google::protobuf::Message>> RequestHandler::handle(
    Method method, std::string_view request, const CallContext& call) noexcept {
  google::protobuf::io::ArrayInputStream input(
      request.data(), static_cast<int>(std::min<std::size_t>(request.size(), INT_MAX)));
  return handle(method, input, static_cast<int64_t>(request.size()), call);
}

Result<std::unique_ptr<google::protobuf::Message>> RequestHandler::handle(
    Method method, google::protobuf::io::ZeroCopyInputStream& in, int64_t size,
    const CallContext& call) noexcept {
  try {
    switch (method) {
      case Method::kCreateSession:
        return parse_and<v1::CreateSessionRequest, v1::CreateSessionResponse>(
            in, size, method, [&](const auto& rq, auto& rs) { return create_session(rq, rs); });
      case Method::kExtendSession:
        return parse_and<v1::ExtendSessionRequest, v1::ExtendSessionResponse>(
            in, size, method, [&](const auto& rq, auto& rs) { return extend_session(rq, rs); });
      case Method::kRun:
        return parse_and<v1::RunRequest, v1::RunResponse>(
            in, size, method, [&](const auto& rq, auto& rs) { return run(rq, call, rs); });
      case Method::kPartialRunSetup:
        return parse_and<v1::PartialRunSetupRequest, v1::PartialRunSetupResponse>(
            in, size, method,
            [&](const auto& rq, auto& rs) { return partial_run_setup(rq, call, rs); });
      case Method::kPartialRun:
        return parse_and<v1::PartialRunRequest, v1::RunResponse>(
            in, size, method, [&](const auto& rq, auto& rs) { return partial_run(rq, call, rs); });
      case Method::kCancelPartialRun:
        return parse_and<v1::CancelPartialRunRequest, v1::CancelPartialRunResponse>(
            in, size, method, [&](const auto& rq, auto&) { return cancel_partial_run(rq); });
      case Method::kCloseSession:
        return parse_and<v1::CloseSessionRequest, v1::CloseSessionResponse>(
            in, size, method, [&](const auto& rq, auto&) { return close_session(rq); });
      case Method::kListSessions:
        return parse_and<v1::ListSessionsRequest, v1::ListSessionsResponse>(
            in, size, method, [&](const auto&, auto& rs) { return list_sessions(rs); });
    }
    return unimplemented("unknown SessionService method {}", static_cast<int>(method));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("{}: the server ran out of memory handling the request",
                              method_name(method));
  } catch (const std::exception& e) {
    return internal_error("{}: {}", method_name(method), e.what());
  } catch (...) {
    return internal_error("{}: an unknown exception", method_name(method));
  }
}

void RequestHandler::handle_async(Method method, google::protobuf::io::ZeroCopyInputStream& in,
                                  int64_t size, const CallContext& call, Answer answer) noexcept {
  if (method != Method::kRun && method != Method::kPartialRun) {
    answer(handle(method, in, size, call), nullptr);
    return;
  }
  auto once = std::make_shared<AnswerOnce>(std::move(answer));
  const auto fail = [&](Status status) { (*once)(std::move(status), nullptr); };
  try {
    const std::string what = fmt::format("the {} request", method_name(method));
    if (method == Method::kRun) {
      v1::RunRequest request;
      if (Status s = parse_message(in, size, request, what); !s.is_ok()) return fail(std::move(s));
      run_async(request, call,
                [once](auto out, auto hold) { (*once)(std::move(out), std::move(hold)); });
    } else {
      v1::PartialRunRequest request;
      if (Status s = parse_message(in, size, request, what); !s.is_ok()) return fail(std::move(s));
      partial_run_async(request, call,
                        [once](auto out, auto hold) { (*once)(std::move(out), std::move(hold)); });
    }
  } catch (const std::bad_alloc&) {
    fail(resource_exhausted("{}: the server ran out of memory handling the request",
                            method_name(method)));
  } catch (const std::exception& e) {
    fail(internal_error("{}: {}", method_name(method), e.what()));
  } catch (...) {
    fail(internal_error("{}: an unknown exception", method_name(method)));
  }
}

void RequestHandler::run_async(const v1::RunRequest& request, const CallContext& call,
                               Answer answer) {
  auto once = std::make_shared<AnswerOnce>(std::move(answer));
  Result<StepArgs> args = decode_step(registry_, request, call);
  if (!args.is_ok()) return (*once)(args.status(), nullptr);
  const bool trace = args->options.trace;
  registry_.run_async(
      request.session_handle(), args->feeds, args->fetches, names(request.target()), args->options,
      answer_step(once, method_name(Method::kRun), max_response_bytes_, args->fetches, trace));
}

void RequestHandler::partial_run_async(const v1::PartialRunRequest& request,
                                       const CallContext& call, Answer answer) {
  auto once = std::make_shared<AnswerOnce>(std::move(answer));
  Result<StepArgs> args = decode_step(registry_, request, call);
  if (!args.is_ok()) return (*once)(args.status(), nullptr);
  const bool trace = args->options.trace;
  registry_.partial_run_async(request.session_handle(), request.partial_run_handle(), args->feeds,
                              args->fetches, names(request.target()), args->options,
                              answer_step(once, method_name(Method::kPartialRun),
                                          max_response_bytes_, args->fetches, trace));
}

Status RequestHandler::create_session(const v1::CreateSessionRequest& request,
                                      v1::CreateSessionResponse& response) {
  const v1::SessionConfig& config = request.config();
  GRAPHRUN_RETURN_IF_ERROR(check_not_negative("inter_op_threads", config.inter_op_threads()));
  GRAPHRUN_RETURN_IF_ERROR(check_not_negative("plan_cache_capacity", config.plan_cache_capacity()));
  GRAPHRUN_RETURN_IF_ERROR(
      check_not_negative("max_open_partial_runs", config.max_open_partial_runs()));
  GRAPHRUN_RETURN_IF_ERROR(
      check_not_negative("partial_run_idle_timeout_ms", config.partial_run_idle_timeout_ms()));
  const int max_threads = registry_.max_inter_op_threads();
  if (config.inter_op_threads() > max_threads) {
    return invalid_argument(
        "SessionConfig.inter_op_threads = {} exceeds this server's limit of {} "
        "(max_inter_op_threads)",
        config.inter_op_threads(), max_threads);
  }
  SessionOptions options;
  options.inter_op_threads = config.inter_op_threads();
  if (config.plan_cache_capacity() > 0) {
    options.plan_cache_capacity = static_cast<std::size_t>(config.plan_cache_capacity());
  }
  if (config.max_open_partial_runs() > 0) {
    options.max_open_partial_runs = static_cast<std::size_t>(config.max_open_partial_runs());
  }
  if (config.partial_run_idle_timeout_ms() > 0) {
    options.partial_run_idle_timeout =
        std::chrono::milliseconds(config.partial_run_idle_timeout_ms());
  }
  GRAPHRUN_ASSIGN_OR_RETURN(SessionRegistry::Created created,
                            registry_.create(request.graph_def(), options));
  response.set_session_handle(created.handle);
  response.set_graph_version(created.graph_version);
  return Status::ok();
}

Status RequestHandler::extend_session(const v1::ExtendSessionRequest& request,
                                      v1::ExtendSessionResponse& response) {
  GRAPHRUN_ASSIGN_OR_RETURN(int64_t version,
                            registry_.extend(request.session_handle(), request.graph_def(),
                                             request.current_graph_version()));
  response.set_new_graph_version(version);
  return Status::ok();
}

Status RequestHandler::run(const v1::RunRequest& request, const CallContext& call,
                           v1::RunResponse& response) {
  return serve_step(registry_, method_name(Method::kRun), max_response_bytes_, request, call,
                    response,
                    [&](const NamedTensors& feeds, const std::vector<std::string>& fetches,
                        const RunOptions& options, RunMetadata* metadata) {
                      return registry_.run(request.session_handle(), feeds, fetches,
                                           names(request.target()), options, metadata);
                    });
}

Status RequestHandler::partial_run_setup(const v1::PartialRunSetupRequest& request,
                                         const CallContext& call,
                                         v1::PartialRunSetupResponse& response) {
  GRAPHRUN_ASSIGN_OR_RETURN(RunOptions options, run_options(call, request.options()));
  // The call's stop ends the call, not the run it sets up (the run outlives
  // the call; a client cancels it with CancelPartialRun).
  options.stop_token = {};
  GRAPHRUN_ASSIGN_OR_RETURN(
      std::string id,
      registry_.partial_run_setup(request.session_handle(), names(request.feed()),
                                  names(request.fetch()), names(request.target()), options));
  response.set_partial_run_handle(id);
  return Status::ok();
}

Status RequestHandler::partial_run(const v1::PartialRunRequest& request, const CallContext& call,
                                   v1::RunResponse& response) {
  return serve_step(
      registry_, method_name(Method::kPartialRun), max_response_bytes_, request, call, response,
      [&](const NamedTensors& feeds, const std::vector<std::string>& fetches,
          const RunOptions& options, RunMetadata* metadata) {
        return registry_.partial_run(request.session_handle(), request.partial_run_handle(), feeds,
                                     fetches, names(request.target()), options, metadata);
      });
}

Status RequestHandler::cancel_partial_run(const v1::CancelPartialRunRequest& request) {
  return registry_.cancel_partial_run(request.session_handle(), request.partial_run_handle());
}

Status RequestHandler::close_session(const v1::CloseSessionRequest& request) {
  return registry_.close(request.session_handle());
}

Status RequestHandler::list_sessions(v1::ListSessionsResponse& response) {
  for (const SessionInfo& info : registry_.list()) {
    v1::SessionInfo* out = response.add_sessions();
    out->set_session_handle(info.handle);
    out->set_graph_version(info.graph_version);
    out->set_num_nodes(info.num_nodes);
    out->set_open_partial_runs(info.open_partial_runs);
    out->set_idle_ms(info.idle.count());
  }
  return Status::ok();
}

}  // namespace graphrun::service_internal
