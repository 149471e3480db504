#include <fmt/format.h>
#include <graphrun/graph_def.h>
#include <graphrun/remote_session.h>
#include <graphrun/v1/session_service.grpc.pb.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <utility>

#include "api/src/deadline.h"

namespace graphrun {
namespace {

// What a local Session says once it is closed (scheduler/run_state.h).
Status session_closed_status() { return cancelled("Session has been closed."); }

Status from_grpc(const grpc::Status& status) {
  if (status.ok()) return Status::ok();
  const int code = static_cast<int>(status.error_code());
  const bool known = code > 0 && code <= static_cast<int>(StatusCode::kUnauthenticated);
  return {known ? static_cast<StatusCode>(code) : StatusCode::kUnknown, status.error_message()};
}

// "x" and "x:0" name the same tensor.
std::string tensor_key(std::string_view name) {
  const std::size_t colon = name.rfind(':');
  const bool has_index = colon != std::string_view::npos && colon + 1 < name.size() &&
                         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(colon) + 1,
                                     name.end(), [](char c) { return c >= '0' && c <= '9'; });
  return has_index ? std::string(name) : fmt::format("{}:0", name);
}

// "n", "^n" and "n:0" name the same target node.
std::string target_key(std::string_view name) {
  if (!name.empty() && name.front() == '^') name.remove_prefix(1);
  const std::string key = tensor_key(name);
  return key.substr(0, key.rfind(':'));
}

std::string target_name(const TargetRef& target) { return target.to_string(); }

void set_options(const RunOptions& options, v1::RunOptions* proto) {
  proto->set_trace(options.trace);
  // On the wire 0 means "no timeout": a zero or negative timeout is the
  // smallest one instead.
  if (options.timeout) proto->set_timeout_ms(std::max<int64_t>(options.timeout->count(), 1));
}

template <typename Field>
void add_feeds(const FeedList& feeds, Field* field) {
  for (const Feed& feed : feeds) {
    v1::NamedTensorProto* out = field->Add();
    out->set_name(feed.tensor.to_string());
    *out->mutable_tensor() = tensor_to_proto(feed.value);
  }
}

Shape shape_from_proto(const v1::TensorShapeProto& proto) {
  if (proto.unknown_rank()) return Shape::unknown();
  std::vector<int64_t> dims;
  dims.reserve(static_cast<std::size_t>(proto.dim_size()));
  for (const auto& dim : proto.dim()) dims.push_back(dim.size());
  Result<Shape> shape = Shape::make(dims);
  return shape.is_ok() ? *shape : Shape::unknown();
}

// The fetched tensors, in request order; the step statistics appended to
// `metadata` when tracing (as a local run appends them).
Result<std::vector<Tensor>> decode_response(const v1::RunResponse& response, int num_fetches,
                                            bool trace, RunMetadata* metadata) {
  if (response.tensor_size() != num_fetches) {
    return internal_error("the server returned {} tensor(s) for {} fetch(es)",
                          response.tensor_size(), num_fetches);
  }
  std::vector<Tensor> out;
  out.reserve(static_cast<std::size_t>(num_fetches));
  for (const v1::NamedTensorProto& named : response.tensor()) {
    Result<Tensor> value = tensor_from_proto(named.tensor());
    if (!value.is_ok()) {
      return value.status().with_prefix(fmt::format("fetched tensor '{}'", named.name()));
    }
    out.push_back(std::move(value).value());
  }
  if (trace && metadata != nullptr) {
    metadata->cpu_isa = response.metadata().cpu_isa();
    for (const v1::NodeExecStats& proto : response.metadata().step_stats().node_stats()) {
      NodeExecStats stats;
      stats.node = proto.node();
      stats.op = proto.op();
      stats.start_ns = proto.start_ns();
      stats.end_ns = proto.end_ns();
      stats.thread = proto.thread();
      for (const auto& shape : proto.output_shapes()) {
        stats.output_shapes.push_back(shape_from_proto(shape));
      }
      stats.output_bytes = proto.output_bytes();
      metadata->step_stats.push_back(std::move(stats));
    }
  }
  return out;
}

}  // namespace

struct RemoteSession::Core {
  RemoteSessionOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::SessionService::Stub> stub;  // thread-safe
  std::string handle;                              // set once, before sharing
  std::optional<std::chrono::milliseconds> partial_run_idle_timeout;
  std::atomic<bool> closed{false};
  std::atomic<int64_t> graph_version{0};

  // Serializes extend(); guards mirror.
  std::mutex extend_mu;
  // The session's graph as this client built it: extend() checks a grown
  // graph against it exactly as a local Session checks against its copy.
  Graph mirror;

  explicit Core(Graph graph) : mirror(std::move(graph)) {}

  // Metadata and deadline of one call; no deadline when `timeout` is unset.
  void prepare(grpc::ClientContext& context,
               std::optional<std::chrono::milliseconds> timeout) const {
    if (!options.bearer_token.empty()) {
      context.AddMetadata("authorization", "Bearer " + options.bearer_token);
    }
    if (timeout) {
      context.set_deadline(graphrun::internal::deadline_after<std::chrono::system_clock>(
          std::chrono::system_clock::now(), *timeout));
    }
  }
  void prepare_control(grpc::ClientContext& context) const {
    prepare(context, options.control_timeout);
  }
  // Run and PartialRun: the step's timeout plus the margin, so the server
  // reports the deadline; none without a timeout (as a local run).
  void prepare_step(grpc::ClientContext& context, const RunOptions& run) const {
    if (!run.timeout) return prepare(context, std::nullopt);
    prepare(context,
            std::max(*run.timeout, std::chrono::milliseconds(1)) + options.deadline_margin);
  }

  bool is_session_not_found(const Status& status) const {
    return status.code() == StatusCode::kNotFound &&
           status.message() == fmt::format("session '{}' not found", handle);
  }
  // A call's error as a local session reports it: once closed, the server's
  // "session not found" is the local "Session has been closed.".
  Status session_error(const grpc::Status& grpc_status) const {
    Status status = from_grpc(grpc_status);
    if (closed.load() && is_session_not_found(status)) {
      return session_closed_status();
    }
    return status;
  }
};

// What the client knows of one partial run. `core` and `id` are set once;
// the rest is guarded by mu.
struct RemotePartialRunHandle::State {
  std::shared_ptr<RemoteSession::Core> core;
  std::string id;
  std::set<std::string> declared_fetches;  // tensor_key
  std::set<std::string> declared_targets;  // target_key

  mutable std::mutex mu;
  std::set<std::string> fetched;
  std::set<std::string> targets_run;
  bool cancelled = false;
  bool stopped = false;              // the setup's stop_token was stopped
  std::optional<Status> last_error;  // of the latest call, if it failed
  std::optional<Status> ended;       // what every later call returns

  bool complete_locked() const {
    return fetched.size() == declared_fetches.size() &&
           std::includes(targets_run.begin(), targets_run.end(), declared_targets.begin(),
                         declared_targets.end());
  }
  bool is_run_not_found(const Status& status) const {
    return status.code() == StatusCode::kNotFound &&
           status.message() ==
               fmt::format("partial run '{}' not found in session '{}'", id, core->handle);
  }
  // The server forgot the run: it ended. Say how, as the local run would.
  Status forgotten_locked(const Status& not_found) const {
    if (stopped) return graphrun::cancelled("partial run {} was cancelled by its caller", id);
    if (cancelled) return cancelled_status();
    if (complete_locked()) return complete_status();
    if (last_error) return *last_error;  // a misuse error leaves the run open
    if (core->partial_run_idle_timeout) {
      return graphrun::cancelled("partial run {} was idle for more than {} ms and was cancelled",
                                 id, core->partial_run_idle_timeout->count());
    }
    return not_found;
  }
  Status complete_status() const {
    return invalid_argument(
        "partial run {} is complete: every fetch and target of its setup has been produced", id);
  }
  Status cancelled_status() const {
    return graphrun::cancelled("partial run {} was cancelled", id);
  }

  // partial_run_setup's RunOptions::stop_token: a stop cancels the run on
  // the server (as a local session's watch() does). Declared last: it is
  // unregistered (waiting for a running callback) before the rest goes.
  struct StopRun {
    State* state;
    void operator()() const { state->stop(); }
  };
  std::optional<std::stop_callback<StopRun>> setup_stop;
  void stop();
  ~State() { setup_stop.reset(); }
};

void RemotePartialRunHandle::State::stop() {
  {
    const std::lock_guard lock(mu);
    if (ended || stopped) return;
    stopped = true;
  }
  v1::CancelPartialRunRequest request;
  request.set_session_handle(core->handle);
  request.set_partial_run_handle(id);
  v1::CancelPartialRunResponse response;
  grpc::ClientContext context;
  core->prepare_control(context);
  // The next call learns the outcome: the server forgot the run (NotFound,
  // mapped by forgotten_locked) or the session is gone.
  static_cast<void>(core->stub->CancelPartialRun(&context, request, &response));
}

// ---- RemotePartialRunHandle ----

RemotePartialRunHandle::RemotePartialRunHandle(std::shared_ptr<State> state)
    : state_(std::move(state)) {}
RemotePartialRunHandle::RemotePartialRunHandle(RemotePartialRunHandle&& other) noexcept = default;
RemotePartialRunHandle& RemotePartialRunHandle::operator=(RemotePartialRunHandle&& other) noexcept {
  if (this != &other) {
    abandon();
    state_ = std::move(other.state_);
  }
  return *this;
}
RemotePartialRunHandle::~RemotePartialRunHandle() { abandon(); }

const std::string& RemotePartialRunHandle::id() const {
  static const std::string kEmpty;
  return state_ != nullptr ? state_->id : kEmpty;
}

bool RemotePartialRunHandle::is_done() const {
  if (state_ == nullptr) return true;
  const std::lock_guard lock(state_->mu);
  return state_->ended.has_value();
}

// Cancels a run not known to be done, as destroying a local handle does.
void RemotePartialRunHandle::abandon() {
  if (state_ == nullptr) return;
  const std::shared_ptr<State> state = std::move(state_);
  {
    const std::lock_guard lock(state->mu);
    if (state->ended) return;
    state->ended = graphrun::cancelled("partial run {} was abandoned", state->id);
  }
  const RemoteSession::Core& core = *state->core;
  if (core.closed.load()) return;  // closing cancelled it
  v1::CancelPartialRunRequest request;
  request.set_session_handle(core.handle);
  request.set_partial_run_handle(state->id);
  v1::CancelPartialRunResponse response;
  grpc::ClientContext context;
  core.prepare_control(context);
  static_cast<void>(core.stub->CancelPartialRun(&context, request, &response));
}

// ---- RemoteSession ----

RemoteSession::RemoteSession(std::shared_ptr<Core> core) : core_(std::move(core)) {}

RemoteSession::~RemoteSession() { static_cast<void>(close()); }

Result<std::unique_ptr<RemoteSession>> RemoteSession::create(std::string_view target,
                                                             const Graph& graph,
                                                             const SessionOptions& options,
                                                             RemoteSessionOptions remote) {
  if (!graph.status().is_ok()) {
    return graph.status().with_prefix("cannot create a session from a graph with a build error");
  }
  GRAPHRUN_ASSIGN_OR_RETURN(v1::GraphDef graph_def, graph_to_graph_def(graph));
  return open(target, graph.clone(), std::move(graph_def), options, std::move(remote));
}

Result<std::unique_ptr<RemoteSession>> RemoteSession::create(std::string_view target,
                                                             const v1::GraphDef& graph_def,
                                                             const SessionOptions& options,
                                                             RemoteSessionOptions remote) {
  GRAPHRUN_ASSIGN_OR_RETURN(Graph graph, graph_from_graph_def(graph_def));
  return open(target, std::move(graph), graph_def, options, std::move(remote));
}

Result<std::unique_ptr<RemoteSession>> RemoteSession::open(std::string_view target, Graph graph,
                                                           v1::GraphDef graph_def,
                                                           const SessionOptions& options,
                                                           RemoteSessionOptions remote) {
  if (options.inter_op_threads < 0) {
    return invalid_argument("SessionOptions::inter_op_threads must be >= 0, got {}",
                            options.inter_op_threads);
  }
  if (options.thread_pool != nullptr) {
    return invalid_argument("SessionOptions::thread_pool cannot be used by a RemoteSession");
  }
  if (remote.max_message_bytes <= 0) {
    return invalid_argument("RemoteSessionOptions::max_message_bytes must be positive, got {}",
                            remote.max_message_bytes);
  }
  auto core = std::make_shared<Core>(std::move(graph));
  core->options = std::move(remote);
  if (core->options.channel != nullptr) {
    core->channel = core->options.channel;
  } else {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(core->options.max_message_bytes);
    args.SetMaxSendMessageSize(core->options.max_message_bytes);
    const std::shared_ptr<grpc::ChannelCredentials> credentials =
        core->options.credentials != nullptr ? core->options.credentials
                                             : grpc::InsecureChannelCredentials();
    core->channel = grpc::CreateCustomChannel(std::string(target), credentials, args);
  }
  if (core->channel == nullptr) return invalid_argument("cannot make a channel to '{}'", target);
  core->stub = v1::SessionService::NewStub(core->channel);
  core->partial_run_idle_timeout = options.partial_run_idle_timeout;

  v1::CreateSessionRequest request;
  *request.mutable_graph_def() = std::move(graph_def);
  v1::SessionConfig* config = request.mutable_config();
  config->set_inter_op_threads(options.inter_op_threads);
  config->set_plan_cache_capacity(static_cast<int64_t>(options.plan_cache_capacity));
  config->set_max_open_partial_runs(static_cast<int64_t>(options.max_open_partial_runs));
  if (options.partial_run_idle_timeout) {
    config->set_partial_run_idle_timeout_ms(
        std::max<int64_t>(options.partial_run_idle_timeout->count(), 1));
  }
  v1::CreateSessionResponse response;
  grpc::ClientContext context;
  core->prepare_control(context);
  GRAPHRUN_RETURN_IF_ERROR(from_grpc(core->stub->CreateSession(&context, request, &response)));
  core->handle = response.session_handle();
  core->graph_version.store(response.graph_version());
  return std::unique_ptr<RemoteSession>(new RemoteSession(std::move(core)));
}

const std::string& RemoteSession::handle() const { return core_->handle; }
int64_t RemoteSession::graph_version() const { return core_->graph_version.load(); }

namespace {

// A stop requested on `token` cancels the call of `context` (the server then
// stops its step); nothing is registered for a token that cannot stop.
struct CancelCall {
  grpc::ClientContext* context;
  void operator()() const { context->TryCancel(); }
};
std::optional<std::stop_callback<CancelCall>> cancel_on_stop(const std::stop_token& token,
                                                             grpc::ClientContext& context) {
  if (!token.stop_possible()) return std::nullopt;
  return std::optional<std::stop_callback<CancelCall>>(std::in_place, token, CancelCall{&context});
}

// The call failed because its caller stopped it (not the server).
bool stopped_by_caller(const grpc::Status& status, const RunOptions& options) {
  return status.error_code() == grpc::StatusCode::CANCELLED && options.stop_token.stop_requested();
}

}  // namespace

Result<std::vector<Tensor>> RemoteSession::run(const FeedList& feeds,
                                               const std::vector<TensorRef>& fetches,
                                               const std::vector<TargetRef>& targets,
                                               const RunOptions& options, RunMetadata* metadata) {
  const Core& core = *core_;
  if (core.closed.load()) return session_closed_status();
  v1::RunRequest request;
  request.set_session_handle(core.handle);
  add_feeds(feeds, request.mutable_feed());
  for (const TensorRef& fetch : fetches) request.add_fetch(fetch.to_string());
  for (const TargetRef& target : targets) request.add_target(target_name(target));
  set_options(options, request.mutable_options());
  v1::RunResponse response;
  grpc::ClientContext context;
  core.prepare_step(context, options);
  grpc::Status status;
  {
    const auto on_stop = cancel_on_stop(options.stop_token, context);
    status = core.stub->Run(&context, request, &response);
  }
  if (stopped_by_caller(status, options)) return cancelled("the run was cancelled by its caller");
  if (!status.ok()) return core.session_error(status);
  return decode_response(response, request.fetch_size(), options.trace, metadata);
}

Result<RemotePartialRunHandle> RemoteSession::partial_run_setup(
    const std::vector<TensorRef>& fetches, const std::vector<TensorRef>& feeds,
    const std::vector<TargetRef>& targets, const RunOptions& options) {
  const Core& core = *core_;
  if (core.closed.load()) return session_closed_status();
  auto state = std::make_shared<RemotePartialRunHandle::State>();
  state->core = core_;
  v1::PartialRunSetupRequest request;
  request.set_session_handle(core.handle);
  for (const TensorRef& feed : feeds) request.add_feed(feed.to_string());
  for (const TensorRef& fetch : fetches) {
    request.add_fetch(fetch.to_string());
    state->declared_fetches.insert(tensor_key(fetch.to_string()));
  }
  for (const TargetRef& target : targets) {
    request.add_target(target_name(target));
    state->declared_targets.insert(target_key(target_name(target)));
  }
  set_options(options, request.mutable_options());
  v1::PartialRunSetupResponse response;
  grpc::ClientContext context;
  core.prepare_control(context);
  const grpc::Status status = core.stub->PartialRunSetup(&context, request, &response);
  if (!status.ok()) return core.session_error(status);
  state->id = response.partial_run_handle();
  if (options.stop_token.stop_possible()) {
    state->setup_stop.emplace(options.stop_token,
                              RemotePartialRunHandle::State::StopRun{state.get()});
  }
  return RemotePartialRunHandle(std::move(state));
}

Result<std::vector<Tensor>> RemoteSession::partial_run(
    RemotePartialRunHandle& handle, const FeedList& feeds, const std::vector<TensorRef>& fetches,
    const std::vector<TargetRef>& targets, const RunOptions& options, RunMetadata* metadata) {
  // The local session's checks, in its order.
  if (!handle.is_valid()) {
    return invalid_argument("Must run 'setup' before performing partial runs! (empty handle)");
  }
  RemotePartialRunHandle::State& state = *handle.state_;
  if (state.core != core_) {
    return invalid_argument("partial run {} does not belong to this session", state.id);
  }
  {
    const std::lock_guard lock(state.mu);
    if (state.ended) return *state.ended;
  }
  const Core& core = *core_;
  if (core.closed.load()) return session_closed_status();

  v1::PartialRunRequest request;
  request.set_session_handle(core.handle);
  request.set_partial_run_handle(state.id);
  add_feeds(feeds, request.mutable_feed());
  for (const TensorRef& fetch : fetches) request.add_fetch(fetch.to_string());
  for (const TargetRef& target : targets) request.add_target(target_name(target));
  set_options(options, request.mutable_options());
  v1::RunResponse response;
  grpc::ClientContext context;
  core.prepare_step(context, options);
  grpc::Status grpc_status;
  {
    const auto on_stop = cancel_on_stop(options.stop_token, context);
    grpc_status = core.stub->PartialRun(&context, request, &response);
  }

  const std::lock_guard lock(state.mu);
  if (stopped_by_caller(grpc_status, options)) {
    // The server cancels the whole run when its call is cancelled.
    state.ended = cancelled("partial run {}: the call was cancelled by its caller", state.id);
    return *state.ended;
  }
  if (!grpc_status.ok()) {
    const Status status = core.session_error(grpc_status);
    if (state.is_run_not_found(status)) {
      state.ended = state.forgotten_locked(status);
      return *state.ended;
    }
    if (status == session_closed_status()) state.ended = status;
    state.last_error = status;
    return status;
  }
  Result<std::vector<Tensor>> out =
      decode_response(response, request.fetch_size(), options.trace, metadata);
  state.last_error.reset();
  for (const TensorRef& fetch : fetches) state.fetched.insert(tensor_key(fetch.to_string()));
  for (const TargetRef& target : targets) state.targets_run.insert(target_key(target_name(target)));
  if (state.complete_locked()) state.ended = state.complete_status();
  return out;
}

Status RemoteSession::cancel_partial_run(RemotePartialRunHandle& handle) {
  if (!handle.is_valid()) return invalid_argument("cancel_partial_run: empty handle");
  RemotePartialRunHandle::State& state = *handle.state_;
  if (state.core != core_) {
    return invalid_argument("partial run {} does not belong to this session", state.id);
  }
  {
    const std::lock_guard lock(state.mu);
    if (state.ended) return Status::ok();
  }
  const Core& core = *core_;
  if (core.closed.load()) {
    // Closing cancelled the run: later calls say so, as locally.
    const std::lock_guard lock(state.mu);
    if (!state.ended) state.ended = session_closed_status();
    return Status::ok();
  }
  v1::CancelPartialRunRequest request;
  request.set_session_handle(core.handle);
  request.set_partial_run_handle(state.id);
  v1::CancelPartialRunResponse response;
  grpc::ClientContext context;
  core.prepare_control(context);
  const Status status =
      core.session_error(core.stub->CancelPartialRun(&context, request, &response));
  const std::lock_guard lock(state.mu);
  if (state.ended) return Status::ok();
  if (status.is_ok()) {
    state.cancelled = true;
    state.ended = state.cancelled_status();
    return Status::ok();
  }
  if (state.is_run_not_found(status)) {  // it had ended: cancelling a done run is OK
    state.ended = state.forgotten_locked(status);
    return Status::ok();
  }
  if (status == session_closed_status()) {
    state.ended = status;
    return Status::ok();
  }
  return status;
}

Status RemoteSession::extend(const Graph& grown) {
  Core& core = *core_;
  if (core.closed.load()) return session_closed_status();
  const std::lock_guard lock(core.extend_mu);
  Graph candidate = core.mirror.clone();
  const int before = candidate.num_nodes();
  GRAPHRUN_RETURN_IF_ERROR(candidate.append_nodes_from(grown).with_prefix("Session::extend"));
  if (candidate.num_nodes() == before) return Status::ok();
  GRAPHRUN_ASSIGN_OR_RETURN(v1::GraphDef all, graph_to_graph_def(candidate));
  v1::ExtendSessionRequest request;
  request.set_session_handle(core.handle);
  request.set_current_graph_version(core.graph_version.load());
  for (int i = before; i < all.node_size(); ++i)
    *request.mutable_graph_def()->add_node() = all.node(i);
  v1::ExtendSessionResponse response;
  grpc::ClientContext context;
  core.prepare_control(context);
  const grpc::Status status = core.stub->ExtendSession(&context, request, &response);
  if (!status.ok()) return core.session_error(status);
  core.mirror = std::move(candidate);
  core.graph_version.store(response.new_graph_version());
  return Status::ok();
}

Status RemoteSession::extend(const v1::GraphDef& grown) {
  GRAPHRUN_ASSIGN_OR_RETURN(Graph graph, graph_from_graph_def(grown));
  return extend(graph);
}

Status RemoteSession::close() {
  Core& core = *core_;
  if (core.closed.exchange(true)) return Status::ok();
  v1::CloseSessionRequest request;
  request.set_session_handle(core.handle);
  v1::CloseSessionResponse response;
  grpc::ClientContext context;
  core.prepare_control(context);
  const Status status = from_grpc(core.stub->CloseSession(&context, request, &response));
  if (core.is_session_not_found(status)) return Status::ok();  // already gone
  return status;
}

}  // namespace graphrun
