// DistributedSession (the driver, rank 0) and serve() (the workers): one
// graph across ranks. Every rank cuts the same graph the same way
// (partition.h); per signature the driver works out which of each rank's
// Sends and targets the step needs, starts each worker's part with a
// control message (control.h) and runs its own part as an asynchronous
// step. Steps start on every rank in the driver's order, so the oldest
// step is admitted everywhere and no rank waits for a step another holds
// back. Design: docs/distributed.md, Driver and workers.
#include <graphrun/mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <shared_mutex>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/src/deadline.h"
#include "api/src/target_name.h"
#include "scheduler/mpi/src/control.h"
#include "scheduler/mpi/src/engine.h"
#include "scheduler/mpi/src/partition.h"
#include "scheduler/mpi/src/ship.h"
#include "scheduler/plan.h"

namespace graphrun::mpi {

namespace {

using internal::Kind;
using internal::Message;
using internal::Partition;
using internal::Reader;
using internal::Writer;

// A feed's or fetch's tensor by name, its errors prefixed as one process's
// session prefixes them ("fetch 'w:3': ...").
Result<Output> find_named(const Graph& g, std::string_view what, const std::string& name) {
  Result<Output> o = g.find_output(name);
  if (!o.is_ok()) return o.status().with_prefix(fmt::format("{} '{}'", what, name));
  return o;
}

// A blocking queue of received messages.
class Inbox {
 public:
  void push(Message m) {
    {
      const std::lock_guard lock(mu_);
      queue_.push_back(std::move(m));
    }
    cv_.notify_all();
  }
  // The next message, or nullopt past `deadline`.
  std::optional<Message> pop(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !queue_.empty(); })) return std::nullopt;
    Message m = std::move(queue_.front());
    queue_.pop_front();
    return m;
  }
  Message pop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    Message m = std::move(queue_.front());
    queue_.pop_front();
    return m;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Message> queue_;
};

int64_t timeout_ms(const RunOptions& options) {
  return options.timeout.has_value() ? options.timeout->count() : -1;
}

// The nodes (by id: 1 if reached) a step of `roots` runs: back from them
// over data and control inputs; the walk ends at each input for which
// `stop(input)` is true (a fed tensor).
template <typename Stop>
std::vector<char> walk_back(const Graph& g, std::vector<int> stack, Stop stop) {
  std::vector<char> reached(static_cast<std::size_t>(g.num_nodes()), 0);
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    if (reached[static_cast<std::size_t>(id)] != 0) continue;
    reached[static_cast<std::size_t>(id)] = 1;
    const Node& n = *g.node(id);
    for (const Output& in : n.inputs()) {
      if (!stop(in)) stack.push_back(in.node()->id());
    }
    for (const Node* dep : n.control_inputs()) stack.push_back(dep->id());
  }
  return reached;
}

// How long past a call's deadline the driver waits for a worker's answer
// before it calls the rank unavailable (a stopped or lost process, a
// kernel that ignores cancellation).
constexpr auto kAnswerGrace = std::chrono::seconds(1);

// Waits on `cv` until `done`, or until the call's deadline (from `start`)
// plus kAnswerGrace: false then. Without a timeout, without bound.
template <typename Done>
bool wait_parts(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                const RunOptions& options, std::chrono::steady_clock::time_point start, Done done) {
  if (!options.timeout.has_value()) {
    cv.wait(lock, done);
    return true;
  }
  using Steady = std::chrono::steady_clock;
  const auto deadline = graphrun::internal::deadline_after<Steady>(start, *options.timeout);
  return cv.wait_until(lock, graphrun::internal::deadline_after<Steady>(deadline, kAnswerGrace),
                       done);
}

Status unanswered(int rank, const RunOptions& options) {
  return unavailable(
      "rank {} did not answer within the call's deadline of {} ms (+{} s): its process is "
      "stopped, lost, or runs a kernel that does not stop when cancelled",
      rank, options.timeout.has_value() ? options.timeout->count() : 0,
      std::chrono::duration_cast<std::chrono::seconds>(kAnswerGrace).count());
}

}  // namespace

// ---------------------------------------------------------------- driver

// One step in flight: its parts (rank 0's and the workers') report here.
struct Step {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;
  Status first;  // the first error of any part
  std::vector<Tensor> fetched;
  std::stop_source stop;
  std::vector<int> workers;  // the ranks with a part
  std::set<int> reported;    // guarded by mu
};

namespace {

// The check a Session makes of a fed value (the same message), made by the
// driver before any rank starts: a far part must not run a step that one
// process refuses.
Status check_feed_value(const std::string& name, DType dtype, const Shape& shape,
                        const Tensor& value) {
  if (!value.is_initialized()) {
    return invalid_argument("feed '{}': the value is an empty (uninitialized) tensor", name);
  }
  if (value.dtype() != dtype || !value.shape().is_compatible_with(shape)) {
    return invalid_argument("feed '{}' expects {}{}, got {}", name, dtype_name(dtype),
                            shape.to_string(), value.debug_type());
  }
  return Status::ok();
}

}  // namespace

struct Signature {
  struct Part {
    int rank = 0;
    std::string fixed;  // fetch edges, sends, targets (the start message's head)
  };
  std::vector<int> feed_rank;  // per feed
  std::vector<std::string> feed_name;
  std::vector<DType> feed_dtype;  // of the fed tensor
  std::vector<Shape> feed_shape;
  std::vector<std::string> local_fetches;
  std::vector<std::string> local_targets;
  std::vector<Part> parts;  // workers with something to do
  bool local = false;       // rank 0 runs a part
};

namespace {
// The driver's step ids, from 1, unique in the process (see Impl).
uint64_t next_step_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

struct DistributedSession::Impl {
  std::shared_ptr<World> world;
  ClusterOptions cluster;
  std::unique_ptr<Graph> graph;  // the global graph, the partition's
  std::unique_ptr<Partition> partition;
  std::unique_ptr<Session> session;  // rank 0's part

  std::mutex mu;  // plans, step ids, the order steps start in, and extends
  std::unordered_map<std::string, std::shared_ptr<const Signature>> plans;
  std::map<std::pair<int, int>, int> fetch_edges;  // (node, output) -> edge id
  // Step ids come from next_step_id(): unique in the process, so that a
  // worker's late answer to an earlier session's step never meets a step
  // of this one.
  bool closed = false;
  Status broken;  // an extend that failed half-way; guarded by mu
  // Readers of the graph and the placement that do not hold mu (a partial
  // run's names) share it; extend() holds it exclusively (after mu) while
  // it appends nodes. Nodes are never moved, so pointers stay valid.
  std::shared_mutex graph_mu;

  std::mutex steps_mu;
  std::unordered_map<uint64_t, std::shared_ptr<Step>> steps;
  std::unordered_map<uint64_t, std::weak_ptr<PartialRun::State>> partials;

  // The heartbeat (ClusterOptions::heartbeat_interval): when each rank was
  // last heard from, and the thread that pings the workers and fails the
  // steps of a silent one (lost()).
  std::mutex heard_mu;
  std::vector<std::chrono::steady_clock::time_point> last_heard;  // by rank; guarded by heard_mu
  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool beat_stop = false;  // guarded by beat_mu
  std::thread beat;

  Inbox control;                                               // kReady, kClosed
  std::vector<std::unique_ptr<internal::Listener>> listeners;  // last: destroyed first

  // close() stopped the heartbeat; this is for a create() cut short.
  ~Impl() {
    if (beat.joinable()) stop_heartbeat();
  }

  void deliver(Message m);
  void heartbeat();
  void stop_heartbeat();
  // `rank` sent nothing for heartbeat_timeout: its parts of the steps and
  // partial runs in flight fail with Unavailable.
  void lost(int rank);
  // Part `rank` of step `id` ended with `s` (rank -1: no part, the
  // caller's stop). The first error ends the step on every rank.
  void report(const std::shared_ptr<Step>& step, uint64_t id, int rank, Status s);
  Result<std::shared_ptr<const Signature>> plan(const FeedList& feeds,
                                                const std::vector<TensorRef>& fetches,
                                                const std::vector<TargetRef>& targets);
  // One step: of `sig` (a Callable's) or, when null, of the signature of
  // `feeds`, `fetches` and `targets` (planned under mu); `values` are the
  // feeds' tensors in order; rank 0's part runs through `local_callable`
  // when given.
  Result<std::vector<Tensor>> execute(std::shared_ptr<const Signature> sig, const FeedList* feeds,
                                      const std::vector<TensorRef>* fetches,
                                      const std::vector<TargetRef>* targets,
                                      std::span<const Tensor> values,
                                      const graphrun::Callable* local_callable,
                                      const RunOptions& options);
  // DistributedSession::extend, with mu held.
  Status extend(const Graph& grown);
  // Sends close to `notify` and waits (close_timeout) for `wait_for` to
  // confirm; with `heartbeat`, not for a rank the heartbeat finds silent
  // (the heartbeat still runs).
  Status shut_down(const std::vector<int>& notify, const std::vector<int>& wait_for,
                   bool heartbeat = false);
};

// One partial run spanning ranks, on the driver.
struct DistributedSession::PartialRun::State {
  std::shared_ptr<DistributedSession::Impl> impl;
  uint64_t id = 0;
  std::vector<Output> feeds, fetches;  // declared, of the global graph
  std::vector<const Node*> targets;
  std::vector<int> feed_rank, fetch_rank, target_rank;
  std::vector<std::string> local_fetch;  // per declared fetch, its name on rank 0
  std::vector<std::vector<int>> fetch_needs, target_needs;  // declared feeds they need
  std::vector<int> workers;                                 // the ranks with a part
  PartialRunHandle local;                                   // rank 0's part
  std::stop_source stop;                                    // ends rank 0's part

  std::mutex call_mu;           // one call at a time
  std::vector<char> fed, done;  // per declared feed / fetch; guarded by call_mu

  std::mutex mu;
  std::condition_variable cv;
  std::set<int> awaiting;  // workers whose reply to this call is due
  Status first;            // the first error of any rank
  bool ended = false;      // complete, failed or cancelled

  // Records the first error (`rank` > 0: prefixed) and ends every part.
  void fail(int rank, Status s);
  // Ends rank 0's part now, on the calling thread: a user's thread, never
  // the progress thread, which may drop the last reference to this state
  // (ending a partial run waits for its nodes, which may wait for MPI).
  void end_local() {
    if (local.is_valid()) static_cast<void>(impl->session->cancel_partial_run(local));
  }
  // A worker's reply to a setup or call.
  void replied(int rank, Status s) {
    if (!s.is_ok()) fail(rank, std::move(s));
    {
      const std::lock_guard lock(mu);
      awaiting.erase(rank);
    }
    cv.notify_all();
  }
};

void DistributedSession::PartialRun::State::fail(int rank, Status s) {
  if (s.is_ok()) return;
  if (rank > 0) s = s.with_prefix(fmt::format("rank {}", rank));
  {
    const std::lock_guard lock(mu);
    if (ended) return;  // complete, or an error came first
    first = std::move(s);
    ended = true;
  }
  cv.notify_all();
  stop.request_stop();
  for (int w : workers) {
    if (w != rank) {
      internal::send_message(impl->world->engine(), w, internal::kToWorker, Kind::kAbort, id, {});
    }
  }
}

void DistributedSession::Impl::deliver(Message m) {
  {
    const std::lock_guard lock(heard_mu);
    last_heard[static_cast<std::size_t>(m.source)] = std::chrono::steady_clock::now();
  }
  if (m.kind == Kind::kPong) return;
  if (m.kind != Kind::kDone && m.kind != Kind::kCallDone) {
    control.push(std::move(m));
    return;
  }
  std::shared_ptr<Step> step;
  std::shared_ptr<PartialRun::State> partial;
  {
    const std::lock_guard lock(steps_mu);
    if (auto it = steps.find(m.step); it != steps.end()) step = it->second;
    if (auto it = partials.find(m.step); it != partials.end()) partial = it->second.lock();
  }
  Reader r(m.payload);
  if (step != nullptr) {
    report(step, m.step, m.source, r.status());
  } else if (partial != nullptr) {
    // kDone: the worker's part ended by itself (an error); kCallDone: a reply.
    if (m.kind == Kind::kDone) {
      partial->fail(m.source, r.status());
    } else {
      partial->replied(m.source, r.status());
    }
  }
  // Else a part that ended after its step did.
}

void DistributedSession::Impl::report(const std::shared_ptr<Step>& step, uint64_t id, int rank,
                                      Status s) {
  // rank -1: the caller's stop, no rank's.
  if (!s.is_ok() && rank > 0) s = s.with_prefix(fmt::format("rank {}", rank));
  std::vector<int> others;
  bool abort = false;
  {
    const std::lock_guard lock(step->mu);
    if (rank >= 0) {
      if (!step->reported.insert(rank).second) return;
      --step->pending;
    }
    if (!s.is_ok() && step->first.is_ok()) {
      step->first = std::move(s);
      abort = true;
      for (int w : step->workers) {
        if (step->reported.count(w) == 0) others.push_back(w);
      }
    }
  }
  step->cv.notify_all();
  if (abort) {
    // The step ends everywhere: rank 0's Recvs stop, the workers abort.
    step->stop.request_stop();
    for (int w : others) {
      internal::send_message(world->engine(), w, internal::kToWorker, Kind::kAbort, id, {});
    }
  }
}

void DistributedSession::Impl::heartbeat() {
  std::unique_lock lock(beat_mu);
  while (!beat_cv.wait_until(lock,
                             graphrun::internal::steady_deadline_after(cluster.heartbeat_interval),
                             [&] { return beat_stop; })) {
    lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    std::vector<int> silent;
    {
      const std::lock_guard held(heard_mu);
      for (int r = 1; r < world->size(); ++r) {
        const auto quiet_for = std::chrono::duration_cast<std::chrono::milliseconds>(
            now - last_heard[static_cast<std::size_t>(r)]);
        if (quiet_for > cluster.heartbeat_timeout) {
          silent.push_back(r);
        }
      }
    }
    for (int r = 1; r < world->size(); ++r) {
      internal::send_message(world->engine(), r, internal::kToWorker, Kind::kPing, 0, {});
    }
    for (int r : silent) lost(r);
    lock.lock();
  }
}

void DistributedSession::Impl::stop_heartbeat() {
  {
    const std::lock_guard lock(beat_mu);
    beat_stop = true;
  }
  beat_cv.notify_all();
  if (beat.joinable()) beat.join();
}

void DistributedSession::Impl::lost(int rank) {
  std::vector<std::pair<uint64_t, std::shared_ptr<Step>>> hit;
  std::vector<std::shared_ptr<PartialRun::State>> hit_partials;
  auto has = [rank](const std::vector<int>& ranks) {
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  };
  {
    const std::lock_guard lock(steps_mu);
    for (const auto& [id, step] : steps) {
      if (has(step->workers)) hit.emplace_back(id, step);
    }
    for (const auto& [id, weak] : partials) {
      std::shared_ptr<PartialRun::State> p = weak.lock();
      if (p != nullptr && has(p->workers)) hit_partials.push_back(std::move(p));
    }
  }
  // Once per part: a step that heard from the rank, a partial run that
  // ended (its fail() told every rank) are left alone.
  std::erase_if(hit, [rank](const auto& h) {
    const std::lock_guard lock(h.second->mu);
    return h.second->reported.count(rank) != 0;
  });
  std::erase_if(hit_partials, [](const auto& p) {
    const std::lock_guard lock(p->mu);
    return p->ended;
  });
  if (hit.empty() && hit_partials.empty()) return;
  const Status s = unavailable(
      "sent nothing for {} ms, not even an answer to the driver's heartbeat "
      "(ClusterOptions::heartbeat_timeout): its process is stopped or lost",
      cluster.heartbeat_timeout.count());
  // The others are told to stop by report() and fail(); the silent rank
  // too, for when it answers again: its part has not ended.
  for (const auto& [id, step] : hit) {
    report(step, id, rank, s);
    internal::send_message(world->engine(), rank, internal::kToWorker, Kind::kAbort, id, {});
  }
  for (const auto& p : hit_partials) {
    p->replied(rank, s);
    internal::send_message(world->engine(), rank, internal::kToWorker, Kind::kAbort, p->id, {});
  }
}

Result<std::shared_ptr<const Signature>> DistributedSession::Impl::plan(
    const FeedList& feeds, const std::vector<TensorRef>& fetches,
    const std::vector<TargetRef>& targets) {
  std::string key;
  for (const Feed& f : feeds) key += f.tensor.to_string() + ',';
  key += '|';
  for (const TensorRef& f : fetches) key += f.to_string() + ',';
  key += '|';
  for (const TargetRef& t : targets) key += t.to_string() + ',';
  if (auto it = plans.find(key); it != plans.end()) return it->second;

  const Graph& g = *graph;
  auto sig = std::make_shared<Signature>();
  std::set<std::pair<int, int>> fed;
  for (const Feed& f : feeds) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, find_named(g, "feed", f.tensor.to_string()));
    // As one process, before any rank starts (else the parts that took
    // their feed once would run).
    if (!fed.emplace(o.node()->id(), o.index()).second) {
      return invalid_argument("tensor '{}' is fed more than once", o.name());
    }
    sig->feed_rank.push_back(partition->rank_of(o.node()->id()));
    sig->feed_name.push_back(o.name());
    sig->feed_dtype.push_back(o.dtype());
    sig->feed_shape.push_back(o.shape());
  }
  // What the step needs: back from the fetches and targets, stopping at
  // fed tensors.
  std::vector<int> stack;
  std::vector<Output> fetched;
  for (const TensorRef& f : fetches) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, find_named(g, "fetch", f.to_string()));
    fetched.push_back(o);
    if (fed.count({o.node()->id(), o.index()}) == 0) stack.push_back(o.node()->id());
  }
  std::vector<const Node*> targeted;
  for (const TargetRef& t : targets) {
    const Node* n = graphrun::internal::find_target_node(g, t.to_string());
    if (n == nullptr) return not_found("target '{}' is not a node of the graph", t.to_string());
    targeted.push_back(n);
    stack.push_back(n->id());
  }
  if (fetched.empty() && targeted.empty()) {
    return invalid_argument("Must specify at least one target to fetch or execute.");
  }
  const std::vector<char> needed = walk_back(g, std::move(stack), [&](const Output& in) {
    return fed.count({in.node()->id(), in.index()}) != 0;
  });
  // As one process, before any rank starts: a far part must not run (and
  // act on its variables) for a step that an unfed placeholder ends.
  for (int id = 0; id < g.num_nodes(); ++id) {
    if (needed[static_cast<std::size_t>(id)] != 0 && g.node(id)->op() == "Placeholder") {
      return invalid_argument("{}", sched::placeholder_message(*g.node(id)));
    }
  }
  const int ranks = world->size();
  std::vector<std::vector<int>> sends(static_cast<std::size_t>(ranks));
  std::vector<std::vector<std::string>> targets_of(static_cast<std::size_t>(ranks));
  std::vector<Writer> edge_records(static_cast<std::size_t>(ranks));
  std::vector<int> num_fetch_edges(static_cast<std::size_t>(ranks), 0);
  for (const internal::CrossEdge& e : partition->edges()) {
    const bool used = std::any_of(e.consumers.begin(), e.consumers.end(),
                                  [&](int c) { return needed[static_cast<std::size_t>(c)] != 0; });
    if (used) sends[static_cast<std::size_t>(e.from)].push_back(e.id);
  }
  const int before = partition->next_edge_id();
  for (const Output& o : fetched) {
    const int r = partition->rank_of(o.node()->id());
    if (r == 0) {
      sig->local_fetches.push_back(o.name());
      continue;
    }
    auto [it, added] =
        fetch_edges.emplace(std::make_pair(o.node()->id(), o.index()), partition->next_edge_id());
    if (added) GRAPHRUN_RETURN_IF_ERROR(partition->add_fetch_edge(it->second, o.name(), r, 0));
    sig->local_fetches.push_back(partition->recv_name(it->second));
    auto& mine = sends[static_cast<std::size_t>(r)];
    if (std::find(mine.begin(), mine.end(), it->second) == mine.end()) {
      mine.push_back(it->second);
      edge_records[static_cast<std::size_t>(r)]
          .u64(static_cast<uint64_t>(it->second))
          .str(o.name());
      ++num_fetch_edges[static_cast<std::size_t>(r)];
    }
  }
  if (partition->next_edge_id() != before) {
    GRAPHRUN_RETURN_IF_ERROR(session->extend(partition->local()));
  }
  for (const Node* n : targeted) {
    targets_of[static_cast<std::size_t>(partition->rank_of(n->id()))].push_back(n->name());
  }
  for (int id : sends[0]) sig->local_targets.push_back(partition->send_name(id));
  for (const std::string& t : targets_of[0]) sig->local_targets.push_back(t);
  sig->local = !sig->local_fetches.empty() || !sig->local_targets.empty();
  for (int r = 1; r < ranks; ++r) {
    const auto& s = sends[static_cast<std::size_t>(r)];
    const auto& t = targets_of[static_cast<std::size_t>(r)];
    if (s.empty() && t.empty()) continue;
    Writer w;
    w.u64(static_cast<uint64_t>(num_fetch_edges[static_cast<std::size_t>(r)]));
    std::string head = w.take() + edge_records[static_cast<std::size_t>(r)].take();
    Writer rest;
    rest.u64(s.size());
    for (int id : s) rest.u64(static_cast<uint64_t>(id));
    rest.u64(t.size());
    for (const std::string& name : t) rest.str(name);
    sig->parts.push_back(Signature::Part{r, head + rest.take()});
  }
  plans.emplace(std::move(key), sig);
  return std::shared_ptr<const Signature>(sig);
}

Status DistributedSession::Impl::shut_down(const std::vector<int>& notify,
                                           const std::vector<int>& wait_for, bool heartbeat) {
  for (int r : notify) {
    internal::send_message(world->engine(), r, internal::kToWorker, Kind::kClose, 0, {});
  }
  const auto deadline = graphrun::internal::steady_deadline_after(cluster.close_timeout);
  std::set<int> waiting(wait_for.begin(), wait_for.end());
  Status status;
  // A rank the heartbeat finds silent (stopped, lost) is not waited for: a
  // live one keeps answering the heartbeat while it ends its steps.
  auto give_up_on_silent = [&] {
    const auto now = std::chrono::steady_clock::now();
    const std::lock_guard lock(heard_mu);
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (now - last_heard[static_cast<std::size_t>(*it)] > cluster.heartbeat_timeout) {
        status.update(unavailable(
            "rank {} did not confirm the session's close: it sent nothing for {} ms, not even an "
            "answer to the driver's heartbeat (ClusterOptions::heartbeat_timeout): its process "
            "is stopped or lost",
            *it, cluster.heartbeat_timeout.count()));
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
  };
  while (!waiting.empty()) {
    if (heartbeat) give_up_on_silent();
    if (waiting.empty()) break;
    const auto until =
        heartbeat ? std::min(deadline,
                             graphrun::internal::steady_deadline_after(cluster.heartbeat_interval))
                  : deadline;
    std::optional<Message> m = control.pop(until);
    if (!m.has_value()) {
      if (std::chrono::steady_clock::now() < deadline) continue;
      status.update(unavailable("rank {} did not confirm the session's close within {} ms",
                                *waiting.begin(), cluster.close_timeout.count()));
      return status;
    }
    if (m->kind == Kind::kClosed) waiting.erase(m->source);
  }
  return status;
}

DistributedSession::DistributedSession(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

DistributedSession::~DistributedSession() { static_cast<void>(close()); }

namespace {
// A DistributedSession of this process is open (created and not closed):
// the workers serve one driver session at a time, and a second create()
// would take them from the first.
std::atomic<bool> g_driver_open{false};
}  // namespace

Result<std::unique_ptr<DistributedSession>> DistributedSession::create(const Graph& graph,
                                                                       SessionOptions options,
                                                                       ClusterOptions cluster) {
  std::shared_ptr<World> world = World::current();
  if (world == nullptr) {
    return failed_precondition("DistributedSession needs graphrun::mpi::World::init() first");
  }
  if (world->rank() != 0) {
    return failed_precondition(
        "DistributedSession is made on rank 0; rank {} runs graphrun::mpi::serve()", world->rank());
  }
  GRAPHRUN_RETURN_IF_ERROR(graph.status());
  if (g_driver_open.exchange(true)) {
    return failed_precondition(
        "another DistributedSession of this process is open: the workers serve one at a time "
        "(close it first)");
  }
  // Released unless the session is made (then its close() releases it).
  struct OpenFlag {
    bool keep = false;
    ~OpenFlag() {
      if (!keep) g_driver_open.store(false);
    }
  } open_flag;
  auto impl = std::make_shared<Impl>();
  impl->world = world;
  impl->cluster = cluster;
  impl->graph = std::make_unique<Graph>(graph.clone());
  impl->last_heard.assign(static_cast<std::size_t>(world->size()),
                          std::chrono::steady_clock::now());
  Impl* self = impl.get();
  std::vector<int> workers;
  for (int r = 1; r < world->size(); ++r) {
    impl->listeners.push_back(
        std::make_unique<internal::Listener>(world->engine(), r, internal::kToDriver,
                                             [self](Message m) { self->deliver(std::move(m)); }));
    workers.push_back(r);
  }
  // A nonce of this session in every transfer's header (Partition::make).
  std::random_device entropy;
  const auto session_id = static_cast<int64_t>((uint64_t{entropy()} << 32) ^ entropy());
  Result<std::unique_ptr<Partition>> partition =
      Partition::make(*impl->graph, world->size(), 0, session_id);
  Status setup = partition.status();
  const bool beats = cluster.heartbeat_interval.count() > 0;
  if (setup.is_ok() && beats && cluster.heartbeat_timeout <= cluster.heartbeat_interval) {
    setup = invalid_argument(
        "ClusterOptions::heartbeat_timeout ({} ms) must be longer than heartbeat_interval ({} ms)",
        cluster.heartbeat_timeout.count(), cluster.heartbeat_interval.count());
  }
  if (setup.is_ok()) {
    impl->partition = std::move(*partition);
    Result<std::unique_ptr<Session>> session =
        Session::create(impl->partition->local(), std::move(options));
    setup = session.status();
    if (setup.is_ok()) impl->session = std::move(*session);
  }
  if (!setup.is_ok()) {
    // The workers wait for a hello: they are closed instead.
    static_cast<void>(impl->shut_down(workers, workers));
    impl->closed = true;
    return setup;
  }
  // Every worker must hold the same graph before a step starts.
  const uint64_t print = Partition::fingerprint(*impl->graph);
  for (int r : workers) {
    Writer w;
    w.u64(print).u64(static_cast<uint64_t>(world->size())).i64(session_id);
    internal::send_message(world->engine(), r, internal::kToWorker, Kind::kHello, 0, w.take());
  }
  const auto deadline = graphrun::internal::steady_deadline_after(cluster.connect_timeout);
  std::set<int> waiting(workers.begin(), workers.end());
  std::vector<int> ready;
  Status failed;
  while (!waiting.empty()) {
    std::optional<Message> m = impl->control.pop(deadline);
    if (!m.has_value()) {
      failed.update(unavailable(
          "rank {} did not answer within {} ms: every rank but 0 must run graphrun::mpi::serve()",
          *waiting.begin(), cluster.connect_timeout.count()));
      break;
    }
    if (m->kind == Kind::kNeedPart) {
      // A worker without a graph (serve_without_graph): its part is cut
      // here and sent as a GraphDef; its kReady follows.
      Result<std::string> part =
          internal::encode_part(*impl->graph, world->size(), m->source, session_id);
      if (!part.is_ok()) {
        failed.update(part.status().with_prefix(fmt::format("rank {}", m->source)));
        break;
      }
      internal::send_message(world->engine(), m->source, internal::kToWorker, Kind::kPart, 0,
                             std::move(*part));
      continue;
    }
    if (m->kind != Kind::kReady) continue;
    waiting.erase(m->source);
    Reader r(m->payload);
    Status st = r.status();
    if (st.is_ok()) {
      ready.push_back(m->source);
    } else {
      failed.update(st.with_prefix(fmt::format("rank {}", m->source)));
    }
  }
  if (!failed.is_ok()) {
    // Ranks that answered OK and ranks that did not answer yet are closed;
    // only the first are waited for.
    std::vector<int> notify(ready);
    notify.insert(notify.end(), waiting.begin(), waiting.end());
    static_cast<void>(impl->shut_down(notify, ready));
    impl->closed = true;
    return failed;
  }
  if (beats && world->size() > 1) {
    {
      const std::lock_guard lock(impl->heard_mu);
      std::fill(impl->last_heard.begin(), impl->last_heard.end(), std::chrono::steady_clock::now());
    }
    impl->beat = std::thread([self] { self->heartbeat(); });
  }
  open_flag.keep = true;
  return std::unique_ptr<DistributedSession>(new DistributedSession(std::move(impl)));
}

const std::vector<int>& DistributedSession::placement() const { return impl_->partition->ranks(); }

Result<std::vector<Tensor>> DistributedSession::run(const FeedList& feeds,
                                                    const std::vector<TensorRef>& fetches,
                                                    const std::vector<TargetRef>& targets,
                                                    const RunOptions& options) {
  std::vector<Tensor> values;
  values.reserve(feeds.size());
  for (const Feed& f : feeds) values.push_back(f.value);
  return impl_->execute(nullptr, &feeds, &fetches, &targets, values, nullptr, options);
}

Result<std::vector<Tensor>> DistributedSession::Impl::execute(
    std::shared_ptr<const Signature> sig, const FeedList* feeds,
    const std::vector<TensorRef>* fetches, const std::vector<TargetRef>* targets,
    std::span<const Tensor> values, const graphrun::Callable* local_callable,
    const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Impl& s = *this;
  auto step = std::make_shared<Step>();
  uint64_t id = 0;
  {
    const std::lock_guard lock(s.mu);
    if (s.closed) return cancelled("Session has been closed.");
    if (sig == nullptr) {
      GRAPHRUN_ASSIGN_OR_RETURN(sig, s.plan(*feeds, *fetches, *targets));
    }
    for (std::size_t k = 0; k < values.size() && k < sig->feed_name.size(); ++k) {
      GRAPHRUN_RETURN_IF_ERROR(
          check_feed_value(sig->feed_name[k], sig->feed_dtype[k], sig->feed_shape[k], values[k]));
    }
    id = next_step_id();
    for (const Signature::Part& p : sig->parts) step->workers.push_back(p.rank);
    step->pending = static_cast<int>(sig->parts.size()) + (sig->local ? 1 : 0);
    {
      const std::lock_guard steps_lock(s.steps_mu);
      s.steps.emplace(id, step);
    }
    for (const Signature::Part& p : sig->parts) {
      Writer w;
      w.i64(timeout_ms(options));
      std::size_t n = 0;
      for (std::size_t k = 0; k < values.size(); ++k) n += sig->feed_rank[k] == p.rank ? 1 : 0;
      w.u64(n);
      for (std::size_t k = 0; k < values.size(); ++k) {
        if (sig->feed_rank[k] == p.rank) w.str(sig->feed_name[k]).tensor(values[k]);
      }
      internal::send_message(s.world->engine(), p.rank, internal::kToWorker, Kind::kStart, id,
                             p.fixed + w.take());
    }
    if (sig->local) {
      RunOptions o;
      o.timeout = options.timeout;
      o.stop_token = step->stop.get_token();
      Impl* self = &s;
      RunDone done = [self, step, id](Result<std::vector<Tensor>> r, RunMetadata*) {
        if (r.is_ok()) {
          const std::lock_guard held(step->mu);
          step->fetched = std::move(*r);
        }
        self->report(step, id, 0, r.is_ok() ? Status::ok() : r.status());
      };
      std::vector<Tensor> local_values{Tensor(static_cast<int64_t>(id))};
      for (std::size_t k = 0; k < values.size(); ++k) {
        if (sig->feed_rank[k] == 0) local_values.push_back(values[k]);
      }
      if (local_callable != nullptr) {
        local_callable->run_async(std::move(local_values), o, std::move(done));
      } else {
        FeedList local;
        local.reserve(local_values.size());
        local.push_back(Feed{s.partition->step_name(), std::move(local_values[0])});
        std::size_t next = 1;
        for (std::size_t k = 0; k < values.size(); ++k) {
          if (sig->feed_rank[k] == 0) {
            local.push_back(Feed{sig->feed_name[k], std::move(local_values[next++])});
          }
        }
        std::vector<TensorRef> local_fetches(sig->local_fetches.begin(), sig->local_fetches.end());
        std::vector<TargetRef> local_targets(sig->local_targets.begin(), sig->local_targets.end());
        s.session->run_async(local, local_fetches, local_targets, o, std::move(done));
      }
    }
  }
  // A stop of the caller's token ends the step on every rank.
  std::optional<std::stop_callback<std::function<void()>>> on_stop;
  if (options.stop_token.stop_possible()) {
    on_stop.emplace(options.stop_token, std::function<void()>([&s, step, id] {
                      s.report(step, id, -1, cancelled("the run was cancelled by its caller"));
                    }));
  }
  Status first;
  std::vector<Tensor> fetched;
  {
    std::unique_lock lock(step->mu);
    if (!wait_parts(lock, step->cv, options, start, [&] { return step->pending == 0; })) {
      // The silent rank is named; the others were told to stop.
      for (int w : step->workers) {
        if (step->reported.count(w) == 0) {
          first = unanswered(w, options);
          break;
        }
      }
      if (first.is_ok()) first = step->first;
      if (first.is_ok()) first = deadline_exceeded("the run's deadline passed");
    } else {
      first = step->first;
      fetched = std::move(step->fetched);
    }
  }
  on_stop.reset();
  {
    const std::lock_guard steps_lock(s.steps_mu);
    s.steps.erase(id);
  }
  if (!first.is_ok()) return first;
  // Fetches in the caller's order (rank 0's part fetched them all).
  return fetched;
}

// ------------------------------------------------------ callables (driver)

struct DistributedSession::Callable::State {
  std::shared_ptr<DistributedSession::Impl> impl;
  std::shared_ptr<const Signature> sig;
  std::optional<graphrun::Callable> local;  // rank 0's part, when it has one
  std::size_t num_fetches = 0;
};

DistributedSession::Callable::Callable() = default;
DistributedSession::Callable::Callable(Callable&&) noexcept = default;
DistributedSession::Callable& DistributedSession::Callable::operator=(Callable&&) noexcept =
    default;
DistributedSession::Callable::~Callable() = default;

std::size_t DistributedSession::Callable::num_feeds() const {
  return state_ == nullptr ? 0 : state_->sig->feed_rank.size();
}

std::size_t DistributedSession::Callable::num_fetches() const {
  return state_ == nullptr ? 0 : state_->num_fetches;
}

Status DistributedSession::Callable::run(std::span<const Tensor> feeds, std::span<Tensor> fetches,
                                         const RunOptions& options) const {
  if (state_ == nullptr) return failed_precondition("the Callable is empty (moved from)");
  if (feeds.size() != num_feeds()) {
    return invalid_argument("the Callable takes {} feeds, got {}", num_feeds(), feeds.size());
  }
  if (fetches.size() != num_fetches()) {
    return invalid_argument("the Callable makes {} fetches, got {} slots", num_fetches(),
                            fetches.size());
  }
  const State& st = *state_;
  GRAPHRUN_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                            st.impl->execute(st.sig, nullptr, nullptr, nullptr, feeds,
                                             st.local.has_value() ? &*st.local : nullptr, options));
  std::move(out.begin(), out.end(), fetches.begin());
  return Status::ok();
}

Result<DistributedSession::Callable> DistributedSession::make_callable(
    const std::vector<TensorRef>& feeds, const std::vector<TensorRef>& fetches,
    const std::vector<TargetRef>& targets) {
  Impl& s = *impl_;
  auto st = std::make_shared<Callable::State>();
  st->impl = impl_;
  st->num_fetches = fetches.size();
  FeedList named;
  for (const TensorRef& f : feeds) named.push_back(Feed{f, Tensor()});
  {
    const std::lock_guard lock(s.mu);
    if (s.closed) return cancelled("Session has been closed.");
    GRAPHRUN_ASSIGN_OR_RETURN(st->sig, s.plan(named, fetches, targets));
  }
  const Signature& sig = *st->sig;
  if (sig.local) {
    std::vector<TensorRef> local_feeds{TensorRef(s.partition->step_name())};
    for (std::size_t k = 0; k < sig.feed_rank.size(); ++k) {
      if (sig.feed_rank[k] == 0) local_feeds.emplace_back(sig.feed_name[k]);
    }
    std::vector<TensorRef> local_fetches(sig.local_fetches.begin(), sig.local_fetches.end());
    std::vector<TargetRef> local_targets(sig.local_targets.begin(), sig.local_targets.end());
    GRAPHRUN_ASSIGN_OR_RETURN(graphrun::Callable local,
                              s.session->make_callable(local_feeds, local_fetches, local_targets));
    st->local.emplace(std::move(local));
  }
  Callable c;
  c.state_ = std::move(st);
  return c;
}

// ------------------------------------------------- partial runs (driver)

DistributedSession::PartialRun::PartialRun() = default;
DistributedSession::PartialRun::PartialRun(PartialRun&&) noexcept = default;
DistributedSession::PartialRun& DistributedSession::PartialRun::operator=(PartialRun&& o) noexcept {
  if (this != &o) {
    if (state_ != nullptr) {
      state_->fail(0, cancelled("the partial run's handle was replaced"));
      state_->end_local();
    }
    state_ = std::move(o.state_);
  }
  return *this;
}
DistributedSession::PartialRun::~PartialRun() {
  if (state_ != nullptr) {
    state_->fail(0, cancelled("the partial run's handle was destroyed"));
    state_->end_local();
  }
}
bool DistributedSession::PartialRun::is_done() const {
  if (state_ == nullptr) return true;
  const std::lock_guard lock(state_->mu);
  return state_->ended;
}

namespace {
// The declared feeds (indices) that `root` needs: back from it, stopping
// at declared feeds.
std::vector<int> needs_of(const Graph& g, int root, const std::vector<Output>& feeds) {
  std::set<int> needs;
  static_cast<void>(walk_back(g, {root}, [&](const Output& in) {
    const auto it = std::find(feeds.begin(), feeds.end(), in);
    if (it == feeds.end()) return false;
    needs.insert(static_cast<int>(it - feeds.begin()));
    return true;
  }));
  return {needs.begin(), needs.end()};
}
}  // namespace

Result<DistributedSession::PartialRun> DistributedSession::partial_run_setup(
    const std::vector<TensorRef>& fetches, const std::vector<TensorRef>& feeds,
    const std::vector<TargetRef>& targets, const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  auto st = std::make_shared<PartialRun::State>();
  st->impl = impl_;
  std::shared_lock read(s.graph_mu);  // an extend may append nodes
  const Graph& g = *s.graph;
  FeedList declared;
  for (const TensorRef& f : feeds) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, g.find_output(f.to_string()));
    st->feeds.push_back(o);
    st->feed_rank.push_back(s.partition->rank_of(o.node()->id()));
    declared.push_back(Feed{o.name(), Tensor()});
  }
  for (const TensorRef& f : fetches) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, find_named(g, "fetch", f.to_string()));
    st->fetches.push_back(o);
    st->fetch_needs.push_back(
        std::find(st->feeds.begin(), st->feeds.end(), o) != st->feeds.end()
            ? std::vector<int>{static_cast<int>(std::find(st->feeds.begin(), st->feeds.end(), o) -
                                                st->feeds.begin())}
            : needs_of(g, o.node()->id(), st->feeds));
  }
  for (const TargetRef& t : targets) {
    const Node* n = graphrun::internal::find_target_node(g, t.to_string());
    if (n == nullptr) return not_found("target '{}' is not a node of the graph", t.to_string());
    st->targets.push_back(n);
    st->target_rank.push_back(s.partition->rank_of(n->id()));
    st->target_needs.push_back(needs_of(g, n->id(), st->feeds));
  }
  st->fed.assign(st->feeds.size(), 0);
  st->done.assign(st->fetches.size(), 0);
  std::vector<TensorRef> fetch_refs(fetches.begin(), fetches.end());
  read.unlock();
  const std::lock_guard lock(s.mu);
  if (s.closed) return cancelled("Session has been closed.");
  GRAPHRUN_ASSIGN_OR_RETURN(std::shared_ptr<const Signature> sig,
                            s.plan(declared, fetch_refs, targets));
  st->local_fetch = sig->local_fetches;
  st->id = next_step_id();
  for (const Signature::Part& p : sig->parts) st->workers.push_back(p.rank);
  {
    const std::lock_guard steps_lock(s.steps_mu);
    s.partials.emplace(st->id, st);
  }
  auto forget = [&] {
    const std::lock_guard steps_lock(s.steps_mu);
    s.partials.erase(st->id);
  };
  {
    const std::lock_guard st_lock(st->mu);
    st->awaiting.insert(st->workers.begin(), st->workers.end());
  }
  for (const Signature::Part& p : sig->parts) {
    Writer w;
    w.i64(timeout_ms(options));
    std::vector<std::string> mine;
    for (std::size_t k = 0; k < st->feeds.size(); ++k) {
      if (st->feed_rank[k] == p.rank) mine.push_back(st->feeds[k].name());
    }
    w.u64(mine.size());
    for (const std::string& name : mine) w.str(name);
    internal::send_message(s.world->engine(), p.rank, internal::kToWorker, Kind::kPartialSetup,
                           st->id, p.fixed + w.take());
  }
  // Rank 0's part: its fetches and the step id, which the last call
  // fetches so that no earlier call waits for every target.
  std::vector<TensorRef> local_fetches(sig->local_fetches.begin(), sig->local_fetches.end());
  local_fetches.emplace_back(s.partition->step_name());
  std::vector<TensorRef> local_feeds{TensorRef(s.partition->step_name())};
  for (std::size_t k = 0; k < st->feeds.size(); ++k) {
    if (st->feed_rank[k] == 0) local_feeds.emplace_back(st->feeds[k].name());
  }
  std::vector<TargetRef> local_targets(sig->local_targets.begin(), sig->local_targets.end());
  RunOptions o;
  o.timeout = options.timeout;
  o.stop_token = st->stop.get_token();
  Result<PartialRunHandle> local =
      s.session->partial_run_setup(local_fetches, local_feeds, local_targets, o);
  Status status = local.status();
  if (status.is_ok()) {
    st->local = std::move(*local);
    status = s.session
                 ->partial_run(st->local,
                               {{s.partition->step_name(), Tensor(static_cast<int64_t>(st->id))}},
                               {}, {}, o)
                 .status();
  }
  if (!status.is_ok()) st->fail(0, status);
  {
    std::unique_lock st_lock(st->mu);
    if (!wait_parts(st_lock, st->cv, options, start, [&] { return st->awaiting.empty(); })) {
      status = unanswered(*st->awaiting.begin(), options);
    } else {
      status = st->first;
    }
  }
  if (!status.is_ok()) {
    st->fail(0, status);
    st->end_local();
    forget();
    return status;
  }
  PartialRun handle;
  handle.state_ = std::move(st);
  return handle;
}

Result<std::vector<Tensor>> DistributedSession::partial_run(PartialRun& handle,
                                                            const FeedList& feeds,
                                                            const std::vector<TensorRef>& fetches,
                                                            const std::vector<TargetRef>& targets,
                                                            const RunOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Impl& s = *impl_;
  const std::shared_ptr<PartialRun::State> st = handle.state_;
  if (st == nullptr) return invalid_argument("an empty partial run handle");
  if (st->impl != impl_) return invalid_argument("a partial run handle of another session");
  {
    // As TF: a closed session first (its workers are gone: nothing to ask).
    const std::lock_guard lock(s.mu);
    if (s.closed) return cancelled("Session has been closed.");
  }
  std::unique_lock call(st->call_mu, std::try_to_lock);
  if (!call.owns_lock()) {
    return failed_precondition("another call on this partial run is in progress");
  }
  {
    const std::lock_guard lock(st->mu);
    if (st->ended) {
      return st->first.is_ok() ? invalid_argument(
                                     "the partial run is complete: every fetch and target of its "
                                     "setup has been produced")
                               : st->first;
    }
  }
  std::shared_lock read(s.graph_mu);  // an extend may append nodes
  const Graph& g = *s.graph;
  // Resolved and checked as one process would: misuse leaves the run usable.
  std::vector<int> feed_ids, fetch_ids, target_ids;
  for (const Feed& f : feeds) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, g.find_output(f.tensor.to_string()));
    auto it = std::find(st->feeds.begin(), st->feeds.end(), o);
    if (it == st->feeds.end()) {
      return invalid_argument("The feed '{}' was not specified in partial_run_setup.", o.name());
    }
    const auto id = static_cast<int>(it - st->feeds.begin());
    if (st->fed[static_cast<std::size_t>(id)] != 0 ||
        std::find(feed_ids.begin(), feed_ids.end(), id) != feed_ids.end()) {
      return invalid_argument("The feed '{}' has already been fed.", o.name());
    }
    GRAPHRUN_RETURN_IF_ERROR(check_feed_value(o.name(), o.dtype(), o.shape(), f.value));
    feed_ids.push_back(id);
  }
  for (const TensorRef& f : fetches) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, g.find_output(f.to_string()));
    auto it = std::find(st->fetches.begin(), st->fetches.end(), o);
    if (it == st->fetches.end()) {
      return invalid_argument("The fetch '{}' was not specified in partial_run_setup.", o.name());
    }
    const auto id = static_cast<int>(it - st->fetches.begin());
    if (st->done[static_cast<std::size_t>(id)] != 0) {
      return invalid_argument("The fetch '{}' has already been fetched.", o.name());
    }
    fetch_ids.push_back(id);
  }
  for (const TargetRef& t : targets) {
    const Node* n = g.find_node(t.to_string());
    auto it =
        n == nullptr ? st->targets.end() : std::find(st->targets.begin(), st->targets.end(), n);
    if (it == st->targets.end()) {
      return invalid_argument("The target '{}' was not specified in partial_run_setup.",
                              t.to_string());
    }
    target_ids.push_back(static_cast<int>(it - st->targets.begin()));
  }
  read.unlock();
  auto will_be_fed = [&](int f) {
    return st->fed[static_cast<std::size_t>(f)] != 0 ||
           std::find(feed_ids.begin(), feed_ids.end(), f) != feed_ids.end();
  };
  auto check = [&](const std::vector<int>& needs, const std::string& what) -> Status {
    std::string missing;
    for (int f : needs) {
      if (!will_be_fed(f)) {
        missing += fmt::format("{}'{}'", missing.empty() ? "" : ", ",
                               st->feeds[static_cast<std::size_t>(f)].name());
      }
    }
    if (missing.empty()) return Status::ok();
    return invalid_argument(
        "{} can't be computed from the feeds that have been fed so far: {} still missing", what,
        missing);
  };
  bool last = true;
  for (std::size_t k = 0; k < st->fetches.size(); ++k) {
    if (st->done[k] == 0 &&
        std::find(fetch_ids.begin(), fetch_ids.end(), static_cast<int>(k)) == fetch_ids.end()) {
      last = false;
    }
  }
  // The call that fetches the last fetches waits for every target too.
  std::vector<int> awaited_targets = target_ids;
  if (last) {
    for (std::size_t t = 0; t < st->targets.size(); ++t) {
      awaited_targets.push_back(static_cast<int>(t));
    }
    std::sort(awaited_targets.begin(), awaited_targets.end());
    awaited_targets.erase(std::unique(awaited_targets.begin(), awaited_targets.end()),
                          awaited_targets.end());
  }
  for (int k : fetch_ids) {
    GRAPHRUN_RETURN_IF_ERROR(
        check(st->fetch_needs[static_cast<std::size_t>(k)],
              fmt::format("Fetch '{}'", st->fetches[static_cast<std::size_t>(k)].name())));
  }
  for (int t : awaited_targets) {
    GRAPHRUN_RETURN_IF_ERROR(
        check(st->target_needs[static_cast<std::size_t>(t)],
              fmt::format("Target '{}'", st->targets[static_cast<std::size_t>(t)]->name())));
  }

  // Each worker gets its feeds and targets (and, last, the end of its part).
  for (int r : st->workers) {
    std::vector<int> my_feeds, my_targets;
    for (int f : feed_ids) {
      if (st->feed_rank[static_cast<std::size_t>(f)] == r) my_feeds.push_back(f);
    }
    for (int t : awaited_targets) {
      if (st->target_rank[static_cast<std::size_t>(t)] == r) my_targets.push_back(t);
    }
    if (my_feeds.empty() && my_targets.empty() && !last) continue;
    Writer w;
    w.u64(last ? 1 : 0).i64(timeout_ms(options)).u64(my_feeds.size());
    for (int f : my_feeds) {
      w.str(st->feeds[static_cast<std::size_t>(f)].name())
          .tensor(feeds[static_cast<std::size_t>(std::find(feed_ids.begin(), feed_ids.end(), f) -
                                                 feed_ids.begin())]
                      .value);
    }
    w.u64(my_targets.size());
    for (int t : my_targets) w.str(st->targets[static_cast<std::size_t>(t)]->name());
    {
      const std::lock_guard lock(st->mu);
      st->awaiting.insert(r);
    }
    internal::send_message(s.world->engine(), r, internal::kToWorker, Kind::kPartialCall, st->id,
                           w.take());
  }
  FeedList local_feeds;
  for (std::size_t k = 0; k < feed_ids.size(); ++k) {
    const auto f = static_cast<std::size_t>(feed_ids[k]);
    if (st->feed_rank[f] == 0) local_feeds.push_back(Feed{st->feeds[f].name(), feeds[k].value});
  }
  std::vector<TensorRef> local_fetches;
  for (int k : fetch_ids) local_fetches.emplace_back(st->local_fetch[static_cast<std::size_t>(k)]);
  if (last) local_fetches.emplace_back(s.partition->step_name());
  std::vector<TargetRef> local_targets;
  for (int t : awaited_targets) {
    if (st->target_rank[static_cast<std::size_t>(t)] == 0) {
      local_targets.emplace_back(st->targets[static_cast<std::size_t>(t)]->name());
    }
  }
  RunOptions o;
  o.timeout = options.timeout;
  o.stop_token = options.stop_token;
  Result<std::vector<Tensor>> out =
      s.session->partial_run(st->local, local_feeds, local_fetches, local_targets, o);
  if (!out.is_ok()) st->fail(0, out.status());
  Status status;
  {
    std::unique_lock lock(st->mu);
    if (!wait_parts(lock, st->cv, options, start, [&] { return st->awaiting.empty(); })) {
      status = unanswered(*st->awaiting.begin(), options);
    } else {
      status = st->first;
      if (status.is_ok() && last) st->ended = true;
    }
  }
  if (!status.is_ok() || last) {
    const std::lock_guard steps_lock(s.steps_mu);
    s.partials.erase(st->id);
  }
  if (!status.is_ok()) {
    st->fail(0, status);
    st->end_local();
    return status;
  }
  for (int f : feed_ids) st->fed[static_cast<std::size_t>(f)] = 1;
  for (int k : fetch_ids) st->done[static_cast<std::size_t>(k)] = 1;
  if (last) out->pop_back();  // the step id
  return out;
}

Status DistributedSession::cancel_partial_run(PartialRun& handle) {
  if (handle.state_ == nullptr) return invalid_argument("an empty partial run handle");
  handle.state_->fail(0, cancelled("the partial run was cancelled"));
  handle.state_->end_local();
  const std::lock_guard steps_lock(impl_->steps_mu);
  impl_->partials.erase(handle.state_->id);
  return Status::ok();
}

// ------------------------------------------------------- extend (driver)

Status DistributedSession::extend(const Graph& grown) {
  Impl& s = *impl_;
  // No step starts from the first delta sent until every worker took its
  // part: a plan made between could name a node a worker lacks.
  const std::lock_guard lock(s.mu);
  if (s.closed) return cancelled("Session has been closed.");
  if (!s.broken.is_ok()) {
    return failed_precondition(
        "DistributedSession::extend: an earlier extend failed half-way ({}); the signatures so "
        "far still run, but the graph cannot grow",
        s.broken.to_string());
  }
  return s.extend(grown).with_prefix("DistributedSession::extend");
}

Status DistributedSession::Impl::extend(const Graph& grown) {
  // Everything is checked and every delta written before anything changes.
  Graph next = graph->clone();
  GRAPHRUN_RETURN_IF_ERROR(next.append_nodes_from(grown));
  const int old = graph->num_nodes();
  for (int id = 0; id < old; ++id) {
    if (graph->node(id)->device() != grown.node(id)->device()) {
      return invalid_argument(
          "cannot extend: node {} of the given graph is {} on device '{}' but here it is on "
          "'{}' (a placed node cannot move)",
          id, grown.node(id)->describe(), grown.node(id)->device(), graph->node(id)->device());
    }
  }
  if (next.num_nodes() == old) return Status::ok();
  GRAPHRUN_ASSIGN_OR_RETURN(internal::Growth growth, partition->grow(next, world->size()));
  for (int id = old; id < next.num_nodes(); ++id) {
    const Node& n = *next.node(id);
    const int r = growth.ranks[static_cast<std::size_t>(id)];
    if (r != 0 &&
        (n.kernel_override() != nullptr || n.op() == "Call" || n.op() == "StatelessCall")) {
      return invalid_argument(
          "{} is placed on rank {}, a worker: its kernel is code of this program and cannot be "
          "sent there (place it on rank 0)",
          n.describe(), r);
    }
  }
  std::vector<std::pair<int, std::string>> deltas;  // (rank, kExtend payload)
  for (int r = 1; r < world->size(); ++r) {
    std::vector<internal::Stub> stubs;
    Result<Graph> delta = partition->delta(next, growth, r, stubs);
    if (!delta.is_ok()) return delta.status().with_prefix(fmt::format("rank {}", r));
    if (delta->num_nodes() == 0) continue;  // nothing new on that rank
    Result<std::string> payload = internal::encode_delta(*delta, stubs);
    if (!payload.is_ok()) return payload.status().with_prefix(fmt::format("rank {}", r));
    deltas.emplace_back(r, std::move(*payload));
  }

  // Rank 0 first: its graph, its cut and its session.
  Status status;
  {
    const std::unique_lock write(graph_mu);
    status = graph->append_nodes_from(grown);
    if (status.is_ok()) status = partition->apply(growth);
  }
  if (status.is_ok()) status = session->extend(partition->local());
  if (!status.is_ok()) {
    broken = status;
    return status;
  }
  // Then every worker with something new, each confirming.
  for (auto& [r, payload] : deltas) {
    internal::send_message(world->engine(), r, internal::kToWorker, Kind::kExtend, 0,
                           std::move(payload));
  }
  std::set<int> waiting;
  for (const auto& d : deltas) waiting.insert(d.first);
  const auto deadline = graphrun::internal::steady_deadline_after(cluster.connect_timeout);
  while (!waiting.empty()) {
    std::optional<Message> m = control.pop(deadline);
    if (!m.has_value()) {
      status.update(unavailable("rank {} did not confirm the extend within {} ms", *waiting.begin(),
                                cluster.connect_timeout.count()));
      break;
    }
    if (m->kind != Kind::kExtended || waiting.erase(m->source) == 0) continue;
    Reader r(m->payload);
    status.update(r.status().with_prefix(fmt::format("rank {}", m->source)));
  }
  if (!status.is_ok()) broken = status;
  return status;
}

Status DistributedSession::close() {
  Impl& s = *impl_;
  {
    const std::lock_guard lock(s.mu);
    if (s.closed) return Status::ok();
    s.closed = true;
  }
  // Steps in flight end: rank 0's part at once, the workers' at their close.
  Status status = s.session->close();
  std::vector<int> workers;
  for (int r = 1; r < s.world->size(); ++r) workers.push_back(r);
  // The heartbeat goes on meanwhile: a live worker answers it while it ends
  // its steps, and close does not wait for one that has gone silent.
  status.update(s.shut_down(workers, workers, s.beat.joinable()));
  s.stop_heartbeat();
  for (auto& l : s.listeners) l->stop();
  g_driver_open.store(false);  // the workers are free for another session
  return status;
}

// ---------------------------------------------------------------- worker

namespace {

class Worker {
 public:
  // `graph` null: the driver sends this rank its part (serve_without_graph).
  Worker(std::shared_ptr<World> world, const Graph* graph, SessionOptions options)
      : world_(std::move(world)), graph_(graph), options_(std::move(options)) {}

  Status serve() {
    Status setup;  // this rank's cut and session, made at the hello
    bool made = false;
    // The heartbeat is answered here, on the progress thread: whatever
    // this rank's kernels and its loop below do, a live process answers.
    internal::Listener listener(world_->engine(), 0, internal::kToWorker, [this](Message m) {
      if (m.kind == Kind::kPing) {
        reply(Kind::kPong, 0, {});
        return;
      }
      inbox_.push(std::move(m));
    });
    for (;;) {
      // Every 10 ms without a message: partial runs that ended by
      // themselves (a kernel error) are reported.
      std::optional<Message> next =
          inbox_.pop(std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
      if (!next.has_value()) {
        // Rank 0's World ended (its program returned) without closing a
        // session with this rank: no driver will come.
        if (world_->engine().farewell_received()) {
          end_everything();
          if (made) {
            return aborted(
                "rank 0 ended its MPI world without closing its DistributedSession with this "
                "rank");
          }
          return aborted(
              "rank 0 ended its MPI world without a DistributedSession with this rank: its "
              "program returned (or failed) before its DistributedSession::create reached this "
              "rank");
        }
        probe_partials();
        continue;
      }
      Message& m = *next;
      switch (m.kind) {
        case Kind::kHello: {
          Status s = hello(m, setup);
          if (s.is_ok() && graph_ == nullptr) {
            reply(Kind::kNeedPart, 0, {});  // the driver answers with kPart
            break;
          }
          made = true;
          reply(Kind::kReady, 0, Writer().status(s).take());
          if (!s.is_ok()) return s;
          break;
        }
        case Kind::kPart: {
          Status s = take_part(m);
          setup = s;
          made = true;
          reply(Kind::kReady, 0, Writer().status(s).take());
          if (!s.is_ok()) return s;
          break;
        }
        case Kind::kStart: start(m); break;
        case Kind::kPartialSetup: partial_setup(m); break;
        case Kind::kPartialCall: partial_call(m); break;
        case Kind::kAbort: abort(m.step); break;
        case Kind::kExtend: reply(Kind::kExtended, 0, Writer().status(extend(m)).take()); break;
        case Kind::kClose: {
          end_everything();
          reply(Kind::kClosed, 0, {});
          // Closed before a hello: the driver failed to set up, and so
          // would this rank (the same placement), which is returned.
          if (!made && graph_ != nullptr) setup = make(0);
          if (!made && graph_ == nullptr) {
            setup = aborted(
                "the driver closed before this rank got its part of the graph: its "
                "DistributedSession::create failed");
          }
          return setup;
        }
        default: break;
      }
    }
  }

 private:
  // Stops the steps in flight, ends the partial runs, waits until none is
  // left and closes this rank's session.
  void end_everything() {
    std::vector<uint64_t> open;
    {
      const std::lock_guard held(mu_);
      for (auto& [id, stop] : steps_) stop->request_stop();
      for (auto& [id, p] : partials_) open.push_back(id);
    }
    for (uint64_t id : open) abort(id);
    {
      std::unique_lock held(mu_);
      idle_.wait(held, [&] { return steps_.empty() && partials_.empty(); });
    }
    if (session_ != nullptr) static_cast<void>(session_->close());
  }

  // This rank's part of one partial run: its handle and the calls queued
  // on it (a partial run takes one call at a time).
  struct Partial {
    PartialRunHandle handle;
    struct Call {
      FeedList feeds;
      std::vector<TensorRef> fetches;
      std::vector<TargetRef> targets;
      RunOptions options;
      bool finish = false;  // the last call: the part completes
      bool probe = false;   // asks an ended part for its status
    };
    std::deque<Call> queue;  // guarded by Worker::mu_
    bool busy = false;       // a call is out
    bool abandoned = false;  // aborted or finished: forgotten once idle
    bool reported = false;   // its own end was reported
  };

  Status make(int64_t session) {
    GRAPHRUN_ASSIGN_OR_RETURN(partition_,
                              Partition::make(*graph_, world_->size(), world_->rank(), session));
    GRAPHRUN_ASSIGN_OR_RETURN(session_, Session::create(partition_->local(), options_));
    return Status::ok();
  }

  // Checks the driver's graph and world against this rank's, then cuts
  // the graph for the driver's session (`setup`: that cut's status).
  Status hello(const Message& m, Status& setup) {
    Reader r(m.payload);
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t print, r.u64());
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t size, r.u64());
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t session, r.i64());
    if (size != static_cast<uint64_t>(world_->size())) {
      return failed_precondition("the driver sees {} ranks, this rank {}", size, world_->size());
    }
    session_id_ = session;
    if (graph_ == nullptr) return Status::ok();  // the part comes in a kPart
    if (print != Partition::fingerprint(*graph_)) {
      return failed_precondition(
          "this rank's graph ({} nodes) is not the driver's: every rank must build the same "
          "graph (the same nodes, in the same order)",
          graph_->num_nodes());
    }
    setup = make(session);
    return setup;
  }

  // Adds the driver's delta of an extend to this rank's part and extends
  // its session (steps in flight go on).
  Status extend(const Message& m) {
    if (session_ == nullptr) return failed_precondition("this worker has no session");
    GRAPHRUN_ASSIGN_OR_RETURN(auto delta, internal::decode_delta(m.payload));
    GRAPHRUN_RETURN_IF_ERROR(partition_->import(delta.first, delta.second));
    return session_->extend(partition_->local());
  }

  // Adopts the part the driver cut for this rank (a worker without a
  // graph) and makes its session.
  Status take_part(const Message& m) {
    GRAPHRUN_ASSIGN_OR_RETURN(partition_,
                              internal::decode_part(m.payload, world_->rank(), session_id_));
    GRAPHRUN_ASSIGN_OR_RETURN(session_, Session::create(partition_->local(), options_));
    return Status::ok();
  }

  void reply(Kind kind, uint64_t step, std::string payload) {
    internal::send_message(world_->engine(), 0, internal::kToDriver, kind, step,
                           std::move(payload));
  }

  void abort(uint64_t id) {
    std::shared_ptr<Partial> p;
    {
      const std::lock_guard held(mu_);
      if (auto it = steps_.find(id); it != steps_.end()) it->second->request_stop();
      if (auto it = partials_.find(id); it != partials_.end()) {
        p = it->second;
        p->abandoned = true;
        p->reported = true;
        if (!p->busy) partials_.erase(it);
      }
    }
    if (p != nullptr) {
      static_cast<void>(session_->cancel_partial_run(p->handle));
      idle_.notify_all();
    }
  }

  // Decodes a start message and runs this rank's part as an asynchronous
  // step; its status goes back to the driver.
  void start(const Message& m) {
    auto stop = std::make_shared<std::stop_source>();
    {
      const std::lock_guard lock(mu_);
      steps_.emplace(m.step, stop);
    }
    FeedList feeds{{partition_->step_name(), Tensor(static_cast<int64_t>(m.step))}};
    std::vector<TargetRef> targets;
    RunOptions options;
    Reader r(m.payload);
    Status s = decode_head(r, targets);
    if (s.is_ok()) s = decode_timeout(r, options);
    if (s.is_ok()) s = decode_feeds(r, feeds);
    if (!s.is_ok()) {
      finish(m.step, s);
      return;
    }
    options.stop_token = stop->get_token();
    const uint64_t id = m.step;
    session_->run_async(feeds, {}, targets, options,
                        [this, id](Result<std::vector<Tensor>> result, RunMetadata*) {
                          finish(id, result.is_ok() ? Status::ok() : result.status());
                        });
  }

  // The part of a signature every start message begins with: fetch edges
  // (added to this rank's graph when new), the Sends and the targets.
  Status decode_head(Reader& r, std::vector<TargetRef>& targets) {
    if (session_ == nullptr) return failed_precondition("this worker has no session");
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t num_fetch_edges, r.u64());
    bool grew = false;
    for (uint64_t k = 0; k < num_fetch_edges; ++k) {
      GRAPHRUN_ASSIGN_OR_RETURN(uint64_t id, r.u64());
      GRAPHRUN_ASSIGN_OR_RETURN(std::string tensor, r.str());
      if (partition_->send_name(static_cast<int>(id)).empty()) {
        GRAPHRUN_RETURN_IF_ERROR(
            partition_->add_fetch_edge(static_cast<int>(id), tensor, world_->rank(), 0));
        grew = true;
      }
    }
    if (grew) GRAPHRUN_RETURN_IF_ERROR(session_->extend(partition_->local()));
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t num_sends, r.u64());
    for (uint64_t k = 0; k < num_sends; ++k) {
      GRAPHRUN_ASSIGN_OR_RETURN(uint64_t id, r.u64());
      const std::string& send = partition_->send_name(static_cast<int>(id));
      if (send.empty()) return internal_error("this rank has no Send of edge {}", id);
      targets.emplace_back(send);
    }
    return decode_targets(r, targets);
  }

  static Status decode_targets(Reader& r, std::vector<TargetRef>& targets) {
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t num_targets, r.u64());
    for (uint64_t k = 0; k < num_targets; ++k) {
      GRAPHRUN_ASSIGN_OR_RETURN(std::string name, r.str());
      targets.emplace_back(std::move(name));
    }
    return Status::ok();
  }

  static Status decode_timeout(Reader& r, RunOptions& options) {
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t timeout, r.i64());
    if (timeout >= 0) options.timeout = std::chrono::milliseconds(timeout);
    return Status::ok();
  }

  static Status decode_feeds(Reader& r, FeedList& feeds) {
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t num_feeds, r.u64());
    for (uint64_t k = 0; k < num_feeds; ++k) {
      GRAPHRUN_ASSIGN_OR_RETURN(std::string name, r.str());
      GRAPHRUN_ASSIGN_OR_RETURN(Tensor value, r.tensor());
      feeds.push_back(Feed{std::move(name), std::move(value)});
    }
    return Status::ok();
  }

  void finish(uint64_t step, const Status& s) {
    reply(Kind::kDone, step, Writer().status(s).take());
    {
      const std::lock_guard lock(mu_);
      steps_.erase(step);
    }
    idle_.notify_all();
  }

  // This rank's part of a partial run: a partial run of its own session
  // whose only fetch is the step id, fetched by the last call (so that no
  // earlier call waits for every Send), then fed the step id.
  void partial_setup(const Message& m) {
    Reader r(m.payload);
    std::vector<TargetRef> targets;
    RunOptions options;
    std::vector<TensorRef> feeds{TensorRef(partition_->step_name())};
    Status s = decode_head(r, targets);
    if (s.is_ok()) s = decode_timeout(r, options);
    if (s.is_ok()) {
      Result<uint64_t> n = r.u64();
      s = n.status();
      for (uint64_t k = 0; s.is_ok() && k < *n; ++k) {
        Result<std::string> name = r.str();
        s = name.status();
        if (s.is_ok()) feeds.emplace_back(*name);
      }
    }
    if (!s.is_ok()) {
      reply(Kind::kCallDone, m.step, Writer().status(s).take());
      return;
    }
    Result<PartialRunHandle> handle =
        session_->partial_run_setup({TensorRef(partition_->step_name())}, feeds, targets, options);
    if (!handle.is_ok()) {
      reply(Kind::kCallDone, m.step, Writer().status(handle.status()).take());
      return;
    }
    auto p = std::make_shared<Partial>();
    p->handle = std::move(*handle);
    {
      const std::lock_guard lock(mu_);
      partials_[m.step] = p;
    }
    Partial::Call first;
    first.feeds.push_back(Feed{partition_->step_name(), Tensor(static_cast<int64_t>(m.step))});
    first.options = options;
    enqueue(m.step, p, std::move(first));
  }

  void partial_call(const Message& m) {
    std::shared_ptr<Partial> p;
    {
      const std::lock_guard lock(mu_);
      if (auto it = partials_.find(m.step); it != partials_.end()) p = it->second;
    }
    Reader r(m.payload);
    Partial::Call call;
    Status s = p == nullptr ? failed_precondition("this rank has no part of partial run {}", m.step)
                            : Status::ok();
    if (s.is_ok()) {
      Result<uint64_t> finish = r.u64();
      s = finish.status();
      if (s.is_ok()) call.finish = *finish != 0;
    }
    if (s.is_ok()) s = decode_timeout(r, call.options);
    if (s.is_ok()) s = decode_feeds(r, call.feeds);
    if (s.is_ok()) s = decode_targets(r, call.targets);
    if (!s.is_ok()) {
      reply(Kind::kCallDone, m.step, Writer().status(s).take());
      return;
    }
    if (call.finish) call.fetches.emplace_back(partition_->step_name());
    enqueue(m.step, p, std::move(call));
  }

  // Parts that ended without a call out (a kernel failed) are asked for
  // their status, which goes to the driver: it ends the run everywhere.
  void probe_partials() {
    std::vector<std::pair<uint64_t, std::shared_ptr<Partial>>> ended;
    {
      const std::lock_guard lock(mu_);
      for (auto& [id, p] : partials_) {
        if (!p->busy && !p->reported && p->handle.is_done()) {
          p->reported = true;
          ended.emplace_back(id, p);
        }
      }
    }
    for (auto& [id, p] : ended) {
      Partial::Call probe;
      probe.probe = true;
      enqueue(id, p, std::move(probe));
    }
  }

  void enqueue(uint64_t id, const std::shared_ptr<Partial>& p, Partial::Call call) {
    {
      const std::lock_guard lock(mu_);
      p->queue.push_back(std::move(call));
      if (p->busy) return;
      p->busy = true;
    }
    pump(id, p);
  }

  // Runs the next queued call; its end replies and runs the one after.
  void pump(uint64_t id, const std::shared_ptr<Partial>& p) {
    Partial::Call call;
    {
      const std::lock_guard lock(mu_);
      if (p->queue.empty()) {
        p->busy = false;
        if (p->abandoned) {
          partials_.erase(id);
          idle_.notify_all();
        }
        return;
      }
      call = std::move(p->queue.front());
      p->queue.pop_front();
    }
    const bool finish = call.finish;
    const bool probe = call.probe;
    session_->partial_run_async(
        p->handle, call.feeds, call.fetches, call.targets, call.options,
        [this, id, p, finish, probe](Result<std::vector<Tensor>> result, RunMetadata*) {
          const Status s = result.is_ok() ? Status::ok() : result.status();
          if (probe) {
            if (!s.is_ok()) reply(Kind::kDone, id, Writer().status(s).take());
          } else {
            reply(Kind::kCallDone, id, Writer().status(s).take());
          }
          if (finish || probe || !s.is_ok()) {
            const std::lock_guard lock(mu_);
            p->abandoned = p->abandoned || finish || !s.is_ok();
            p->reported = p->reported || !s.is_ok();
          }
          pump(id, p);
        });
  }

  std::shared_ptr<World> world_;
  const Graph* graph_;
  SessionOptions options_;
  std::unique_ptr<Partition> partition_;
  int64_t session_id_ = 0;  // the driver's nonce, from its hello
  std::unique_ptr<Session> session_;
  Inbox inbox_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::unordered_map<uint64_t, std::shared_ptr<std::stop_source>> steps_;  // guarded by mu_
  std::unordered_map<uint64_t, std::shared_ptr<Partial>> partials_;        // guarded by mu_
};

}  // namespace

namespace {

Status serve_on(const Graph* graph, SessionOptions options, std::string_view what) {
  std::shared_ptr<World> world = World::current();
  if (world == nullptr) {
    return failed_precondition("graphrun::mpi::{}() needs graphrun::mpi::World::init() first",
                               what);
  }
  if (world->rank() == 0) {
    return failed_precondition(
        "graphrun::mpi::{}() runs on ranks 1..n-1; rank 0 makes the DistributedSession", what);
  }
  // The driver admits the steps (its own part queues for its threads);
  // a worker starts every part it is sent. Were worker parts queued too,
  // the driver and a worker could admit two steps in different orders
  // (a free thread goes to the caller that finds it first), each then
  // holding its threads for a step the other has queued: a deadlock.
  options.queue_async_calls = false;
  Worker worker(world, graph, std::move(options));
  return worker.serve();
}

}  // namespace

Status serve(const Graph& graph, SessionOptions options) {
  return serve_on(&graph, std::move(options), "serve");
}

Status serve_without_graph(SessionOptions options) {
  return serve_on(nullptr, std::move(options), "serve_without_graph");
}

}  // namespace graphrun::mpi
