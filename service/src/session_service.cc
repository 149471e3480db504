#include <fmt/format.h>
#include <graphrun/graph_def.h>
#include <graphrun/session_service.h>

#include "service/src/call_executor.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <stop_token>
#include <utility>
#include <vector>

namespace graphrun {
namespace {

grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* context, const Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(to_grpc_status(status));
  return reactor;
}

// The bytes a TensorProto decodes to, computed before decoding (a single
// typed value may ask for any shape). Saturates past kMaxTensorProtoBytes;
// malformed shapes count 0 and fail in tensor_from_proto.
int64_t proto_tensor_bytes(const v1::TensorProto& proto) {
  if (!proto.tensor_content().empty()) return static_cast<int64_t>(proto.tensor_content().size());
  int64_t size = 8;
  switch (proto.dtype()) {
    case v1::DT_BOOL: size = 1; break;
    case v1::DT_FLOAT:
    case v1::DT_INT32: size = 4; break;
    default: break;
  }
  int64_t bytes = size;
  for (const auto& dim : proto.tensor_shape().dim()) {
    if (dim.size() <= 0) return 0;
    if (bytes > kMaxTensorProtoBytes / dim.size()) return kMaxTensorProtoBytes + 1;
    bytes *= dim.size();
  }
  return bytes;
}

template <typename Feeds>
Result<NamedTensors> decode_feeds(const SessionRegistry& registry, const Feeds& feeds) {
  int64_t bytes = 0;
  for (const v1::NamedTensorProto& feed : feeds) {
    bytes = std::min(bytes + proto_tensor_bytes(feed.tensor()), kMaxTensorProtoBytes + 1);
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
RunOptions run_options(const grpc::CallbackServerContext& context, const v1::RunOptions& proto) {
  RunOptions options;
  options.trace = proto.trace();
  if (proto.timeout_ms() > 0) options.timeout = std::chrono::milliseconds(proto.timeout_ms());
  const auto deadline = context.deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    const auto left = std::max(
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::system_clock::now()),
        std::chrono::milliseconds(0));
    if (!options.timeout || left < *options.timeout) options.timeout = left;
  }
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

void encode_response(const std::vector<std::string>& fetches, const std::vector<Tensor>& values,
                     const RunMetadata& metadata, bool trace, v1::RunResponse* response) {
  for (std::size_t i = 0; i < fetches.size() && i < values.size(); ++i) {
    v1::NamedTensorProto* out = response->add_tensor();
    out->set_name(fetches[i]);
    *out->mutable_tensor() = tensor_to_proto(values[i]);
  }
  if (!trace) return;
  v1::StepStats* stats = response->mutable_metadata()->mutable_step_stats();
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
}

// The reactor of a Run or PartialRun call: a client's cancellation (or its
// deadline passing) requests a stop on the step's RunOptions::stop_token.
class StepReactor final : public grpc::ServerUnaryReactor {
 public:
  std::stop_token stop_token() const { return stop_.get_token(); }
  void OnCancel() override { stop_.request_stop(); }
  void OnDone() override { delete this; }  // after Finish; the step is over

 private:
  std::stop_source stop_;
};

// Run and PartialRun, on an executor thread: decode the feeds, run `step`
// (feeds, fetches, options, metadata or null) with the call's options and
// stop token, encode the fetches in request order and, when tracing, the
// step statistics. The reactor is returned at once so that gRPC can deliver
// the client's cancellation while the step runs.
template <typename Request, typename Step>
grpc::ServerUnaryReactor* serve_step(service_internal::CallExecutor& executor,
                                     const SessionRegistry& registry,
                                     grpc::CallbackServerContext* context, const Request* request,
                                     v1::RunResponse* response, Step step) {
  auto* reactor = new StepReactor();
  // The context, request and response live until the reactor's OnDone,
  // which comes after Finish.
  executor.submit([&registry, context, request, response, reactor, step = std::move(step)] {
    const Status status = [&]() -> Status {
      GRAPHRUN_ASSIGN_OR_RETURN(NamedTensors feeds, decode_feeds(registry, request->feed()));
      const std::vector<std::string> fetches = names(request->fetch());
      RunOptions options = run_options(*context, request->options());
      options.stop_token = reactor->stop_token();
      RunMetadata metadata;
      GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                                step(feeds, fetches, options, options.trace ? &metadata : nullptr));
      encode_response(fetches, out, metadata, options.trace, response);
      return Status::ok();
    }();
    reactor->Finish(to_grpc_status(status));
  });
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
    : registry_(registry),
      executor_(std::make_unique<service_internal::CallExecutor>(max_step_threads)) {}

SessionServiceImpl::~SessionServiceImpl() = default;

grpc::ServerUnaryReactor* SessionServiceImpl::CreateSession(grpc::CallbackServerContext* context,
                                                            const v1::CreateSessionRequest* request,
                                                            v1::CreateSessionResponse* response) {
  SessionOptions options;
  const v1::SessionConfig& config = request->config();
  if (config.inter_op_threads() < 0 || config.plan_cache_capacity() < 0 ||
      config.max_open_partial_runs() < 0 || config.partial_run_idle_timeout_ms() < 0) {
    return finish(context, invalid_argument("SessionConfig fields must not be negative"));
  }
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
  Result<SessionRegistry::Created> created = registry_.create(request->graph_def(), options);
  if (!created.is_ok()) return finish(context, created.status());
  response->set_session_handle(created->handle);
  response->set_graph_version(created->graph_version);
  return finish(context, Status::ok());
}

grpc::ServerUnaryReactor* SessionServiceImpl::ExtendSession(grpc::CallbackServerContext* context,
                                                            const v1::ExtendSessionRequest* request,
                                                            v1::ExtendSessionResponse* response) {
  Result<int64_t> version = registry_.extend(request->session_handle(), request->graph_def(),
                                             request->current_graph_version());
  if (!version.is_ok()) return finish(context, version.status());
  response->set_new_graph_version(*version);
  return finish(context, Status::ok());
}

grpc::ServerUnaryReactor* SessionServiceImpl::Run(grpc::CallbackServerContext* context,
                                                  const v1::RunRequest* request,
                                                  v1::RunResponse* response) {
  return serve_step(
      *executor_, registry_, context, request, response,
      [this, request](const NamedTensors& feeds, const std::vector<std::string>& fetches,
                      const RunOptions& options, RunMetadata* metadata) {
        return registry_.run(request->session_handle(), feeds, fetches, names(request->target()),
                             options, metadata);
      });
}

grpc::ServerUnaryReactor* SessionServiceImpl::PartialRunSetup(
    grpc::CallbackServerContext* context, const v1::PartialRunSetupRequest* request,
    v1::PartialRunSetupResponse* response) {
  Result<std::string> id = registry_.partial_run_setup(
      request->session_handle(), names(request->feed()), names(request->fetch()),
      names(request->target()), run_options(*context, request->options()));
  if (!id.is_ok()) return finish(context, id.status());
  response->set_partial_run_handle(*id);
  return finish(context, Status::ok());
}

grpc::ServerUnaryReactor* SessionServiceImpl::PartialRun(grpc::CallbackServerContext* context,
                                                         const v1::PartialRunRequest* request,
                                                         v1::RunResponse* response) {
  return serve_step(
      *executor_, registry_, context, request, response,
      [this, request](const NamedTensors& feeds, const std::vector<std::string>& fetches,
                      const RunOptions& options, RunMetadata* metadata) {
        return registry_.partial_run(request->session_handle(), request->partial_run_handle(),
                                     feeds, fetches, names(request->target()), options, metadata);
      });
}

grpc::ServerUnaryReactor* SessionServiceImpl::CancelPartialRun(
    grpc::CallbackServerContext* context, const v1::CancelPartialRunRequest* request,
    v1::CancelPartialRunResponse* /*response*/) {
  return finish(context, registry_.cancel_partial_run(request->session_handle(),
                                                      request->partial_run_handle()));
}

grpc::ServerUnaryReactor* SessionServiceImpl::CloseSession(grpc::CallbackServerContext* context,
                                                           const v1::CloseSessionRequest* request,
                                                           v1::CloseSessionResponse* /*response*/) {
  return finish(context, registry_.close(request->session_handle()));
}

grpc::ServerUnaryReactor* SessionServiceImpl::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  for (const SessionInfo& info : registry_.list()) {
    v1::SessionInfo* out = response->add_sessions();
    out->set_session_handle(info.handle);
    out->set_graph_version(info.graph_version);
    out->set_num_nodes(info.num_nodes);
    out->set_open_partial_runs(info.open_partial_runs);
    out->set_idle_ms(info.idle.count());
  }
  return finish(context, Status::ok());
}

}  // namespace graphrun
