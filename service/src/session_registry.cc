#include <graphrun/graph_def.h>
#include <graphrun/session_registry.h>
#include <sys/random.h>

#include <fmt/format.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <unordered_map>

#include "api/src/deadline.h"

namespace graphrun {
namespace {

// Closed-for-idleness handles remembered for a better NotFound message.
constexpr std::size_t kRememberedExpiredHandles = 1024;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<TensorRef> tensor_refs(const std::vector<std::string>& names) {
  return {names.begin(), names.end()};
}

std::vector<TargetRef> target_refs(const std::vector<std::string>& names) {
  return {names.begin(), names.end()};
}

// Bytes reserved in the registry's held_bytes, given back at the end of the
// scope unless `bytes` was taken (set to 0) by the entry that holds them.
struct Reservation {
  Reservation(std::atomic<int64_t>* h, int64_t b) : held(h), bytes(b) {}
  std::atomic<int64_t>* held;
  int64_t bytes;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() {
    if (bytes != 0) held->fetch_sub(bytes);
  }
};

}  // namespace

std::string random_handle(std::string_view prefix) {
  std::array<unsigned char, 16> bytes{};
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0) {
      GRAPHRUN_CHECK_MSG(errno == EINTR, "getrandom failed");
      continue;
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(prefix);
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

// One open partial run of a session, and the turn of the calls on it: the
// service serializes them (a call waits for the one in progress, within its
// own deadline and stop), so that a call cancelled by its client, whose
// step is still stopping, never makes the next call fail with "in use".
// A blocking call waits on `cv`; an asynchronous one queues a Waiter, which
// end_turn() hands the turn to (before any blocking caller) without a
// thread waiting.
struct OpenPartialRun : std::enable_shared_from_this<OpenPartialRun> {
  explicit OpenPartialRun(PartialRunHandle h) : handle(std::move(h)) {}
  PartialRunHandle handle;
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false;  // guarded by mu

  // A queued asynchronous call: `start(true)` when it has the turn,
  // `start(false)` when its stop came first. Exactly one of them.
  struct Waiter {
    std::function<void(bool)> start;
    struct Stopped {
      std::weak_ptr<OpenPartialRun> run;
      std::weak_ptr<Waiter> waiter;
      void operator()() const;
    };
    std::optional<std::stop_callback<Stopped>> on_stop;
  };
  std::deque<std::shared_ptr<Waiter>> waiters;  // guarded by mu

  bool is_done() const { return handle.is_done(); }

  // Waits for the turn; false when `options`' deadline or stop came first.
  bool take_turn(const RunOptions& options) {
    struct Wake {
      OpenPartialRun* run;
      void operator()() const {
        const std::lock_guard lock(run->mu);
        run->cv.notify_all();
      }
    };
    std::optional<std::stop_callback<Wake>> on_stop;
    if (options.stop_token.stop_possible()) on_stop.emplace(options.stop_token, Wake{this});
    std::unique_lock lock(mu);
    const auto free = [&] { return !busy || options.stop_token.stop_requested(); };
    if (options.timeout) {
      // wait_until: wait_for adds the timeout to now(), which overflows for
      // a client's INT64_MAX ms.
      if (!cv.wait_until(lock, graphrun::internal::steady_deadline_after(*options.timeout), free)) {
        return false;
      }
    } else {
      cv.wait(lock, free);
    }
    if (busy) return false;  // stopped
    busy = true;
    return true;
  }

  // Calls `start(true)` with the turn, now on this thread if it is free,
  // else from end_turn() of the call before; or `start(false)` when `stop`
  // is requested first.
  void take_turn_async(const std::stop_token& stop, std::function<void(bool)> start) {
    auto waiter = std::make_shared<Waiter>();
    {
      const std::lock_guard lock(mu);
      if (!busy) {
        busy = true;
        waiter = nullptr;
      } else {
        waiter->start = std::move(start);
        waiters.push_back(waiter);
      }
    }
    if (waiter == nullptr) {
      start(true);
      return;
    }
    // Outside the lock: a stop requested already runs the callback here.
    if (stop.stop_possible()) {
      waiter->on_stop.emplace(stop, Waiter::Stopped{weak_from_this(), waiter});
    }
  }

  void end_turn() {
    std::shared_ptr<Waiter> next;
    {
      const std::lock_guard lock(mu);
      if (waiters.empty()) {
        busy = false;
      } else {
        next = std::move(waiters.front());  // busy stays: the turn passes on
        waiters.pop_front();
      }
    }
    if (next == nullptr) {
      cv.notify_one();
      return;
    }
    // The waiter's stop callback stays registered until the waiter goes
    // (when `next` and take_turn_async() let go of it): a stop from now on
    // finds it out of the queue and does nothing.
    std::function<void(bool)> start = std::move(next->start);
    start(true);
  }
};

void OpenPartialRun::Waiter::Stopped::operator()() const {
  const std::shared_ptr<OpenPartialRun> self = run.lock();
  const std::shared_ptr<Waiter> me = waiter.lock();
  if (self == nullptr || me == nullptr) return;
  std::function<void(bool)> start;
  {
    const std::lock_guard lock(self->mu);
    const auto it = std::find(self->waiters.begin(), self->waiters.end(), me);
    if (it == self->waiters.end()) return;  // got the turn meanwhile
    self->waiters.erase(it);
    start = std::move(me->start);
  }
  start(false);
}

// One open session. The session is declared before the partial runs, so the
// handles are destroyed first (a session must outlive its handles).
struct SessionRegistry::Entry {
  std::string handle;
  std::unique_ptr<Session> session;
  std::atomic<int64_t> graph_version{0};
  std::atomic<int64_t> num_nodes{0};
  std::atomic<int64_t> last_use_ns{now_ns()};  // relaxed: reporting only

  // Serializes extend(); guards graph_def.
  std::mutex extend_mu;
  // The session's graph as a GraphDef in node-id order (a topological
  // order), which extend() appends the new nodes to.
  v1::GraphDef graph_def;

  mutable std::mutex mu;
  // Guarded by mu. Open partial runs by id; shared with the calls using them.
  std::map<std::string, std::shared_ptr<OpenPartialRun>, std::less<>> partial_runs;

  void touch() { last_use_ns.store(now_ns(), std::memory_order_relaxed); }

  // Set before the session is closed (by CloseSession, the idle sweep or
  // the server's end): a call that finds its partial run ended then says
  // the session was closed, as the call in progress was told.
  std::atomic<bool> closed{false};
  void close() {
    closed.store(true, std::memory_order_release);
    static_cast<void>(session->close());
  }

  // Why a call that got the turn finds partial run `id` ended: the session
  // was closed (CANCELLED, as the call in progress was answered), or the
  // run failed or was cancelled (gone for the client, as after the call
  // that ended it).
  Status ended_partial_run(std::string_view id) const {
    if (closed.load(std::memory_order_acquire)) return cancelled("Session has been closed.");
    return not_found("partial run '{}' not found in session '{}'", id, handle);
  }

  // Forgets the partial runs that completed, failed or were cancelled
  // (also by the session's idle timeout). Requires mu.
  void purge_done_locked() {
    std::erase_if(partial_runs, [](const auto& kv) { return kv.second->is_done(); });
  }

  Result<std::shared_ptr<OpenPartialRun>> find_partial_run(std::string_view id) const {
    const std::lock_guard lock(mu);
    const auto it = partial_runs.find(id);
    if (it == partial_runs.end()) {
      return not_found("partial run '{}' not found in session '{}'", id, handle);
    }
    return it->second;
  }

  // This session's part of the registry's held_bytes.
  int64_t estimated_bytes = 0;
  std::shared_ptr<std::atomic<int64_t>> held_bytes;

  ~Entry() {
    {
      const std::lock_guard lock(mu);
      partial_runs.clear();
    }
    if (session != nullptr) static_cast<void>(session->close());
    session.reset();
    v1::GraphDef().Swap(&graph_def);  // frees the kept GraphDef now
    if (held_bytes != nullptr) held_bytes->fetch_sub(estimated_bytes);
    // A large session's memory goes back to the system, not only to the
    // allocators' caches (measured: without this, 1.3 GB of a closed
    // 10^6-node session stayed resident).
    if (estimated_bytes >= kReleaseMemoryAbove) release_cached_memory();
  }
  static constexpr int64_t kReleaseMemoryAbove = int64_t{16} << 20;
};

SessionRegistry::SessionRegistry(ServiceLimits limits) : limits_(limits) {
  if (limits_.session_idle_timeout.count() > 0) {
    sweeper_ = std::thread([this] { sweep_until_stopped(); });
  }
}

SessionRegistry::~SessionRegistry() {
  {
    const std::lock_guard lock(mu_);
    stopping_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  close_all();
}

void SessionRegistry::sweep_until_stopped() {
  // Often enough that a session is closed within a quarter of the timeout
  // past it; at most once a second, at least every 10 ms.
  const auto period = std::clamp<std::chrono::milliseconds>(
      limits_.session_idle_timeout / 4, std::chrono::milliseconds(10), std::chrono::seconds(1));
  std::unique_lock lock(mu_);
  while (!sweeper_cv_.wait_for(lock, period, [this] { return stopping_; })) {
    lock.unlock();
    close_idle_sessions();
    lock.lock();
  }
}

std::size_t SessionRegistry::close_idle_sessions() {
  if (limits_.session_idle_timeout.count() <= 0) return 0;
  // Saturating: a timeout past the clock's range (--session-idle-timeout
  // takes up to 10^15 ms, more nanoseconds than int64 counts) closes nothing.
  int64_t timeout_ns = 0;
  if (__builtin_mul_overflow(limits_.session_idle_timeout.count(), int64_t{1'000'000},
                             &timeout_ns)) {
    return 0;
  }
  const int64_t cutoff = now_ns() - timeout_ns;
  std::vector<std::shared_ptr<Entry>> idle;
  {
    const std::lock_guard lock(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      // use_count() == 1: only the map holds the entry, and taking it from
      // the map needs mu_, so no call is in progress or can start.
      if (it->second.use_count() == 1 &&
          it->second->last_use_ns.load(std::memory_order_relaxed) < cutoff) {
        expired_.push_back(it->first);
        if (expired_.size() > kRememberedExpiredHandles) expired_.pop_front();
        idle.push_back(std::move(it->second));
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& entry : idle) entry->close();
  return idle.size();
}

int SessionRegistry::max_inter_op_threads() const {
  const int limit = limits_.max_inter_op_threads > 0 ? limits_.max_inter_op_threads
                                                     : ThreadPool::default_threads();
  return std::min(limit, ThreadPool::max_threads());
}

namespace {
// A byte count for a message: the counts here saturate at
// kMaxTensorProtoBytes + 1, which is "more than kMaxTensorProtoBytes", not a
// size.
std::string byte_count(int64_t bytes) {
  if (bytes > kMaxTensorProtoBytes) return fmt::format("more than {}", kMaxTensorProtoBytes);
  return fmt::format("{}", bytes);
}
}  // namespace

Status SessionRegistry::check_request_bytes(int64_t bytes) const {
  if (bytes > limits_.max_tensor_bytes_per_request) {
    return resource_exhausted(
        "request feeds {} tensor bytes (limit max_tensor_bytes_per_request = {})",
        byte_count(bytes), limits_.max_tensor_bytes_per_request);
  }
  return Status::ok();
}

Status SessionRegistry::check_graph_def_tensors(const v1::GraphDef& def) const {
  const int64_t bytes = graph_def_tensor_bytes(def);
  if (bytes > limits_.max_tensor_bytes_per_request) {
    return resource_exhausted(
        "the GraphDef's tensors (Const values) take {} bytes (limit max_tensor_bytes_per_request "
        "= {})",
        byte_count(bytes), limits_.max_tensor_bytes_per_request);
  }
  return Status::ok();
}

namespace {
// The bytes of `node`'s output 0 when its shape is fully known, saturating.
int64_t static_output_bytes(const Node& node) {
  if (node.num_outputs() == 0) return 0;
  const Shape& shape = node.output_shape(0);
  if (shape.is_unknown_rank()) return 0;
  // Unknown (-1) or empty (0) anywhere: nothing known to count, whatever
  // the other dimensions ([2^40, 0] is 0 bytes, not saturated).
  if (std::ranges::any_of(shape.dims(), [](int64_t d) { return d <= 0; })) return 0;
  return product_of_positive_dims(static_cast<int64_t>(dtype_size(node.output_dtype(0))),
                                  shape.dims(), kMaxTensorProtoBytes)
      .value_or(kMaxTensorProtoBytes + 1);
}
}  // namespace

Status SessionRegistry::check_materialized(const Graph& graph, int first, int64_t constants) const {
  int64_t made = 0;
  const Node* largest = nullptr;
  int64_t largest_bytes = 0;
  for (int id = first; id < graph.num_nodes(); ++id) {
    const Node& node = *graph.node(id);
    // graphrun's Zeros and Ones build Consts: Fill is the op that makes a
    // tensor of a shape known at build time on every run.
    if (node.op() != "Fill") continue;
    const int64_t bytes = static_output_bytes(node);
    made = std::min(made + bytes, kMaxTensorProtoBytes + 1);
    if (bytes > largest_bytes) {
      largest_bytes = bytes;
      largest = &node;
    }
  }
  const int64_t total = std::min(made + constants, kMaxTensorProtoBytes + 1);
  if (total > limits_.max_tensor_bytes_per_request) {
    return resource_exhausted(
        "the graph's tensors take {} bytes: {} of Const values and {} made by every run of "
        "Fill{} (limit max_tensor_bytes_per_request = {})",
        byte_count(total), byte_count(constants), byte_count(made),
        largest == nullptr
            ? std::string()
            : fmt::format(" ({} alone: {})", largest->describe(), byte_count(largest_bytes)),
        limits_.max_tensor_bytes_per_request);
  }
  return Status::ok();
}

Status SessionRegistry::reserve_bytes(int64_t current, int64_t bytes) {
  if (current + bytes > limits_.max_session_bytes) {
    return resource_exhausted(
        "the session would hold about {} bytes ({} per node plus its tensors) (limit "
        "max_session_bytes = {})",
        current + bytes, kEstimatedBytesPerNode, limits_.max_session_bytes);
  }
  const int64_t held = held_bytes_->fetch_add(bytes) + bytes;
  if (held > limits_.max_total_session_bytes) {
    held_bytes_->fetch_sub(bytes);
    return resource_exhausted(
        "the open sessions would hold about {} bytes (limit max_total_session_bytes = {})", held,
        limits_.max_total_session_bytes);
  }
  return Status::ok();
}

int64_t SessionRegistry::held_bytes() const { return held_bytes_->load(); }

Status SessionRegistry::check_graph_nodes(int64_t nodes) const {
  if (nodes > limits_.max_graph_nodes) {
    return resource_exhausted("the graph has {} nodes (limit max_graph_nodes = {})", nodes,
                              limits_.max_graph_nodes);
  }
  return Status::ok();
}

namespace {

Status check_feed_bytes(const SessionRegistry& registry, const NamedTensors& feeds) {
  int64_t bytes = 0;
  for (const auto& [name, value] : feeds) bytes += static_cast<int64_t>(value.byte_size());
  return registry.check_request_bytes(bytes);
}

FeedList feed_list(const NamedTensors& feeds) {
  FeedList out;
  out.reserve(feeds.size());
  for (const auto& [name, value] : feeds) out.push_back(Feed{TensorRef(name), value});
  return out;
}

}  // namespace

Result<SessionRegistry::Created> SessionRegistry::create(const v1::GraphDef& graph_def,
                                                         SessionOptions options) {
  const auto full = [this] {
    return resource_exhausted("{} sessions are open (limit max_sessions = {})", sessions_.size(),
                              limits_.max_sessions);
  };
  {
    const std::lock_guard lock(mu_);
    if (sessions_.size() >= limits_.max_sessions) return full();
  }
  if (options.thread_pool == nullptr && options.inter_op_threads > max_inter_op_threads()) {
    return invalid_argument(
        "SessionOptions::inter_op_threads = {} exceeds this server's limit of {} "
        "(max_inter_op_threads)",
        options.inter_op_threads, max_inter_op_threads());
  }
  // A session that asks for no particular count gets the default, within
  // the server's cap.
  if (options.thread_pool == nullptr && options.inter_op_threads == 0) {
    options.inter_op_threads = std::min(ThreadPool::default_threads(), max_inter_op_threads());
  }
  if (options.max_tensor_bytes <= 0 || options.max_tensor_bytes > limits_.max_output_tensor_bytes) {
    options.max_tensor_bytes = limits_.max_output_tensor_bytes;
  }
  GRAPHRUN_RETURN_IF_ERROR(check_graph_nodes(graph_def.node_size()));
  // Before anything is imported (a 65-byte Const may declare a GiB).
  GRAPHRUN_RETURN_IF_ERROR(check_graph_def_tensors(graph_def));
  const int64_t constants = graph_def_tensor_bytes(graph_def);
  const int64_t estimate = constants + int64_t{graph_def.node_size()} * kEstimatedBytesPerNode;
  GRAPHRUN_RETURN_IF_ERROR(reserve_bytes(0, estimate));
  // Given back unless the session is made (then its entry owns it).
  Reservation reservation{held_bytes_.get(), estimate};
  GRAPHRUN_ASSIGN_OR_RETURN(Graph graph, graph_from_graph_def(graph_def));
  GRAPHRUN_RETURN_IF_ERROR(check_materialized(graph, 0, constants));
  options.max_open_partial_runs =
      std::min(options.max_open_partial_runs, limits_.max_partial_runs_per_session);
  if (limits_.partial_run_idle_timeout.count() > 0) {
    options.partial_run_idle_timeout =
        std::min(options.partial_run_idle_timeout.value_or(limits_.partial_run_idle_timeout),
                 limits_.partial_run_idle_timeout);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                            Session::create(graph, std::move(options)));
  auto entry = std::make_shared<Entry>();
  // Export the session's own copy: its node order is what extend() appends
  // to (graph_from_graph_def keeps an already topological order).
  GRAPHRUN_ASSIGN_OR_RETURN(entry->graph_def, graph_to_graph_def(session->graph()));
  entry->num_nodes.store(session->graph().num_nodes());
  entry->session = std::move(session);
  entry->handle = random_handle("s-");
  entry->held_bytes = held_bytes_;
  entry->estimated_bytes = std::exchange(reservation.bytes, 0);
  Created created{entry->handle, 0};
  {
    const std::lock_guard lock(mu_);
    if (sessions_.size() >= limits_.max_sessions) return full();
    sessions_.emplace(entry->handle, std::move(entry));
  }
  return created;
}

Result<std::shared_ptr<SessionRegistry::Entry>> SessionRegistry::find(
    std::string_view handle) const {
  const std::lock_guard lock(mu_);
  const auto it = sessions_.find(handle);
  if (it == sessions_.end()) {
    if (std::find(expired_.begin(), expired_.end(), handle) != expired_.end()) {
      return not_found(
          "session '{}' not found: it was closed after {} ms without a call (limit "
          "session_idle_timeout)",
          handle, limits_.session_idle_timeout.count());
    }
    return not_found("session '{}' not found", handle);
  }
  it->second->touch();
  return it->second;
}

Result<std::shared_ptr<Session>> SessionRegistry::get(std::string_view handle) const {
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, find(handle));
  Session* session = entry->session.get();
  return std::shared_ptr<Session>(std::move(entry), session);  // keeps the entry alive
}

Result<int64_t> SessionRegistry::extend(std::string_view handle, const v1::GraphDef& new_nodes,
                                        int64_t current_graph_version) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, find(handle));
  const std::lock_guard lock(entry->extend_mu);
  const int64_t version = entry->graph_version.load();
  if (current_graph_version != version) {
    return failed_precondition(
        "session '{}' is at graph version {}, the request extends version {}", handle, version,
        current_graph_version);
  }
  GRAPHRUN_RETURN_IF_ERROR(
      check_graph_nodes(int64_t{entry->graph_def.node_size()} + new_nodes.node_size()));
  GRAPHRUN_RETURN_IF_ERROR(check_graph_def_tensors(new_nodes));
  const int64_t constants = graph_def_tensor_bytes(new_nodes);
  const int64_t added = constants + int64_t{new_nodes.node_size()} * kEstimatedBytesPerNode;
  GRAPHRUN_RETURN_IF_ERROR(reserve_bytes(entry->estimated_bytes, added));
  Reservation reservation{held_bytes_.get(), added};
  const int old_nodes = entry->graph_def.node_size();
  {
    // Named in the request's terms: the import below numbers the nodes of
    // the session's graph and the request's together.
    std::unordered_map<std::string_view, int> names;
    names.reserve(static_cast<std::size_t>(old_nodes + new_nodes.node_size()));
    for (const v1::NodeDef& node : entry->graph_def.node()) names.emplace(node.name(), -1);
    for (int i = 0; i < new_nodes.node_size(); ++i) {
      const v1::NodeDef& node = new_nodes.node(i);
      const auto [it, inserted] = names.emplace(node.name(), i);
      if (inserted) continue;
      if (it->second < 0) {
        return invalid_argument(
            "node '{}' ({}), node #{} of the request: the session's graph "
            "already has a node of that name",
            node.name(), node.op(), i);
      }
      return invalid_argument("node '{}' ({}): the request names it twice (its nodes #{} and #{})",
                              node.name(), node.op(), it->second, i);
    }
  }
  v1::GraphDef grown = entry->graph_def;
  for (const v1::NodeDef& node : new_nodes.node()) *grown.add_node() = node;
  GRAPHRUN_ASSIGN_OR_RETURN(Graph graph, graph_from_graph_def(grown));
  GRAPHRUN_RETURN_IF_ERROR(check_materialized(graph, old_nodes, constants));
  GRAPHRUN_RETURN_IF_ERROR(entry->session->extend(graph));
  entry->estimated_bytes += std::exchange(reservation.bytes, 0);
  entry->graph_def = std::move(grown);
  entry->num_nodes.store(graph.num_nodes());
  entry->graph_version.store(version + 1);
  entry->touch();
  return version + 1;
}

Result<std::vector<Tensor>> SessionRegistry::run(std::string_view handle, const NamedTensors& feeds,
                                                 const std::vector<std::string>& fetches,
                                                 const std::vector<std::string>& targets,
                                                 const RunOptions& options, RunMetadata* metadata) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, find(handle));
  GRAPHRUN_RETURN_IF_ERROR(check_feed_bytes(*this, feeds));
  Result<std::vector<Tensor>> out = entry->session->run(feed_list(feeds), tensor_refs(fetches),
                                                        target_refs(targets), options, metadata);
  entry->touch();  // idle time counts from the end of the last call
  return out;
}

void SessionRegistry::run_async(std::string_view handle, const NamedTensors& feeds,
                                const std::vector<std::string>& fetches,
                                const std::vector<std::string>& targets, const RunOptions& options,
                                StepDone done) {
  Result<std::shared_ptr<Entry>> found = find(handle);
  if (!found.is_ok()) return done(found.status(), nullptr, nullptr);
  if (Status s = check_feed_bytes(*this, feeds); !s.is_ok()) {
    return done(std::move(s), nullptr, nullptr);
  }
  std::shared_ptr<Entry> entry = std::move(found).value();
  Session& session = *entry->session;
  session.run_async(feed_list(feeds), tensor_refs(fetches), target_refs(targets), options,
                    [entry = std::move(entry), done = std::move(done)](
                        Result<std::vector<Tensor>> out, RunMetadata* metadata) mutable {
                      entry->touch();  // idle time counts from the end of the last call
                      done(std::move(out), metadata, std::move(entry));
                    });
}

Result<std::string> SessionRegistry::partial_run_setup(std::string_view handle,
                                                       const std::vector<std::string>& feeds,
                                                       const std::vector<std::string>& fetches,
                                                       const std::vector<std::string>& targets,
                                                       const RunOptions& options) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, find(handle));
  {
    const std::lock_guard lock(entry->mu);
    entry->purge_done_locked();
    if (entry->partial_runs.size() >= limits_.max_partial_runs_per_session) {
      return resource_exhausted(
          "session '{}' has {} open partial runs (limit max_partial_runs_per_session = {})", handle,
          entry->partial_runs.size(), limits_.max_partial_runs_per_session);
    }
  }
  GRAPHRUN_ASSIGN_OR_RETURN(PartialRunHandle run, entry->session->partial_run_setup(
                                                      tensor_refs(fetches), tensor_refs(feeds),
                                                      target_refs(targets), options));
  auto shared = std::make_shared<OpenPartialRun>(std::move(run));
  std::string id = shared->handle.id();
  const std::lock_guard lock(entry->mu);
  // Concurrent setups may both have passed the check above; the session's
  // own max_open_partial_runs (capped by the same limit) bounds them.
  entry->partial_runs.emplace(id, std::move(shared));
  return id;
}

Result<std::vector<Tensor>> SessionRegistry::partial_run(
    std::string_view handle, std::string_view partial_run_id, const NamedTensors& feeds,
    const std::vector<std::string>& fetches, const std::vector<std::string>& targets,
    const RunOptions& options, RunMetadata* metadata) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, find(handle));
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<OpenPartialRun> run,
                            entry->find_partial_run(partial_run_id));
  GRAPHRUN_RETURN_IF_ERROR(check_feed_bytes(*this, feeds));
  const auto forget = [&] {
    const std::lock_guard lock(entry->mu);
    const auto it = entry->partial_runs.find(partial_run_id);
    if (it != entry->partial_runs.end() && it->second == run) entry->partial_runs.erase(it);
  };
  const auto waited_from = std::chrono::steady_clock::now();
  if (!run->take_turn(options)) {
    if (options.stop_token.stop_requested()) {
      return cancelled(
          "partial run '{}': the call was cancelled while it waited for the call in "
          "progress on the same partial run",
          partial_run_id);
    }
    return deadline_exceeded(
        "partial run '{}': the call's deadline expired while it waited for the call in progress "
        "on the same partial run",
        partial_run_id);
  }
  struct EndTurn {
    OpenPartialRun* run;
    ~EndTurn() { run->end_turn(); }
  } end_turn{run.get()};
  if (run->is_done()) {
    // Failed, cancelled (perhaps by the call that had the turn) or its
    // session closed.
    forget();
    return entry->ended_partial_run(partial_run_id);
  }
  // The call's timeout counts from its arrival, the wait for its turn
  // included.
  RunOptions call_options = options;
  if (call_options.timeout) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - waited_from);
    call_options.timeout = std::max(std::chrono::milliseconds(0), *call_options.timeout - waited);
  }
  Result<std::vector<Tensor>> out =
      entry->session->partial_run(run->handle, feed_list(feeds), tensor_refs(fetches),
                                  target_refs(targets), call_options, metadata);
  entry->touch();
  if (run->is_done()) forget();
  return out;
}

void SessionRegistry::partial_run_async(std::string_view handle, std::string_view partial_run_id,
                                        const NamedTensors& feeds,
                                        const std::vector<std::string>& fetches,
                                        const std::vector<std::string>& targets,
                                        const RunOptions& options, StepDone done) {
  Result<std::shared_ptr<Entry>> found = find(handle);
  if (!found.is_ok()) return done(found.status(), nullptr, nullptr);
  std::shared_ptr<Entry> entry = std::move(found).value();
  Result<std::shared_ptr<OpenPartialRun>> open = entry->find_partial_run(partial_run_id);
  if (!open.is_ok()) return done(open.status(), nullptr, nullptr);
  if (Status s = check_feed_bytes(*this, feeds); !s.is_ok()) {
    return done(std::move(s), nullptr, nullptr);
  }
  // What the call needs once it has the turn, perhaps after this returns.
  struct Call {
    std::shared_ptr<Entry> entry;
    std::shared_ptr<OpenPartialRun> run;
    std::string id;
    FeedList feeds;
    std::vector<TensorRef> fetches;
    std::vector<TargetRef> targets;
    RunOptions options;
    std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
    StepDone done;

    void forget() const {
      const std::lock_guard lock(entry->mu);
      const auto it = entry->partial_runs.find(id);
      if (it != entry->partial_runs.end() && it->second == run) entry->partial_runs.erase(it);
    }
    // Ends the call before its step: hands the turn on (when it had it),
    // then answers.
    void fail(Status status, bool had_turn) {
      if (had_turn) run->end_turn();
      done(std::move(status), nullptr, std::move(entry));
    }
  };
  auto call = std::make_shared<Call>();
  call->entry = std::move(entry);
  call->run = std::move(open).value();
  call->id = std::string(partial_run_id);
  call->feeds = feed_list(feeds);
  call->fetches = tensor_refs(fetches);
  call->targets = target_refs(targets);
  call->options = options;
  call->done = std::move(done);
  OpenPartialRun& run = *call->run;
  run.take_turn_async(options.stop_token, [call = std::move(call)](bool got_turn) mutable {
    if (!got_turn) {
      return call->fail(cancelled("partial run '{}': the call was cancelled while it waited for "
                                  "the call in progress on the same partial run",
                                  call->id),
                        false);
    }
    if (call->run->is_done()) {
      // Failed, cancelled (perhaps by the call that had the turn) or its
      // session closed.
      call->forget();
      return call->fail(call->entry->ended_partial_run(call->id), true);
    }
    // The call's timeout counts from its arrival, the wait for its turn
    // included.
    RunOptions call_options = call->options;
    if (call_options.timeout) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - call->arrived);
      if (waited > *call_options.timeout) {
        return call->fail(deadline_exceeded("partial run '{}': the call's deadline expired while "
                                            "it waited for the call in progress on the same "
                                            "partial run",
                                            call->id),
                          true);
      }
      call_options.timeout = std::max(std::chrono::milliseconds(0), *call_options.timeout - waited);
    }
    Session& session = *call->entry->session;
    OpenPartialRun& open_run = *call->run;
    Call* raw = call.get();
    session.partial_run_async(
        open_run.handle, raw->feeds, raw->fetches, raw->targets, call_options,
        [call = std::move(call)](Result<std::vector<Tensor>> out, RunMetadata* metadata) mutable {
          call->entry->touch();
          if (call->run->is_done()) call->forget();
          call->run->end_turn();
          StepDone answer = std::move(call->done);
          std::shared_ptr<void> hold = std::move(call->entry);
          // The rest of the call (its run, tensors) goes now; `hold` keeps
          // the session.
          call = nullptr;
          answer(std::move(out), metadata, std::move(hold));
        });
  });
}

Status SessionRegistry::cancel_partial_run(std::string_view handle,
                                           std::string_view partial_run_id) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, find(handle));
  std::shared_ptr<OpenPartialRun> run;
  {
    const std::lock_guard lock(entry->mu);
    const auto it = entry->partial_runs.find(partial_run_id);
    if (it == entry->partial_runs.end()) {
      return not_found("partial run '{}' not found in session '{}'", partial_run_id, handle);
    }
    run = std::move(it->second);
    entry->partial_runs.erase(it);
  }
  return entry->session->cancel_partial_run(run->handle);
}

Status SessionRegistry::close(std::string_view handle) {
  std::shared_ptr<Entry> entry;
  {
    const std::lock_guard lock(mu_);
    const auto it = sessions_.find(handle);
    if (it == sessions_.end()) return not_found("session '{}' not found", handle);
    entry = std::move(it->second);
    sessions_.erase(it);
  }
  // Cancels the calls in flight; they hold the entry, and the last one to
  // return destroys the session.
  entry->closed.store(true, std::memory_order_release);
  return entry->session->close();
}

void SessionRegistry::close_all() {
  std::map<std::string, std::shared_ptr<Entry>, std::less<>> sessions;
  {
    const std::lock_guard lock(mu_);
    sessions.swap(sessions_);
  }
  for (auto& [handle, entry] : sessions) entry->close();
}

std::vector<SessionInfo> SessionRegistry::list() const {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    const std::lock_guard lock(mu_);
    for (const auto& [handle, entry] : sessions_) entries.push_back(entry);
  }
  const int64_t now = now_ns();
  std::vector<SessionInfo> out;
  out.reserve(entries.size());
  for (const auto& entry : entries) {
    SessionInfo info;
    info.handle = entry->handle;
    info.graph_version = entry->graph_version.load();
    info.num_nodes = entry->num_nodes.load();
    {
      const std::lock_guard lock(entry->mu);
      entry->purge_done_locked();
      info.open_partial_runs = static_cast<int64_t>(entry->partial_runs.size());
    }
    info.idle = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::nanoseconds(now - entry->last_use_ns.load(std::memory_order_relaxed)));
    out.push_back(std::move(info));
  }
  return out;
}

std::size_t SessionRegistry::size() const {
  const std::lock_guard lock(mu_);
  return sessions_.size();
}

}  // namespace graphrun
