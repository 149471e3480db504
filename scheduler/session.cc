// graphrun::Session and graphrun::Callable: the public facade over
// sched::SessionImpl.
#include <graphrun/session.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "scheduler/partial_run.h"
#include "scheduler/run_done.h"
#include "scheduler/session_impl.h"

namespace graphrun {

namespace {

Status check_graph(const Graph& graph) {
  return graph.status().is_ok() ? Status::ok()
                                : graph.status().with_prefix(
                                      "cannot create a session from a graph with a build error");
}

}  // namespace

Result<std::unique_ptr<Session>> Session::create(const Graph& graph, SessionOptions options) {
  GRAPHRUN_RETURN_IF_ERROR(check_graph(graph));
  return create(graph.clone(), std::move(options));
}

Result<std::unique_ptr<Session>> Session::create(Graph&& graph, SessionOptions options) {
  GRAPHRUN_RETURN_IF_ERROR(check_graph(graph));
  // A GRAPHRUN_CPU_ISA the kernels cannot honour fails here, not as a
  // SIGILL in a kernel.
  if (!cpu_isa_status().is_ok()) return cpu_isa_status();
  if (options.inline_below_cycles <= 0) {
    return invalid_argument("SessionOptions::inline_below_cycles must be > 0, got {}",
                            options.inline_below_cycles);
  }
  if (options.inter_op_threads < 0) {
    return invalid_argument("SessionOptions::inter_op_threads must be >= 0, got {}",
                            options.inter_op_threads);
  }
  if (options.thread_pool == nullptr) {
    if (options.inter_op_threads > ThreadPool::max_threads()) {
      return invalid_argument(
          "SessionOptions::inter_op_threads = {} exceeds the limit of {} "
          "(ThreadPool::max_threads(): {} per core)",
          options.inter_op_threads, ThreadPool::max_threads(), ThreadPool::kMaxThreadsPerCore);
    }
    GRAPHRUN_ASSIGN_OR_RETURN(options.thread_pool, ThreadPool::create(options.inter_op_threads));
  }
  auto impl = std::make_unique<sched::SessionImpl>(std::move(graph), options);
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Session::Session(std::unique_ptr<sched::SessionImpl> impl) : impl_(std::move(impl)) {}
namespace {
// Sessions destroyed inside one of their own dones (a done that held the
// last reference): their destructor waits for the calls in flight, that
// done's among them, so they end here, on a thread of their own, once it
// has returned. The thread starts with the first such session and is
// joined at exit, after the sessions it was given have ended.
// Thread safety: thread-safe.
class Reaper {
 public:
  static Reaper& get() {
    static Reaper reaper;
    return reaper;
  }
  void end(std::unique_ptr<sched::SessionImpl> session) {
    const std::lock_guard lock(mu_);
    queue_.push_back(std::move(session));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_one();
  }
  ~Reaper() {
    {
      const std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Reaper() = default;
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every session has ended
      std::unique_ptr<sched::SessionImpl> session = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      session.reset();  // waits for the done that destroyed it to return
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<sched::SessionImpl>> queue_;  // guarded by mu_
  bool stopping_ = false;                                  // guarded by mu_
  std::thread thread_;
};
}  // namespace

Session::~Session() {
  // Inside one of its own dones, this thread's call is still in flight:
  // waiting for it here would wait for ever.
  if (impl_ != nullptr && sched::in_done_of(impl_.get())) Reaper::get().end(std::move(impl_));
}

Result<std::vector<Tensor>> Session::run(const FeedList& feeds,
                                         const std::vector<TensorRef>& fetches,
                                         const std::vector<TargetRef>& targets,
                                         const RunOptions& options, RunMetadata* metadata) {
  return impl_->run(feeds, fetches, targets, options, metadata);
}

void Session::run_async(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                        const std::vector<TargetRef>& targets, const RunOptions& options,
                        RunDone done) {
  impl_->run_async(feeds, fetches, targets, options, std::move(done));
}

namespace {
// A done that fulfils a promise (the future-returning forms).
std::pair<RunDone, std::future<Result<std::vector<Tensor>>>> promise_done() {
  auto promise = std::make_shared<std::promise<Result<std::vector<Tensor>>>>();
  std::future<Result<std::vector<Tensor>>> future = promise->get_future();
  RunDone done = [promise](Result<std::vector<Tensor>> result, RunMetadata*) {
    promise->set_value(std::move(result));
  };
  return {std::move(done), std::move(future)};
}
}  // namespace

std::future<Result<std::vector<Tensor>>> Session::run_async(const FeedList& feeds,
                                                            const std::vector<TensorRef>& fetches,
                                                            const std::vector<TargetRef>& targets,
                                                            const RunOptions& options) {
  auto [done, future] = promise_done();
  impl_->run_async(feeds, fetches, targets, options, std::move(done));
  return std::move(future);
}

Result<Callable> Session::make_callable(const std::vector<TensorRef>& feeds,
                                        const std::vector<TensorRef>& fetches,
                                        const std::vector<TargetRef>& targets) {
  return impl_->make_callable(feeds, fetches, targets);
}

Status Session::close() { return impl_->close(); }
Status Session::extend(const Graph& grown) { return impl_->extend(grown); }

Result<PartialRunHandle> Session::partial_run_setup(const std::vector<TensorRef>& fetches,
                                                    const std::vector<TensorRef>& feeds,
                                                    const std::vector<TargetRef>& targets,
                                                    const RunOptions& options) {
  return impl_->partial_run_setup(fetches, feeds, targets, options);
}

Result<std::vector<Tensor>> Session::partial_run(PartialRunHandle& handle, const FeedList& feeds,
                                                 const std::vector<TensorRef>& fetches,
                                                 const std::vector<TargetRef>& targets,
                                                 const RunOptions& options, RunMetadata* metadata) {
  const sched::SessionImpl::CallScope call(impl_.get());
  if (!handle.is_valid()) {
    return invalid_argument("Must run 'setup' before performing partial runs! (empty handle)");
  }
  if (!handle.run_->belongs_to(impl_.get())) {
    return invalid_argument("partial run {} does not belong to this session", handle.id());
  }
  return handle.run_->call(feeds, fetches, targets, options, metadata);
}

void Session::partial_run_async(PartialRunHandle& handle, const FeedList& feeds,
                                const std::vector<TensorRef>& fetches,
                                const std::vector<TargetRef>& targets, const RunOptions& options,
                                RunDone done) {
  const sched::SessionImpl::CallScope call(impl_.get());
  Status misuse;
  if (!handle.is_valid()) {
    misuse = invalid_argument("Must run 'setup' before performing partial runs! (empty handle)");
  } else if (!handle.run_->belongs_to(impl_.get())) {
    misuse = invalid_argument("partial run {} does not belong to this session", handle.id());
  }
  if (!misuse.is_ok()) {
    sched::call_done(impl_.get(), done, misuse, nullptr);
    return;
  }
  handle.run_->call_async(feeds, fetches, targets, options, std::move(done));
}

std::future<Result<std::vector<Tensor>>> Session::partial_run_async(
    PartialRunHandle& handle, const FeedList& feeds, const std::vector<TensorRef>& fetches,
    const std::vector<TargetRef>& targets, const RunOptions& options) {
  auto [done, future] = promise_done();
  partial_run_async(handle, feeds, fetches, targets, options, std::move(done));
  return std::move(future);
}

Status Session::cancel_partial_run(PartialRunHandle& handle) {
  const sched::SessionImpl::CallScope call(impl_.get());
  if (!handle.is_valid()) return invalid_argument("cancel_partial_run: empty handle");
  if (!handle.run_->belongs_to(impl_.get())) {
    return invalid_argument("partial run {} does not belong to this session", handle.id());
  }
  handle.run_->cancel(cancelled("partial run {} was cancelled", handle.id()));
  return Status::ok();
}

std::size_t Session::num_open_partial_runs() const { return impl_->num_open_partial_runs(); }

PartialRunHandle::PartialRunHandle(std::shared_ptr<sched::PartialRun> run) : run_(std::move(run)) {}
PartialRunHandle::PartialRunHandle(PartialRunHandle&& other) noexcept = default;
PartialRunHandle& PartialRunHandle::operator=(PartialRunHandle&& other) noexcept {
  if (this != &other) {
    if (run_ != nullptr) run_->cancel(cancelled("partial run {} was abandoned", run_->id()));
    run_ = std::move(other.run_);
  }
  return *this;
}
PartialRunHandle::~PartialRunHandle() {
  if (run_ != nullptr && !run_->is_ended()) {
    run_->cancel(cancelled("partial run {} was abandoned", run_->id()));
  }
}
const std::string& PartialRunHandle::id() const {
  static const std::string kEmpty;
  return run_ != nullptr ? run_->id() : kEmpty;
}
bool PartialRunHandle::is_done() const { return run_ == nullptr || run_->is_done(); }
const Graph& Session::graph() const { return impl_->graph(); }
std::size_t Session::num_cached_plans() const { return impl_->num_cached_plans(); }

Callable::Callable(std::unique_ptr<sched::CallableImpl> impl) : impl_(std::move(impl)) {}
Callable::Callable(Callable&&) noexcept = default;
Callable& Callable::operator=(Callable&&) noexcept = default;
Callable::~Callable() = default;

Status Callable::run(std::span<const Tensor> feeds, std::span<Tensor> fetches,
                     const RunOptions& options, RunMetadata* metadata) const {
  sched::SessionImpl& session = *impl_->session_;
  const sched::SessionImpl::CallScope call(&session);
  GRAPHRUN_RETURN_IF_ERROR(session.check_open());
  const sched::Plan& plan = *impl_->entry_->plan;
  GRAPHRUN_RETURN_IF_ERROR(sched::SessionImpl::check_feeds(plan, feeds));
  if (fetches.size() != plan.fetch_slots.size()) {
    return invalid_argument("expected room for {} fetch(es), got {}", plan.fetch_slots.size(),
                            fetches.size());
  }
  return session.execute(*impl_->entry_, feeds, fetches, options, metadata);
}

void Callable::run_async(std::vector<Tensor> feeds, RunDone done) const {
  run_async(std::move(feeds), RunOptions{}, std::move(done));
}

void Callable::run_async(std::vector<Tensor> feeds, const RunOptions& options, RunDone done) const {
  sched::SessionImpl& session = *impl_->session_;
  const sched::SessionImpl::CallScope call(&session);
  Status ok = session.check_open();
  if (ok.is_ok()) ok = sched::SessionImpl::check_feeds(*impl_->entry_->plan, feeds);
  if (!ok.is_ok()) {
    sched::call_done(&session, done, ok, nullptr);
    return;
  }
  session.execute_async(*impl_->entry_, sched::PlanLease(), impl_->entry_, std::move(feeds),
                        options, std::move(done));
}

std::future<Result<std::vector<Tensor>>> Callable::run_async(std::vector<Tensor> feeds,
                                                             const RunOptions& options) const {
  auto [done, future] = promise_done();
  run_async(std::move(feeds), options, std::move(done));
  return std::move(future);
}

std::size_t Callable::num_feeds() const { return impl_->entry_->plan->feed_slots.size(); }
std::size_t Callable::num_fetches() const { return impl_->entry_->plan->fetch_slots.size(); }

}  // namespace graphrun
