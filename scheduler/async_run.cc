#include "scheduler/async_run.h"

#include "scheduler/session_impl.h"

namespace graphrun::sched {

namespace {
// A run_inline plan granted a permit at once runs on the calling thread;
// a `done` that starts another such run nests once more. Past this depth
// the run goes to the arena instead, so chained calls cannot overflow the
// caller's stack.
constexpr int kMaxInlineDepth = 4;
thread_local int g_inline_depth = 0;
}  // namespace

AsyncRun::AsyncRun(SessionImpl* session, PlanEntry* entry, PlanLease lease,
                   std::shared_ptr<PlanEntry> shared, std::vector<Tensor> feeds,
                   std::size_t num_fetches, const RunOptions& options, RunDone done)
    : session_(session),
      pool_(&session->pool_->impl()),
      entry_(entry),
      lease_(std::move(lease)),
      shared_(std::move(shared)),
      feeds_(std::move(feeds)),
      out_(num_fetches),
      control_(session->step_control(options.trace, options.timeout)),
      stop_token_(options.stop_token),
      done_(std::move(done)),
      call_stripe_(session->calls_in_flight_.add()) {
  if (control_.trace) metadata_.emplace();
}

AsyncRun::~AsyncRun() = default;

void AsyncRun::start() {
  // Registered first: a stop from now on is seen by on_stop() or by the
  // checks below and in run().
  if (stop_token_.stop_possible()) on_stop_.emplace(stop_token_, Stop{this});
  std::unique_lock lock(mu_);  // whoever takes the run out of the queue waits for this
  if (pool_->permits().acquire_or_queue(this, &session_->closed_)) {
    lock.unlock();
    const Plan& plan = *entry_->plan;
    if (plan.run_inline && !control_.trace && g_inline_depth < kMaxInlineDepth) {
      ++g_inline_depth;
      const ThreadPool::Impl::Inside inside(pool_);
      run();  // to the end: `this` is gone
      --g_inline_depth;
    } else {
      pool_->submit([this] { run(); });
    }
    return;
  }
  // Queued. A stop requested before on_stop could find the run queued:
  if (stop_token_.stop_requested() && pool_->permits().remove(this)) {
    lock.unlock();
    fail_queued(cancelled("the run was cancelled by its caller while it waited for a thread"));
    return;
  }
  if (control_.deadline) {
    queue_timer_ = session_->timer().schedule(*control_.deadline, [this] { on_queue_deadline(); });
  }
}

void AsyncRun::on_granted() {
  Timer::Id timer = 0;
  {
    const std::lock_guard lock(mu_);  // start() is done with the run
    timer = std::exchange(queue_timer_, 0);
  }
  // Waits for a deadline callback in flight (it finds the run granted).
  if (timer != 0) session_->timer().cancel(timer);
  pool_->submit([this] { run(); });
}

void AsyncRun::on_closed() {
  Timer::Id timer = 0;
  {
    const std::lock_guard lock(mu_);
    timer = std::exchange(queue_timer_, 0);
  }
  if (timer != 0) session_->timer().cancel(timer);
  fail_queued(session_closed_status());
}

void AsyncRun::on_queue_deadline() {
  if (!pool_->permits().remove(this)) return;  // granted meanwhile
  {
    const std::lock_guard lock(mu_);
    queue_timer_ = 0;  // this callback: nothing to cancel
  }
  fail_queued(deadline_exceeded(
      "the run's deadline expired while it waited for a thread: all {} of the session's pool are "
      "busy",
      pool_->threads));
}

void AsyncRun::on_stop() {
  if (pool_->permits().remove(this)) {
    Timer::Id timer = 0;
    {
      const std::lock_guard lock(mu_);
      timer = std::exchange(queue_timer_, 0);
    }
    if (timer != 0) session_->timer().cancel(timer);
    fail_queued(cancelled("the run was cancelled by its caller while it waited for a thread"));
    return;  // `this` is gone
  }
  const std::lock_guard lock(mu_);
  if (running_) inst_->state().record_error(cancelled("the run was cancelled by its caller"));
}

void AsyncRun::fail_queued(Status why) {
  // From the stop callback itself this does not wait (it is this thread).
  on_stop_.reset();
  complete(std::move(why));
}

void AsyncRun::run() {
  // acquire: pairs with finish_ended_run's release.
  if (session_->has_ended_runs_.load(std::memory_order_acquire)) session_->finish_ended_runs();
  const Plan& plan = *entry_->plan;
  std::unique_ptr<FlowInstance> inst = entry_->pool.take();
  // Built in the arena (a no-op entry from a worker).
  if (inst == nullptr) {
    pool_->execute([&] { inst = std::make_unique<FlowInstance>(plan, session_->runtime_); });
  }
  RunState& state = inst->state();
  {
    const std::lock_guard lock(mu_);
    state.begin(control_, feeds_);
    inst_ = std::move(inst);
    running_ = true;
  }
  feeds_.clear();  // the slots hold them now
  // A stop requested before the step began (on_stop found nothing to stop).
  if (stop_token_.stop_requested())
    state.record_error(cancelled("the run was cancelled by its caller"));
  if (plan.nodes.empty() || plan.run_inline) {
    if (!plan.nodes.empty()) inst_->run();
    finish();
    return;
  }
  inst_->start(&AsyncRun::on_complete, this);
  // The step may have ended (and `this` be gone) already.
}

void AsyncRun::on_complete(void* self) {
  auto* run = static_cast<AsyncRun*>(self);
  // Not from inside the node body: the finisher waits for the graph.
  run->pool_->submit([run] { run->finish(); });
}

void AsyncRun::finish() {
  inst_->wait_quiet();  // the last node's task has ended
  {
    const std::lock_guard lock(mu_);
    running_ = false;  // a stop from now on leaves the state alone
  }
  RunState& state = inst_->state();
  const Status status = state.status();
  if (status.is_ok()) state.take_fetches(out_);
  if (control_.trace) state.collect_stats(*metadata_);
  state.finish();
  std::unique_ptr<FlowInstance> spare = entry_->pool.give_back(std::move(inst_));
  if (spare != nullptr) pool_->execute([&] { spare.reset(); });
  on_stop_.reset();  // waits for a stop callback in flight
  // May hand the permit to a queued call, which starts on another thread.
  pool_->permits().release();
  if (status.is_ok()) {
    complete(std::move(out_));
  } else {
    complete(status);
  }
}

void AsyncRun::complete(Result<std::vector<Tensor>> result) {
  RunDone done = std::move(done_);
  if (done) done(std::move(result), metadata_ ? &*metadata_ : nullptr);
  SessionImpl* const session = session_;
  const std::size_t stripe = call_stripe_;
  delete this;  // ends the plan lease while the session is alive
  // release: the session's destructor, waiting for this count, sees
  // nothing of this call touch it afterwards.
  session->calls_in_flight_.remove(stripe);
}

}  // namespace graphrun::sched
