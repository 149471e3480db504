#include "scheduler/session_impl.h"

#include <pthread.h>
#include <sys/random.h>

#include "api/src/deadline.h"
#include "api/src/target_name.h"
#include "scheduler/async_run.h"
#include "scheduler/partial_run.h"
#include "scheduler/run_done.h"

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

namespace graphrun::sched {
namespace {

void tbb_parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  // Runs in the arena of the calling kernel's pool: intra-op work shares
  // the inter-op threads.
  ThreadPool::Impl* const pool = ThreadPool::Impl::marks.current;  // the kernel's
  ThreadPool::Impl* const in_arena = ThreadPool::Impl::marks.in_arena;
  auto loop = [&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n, static_cast<std::size_t>(std::max<int64_t>(grain, 1))),
        [&](const tbb::blocked_range<int64_t>& r) {
          const ThreadPool::Impl::Inside inside(pool);
          const ThreadPool::Impl::InArena arena(
              in_arena != nullptr ? in_arena : ThreadPool::Impl::marks.in_arena);
          fn(r.begin(), r.end());
        });
  };
  // A kernel of an inline step runs outside the arena: enter it (from
  // inside, execute() neither takes a permit nor switches arenas).
  if (pool != nullptr) {
    pool->execute(loop);
  } else {
    loop();
  }
}

std::shared_ptr<ThreadPool> pool_for(const SessionOptions& o) {
  GRAPHRUN_CHECK(o.thread_pool != nullptr);  // Session::create made one if none was given
  return o.thread_pool;
}

}  // namespace

SessionImpl::SessionImpl(Graph graph, SessionOptions options)
    : graph_(std::move(graph)),
      options_(options),
      pool_(pool_for(options)),
      cache_(options.plan_cache_capacity),
      kernels_(static_cast<std::size_t>(graph_.num_nodes())),
      epoch_(std::chrono::steady_clock::now()) {
  runtime_.parallel_for = &tbb_parallel_for;
  runtime_.threads = pool_->num_threads();
  runtime_.max_tensor_bytes = options_.max_tensor_bytes;
}

SessionImpl::~SessionImpl() {
  shut(/*destroying=*/true);
  // Calls in flight on other threads see closed_ at their next node (or
  // when their kernel polls) and return Cancelled; asynchronous calls
  // count as in flight until their done has returned. Wait until they have.
  // acquire: pairs with CallScope's release, so they no longer touch us.
  while (calls_in_flight_.sum() != 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // Flow graphs are destroyed inside the arena they belong to.
  std::vector<std::shared_ptr<PlanEntry>> entries = cache_.take_all();
  in_arena([&] {
    // Partial runs that ended while the pool was busy.
    finish_ended_runs();
    // A Callable or an inert partial-run handle may keep an entry alive
    // past the session: its pooled flow graphs still die here, in the arena.
    for (const std::shared_ptr<PlanEntry>& e : entries) {
      e->pool.clear();
      e->async_pool.clear();
      const std::lock_guard lock(e->unfused_mu);
      if (e->unfused != nullptr) {
        e->unfused->pool.clear();
        e->unfused->async_pool.clear();
      }
    }
    entries.clear();
  });
}

void SessionImpl::finish_in_arena(EndedRun& run) {
  for (int f : run.unfed) run.inst->put_feed(f);
  run.inst->wait_quiet();
  run.inst->state().finish();
  // A closing session keeps no instance: its plans may outlive it in
  // handles, but their flow graphs must die in its arena (here).
  if (check_open().is_ok())
    run.inst = run.entry->pool.give_back(std::move(run.inst), run.entry->plan->costs->epoch());
  // An inline step runs outside the arena: enter it (from inside, no
  // permit is taken).
  if (run.inst != nullptr) in_arena([&] { run.inst.reset(); });
}

void SessionImpl::finish_detached(EndedRun& run) {
  for (int f : run.unfed) run.inst->put_feed(f);
  run.inst->wait_quiet();
  run.inst->state().finish();
  run.inst.reset();
}

void SessionImpl::finish_ended_run(const Plan& plan, EndedRun run) {
  const WaitLimits at_once{std::chrono::steady_clock::now(), {}, nullptr};
  bool done = false;
  const Status admitted = run_step(plan.costs->run_inline(), false, at_once, [&] {
    finish_in_arena(run);
    done = true;
  });
  if (admitted.is_ok() && done) return;
  const std::lock_guard lock(ended_mu_);
  ended_runs_.push_back(std::move(run));
  has_ended_runs_.store(true, std::memory_order_release);
}

void SessionImpl::finish_ended_runs() {
  std::vector<EndedRun> runs;
  {
    const std::lock_guard lock(ended_mu_);
    runs.swap(ended_runs_);
    has_ended_runs_.store(false, std::memory_order_relaxed);
  }
  for (EndedRun& run : runs) finish_in_arena(run);
  runs.clear();  // the runs' listeners, released here, inside the arena
}

Status SessionImpl::admission_status(Permits::Outcome outcome) const {
  switch (outcome) {
    case Permits::Outcome::kAcquired: return Status::ok();
    case Permits::Outcome::kDeadline:
      return deadline_exceeded(
          "the run's deadline expired while it waited for a thread: all {} of the session's pool "
          "are busy",
          pool_->num_threads());
    case Permits::Outcome::kStopped:
      return cancelled("the run was cancelled by its caller while it waited for a thread");
    case Permits::Outcome::kClosed: return session_closed_status();
  }
  return internal_error("unknown admission outcome");
}

Status SessionImpl::check_open() const {
  if (closed_.load(std::memory_order_acquire)) return session_closed_status();
  return Status::ok();
}

void SessionImpl::shut(bool destroying) {
  closed_.store(true, std::memory_order_release);
  // Calls waiting for a permit of the pool see the flag and return.
  pool_->impl().wake_waiters();
  // Queued asynchronous calls of this session: done(Cancelled), here.
  for (AsyncPermitWaiter* w : pool_->impl().permits().close_queued(&closed_)) w->on_closed();
  for (const std::shared_ptr<PartialRun>& run : open_partial_runs()) {
    if (destroying) {
      run->detach();  // its handle becomes inert
    } else {
      run->cancel(session_closed_status());
    }
  }
}

Status SessionImpl::close() {
  shut(/*destroying=*/false);
  return Status::ok();
}

// ---- partial runs ----

std::vector<std::shared_ptr<PartialRun>> SessionImpl::open_partial_runs() const {
  std::lock_guard lock(runs_mu_);
  std::vector<std::shared_ptr<PartialRun>> runs;
  runs.reserve(open_runs_.size());
  for (const auto& [id, run] : open_runs_) runs.push_back(run);
  return runs;
}

std::size_t SessionImpl::num_open_partial_runs() const {
  std::lock_guard lock(runs_mu_);
  return open_runs_.size();
}

void SessionImpl::unregister_partial_run(const std::string& id) {
  std::shared_ptr<PartialRun> last_ref;  // released outside the lock
  std::lock_guard lock(runs_mu_);
  auto it = open_runs_.find(id);
  if (it != open_runs_.end()) {
    last_ref = std::move(it->second);
    open_runs_.erase(it);
  }
}

namespace {
// Random words from the kernel's CSPRNG, fetched 64 at a time per thread
// (one getrandom() per 32 partial runs: the call was 7% of a small partial
// run). Each word is used once; a forked child refills instead of reusing
// its parent's buffer.
std::atomic<uint64_t> g_fork_generation{0};

uint64_t random_word() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr,
                   [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); });
    return true;
  }();
  (void)registered;
  constexpr std::size_t kWords = 64;
  thread_local std::array<uint64_t, kWords> words{};
  thread_local std::size_t next = kWords;
  thread_local uint64_t generation = 0;
  const uint64_t now = g_fork_generation.load(std::memory_order_relaxed);
  if (next == kWords || generation != now) {
    std::size_t got = 0;
    while (got < sizeof(words)) {
      const ssize_t n =
          getrandom(reinterpret_cast<char*>(words.data()) + got, sizeof(words) - got, 0);
      if (n > 0) got += static_cast<std::size_t>(n);
    }
    next = 0;
    generation = now;
  }
  return words[next++];
}
}  // namespace

void report_throwing_done(const char* what) noexcept {
  // One line per throw: a done that throws is a bug in the caller's code,
  // which this makes visible without ending the process.
  std::fprintf(stderr,
               "graphrun: an asynchronous call's done callback threw%s%s%s; done must not "
               "throw, and the exception was dropped\n",
               what != nullptr ? " (" : " a non-standard exception", what != nullptr ? what : "",
               what != nullptr ? ")" : "");
}

std::string SessionImpl::new_partial_run_id() {
  // 128 bits from the kernel's CSPRNG: ids are unguessable (the service
  // hands them out). std::random_device's construction cost 60 us (85% of
  // a partial run's setup).
  uint64_t words[2] = {random_word(), random_word()};
  // Never repeats within a process even if the CSPRNG did.
  words[1] ^= static_cast<uint64_t>(next_run_serial_.fetch_add(1, std::memory_order_relaxed));
  return fmt::format("pr-{:016x}{:016x}", words[0], words[1]);
}

Result<PartialRunHandle> SessionImpl::partial_run_setup(const std::vector<TensorRef>& fetches,
                                                        const std::vector<TensorRef>& feeds,
                                                        const std::vector<TargetRef>& targets,
                                                        const RunOptions& options) {
  const CallScope call(this);
  GRAPHRUN_RETURN_IF_ERROR(check_open());
  GRAPHRUN_ASSIGN_OR_RETURN(auto prepared, prepare(feeds, fetches, targets, /*partial=*/true));
  auto& [sig, entry] = prepared;

  auto run =
      std::make_shared<PartialRun>(this, entry.share(), std::move(sig), new_partial_run_id());
  auto too_many = [this] {
    return resource_exhausted(
        "too many open partial runs ({}, SessionOptions::max_open_partial_runs)",
        options_.max_open_partial_runs);
  };
  {
    std::lock_guard lock(runs_mu_);
    if (open_runs_.size() >= options_.max_open_partial_runs) return too_many();
  }
  // A partial run's deadlines are per call (PartialRun::call's timer).
  const StepControl control = step_control(options.trace, std::nullopt);
  // Started before it is registered: nothing else can reach it meanwhile.
  const Status admitted =
      run_step(entry->plan->costs->run_inline(), control.trace,
               wait_limits(std::nullopt, options.stop_token), [&] { run->start(control); });
  if (!admitted.is_ok()) return admitted;  // not started: nothing to end
  bool registered = false;
  {
    std::lock_guard lock(runs_mu_);
    // Concurrent setups may have filled the last places meanwhile.
    if (open_runs_.size() < options_.max_open_partial_runs && !closed_.load()) {
      open_runs_.emplace(run->id(), run);
      registered = true;
    }
  }
  if (!registered) {
    const Status why = closed_.load() ? session_closed_status() : too_many();
    run->cancel(why);
    return why;
  }
  run->watch(options.stop_token);
  if (options_.partial_run_idle_timeout) schedule_idle_sweep();
  return PartialRunHandle(std::move(run));
}

void SessionImpl::schedule_idle_sweep() {
  {
    std::lock_guard lock(runs_mu_);
    if (idle_sweep_scheduled_) return;
    idle_sweep_scheduled_ = true;
  }
  const auto period =
      std::max(std::chrono::milliseconds(1), *options_.partial_run_idle_timeout / 4);
  timer_.schedule(graphrun::internal::steady_deadline_after(period),
                  [this] { sweep_idle_partial_runs(); });
}

void SessionImpl::sweep_idle_partial_runs() {
  const auto timeout = *options_.partial_run_idle_timeout;
  const auto now = std::chrono::steady_clock::now();
  for (const std::shared_ptr<PartialRun>& run : open_partial_runs()) {
    // In milliseconds: a timeout near INT64_MAX ms has no nanosecond count.
    if (std::chrono::duration_cast<std::chrono::milliseconds>(now - run->last_used()) > timeout) {
      run->cancel(cancelled("partial run {} was idle for more than {} ms and was cancelled",
                            run->id(), timeout.count()));
    }
  }
  bool again = false;
  {
    std::lock_guard lock(runs_mu_);
    idle_sweep_scheduled_ = false;
    again = !open_runs_.empty() && !closed_.load();
  }
  if (again) schedule_idle_sweep();
}

Result<OpKernel*> SessionImpl::kernel_for(const Node& node) {
  const auto id = static_cast<std::size_t>(node.id());
  // acquire: pairs with the release below, so the kernel is fully built.
  if (OpKernel* k = kernels_[id].load(std::memory_order_acquire)) return k;
  std::lock_guard lock(kernels_mu_);
  OpKernel* k = kernels_[id].load(std::memory_order_relaxed);
  if (k == nullptr) {
    OpKernelConstruction construction(node, resources_);
    const KernelFactory& factory =
        node.kernel_override() ? *node.kernel_override() : node.registration().factory;
    Result<std::unique_ptr<OpKernel>> made = factory(construction);
    if (!made.is_ok()) {
      return made.status().with_prefix(fmt::format("creating the kernel of {}", node.describe()));
    }
    k = made->release();
    kernels_[id].store(k, std::memory_order_release);
  }
  return k;
}

Status SessionImpl::extend(const Graph& grown) {
  const CallScope call(this);
  GRAPHRUN_RETURN_IF_ERROR(check_open());
  std::unique_lock graph_lock(graph_mu_);  // every stripe
  const auto before = static_cast<std::size_t>(graph_.num_nodes());
  GRAPHRUN_RETURN_IF_ERROR(graph_.append_nodes_from(grown).with_prefix("Session::extend"));
  const auto after = static_cast<std::size_t>(graph_.num_nodes());
  if (after == before) return Status::ok();
  // No plan is being compiled (that holds graph_mu_ shared): the kernel
  // tables can grow.
  std::lock_guard kernels_lock(kernels_mu_);
  kernels_.grow(after);  // published to readers by graph_mu_'s unlock
  return Status::ok();
}

void SessionImpl::KernelTable::grow(std::size_t n) {
  auto ptrs = std::unique_ptr<std::atomic<OpKernel*>[]>(new std::atomic<OpKernel*>[n]());
  for (std::size_t i = 0; i < size_; ++i) {
    ptrs[i].store(ptrs_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  ptrs_ = std::move(ptrs);
  size_ = n;
}

template <typename FeedRefs>
Result<std::pair<Signature, PlanLease>> SessionImpl::prepare(const FeedRefs& feeds,
                                                             const std::vector<TensorRef>& fetches,
                                                             const std::vector<TargetRef>& targets,
                                                             bool partial) {
  const StripedSharedLock graph_lock(graph_mu_);
  GRAPHRUN_ASSIGN_OR_RETURN(Signature sig, resolve(feeds, fetches, targets));
  if (partial) {
    // A partial run declares each fetch and target once.
    std::vector<Output> unique_fetches;
    for (const Output& o : sig.fetches) {
      if (std::find(unique_fetches.begin(), unique_fetches.end(), o) == unique_fetches.end()) {
        unique_fetches.push_back(o);
      }
    }
    sig.fetches = std::move(unique_fetches);
    std::sort(sig.targets.begin(), sig.targets.end());
    sig.targets.erase(std::unique(sig.targets.begin(), sig.targets.end()), sig.targets.end());
    sig.partial = true;
  } else {
    sig.fuse = options_.fuse_kernels;
  }
  sig.inline_nodes = options_.inline_cheap_nodes;
  sig.inline_below_cycles = static_cast<uint64_t>(options_.inline_below_cycles);
  GRAPHRUN_ASSIGN_OR_RETURN(PlanLease entry, plan_for(sig));
  return std::pair<Signature, PlanLease>(std::move(sig), std::move(entry));
}

Result<Output> SessionImpl::resolve_tensor(const TensorRef& ref) const {
  const StripedSharedLock graph_lock(graph_mu_);
  return resolve_tensor_locked(ref);
}

Result<const Node*> SessionImpl::resolve_target(const TargetRef& ref) const {
  const StripedSharedLock graph_lock(graph_mu_);
  return resolve_target_locked(ref);
}

Result<Output> SessionImpl::resolve_tensor_locked(const TensorRef& ref) const {
  if (ref.is_output()) {
    const Output& o = ref.output();
    const Node* n = o.node();
    if (n->id() < 0 || n->id() >= graph_.num_nodes() || graph_.node(n->id())->name() != n->name()) {
      return not_found("tensor '{}' is not in this session's graph", o.name());
    }
    const Node* mine = graph_.node(n->id());
    // Output(node, index) is public: its index is checked here, for feeds,
    // fetches and partial runs alike.
    if (o.index() < 0 || o.index() >= mine->num_outputs()) {
      return invalid_argument("{} has {} output(s); index {} is out of range", mine->describe(),
                              mine->num_outputs(), o.index());
    }
    return Output(mine, o.index());
  }
  Result<Output> o = graph_.find_output(ref.name());
  if (!o.is_ok()) return o.status();
  return o;
}

Result<const Node*> SessionImpl::resolve_target_locked(const TargetRef& ref) const {
  if (ref.node() != nullptr) {
    const Node* n = ref.node();
    if (n->id() < 0 || n->id() >= graph_.num_nodes() || graph_.node(n->id())->name() != n->name()) {
      return not_found("target node '{}' is not in this session's graph", n->name());
    }
    return graph_.node(n->id());
  }
  const Node* n = graphrun::internal::find_target_node(graph_, ref.name());
  if (n == nullptr) return not_found("target node '{}' not found in the graph", ref.name());
  return n;
}

template <typename FeedRefs, typename RefOf>
Result<Signature> SessionImpl::resolve_impl(const FeedRefs& feeds, RefOf ref_of,
                                            const std::vector<TensorRef>& fetches,
                                            const std::vector<TargetRef>& targets) const {
  if (fetches.empty() && targets.empty()) {
    return invalid_argument("Must specify at least one target to fetch or execute.");
  }
  Signature sig;
  sig.feeds.reserve(feeds.size());
  for (const auto& feed : feeds) {
    const TensorRef& f = ref_of(feed);
    Result<Output> o = resolve_tensor_locked(f);
    if (!o.is_ok()) return o.status().with_prefix(fmt::format("feed '{}'", f.to_string()));
    if (std::find(sig.feeds.begin(), sig.feeds.end(), *o) != sig.feeds.end()) {
      return invalid_argument("tensor '{}' is fed more than once", o->name());
    }
    sig.feeds.push_back(*o);
  }
  sig.fetches.reserve(fetches.size());
  for (const TensorRef& f : fetches) {
    if (!f.is_output()) {
      // A fetch of a node without outputs gets TF's advice.
      Result<TensorName> tn = parse_tensor_name(f.name());
      if (tn.is_ok()) {
        const Node* n = graph_.find_node(tn->node);
        if (n != nullptr && n->num_outputs() == 0) {
          return invalid_argument(
              "Tried to fetch data for '{}', which produces no output. To run it without fetching "
              "data, pass it as a target.",
              f.name());
        }
      }
    }
    Result<Output> o = resolve_tensor_locked(f);
    if (!o.is_ok()) return o.status().with_prefix(fmt::format("fetch '{}'", f.to_string()));
    sig.fetches.push_back(*o);
  }
  for (const TargetRef& t : targets) {
    GRAPHRUN_ASSIGN_OR_RETURN(const Node* n, resolve_target_locked(t));
    sig.targets.push_back(n);
  }
  return sig;
}

Result<Signature> SessionImpl::resolve(const std::vector<TensorRef>& feeds,
                                       const std::vector<TensorRef>& fetches,
                                       const std::vector<TargetRef>& targets) const {
  return resolve_impl(
      feeds, [](const TensorRef& r) -> const TensorRef& { return r; }, fetches, targets);
}

Result<Signature> SessionImpl::resolve(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                                       const std::vector<TargetRef>& targets) const {
  return resolve_impl(
      feeds, [](const Feed& f) -> const TensorRef& { return f.tensor; }, fetches, targets);
}

namespace {
void append_int(std::string& key, int32_t v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// Binary key: counts, then (node id, index) pairs and target ids.
std::string signature_key(const Signature& sig) {
  std::string key;
  key.reserve(12 + 8 * (sig.feeds.size() + sig.fetches.size()) + 4 * sig.targets.size());
  append_int(key, static_cast<int32_t>(sig.feeds.size()));
  append_int(key, static_cast<int32_t>(sig.fetches.size()));
  append_int(key, static_cast<int32_t>(sig.targets.size()));
  key += sig.partial ? 'P' : 'R';  // partial runs compile differently
  key += sig.fuse ? 'F' : 'U';     // and so do fused plans
  for (const auto* list : {&sig.feeds, &sig.fetches}) {
    for (const Output& o : *list) {
      append_int(key, o.node()->id());
      append_int(key, o.index());
    }
  }
  for (const Node* n : sig.targets) append_int(key, n->id());
  return key;
}
}  // namespace

Result<PlanLease> SessionImpl::plan_for(const Signature& sig) {
  std::string key = signature_key(sig);
  if (PlanLease hit = cache_.find(key)) return hit;
  Result<std::shared_ptr<const Plan>> plan =
      build_plan(graph_, sig, [this](const Node& n) { return kernel_for(n); });
  if (!plan.is_ok()) return plan.status();
  std::vector<std::shared_ptr<PlanEntry>> evicted;
  PlanLease entry = cache_.insert(key, std::move(*plan), &evicted);
  if (!evicted.empty()) in_arena([&] { evicted.clear(); });
  return entry;
}

Status SessionImpl::feed_count_error(const Plan& plan, std::size_t given) {
  return invalid_argument("expected {} feed value(s), got {}", plan.feed_slots.size(), given);
}

Status SessionImpl::feed_error(const Plan& plan, std::size_t f, const Tensor& value) {
  if (!value.is_initialized()) {
    return invalid_argument("feed '{}': the value is an empty (uninitialized) tensor",
                            plan.feed_names[f]);
  }
  if (value.dtype() != plan.feed_dtypes[f] ||
      !value.shape().is_compatible_with(plan.feed_shapes[f])) {
    return invalid_argument("feed '{}' expects {}{}, got {}", plan.feed_names[f],
                            dtype_name(plan.feed_dtypes[f]), plan.feed_shapes[f].to_string(),
                            value.debug_type());
  }
  return Status::ok();
}

namespace {
// Step ids are unique in the process (as TF's): each thread takes blocks of
// ids from one counter, so concurrent runs do not bounce its cache line.
int64_t new_step_id() {
  constexpr int64_t kBlock = 1024;
  static std::atomic<int64_t> next_block{1};
  thread_local int64_t next = 0;
  thread_local int64_t end = 0;
  if (next == end) {
    next = next_block.fetch_add(kBlock, std::memory_order_relaxed);  // relaxed: unique ids only
    end = next + kBlock;
  }
  return next++;
}
}  // namespace

StepControl SessionImpl::step_control(bool trace,
                                      std::optional<std::chrono::milliseconds> timeout) {
  StepControl control;
  control.step_id = new_step_id();
  if (timeout) control.deadline = graphrun::internal::steady_deadline_for(*timeout);
  control.session_closed = &closed_;
  control.pool = &pool_->impl();
  control.trace = trace;
  control.epoch = epoch_;
  return control;
}

Result<PlanEntry*> SessionImpl::unfused_entry(PlanEntry& entry) {
  const std::lock_guard<std::mutex> lock(entry.unfused_mu);
  if (entry.unfused == nullptr) {
    const StripedSharedLock graph_lock(graph_mu_);
    Result<std::shared_ptr<const Plan>> plan =
        build_plan(graph_, entry.plan->unfused, [this](const Node& n) { return kernel_for(n); });
    if (!plan.is_ok()) return plan.status();
    auto twin = std::make_shared<PlanEntry>();
    twin->plan = std::move(*plan);
    entry.unfused = std::move(twin);
  }
  return entry.unfused.get();
}

Status SessionImpl::execute(PlanEntry& entry, std::span<const Tensor> feeds, std::span<Tensor> out,
                            const RunOptions& options, RunMetadata* metadata) {
  const Plan& plan = *entry.plan;
  const StepControl control = step_control(options.trace && metadata != nullptr, options.timeout);
  if (control.trace && plan.fused_nodes > 0) {
    // A trace shows every node: the unfused twin runs instead.
    GRAPHRUN_ASSIGN_OR_RETURN(PlanEntry * twin, unfused_entry(entry));
    return execute(*twin, feeds, out, options, metadata);
  }

  // A step with asynchronous kernels never holds an arena's thread while
  // it waits for one (a Recv waits for another process): a blocking caller
  // outside every arena waits outside, running the step itself when every
  // other node is cheap.
  bool waiting = false;
  if (plan.has_async && ThreadPool::Impl::marks.current == nullptr &&
      ThreadPool::Impl::marks.in_arena == nullptr && tbb::task::current_context() == nullptr) {
    if (!plan.costs->waits_inline() || control.trace)
      return execute_waiting_outside(entry, feeds, out, options, metadata);
    waiting = true;
  }

  Status status;
  const bool run_inline = waiting || (plan.costs->run_inline() && !control.trace);
  auto step = [&] {
    // Flow graphs are built and destroyed in the arena (the nested entry
    // is cheap from inside it and rare from an inline step).
    std::unique_ptr<FlowInstance> inst =
        take_instance(entry.pool, plan, runtime_, [this](auto&& fn) { in_arena(fn); });
    RunState& state = inst->state();
    state.begin(control, feeds);
    {
      // A stop requested from now on (or already) cancels the step; the
      // callback is unregistered (and waited for) before the state is read.
      const auto on_stop = on_stop_requested(options.stop_token, [&state] {
        state.record_error(cancelled("the run was cancelled by its caller"));
      });
      if (waiting) {
        inst->run_waiting();
      } else if (!plan.nodes.empty()) {
        if (run_inline && !inst->run_inline()) {
          in_arena([&] { inst->run(); });  // the policy changed since run_inline was read
        } else {
          inst->run();
        }
      }
    }
    status = state.status();
    if (status.is_ok()) state.take_fetches(out);
    if (control.trace) state.collect_stats(*metadata);
    state.finish();
    // Handed back when the pool is full or the policy changed.
    inst = entry.pool.give_back(std::move(inst), plan.costs->epoch());
    if (inst != nullptr) in_arena([&] { inst.reset(); });
  };
  GRAPHRUN_RETURN_IF_ERROR(
      run_step(run_inline, control.trace, wait_limits(control.deadline, options.stop_token), step));
  return status;
}

Status SessionImpl::execute_waiting_outside(PlanEntry& entry, std::span<const Tensor> feeds,
                                            std::span<Tensor> out, const RunOptions& options,
                                            RunMetadata* metadata) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Result<std::vector<Tensor>>> result;  // set once done
  } wait;
  // The caller's lease (or Callable) keeps `entry` alive until this returns.
  execute_async(entry, PlanLease(), nullptr, std::vector<Tensor>(feeds.begin(), feeds.end()),
                options, [&wait, metadata](Result<std::vector<Tensor>> r, RunMetadata* m) {
                  if (metadata != nullptr && m != nullptr) *metadata = std::move(*m);
                  const std::lock_guard lock(wait.mu);
                  wait.result.emplace(std::move(r));
                  wait.cv.notify_one();
                });
  std::unique_lock lock(wait.mu);
  wait.cv.wait(lock, [&wait] { return wait.result.has_value(); });
  GRAPHRUN_RETURN_IF_ERROR(wait.result->status());
  std::move((*wait.result)->begin(), (*wait.result)->end(), out.begin());
  return Status::ok();
}

Result<std::vector<Tensor>> SessionImpl::run(const FeedList& feeds,
                                             const std::vector<TensorRef>& fetches,
                                             const std::vector<TargetRef>& targets,
                                             const RunOptions& options, RunMetadata* metadata) {
  const CallScope call(this);
  GRAPHRUN_RETURN_IF_ERROR(check_open());
  GRAPHRUN_ASSIGN_OR_RETURN(auto prepared, prepare(feeds, fetches, targets, /*partial=*/false));
  const PlanLease& entry = prepared.second;
  std::vector<Tensor> values;
  values.reserve(feeds.size());
  for (const Feed& f : feeds) values.push_back(f.value);
  GRAPHRUN_RETURN_IF_ERROR(check_feeds(*entry->plan, values));
  std::vector<Tensor> out(fetches.size());
  GRAPHRUN_RETURN_IF_ERROR(execute(*entry, values, out, options, metadata));
  return out;
}

void SessionImpl::run_async(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                            const std::vector<TargetRef>& targets, const RunOptions& options,
                            RunDone done) {
  const CallScope call(this);
  auto fail = [&](const Status& why) { call_done(this, done, why, nullptr); };
  if (Status open = check_open(); !open.is_ok()) return fail(open);
  Result<std::pair<Signature, PlanLease>> prepared =
      prepare(feeds, fetches, targets, /*partial=*/false);
  if (!prepared.is_ok()) return fail(prepared.status());
  PlanLease& lease = prepared->second;
  std::vector<Tensor> values;
  values.reserve(feeds.size());
  for (const Feed& f : feeds) values.push_back(f.value);
  if (Status checked = check_feeds(*lease->plan, values); !checked.is_ok()) return fail(checked);
  PlanEntry& entry = *lease;
  execute_async(entry, std::move(lease), nullptr, std::move(values), options, std::move(done));
}

void SessionImpl::execute_async(PlanEntry& entry, PlanLease lease,
                                std::shared_ptr<PlanEntry> shared, std::vector<Tensor> feeds,
                                const RunOptions& options, RunDone done) {
  PlanEntry* run_entry = &entry;
  if (options.trace && entry.plan->fused_nodes > 0) {
    // A trace shows every node: the unfused twin runs instead.
    Result<PlanEntry*> twin = unfused_entry(entry);
    if (!twin.is_ok()) {
      call_done(this, done, twin.status(), nullptr);
      return;
    }
    run_entry = *twin;
  }
  auto* run = new AsyncRun(this, run_entry, std::move(lease), std::move(shared), std::move(feeds),
                           entry.plan->fetch_slots.size(), options,
                           step_control(options.trace, options.timeout), std::move(done));
  run->admit();
}

Result<Callable> SessionImpl::make_callable(const std::vector<TensorRef>& feeds,
                                            const std::vector<TensorRef>& fetches,
                                            const std::vector<TargetRef>& targets) {
  const CallScope call(this);
  GRAPHRUN_RETURN_IF_ERROR(check_open());
  GRAPHRUN_ASSIGN_OR_RETURN(auto prepared, prepare(feeds, fetches, targets, /*partial=*/false));
  return Callable(std::make_unique<CallableImpl>(this, prepared.second.share()));
}

}  // namespace graphrun::sched
