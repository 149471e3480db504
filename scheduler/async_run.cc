#include "scheduler/async_run.h"

#include "scheduler/run_done.h"
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

// ---- QueuedCall ----

QueuedCall::QueuedCall(SessionImpl* session,
                       std::optional<std::chrono::steady_clock::time_point> deadline,
                       std::stop_token stop)
    : session_(session),
      pool_(&session->pool_->impl()),
      stop_token_(std::move(stop)),
      deadline_(deadline) {}

void QueuedCall::admit() {
  // Registered first: a stop from now on is seen by on_stop() or by the
  // check below (and, once admitted, by the subclass).
  if (stop_token_.stop_possible()) on_stop_.emplace(stop_token_, Stop{this});
  if (!session_->options_.queue_async_calls) {
    admitted(/*at_once=*/true);  // without a permit
    return;
  }
  std::unique_lock lock(mu_);  // whoever takes the call out of the queue waits for this
  if (pool_->permits().acquire_or_queue(this, &session_->closed_)) {
    lock.unlock();
    admitted(/*at_once=*/true);
    return;
  }
  // Queued. A stop requested before on_stop could find the call queued:
  if (stop_token_.stop_requested() && pool_->permits().remove(this)) {
    lock.unlock();
    reject(cancelled("the call was cancelled by its caller while it waited for a thread"));
    return;
  }
  if (deadline_) {
    queue_timer_ = session_->timer().schedule(*deadline_, [this] { on_queue_deadline(); });
  }
}

void QueuedCall::release_permit() {
  // Admitted calls of a session that queues hold one (admit()).
  if (session_->options_.queue_async_calls) pool_->permits().release();
}

void QueuedCall::cancel_queue_timer() {
  Timer::Id timer = 0;
  {
    const std::lock_guard lock(mu_);  // admit() is done with the call
    timer = std::exchange(queue_timer_, 0);
  }
  // Waits for a deadline callback in flight (it finds the call taken).
  if (timer != 0) session_->timer().cancel(timer);
}

void QueuedCall::on_granted() {
  cancel_queue_timer();
  admitted(/*at_once=*/false);
}

void QueuedCall::on_closed() {
  cancel_queue_timer();
  reject(session_closed_status());
}

bool QueuedCall::leave_queue() { return pool_->permits().remove(this); }

void QueuedCall::reject_left(Status why) {
  cancel_queue_timer();
  reject(std::move(why));
}

void QueuedCall::on_queue_deadline() {
  if (!pool_->permits().remove(this)) return;  // granted meanwhile
  cancel_queue_timer();                        // this callback: nothing to wait for
  reject(deadline_exceeded(
      "the call's deadline expired while it waited for a thread: all {} of the session's pool "
      "are busy",
      pool_->threads));
}

void QueuedCall::on_stop() {
  if (pool_->permits().remove(this)) {
    cancel_queue_timer();
    reject(cancelled("the call was cancelled by its caller while it waited for a thread"));
    return;  // `this` is gone
  }
  const std::lock_guard lock(mu_);
  stopped_while_admitted();
}

void QueuedCall::reject(Status why) {
  // From the stop callback itself this does not wait (it is this thread).
  drop_stop();
  rejected(std::move(why));
}

// ---- AsyncRun ----

AsyncRun::AsyncRun(SessionImpl* session, PlanEntry* entry, PlanLease lease,
                   std::shared_ptr<PlanEntry> shared, std::vector<Tensor> feeds,
                   std::size_t num_fetches, const RunOptions& options, StepControl control,
                   RunDone done)
    : QueuedCall(session, control.deadline, options.stop_token),
      entry_(entry),
      lease_(std::move(lease)),
      shared_(std::move(shared)),
      feeds_(std::move(feeds)),
      out_(num_fetches),
      control_(control),
      done_(std::move(done)),
      call_stripe_(session->add_call()) {
  if (control_.trace) metadata_.emplace();
}

void AsyncRun::admitted(bool at_once) {
  const Plan& plan = *entry_->plan;
  if (at_once && plan.costs->run_inline() && !control_.trace && g_inline_depth < kMaxInlineDepth) {
    ++g_inline_depth;
    const ThreadPool::Impl::Inside inside(pool_);
    run();  // to the end: `this` is gone
    --g_inline_depth;
    return;
  }
  pool_->submit([this] { run(); });
}

void AsyncRun::rejected(Status why) { complete(std::move(why)); }

void AsyncRun::stopped_while_admitted() {
  if (running_) inst_->state().record_error(cancelled("the run was cancelled by its caller"));
}

void AsyncRun::run() {
  session_->finish_kept_runs();
  const Plan& plan = *entry_->plan;
  // Built in the arena (a no-op entry from a worker).
  std::unique_ptr<FlowInstance> inst = take_instance(entry_->async_pool, plan, session_->runtime_,
                                                     [this](auto&& fn) { pool_->execute(fn); });
  if (!inst->run_inline() && ThreadPool::Impl::marks.in_arena != pool_) {
    // Admitted to run here as a run_inline plan, whose policy has changed
    // since: the flow graph runs on the asynchronous arena.
    std::unique_ptr<FlowInstance> spare =
        entry_->async_pool.give_back(std::move(inst), plan.costs->epoch());
    if (spare != nullptr) pool_->execute([&] { spare.reset(); });
    pool_->submit([this] { run(); });
    return;
  }
  RunState& state = inst->state();
  // On a worker of the pool's asynchronous arena (or a thread already in
  // one of its arenas), the nodes' intra-op loops stay in that arena.
  control_.in_pool_arena = ThreadPool::Impl::marks.in_arena == pool_;
  {
    const std::lock_guard lock(mu());
    state.begin(control_, feeds_);
    inst_ = std::move(inst);
    running_ = true;
  }
  feeds_.clear();  // the slots hold them now
  // A stop requested before the step began (on_stop found nothing to stop).
  if (stop_token_.stop_requested())
    state.record_error(cancelled("the run was cancelled by its caller"));
  if (plan.nodes.empty() || inst_->run_inline()) {
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
    const std::lock_guard lock(mu());
    running_ = false;  // a stop from now on leaves the state alone
  }
  RunState& state = inst_->state();
  const Status status = state.status();
  if (status.is_ok()) state.take_fetches(out_);
  if (control_.trace) state.collect_stats(*metadata_);
  state.finish();
  std::unique_ptr<FlowInstance> spare =
      entry_->async_pool.give_back(std::move(inst_), entry_->plan->costs->epoch());
  if (spare != nullptr) pool_->execute([&] { spare.reset(); });
  drop_stop();  // waits for a stop callback in flight
  // May hand the permit to a queued call, which starts on another thread.
  release_permit();
  if (status.is_ok()) {
    complete(std::move(out_));
  } else {
    complete(status);
  }
}

void AsyncRun::complete(Result<std::vector<Tensor>> result) {
  RunDone done = std::move(done_);
  call_done(session_, done, std::move(result), metadata_ ? &*metadata_ : nullptr);
  SessionImpl* const session = session_;
  const std::size_t stripe = call_stripe_;
  delete this;  // ends the plan lease while the session is alive
  // release: the session's destructor, waiting for this count, sees
  // nothing of this call touch it afterwards.
  session->remove_call(stripe);
}

}  // namespace graphrun::sched
