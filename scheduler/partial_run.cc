#include "scheduler/partial_run.h"

#include <algorithm>

#include "api/src/deadline.h"
#include "scheduler/async_run.h"
#include "scheduler/run_done.h"
#include "scheduler/session_impl.h"

namespace graphrun::sched {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

PartialRun::PartialRun(SessionImpl* session, std::shared_ptr<PlanEntry> entry, Signature signature,
                       std::string id)
    : session_(session),
      entry_(std::move(entry)),
      plan_(*entry_->plan),
      signature_(std::move(signature)),
      id_(std::move(id)),
      fed_(signature_.feeds.size(), 0),
      fetched_(signature_.fetches.size(), 0),
      ready_(new std::atomic<int>[signature_.fetches.size() + signature_.targets.size()]()),
      waiters_(signature_.fetches.size() + signature_.targets.size()) {
  touch();
}

PartialRun::~PartialRun() {
  // Waits for a stop callback running on another thread.
  setup_stop_.reset();
  // The handle and the session registry are gone: the run ended or was
  // detached; nothing may wait on the group any more.
  GRAPHRUN_DCHECK(instance_ == nullptr);
}

void PartialRun::StopRun::operator()() const {
  run->record_error(cancelled("partial run {} was cancelled by its caller", run->id_));
}

void PartialRun::watch(const std::stop_token& token) {
  if (token.stop_possible()) setup_stop_.emplace(token, StopRun{this});
}

void PartialRun::touch() { last_used_ns_.store(now_ns(), std::memory_order_relaxed); }

std::chrono::steady_clock::time_point PartialRun::last_used() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(last_used_ns_.load(std::memory_order_relaxed)));
}

void PartialRun::start(const StepControl& control) {
  std::unique_ptr<FlowInstance> inst =
      take_instance(entry_->pool, plan_, session_->runtime(),
                    [this](auto&& fn) { session_->in_partial_run_arena(fn); });
  RunState& state = inst->state();
  state.begin(control, {});
  state.set_listener(this);  // before any body can report
  FlowInstance* started = inst.get();
  {
    std::lock_guard lock(instance_mu_);
    instance_ = std::move(inst);
  }
  started->start_roots();
}

// ---- waiters: one atomic per fetch/target decides who releases its handle ----

void PartialRun::on_ready(int k) {
  if (ready_[k].exchange(2) == 1) release_waiter(k);
}

void PartialRun::on_error() {
  failing_.store(true);
  const std::size_t n = signature_.fetches.size() + signature_.targets.size();
  for (std::size_t k = 0; k < n; ++k) {
    int expected = 1;
    if (ready_[k].compare_exchange_strong(expected, 0)) release_waiter(static_cast<int>(k));
  }
}

void PartialRun::release_waiter(int k) {
  if (resume_to_.load() != nullptr) {
    count_down_awaited();
    return;
  }
  // Destroying a deferred, never-run task handle releases the group's wait.
  waiters_[static_cast<std::size_t>(k)] = tbb::task_handle{};
}

void PartialRun::install_waiter(int k) {
  if (ready_[k].load() == 2) return;
  const bool counting = resume_to_.load() != nullptr;
  if (counting) {
    awaited_.fetch_add(1);
  } else {
    waiters_[static_cast<std::size_t>(k)] = group_->defer([] {});
  }
  int expected = 0;
  if (!ready_[k].compare_exchange_strong(expected, 1)) {
    // Became ready meanwhile: nobody else will release this one (the
    // count cannot reach zero here: act holds one).
    if (counting) {
      awaited_.fetch_sub(1);
    } else {
      waiters_[static_cast<std::size_t>(k)] = tbb::task_handle{};
    }
  }
}

// ---- calls ----

Status PartialRun::check_usable() const {
  if (!ended_.load(std::memory_order_acquire)) return Status::ok();
  return end_status_.is_ok() ? invalid_argument(
                                   "partial run {} is complete: every fetch and target of its "
                                   "setup has been produced",
                                   id_)
                             : end_status_;
}

Result<SessionImpl*> PartialRun::lock_for_call(std::unique_lock<CallLock>& call_lock) {
  call_lock = std::unique_lock<CallLock>(call_mu_, std::try_to_lock);
  if (!call_lock.owns_lock()) {
    // Held by a cancellation ending the run (close, cancel_partial_run, the
    // idle sweep), or by a call that failed or was cancelled and is ending
    // the run: wait for it and report how the run ended.
    if (cancels_pending_.load() == 0 && !failing_.load()) {
      return failed_precondition("partial run {} is in use by another call", id_);
    }
    call_lock.lock();
    GRAPHRUN_RETURN_IF_ERROR(check_usable());
  }
  touch();
  GRAPHRUN_RETURN_IF_ERROR(check_usable());
  SessionImpl* session = nullptr;
  {
    std::lock_guard lock(session_mu_);
    session = session_;
  }
  if (session == nullptr) return cancelled("partial run {}: the session was destroyed", id_);
  GRAPHRUN_RETURN_IF_ERROR(session->check_open());
  RunState& state = instance_->state();
  if (state.failed()) return state.status();
  return session;
}

void PartialRun::end_if_failed() {
  // A run cancelled while a call held the lock is ended before the lock goes.
  if (!ended_.load() && instance_ != nullptr && instance_->state().failed()) {
    end(instance_->state().status());
  }
}

Result<PartialRun::CallSteps> PartialRun::resolve_call(SessionImpl* session, const FeedList& feeds,
                                                       const std::vector<TensorRef>& fetches,
                                                       const std::vector<TargetRef>& targets,
                                                       const RunOptions& options, bool traced) {
  // Resolve and check everything before touching the step: misuse leaves the
  // run as it was.
  const std::size_t n_fetches = signature_.fetches.size();
  CallSteps steps;
  steps.feed_ids.reserve(feeds.size());
  steps.feed_values.reserve(feeds.size());
  for (const Feed& f : feeds) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, session->resolve_tensor(f.tensor));
    auto it = std::find(signature_.feeds.begin(), signature_.feeds.end(), o);
    if (it == signature_.feeds.end()) {
      return invalid_argument("The feed '{}' was not specified in partial_run_setup.", o.name());
    }
    const auto id = static_cast<int>(it - signature_.feeds.begin());
    if (fed_[static_cast<std::size_t>(id)] != 0 ||
        std::find(steps.feed_ids.begin(), steps.feed_ids.end(), id) != steps.feed_ids.end()) {
      return invalid_argument("The feed '{}' has already been fed.", o.name());
    }
    steps.feed_ids.push_back(id);
    steps.feed_values.push_back(f.value);
  }
  steps.fetch_ids.reserve(fetches.size());
  for (const TensorRef& f : fetches) {
    GRAPHRUN_ASSIGN_OR_RETURN(Output o, session->resolve_tensor(f));
    auto it = std::find(signature_.fetches.begin(), signature_.fetches.end(), o);
    if (it == signature_.fetches.end()) {
      return invalid_argument("The fetch '{}' was not specified in partial_run_setup.", o.name());
    }
    const auto id = static_cast<int>(it - signature_.fetches.begin());
    if (fetched_[static_cast<std::size_t>(id)] != 0) {
      return invalid_argument("The fetch '{}' has already been fetched.", o.name());
    }
    steps.fetch_ids.push_back(id);
  }
  std::vector<int> target_ids;
  for (const TargetRef& t : targets) {
    GRAPHRUN_ASSIGN_OR_RETURN(const Node* n, session->resolve_target(t));
    auto it = std::find(signature_.targets.begin(), signature_.targets.end(), n);
    if (it == signature_.targets.end()) {
      return invalid_argument("The target '{}' was not specified in partial_run_setup.", n->name());
    }
    target_ids.push_back(static_cast<int>(it - signature_.targets.begin()));
  }
  auto will_be_fed = [&](int f) {
    return fed_[static_cast<std::size_t>(f)] != 0 ||
           std::find(steps.feed_ids.begin(), steps.feed_ids.end(), f) != steps.feed_ids.end();
  };
  auto check_computable = [&](const std::vector<int32_t>& needs,
                              const std::string& what) -> Status {
    std::string missing;
    for (int32_t f : needs) {
      if (!will_be_fed(f)) {
        missing += fmt::format("{}'{}'", missing.empty() ? "" : ", ",
                               plan_.feed_names[static_cast<std::size_t>(f)]);
      }
    }
    if (missing.empty()) return Status::ok();
    return invalid_argument(
        "{} can't be computed from the feeds that have been fed so far: {} still missing", what,
        missing);
  };
  for (int k : steps.fetch_ids) {
    GRAPHRUN_RETURN_IF_ERROR(check_computable(
        plan_.fetch_needs[static_cast<std::size_t>(k)],
        fmt::format("Fetch '{}'", signature_.fetches[static_cast<std::size_t>(k)].name())));
  }
  for (int t : target_ids) {
    GRAPHRUN_RETURN_IF_ERROR(check_computable(
        plan_.target_needs[static_cast<std::size_t>(t)],
        fmt::format("Target '{}'", signature_.targets[static_cast<std::size_t>(t)]->name())));
  }
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    GRAPHRUN_RETURN_IF_ERROR(SessionImpl::check_feed(
        plan_, static_cast<std::size_t>(steps.feed_ids[i]), feeds[i].value));
  }

  // What this call waits for: its fetches and targets; once every fetch is
  // out, also every declared target, so that the run completes.
  std::vector<int>& awaited = steps.awaited;
  for (int k : steps.fetch_ids) awaited.push_back(k);
  for (int t : target_ids) awaited.push_back(static_cast<int>(n_fetches) + t);
  bool last_fetches = true;
  for (std::size_t k = 0; k < n_fetches; ++k) {
    if (fetched_[k] == 0 && std::find(steps.fetch_ids.begin(), steps.fetch_ids.end(),
                                      static_cast<int>(k)) == steps.fetch_ids.end()) {
      last_fetches = false;
    }
  }
  if (last_fetches) {
    for (std::size_t t = 0; t < signature_.targets.size(); ++t)
      awaited.push_back(static_cast<int>(n_fetches + t));
  }
  // Each once: installing a second waiter for the same target would drop
  // the first handle, and with it the wait.
  std::sort(awaited.begin(), awaited.end());
  awaited.erase(std::unique(awaited.begin(), awaited.end()), awaited.end());
  steps.traced = traced;
  if (options.timeout) {
    steps.timeout = *options.timeout;
    steps.deadline = graphrun::internal::steady_deadline_for(*options.timeout);
  }
  return steps;
}

void PartialRun::StopCall::operator()() const {
  run->record_error(cancelled("partial run {}: the call was cancelled by its caller", run->id_));
}

bool PartialRun::act(SessionImpl* session, CallSteps& steps, const std::stop_token& stop,
                     AsyncCall* resume_to) {
  RunState& state = instance_->state();
  state.set_trace(steps.traced);
  // Admitted: from here on the call acts on the run.
  for (std::size_t i = 0; i < steps.feed_ids.size(); ++i) {
    state.set_feed(steps.feed_ids[i], std::move(steps.feed_values[i]));
    fed_[static_cast<std::size_t>(steps.feed_ids[i])] = 1;
  }
  if (steps.deadline) {
    steps.deadline_timer =
        session->timer().schedule(*steps.deadline, [this, timeout = steps.timeout] {
          // Cancelled before the call concludes, so `this` is alive.
          record_error(deadline_exceeded("partial run {}: the call's deadline of {} ms expired",
                                         id_, timeout.count()));
        });
  }
  // A stop requested while this call is in progress cancels the run.
  if (stop.stop_possible())
    steps.on_stop = std::make_unique<std::stop_callback<StopCall>>(stop, StopCall{this});
  if (instance_->run_inline()) {
    // Every node the feeds make ready runs before put_feed returns.
    for (int f : steps.feed_ids) instance_->put_feed(f);
    return false;
  }
  if (resume_to != nullptr) {
    awaited_.store(1);  // act's own: the count cannot end while it installs
    resume_to_.store(resume_to);
  }
  for (int k : steps.awaited) install_waiter(k);
  // seq_cst read after installing (see RunState::record_error): an error
  // recorded before the handles existed is seen here.
  if (state.failed()) on_error();
  for (int f : steps.feed_ids) instance_->put_feed(f);
  if (resume_to == nullptr) {
    group_->wait();
    return false;
  }
  count_down_awaited();
  return true;
}

Result<std::vector<Tensor>> PartialRun::conclude(SessionImpl* session, CallSteps& steps,
                                                 const Status& admitted, RunMetadata* metadata) {
  RunState& state = instance_->state();
  // No thread came in time: the call's deadline, its stop or close() ended
  // the wait, and ends the run as it would have ended the step.
  if (!admitted.is_ok()) record_error(admitted);
  if (steps.deadline_timer != 0) session->timer().cancel(steps.deadline_timer);
  steps.on_stop.reset();  // waits for a callback running on another thread
  if (metadata != nullptr && steps.traced) state.collect_new_stats(*metadata);

  Status status = state.status();
  if (!status.is_ok()) {
    end(status);
    return status;
  }
  std::vector<Tensor> out;
  out.reserve(steps.fetch_ids.size());
  const std::size_t n_fetches = signature_.fetches.size();
  for (int k : steps.fetch_ids) {
    GRAPHRUN_CHECK(ready_[k].load() == 2);
    out.push_back(state.fetch_value(k));
    fetched_[static_cast<std::size_t>(k)] = 1;
  }
  bool complete = std::all_of(fetched_.begin(), fetched_.end(), [](char c) { return c != 0; });
  for (std::size_t t = 0; complete && t < signature_.targets.size(); ++t) {
    complete = ready_[n_fetches + t].load() == 2;
  }
  if (complete) end(Status::ok());
  return out;
}

Result<std::vector<Tensor>> PartialRun::call(const FeedList& feeds,
                                             const std::vector<TensorRef>& fetches,
                                             const std::vector<TargetRef>& targets,
                                             const RunOptions& options, RunMetadata* metadata) {
  std::unique_lock<CallLock> call_lock;
  Result<SessionImpl*> locked = lock_for_call(call_lock);
  struct EndIfFailed {
    PartialRun* run;
    bool armed;
    ~EndIfFailed() {
      if (armed) run->end_if_failed();
    }
  } end_if_failed{this, call_lock.owns_lock()};
  if (!locked.is_ok()) return locked.status();
  SessionImpl* session = *locked;
  const bool traced = options.trace && metadata != nullptr;
  GRAPHRUN_ASSIGN_OR_RETURN(CallSteps steps,
                            resolve_call(session, feeds, fetches, targets, options, traced));
  const Status admitted = session->run_step(
      plan_.costs->run_inline(), traced, session->wait_limits(steps.deadline, options.stop_token),
      [&] {
        // In the arena the run's flow graph lives in: the feeds' nodes run
        // on this thread, fetches first (a 1-thread pool's runs live in
        // its asynchronous arena, which this thread enters).
        if (instance_->run_inline()) {
          act(session, steps, options.stop_token);
        } else {
          session->in_partial_run_arena([&] { act(session, steps, options.stop_token); });
        }
      });
  return conclude(session, steps, admitted, metadata);
}

// One asynchronous partial_run call: checked on the calling thread,
// queued for a permit like a run, then acted out by a worker of the pool's
// asynchronous arena, which enters the run's arena as its caller would.
// Holds the run's call lock from the check to the report.
class PartialRun::AsyncCall final : public QueuedCall {
 public:
  AsyncCall(SessionImpl* session, std::shared_ptr<PartialRun> run,
            std::unique_lock<CallLock> call_lock, CallSteps steps, const RunOptions& options,
            RunDone done)
      : QueuedCall(session, steps.deadline, options.stop_token),
        run_(std::move(run)),
        call_lock_(std::move(call_lock)),
        steps_(std::move(steps)),
        done_(std::move(done)),
        call_stripe_(session->add_call()) {
    if (steps_.traced) metadata_.emplace();
  }

 private:
  ~AsyncCall() = default;

  void admitted(bool /*at_once*/) override {
    pool_->submit([this] { act(); });
  }

  void rejected(Status why) override {
    drop_stop();
    report(run_->conclude(session_, steps_, why, nullptr));
  }

  void act() {
    if (pool_->partial_runs_in_async_arena()) {
      // The run's flow graph lives in this asynchronous arena (a 1-thread
      // pool), whose only worker this is: it must not wait here, inside
      // a task, for nodes it would never run. The release of the call's
      // last awaited fetch or target resumes it.
      session_->finish_kept_runs();
      if (run_->act(session_, steps_, stop_token_, this)) return;
    } else {
      // Act inside the pool's blocking arena, where the run's flow graph
      // lives, as a blocking caller would, holding the permit this call
      // was given.
      auto body = [&] {
        session_->finish_kept_runs();
        run_->act(session_, steps_, stop_token_);
      };
      pool_->arena.execute([&] { pool_->run_marked(body); });
    }
    after_wait();
  }

 public:
  // Any thread: what the call awaited is there (or the run failed).
  void resume() {
    pool_->submit([this] { after_wait(); });
  }

 private:
  void after_wait() {
    release_permit();
    drop_stop();
    report(run_->conclude(session_, steps_, Status::ok(), metadata_ ? &*metadata_ : nullptr));
  }

  void report(Result<std::vector<Tensor>> result) {
    {
      const std::lock_guard lock(run_->pending_mu_);
      run_->pending_call_ = nullptr;
    }
    run_->end_if_failed();
    call_lock_.unlock();  // before done: it may call this run again
    RunDone done = std::move(done_);
    call_done(session_, done, std::move(result), metadata_ ? &*metadata_ : nullptr);
    SessionImpl* const session = session_;
    const std::size_t stripe = call_stripe_;
    delete this;
    session->remove_call(stripe);
  }

  std::shared_ptr<PartialRun> run_;
  std::unique_lock<CallLock> call_lock_;
  CallSteps steps_;
  RunDone done_;
  std::optional<RunMetadata> metadata_;
  std::size_t call_stripe_;
};

void PartialRun::count_down_awaited() {
  if (awaited_.fetch_sub(1) != 1) return;
  // The last: no release of this call can come any more.
  AsyncCall* const call = resume_to_.exchange(nullptr);
  call->resume();
}

void PartialRun::call_async(const FeedList& feeds, const std::vector<TensorRef>& fetches,
                            const std::vector<TargetRef>& targets, const RunOptions& options,
                            RunDone done) {
  auto fail = [&](const Status& why) {
    const SessionImpl* session = nullptr;
    {
      const std::lock_guard lock(session_mu_);
      session = session_;
    }
    call_done(session, done, why, nullptr);
  };
  std::unique_lock<CallLock> call_lock;
  Result<SessionImpl*> locked = lock_for_call(call_lock);
  if (!locked.is_ok()) {
    if (call_lock.owns_lock()) {
      end_if_failed();
      call_lock.unlock();
    }
    return fail(locked.status());
  }
  SessionImpl* session = *locked;
  Result<CallSteps> steps =
      resolve_call(session, feeds, fetches, targets, options, /*traced=*/options.trace);
  if (!steps.is_ok()) {
    end_if_failed();
    call_lock.unlock();
    return fail(steps.status());
  }
  auto* call = new AsyncCall(session, shared_from_this(), std::move(call_lock), std::move(*steps),
                             options, std::move(done));
  {
    const std::lock_guard lock(pending_mu_);
    pending_call_ = call;
  }
  call->admit();
}

void PartialRun::end(const Status& status) {
  if (ended_.load()) return;
  // Take the instance out first: from here on no other thread (cancel, the
  // deadline timer) can reach its state.
  std::unique_ptr<FlowInstance> inst;
  {
    std::lock_guard lock(instance_mu_);
    if (!status.is_ok()) instance_->state().record_error(status);  // cancels, wakes waiters
    inst = std::move(instance_);
  }
  SessionImpl* session = nullptr;
  {
    std::lock_guard lock(session_mu_);
    session = session_;
  }
  // The instance's nodes may still report to this run (its listener)
  // until it is drained: it keeps the run alive.
  SessionImpl::EndedRun ended{std::move(inst), entry_, {}, shared_from_this()};
  if (!status.is_ok()) {
    for (std::size_t f = 0; f < fed_.size(); ++f) {
      if (fed_[f] == 0) ended.unfed.push_back(static_cast<int>(f));
    }
  }
  if (session != nullptr) {
    // Cleaned up now if a thread of the pool is free at once, else by the
    // session's next step (or its destructor): ending a run never waits
    // for a busy pool.
    session->finish_ended_run(plan_, std::move(ended));
  } else {
    SessionImpl::finish_detached(ended);
  }
  end_status_ = status;
  ended_.store(true, std::memory_order_release);
  if (session != nullptr) session->unregister_partial_run(id_);
}

void PartialRun::record_error(const Status& why) {
  std::lock_guard lock(instance_mu_);
  if (instance_ != nullptr) instance_->state().record_error(why);
}

void PartialRun::cancel(const Status& why) {
  if (ended_.load()) return;
  // Wakes a call in progress (it then ends the run and lets go of call_mu_).
  record_error(why);
  cancels_pending_.fetch_add(1);  // a call arriving meanwhile waits for the end
  // An asynchronous call waiting for a thread holds call_mu_: take it out
  // of the queue and end it now (its report lets go of call_mu_) rather
  // than wait until the pool serves it. Under pending_mu_ it cannot report
  // (and be deleted) meanwhile.
  QueuedCall* left = nullptr;
  {
    const std::lock_guard lock(pending_mu_);
    if (pending_call_ != nullptr && pending_call_->leave_queue()) left = pending_call_;
  }
  if (left != nullptr) left->reject_left(why);
  std::lock_guard call_lock(call_mu_);
  if (!ended_.load()) end(why);
  cancels_pending_.fetch_sub(1);
}

void PartialRun::detach() {
  cancel(session_closed_status());
  std::lock_guard lock(session_mu_);
  session_ = nullptr;
}

}  // namespace graphrun::sched
