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
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scheduler/mpi/src/control.h"
#include "scheduler/mpi/src/engine.h"
#include "scheduler/mpi/src/partition.h"

namespace graphrun::mpi {

namespace {

using internal::Kind;
using internal::Message;
using internal::Partition;
using internal::Reader;
using internal::Writer;

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

struct Signature {
  struct Part {
    int rank = 0;
    std::string fixed;  // fetch edges, sends, targets (the start message's head)
  };
  std::vector<int> feed_rank;  // per feed
  std::vector<std::string> feed_name;
  std::vector<std::string> local_fetches;
  std::vector<std::string> local_targets;
  std::vector<Part> parts;  // workers with something to do
  bool local = false;       // rank 0 runs a part
};

struct DistributedSession::Impl {
  std::shared_ptr<World> world;
  ClusterOptions cluster;
  std::unique_ptr<Graph> graph;  // the global graph, the partition's
  std::unique_ptr<Partition> partition;
  std::unique_ptr<Session> session;  // rank 0's part

  std::mutex mu;  // plans, step ids, and the order steps start in
  std::unordered_map<std::string, std::shared_ptr<const Signature>> plans;
  std::map<std::pair<int, int>, int> fetch_edges;  // (node, output) -> edge id
  uint64_t next_step = 1;
  bool closed = false;

  std::mutex steps_mu;
  std::unordered_map<uint64_t, std::shared_ptr<Step>> steps;

  Inbox control;  // kReady, kClosed
  std::vector<std::unique_ptr<internal::Listener>> listeners;

  void deliver(Message m);
  // Part `rank` of step `id` ended with `s` (rank -1: no part, the
  // caller's stop). The first error ends the step on every rank.
  void report(const std::shared_ptr<Step>& step, uint64_t id, int rank, Status s);
  Result<std::shared_ptr<const Signature>> plan(const FeedList& feeds,
                                                const std::vector<TensorRef>& fetches,
                                                const std::vector<TargetRef>& targets);
  // Sends close to `notify` and waits (close_timeout) for `wait_for` to
  // confirm.
  Status shut_down(const std::vector<int>& notify, const std::vector<int>& wait_for);
};

void DistributedSession::Impl::deliver(Message m) {
  if (m.kind != Kind::kDone) {
    control.push(std::move(m));
    return;
  }
  std::shared_ptr<Step> step;
  {
    const std::lock_guard lock(steps_mu);
    auto it = steps.find(m.step);
    if (it != steps.end()) step = it->second;
  }
  if (step == nullptr) return;  // a part that ended after its step did
  Reader r(m.payload);
  report(step, m.step, m.source, r.status());
}

void DistributedSession::Impl::report(const std::shared_ptr<Step>& step, uint64_t id, int rank,
                                      Status s) {
  if (!s.is_ok() && rank != 0) s = s.with_prefix(fmt::format("rank {}", rank));
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
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, g.find_output(f.tensor.to_string()));
    fed.emplace(o.node()->id(), o.index());
    sig->feed_rank.push_back(partition->rank_of(o.node()->id()));
    sig->feed_name.push_back(o.name());
  }
  // What the step needs: back from the fetches and targets, stopping at
  // fed tensors.
  std::vector<char> needed(static_cast<std::size_t>(g.num_nodes()), 0);
  std::vector<int> stack;
  std::vector<Output> fetched;
  for (const TensorRef& f : fetches) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, g.find_output(f.to_string()));
    fetched.push_back(o);
    if (fed.count({o.node()->id(), o.index()}) == 0) stack.push_back(o.node()->id());
  }
  std::vector<const Node*> targeted;
  for (const TargetRef& t : targets) {
    const Node* n = g.find_node(t.to_string());
    if (n == nullptr) return not_found("target '{}' is not a node of the graph", t.to_string());
    targeted.push_back(n);
    stack.push_back(n->id());
  }
  if (fetched.empty() && targeted.empty()) {
    return invalid_argument("run() needs at least one fetch or target");
  }
  while (!stack.empty()) {
    const int id = stack.back();
    stack.pop_back();
    if (needed[static_cast<std::size_t>(id)] != 0) continue;
    needed[static_cast<std::size_t>(id)] = 1;
    const Node& n = *g.node(id);
    for (const Output& in : n.inputs()) {
      if (fed.count({in.node()->id(), in.index()}) == 0) stack.push_back(in.node()->id());
    }
    for (const Node* dep : n.control_inputs()) stack.push_back(dep->id());
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
                                           const std::vector<int>& wait_for) {
  for (int r : notify) {
    internal::send_message(world->engine(), r, internal::kToWorker, Kind::kClose, 0, {});
  }
  const auto deadline = std::chrono::steady_clock::now() + cluster.close_timeout;
  std::set<int> waiting(wait_for.begin(), wait_for.end());
  while (!waiting.empty()) {
    std::optional<Message> m = control.pop(deadline);
    if (!m.has_value()) {
      return unavailable("rank {} did not confirm the session's close within {} ms",
                         *waiting.begin(), cluster.close_timeout.count());
    }
    if (m->kind == Kind::kClosed) waiting.erase(m->source);
  }
  return Status::ok();
}

DistributedSession::DistributedSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DistributedSession::~DistributedSession() { static_cast<void>(close()); }

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
  auto impl = std::make_unique<Impl>();
  impl->world = world;
  impl->cluster = cluster;
  impl->graph = std::make_unique<Graph>(graph.clone());
  Impl* self = impl.get();
  std::vector<int> workers;
  for (int r = 1; r < world->size(); ++r) {
    impl->listeners.push_back(
        std::make_unique<internal::Listener>(world->engine(), r, internal::kToDriver,
                                             [self](Message m) { self->deliver(std::move(m)); }));
    workers.push_back(r);
  }
  Result<std::unique_ptr<Partition>> partition = Partition::make(*impl->graph, world->size(), 0);
  Status setup = partition.status();
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
    w.u64(print).u64(static_cast<uint64_t>(world->size()));
    internal::send_message(world->engine(), r, internal::kToWorker, Kind::kHello, 0, w.take());
  }
  const auto deadline = std::chrono::steady_clock::now() + cluster.connect_timeout;
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
  return std::unique_ptr<DistributedSession>(new DistributedSession(std::move(impl)));
}

const std::vector<int>& DistributedSession::placement() const { return impl_->partition->ranks(); }

Result<std::vector<Tensor>> DistributedSession::run(const FeedList& feeds,
                                                    const std::vector<TensorRef>& fetches,
                                                    const std::vector<TargetRef>& targets,
                                                    const RunOptions& options) {
  Impl& s = *impl_;
  auto step = std::make_shared<Step>();
  uint64_t id = 0;
  std::shared_ptr<const Signature> sig;
  {
    const std::lock_guard lock(s.mu);
    if (s.closed) return cancelled("Session has been closed.");
    GRAPHRUN_ASSIGN_OR_RETURN(sig, s.plan(feeds, fetches, targets));
    id = s.next_step++;
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
      for (std::size_t k = 0; k < feeds.size(); ++k) n += sig->feed_rank[k] == p.rank ? 1 : 0;
      w.u64(n);
      for (std::size_t k = 0; k < feeds.size(); ++k) {
        if (sig->feed_rank[k] == p.rank) w.str(sig->feed_name[k]).tensor(feeds[k].value);
      }
      internal::send_message(s.world->engine(), p.rank, internal::kToWorker, Kind::kStart, id,
                             p.fixed + w.take());
    }
    if (sig->local) {
      FeedList local{{s.partition->step_name(), Tensor(static_cast<int64_t>(id))}};
      for (std::size_t k = 0; k < feeds.size(); ++k) {
        if (sig->feed_rank[k] == 0) local.push_back(Feed{sig->feed_name[k], feeds[k].value});
      }
      std::vector<TensorRef> local_fetches(sig->local_fetches.begin(), sig->local_fetches.end());
      std::vector<TargetRef> local_targets(sig->local_targets.begin(), sig->local_targets.end());
      RunOptions o;
      o.timeout = options.timeout;
      o.stop_token = step->stop.get_token();
      Impl* self = &s;
      s.session->run_async(local, local_fetches, local_targets, o,
                           [self, step, id](Result<std::vector<Tensor>> r, RunMetadata*) {
                             if (r.is_ok()) {
                               const std::lock_guard held(step->mu);
                               step->fetched = std::move(*r);
                             }
                             self->report(step, id, 0, r.is_ok() ? Status::ok() : r.status());
                           });
    }
  }
  // A stop of the caller's token ends the step on every rank.
  std::optional<std::stop_callback<std::function<void()>>> on_stop;
  if (options.stop_token.stop_possible()) {
    on_stop.emplace(options.stop_token, std::function<void()>([&s, step, id] {
                      s.report(step, id, -1, cancelled("the run was stopped"));
                    }));
  }
  Status first;
  std::vector<Tensor> fetched;
  {
    std::unique_lock lock(step->mu);
    step->cv.wait(lock, [&] { return step->pending == 0; });
    first = step->first;
    fetched = std::move(step->fetched);
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
  status.update(s.shut_down(workers, workers));
  for (auto& l : s.listeners) l->stop();
  return status;
}

// ---------------------------------------------------------------- worker

namespace {

class Worker {
 public:
  Worker(std::shared_ptr<World> world, const Graph& graph, SessionOptions options)
      : world_(std::move(world)), graph_(&graph), options_(std::move(options)) {}

  Status serve() {
    Status setup = make();
    internal::Listener listener(world_->engine(), 0, internal::kToWorker,
                                [this](Message m) { inbox_.push(std::move(m)); });
    for (;;) {
      Message m = inbox_.pop();
      switch (m.kind) {
        case Kind::kHello: {
          Status s = setup.is_ok() ? hello(m) : setup;
          reply(Kind::kReady, 0, Writer().status(s).take());
          if (!s.is_ok()) return s;
          break;
        }
        case Kind::kStart: start(m); break;
        case Kind::kAbort: {
          const std::lock_guard held(mu_);
          if (auto it = steps_.find(m.step); it != steps_.end()) it->second->request_stop();
          break;
        }
        case Kind::kClose: {
          {
            std::unique_lock held(mu_);
            for (auto& [id, stop] : steps_) stop->request_stop();
            idle_.wait(held, [&] { return steps_.empty(); });
          }
          if (session_ != nullptr) static_cast<void>(session_->close());
          reply(Kind::kClosed, 0, {});
          return setup;  // closed before a hello: the driver failed too
        }
        default: break;
      }
    }
  }

 private:
  Status make() {
    GRAPHRUN_ASSIGN_OR_RETURN(partition_, Partition::make(*graph_, world_->size(), world_->rank()));
    GRAPHRUN_ASSIGN_OR_RETURN(session_, Session::create(partition_->local(), options_));
    return Status::ok();
  }

  Status hello(const Message& m) {
    Reader r(m.payload);
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t print, r.u64());
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t size, r.u64());
    if (size != static_cast<uint64_t>(world_->size())) {
      return failed_precondition("the driver sees {} ranks, this rank {}", size, world_->size());
    }
    if (print != Partition::fingerprint(*graph_)) {
      return failed_precondition(
          "this rank's graph ({} nodes) is not the driver's: every rank must build the same "
          "graph (the same nodes, in the same order)",
          graph_->num_nodes());
    }
    return Status::ok();
  }

  void reply(Kind kind, uint64_t step, std::string payload) {
    internal::send_message(world_->engine(), 0, internal::kToDriver, kind, step,
                           std::move(payload));
  }

  // Decodes a start message and runs this rank's part as an asynchronous
  // step; its status goes back to the driver.
  void start(const Message& m) {
    auto stop = std::make_shared<std::stop_source>();
    {
      const std::lock_guard lock(mu_);
      steps_.emplace(m.step, stop);
    }
    FeedList feeds;
    std::vector<TargetRef> targets;
    RunOptions options;
    Status s = decode(m, feeds, targets, options);
    if (!s.is_ok()) {
      finish(m.step, s);
      return;
    }
    options.stop_token = stop->get_token();
    const uint64_t id = m.step;
    session_->run_async(feeds, {}, targets, options,
                        [this, id](Result<std::vector<Tensor>> r, RunMetadata*) {
                          finish(id, r.is_ok() ? Status::ok() : r.status());
                        });
  }

  Status decode(const Message& m, FeedList& feeds, std::vector<TargetRef>& targets,
                RunOptions& options) {
    if (session_ == nullptr) return failed_precondition("this worker has no session");
    Reader r(m.payload);
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
    GRAPHRUN_ASSIGN_OR_RETURN(uint64_t num_targets, r.u64());
    for (uint64_t k = 0; k < num_targets; ++k) {
      GRAPHRUN_ASSIGN_OR_RETURN(std::string name, r.str());
      targets.emplace_back(std::move(name));
    }
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t timeout, r.i64());
    if (timeout >= 0) options.timeout = std::chrono::milliseconds(timeout);
    feeds.push_back(Feed{partition_->step_name(), Tensor(static_cast<int64_t>(m.step))});
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

  std::shared_ptr<World> world_;
  const Graph* graph_;
  SessionOptions options_;
  std::unique_ptr<Partition> partition_;
  std::unique_ptr<Session> session_;
  Inbox inbox_;
  std::mutex mu_;
  std::condition_variable idle_;
  std::unordered_map<uint64_t, std::shared_ptr<std::stop_source>> steps_;  // guarded by mu_
};

}  // namespace

Status serve(const Graph& graph, SessionOptions options) {
  std::shared_ptr<World> world = World::current();
  if (world == nullptr) {
    return failed_precondition("graphrun::mpi::serve() needs graphrun::mpi::World::init() first");
  }
  if (world->rank() == 0) {
    return failed_precondition(
        "graphrun::mpi::serve() runs on ranks 1..n-1; rank 0 makes the DistributedSession");
  }
  Worker worker(world, graph, std::move(options));
  return worker.serve();
}

}  // namespace graphrun::mpi
