#include "scheduler/run_state.h"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <new>
#include <utility>

#include "scheduler/thread_pool.h"

namespace graphrun::sched {

RunState::RunState(const Plan& plan, const KernelRuntime& runtime)
    : plan_(plan),
      runtime_(runtime),
      prefetch_limit_(std::ssize(plan.nodes) >= kPrefetchFrom ? std::ssize(plan.nodes) : 0),
      slots_(static_cast<std::size_t>(plan.num_slots)),
      readers_(new std::atomic<int32_t>[static_cast<std::size_t>(plan.num_slots)]) {
  if (std::any_of(plan.nodes.begin(), plan.nodes.end(),
                  [](const NodeItem& item) { return item.async; })) {
    async_ = std::make_unique<AsyncSlot[]>(plan.nodes.size());
  }
}

void RunState::begin(const StepControl& control, std::span<const Tensor> feeds) {
  control_ = control;
  cancellation_.cancelled.store(false, std::memory_order_relaxed);
  cancellation_.session_closed = control.session_closed;
  cancellation_.deadline = control.deadline.value_or(std::chrono::steady_clock::time_point::max());
  failed_.store(false, std::memory_order_relaxed);
  status_ = Status::ok();
  for (int32_t s = 0; s < plan_.num_slots; ++s) {
    readers_[s].store(plan_.slot_readers[static_cast<std::size_t>(s)], std::memory_order_relaxed);
  }
  for (std::size_t f = 0; f < feeds.size(); ++f) slots_[plan_.feed_slots[f]] = feeds[f];
  uint8_t checks = 0;
  if (control_.session_closed != nullptr) checks |= kCheckClosed;
  if (control_.deadline) checks |= kCheckDeadline;
  measure_ = plan_.costs->learns() && (steps_ < kLearnSteps || steps_ % kSampleEvery == 0);
  if (measure_) checks |= kCheckMeasure;
  checks_.store(checks, std::memory_order_relaxed);
  ++steps_;
  if (control_.trace) set_trace(true);  // checks_ has no trace bit yet
  // The flow graph's try_put publishes these writes to the executing threads.
}

void RunState::set_trace(bool on) {
  if (on && stats_.size() != plan_.nodes.size()) {
    stats_.assign(plan_.nodes.size(), NodeExecStats{});
    stat_state_.reset(new std::atomic<uint8_t>[plan_.nodes.size()]());
  }
  if (on) {
    traced_ = true;
    checks_.fetch_or(kCheckTrace, std::memory_order_release);  // publishes stats_
  } else {
    checks_.fetch_and(static_cast<uint8_t>(~kCheckTrace), std::memory_order_relaxed);
  }
}

void RunState::record_error(Status s) {
  {
    std::lock_guard lock(mu_);
    status_.update(s);
  }
  // seq_cst: a partial-run waiter installs its wait handle, then reads
  // failed_; this path sets failed_, then scans the handles (Dekker).
  failed_.store(true);
  cancellation_.cancelled.store(true, std::memory_order_relaxed);  // advisory for kernels
  if (listener_ != nullptr) listener_->on_error();
}

Status RunState::status() {
  // status_ changes only in record_error, which sets failed_ after it.
  if (!failed_.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard lock(mu_);
  return status_;
}

void RunState::release_inputs(const NodeItem& item) {
  for (int32_t k = item.input_begin; k < item.input_end; ++k) {
    const int32_t s = plan_.input_slots[static_cast<std::size_t>(k)];
    // acq_rel: the last reader must see every other reader's use finished.
    if (readers_[s].fetch_sub(1, std::memory_order_acq_rel) == 1)
      slots_[static_cast<std::size_t>(s)] = Tensor();
  }
}

bool RunState::interrupted(const NodeItem& item, uint8_t checks, const char* when) {
  if ((checks & kCheckClosed) != 0 &&
      control_.session_closed->load(std::memory_order_relaxed)) {  // relaxed: advisory
    record_error(session_closed_status());
    return true;
  }
  if ((checks & kCheckDeadline) != 0 && std::chrono::steady_clock::now() > *control_.deadline) {
    record_error(
        deadline_exceeded("the run's deadline expired {} {} ran", when, item.node->describe()));
    return true;
  }
  return false;
}

void RunState::fail_node(const NodeItem& item, const Status& s) {
  std::string inputs;
  for (int32_t k = item.input_begin; k < item.input_end; ++k) {
    const Tensor& t =
        slots_[static_cast<std::size_t>(plan_.input_slots[static_cast<std::size_t>(k)])];
    inputs += fmt::format("{}{}", k == item.input_begin ? "" : ", ", t.debug_type());
  }
  record_error(
      Status(s.code(),
             fmt::format("{}: {}{}", item.node->describe(), s.message(),
                         inputs.empty() ? std::string() : fmt::format(" (inputs: {})", inputs))));
}

inline OpKernelContext RunState::make_context(const NodeItem& item) {
  return OpKernelContext(
      *item.node, item.num_outputs, slots_.data(),
      std::span<const int32_t>(plan_.input_slots.data() + item.input_begin,
                               static_cast<std::size_t>(item.input_end - item.input_begin)),
      slots_.data() + item.output_base, runtime_, &cancellation_, control_.step_id);
}

namespace {
// The status of the exception a kernel threw (call inside a catch block).
[[gnu::noinline, gnu::cold]] Status thrown_status() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return resource_exhausted("out of memory");
  } catch (const std::exception& e) {
    return internal_error("kernel threw: {}", e.what());
  } catch (...) {
    return internal_error("kernel threw a non-standard exception");
  }
}
}  // namespace

inline Status RunState::check_outputs(const NodeItem& item) const {
  for (int32_t o = 0; o < item.num_outputs; ++o) {
    if (!slots_[static_cast<std::size_t>(item.output_base + o)].is_initialized()) {
      return internal_error("the kernel did not produce output {}", o);
    }
  }
  return Status::ok();
}

inline Status RunState::call_kernel(const NodeItem& item) noexcept {
  OpKernelContext ctx = make_context(item);
  try {
    Status s = item.kernel->compute(ctx);
    if (!s.is_ok()) return s;
  } catch (...) {
    return thrown_status();
  }
  return check_outputs(item);
}

void RunState::record_stats(const NodeItem& item, NodeExecStats& stat, int64_t start_ns) {
  stat.start_ns = start_ns;
  stat.end_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - control_.epoch)
                    .count();
  stat.node = item.node->name();
  stat.op = item.node->op();
  stat.thread = tbb::this_task_arena::current_thread_index();
  for (int32_t o = 0; o < item.num_outputs; ++o) {
    const Tensor& t = slots_[static_cast<std::size_t>(item.output_base + o)];
    stat.output_shapes.push_back(t.shape());
    stat.output_bytes += static_cast<int64_t>(t.byte_size());
  }
}

int64_t RunState::trace_now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              control_.epoch)
      .count();
}

// After the kernel (or none, for a NoOp): the statistics, then the inputs
// released.
inline void RunState::end_node(const NodeItem& item, uint8_t checks, int64_t start_ns,
                               const Status& s) noexcept {
  if (!item.skip_kernel) {
    // A kernel that stopped because the session closed or the deadline
    // passed fails the step with that reason, whatever it returned.
    if (may_be_interrupted(checks) && interrupted(item, checks, "while")) return;
    if (!s.is_ok()) [[unlikely]] {
      fail_node(item, s);
      return;
    }
  }
  if ((checks & kCheckTrace) != 0) {
    const auto i = static_cast<std::size_t>(&item - plan_.nodes.data());
    record_stats(item, stats_[i], start_ns);
    // Publishes stats_[i] to collect_new_stats (partial runs).
    stat_state_[i].store(1, std::memory_order_release);
  }
  if (item.input_end > item.input_begin) release_inputs(item);
}

template <bool kMarked>
inline Status RunState::call_in_pool(const NodeItem& item) noexcept {
  if constexpr (kMarked) {
    return call_kernel(item);
  } else {
    // A kernel calling a session of the same pool is already inside it.
    const ThreadPool::Impl::KernelMarks marks(control_.pool, control_.in_pool_arena);
    return call_kernel(item);
  }
}

template <bool kMarked>
inline void RunState::execute_node(const NodeItem& item) noexcept {
  prefetch_ahead(item);
  const uint8_t checks = checks_.load(std::memory_order_acquire);  // pairs with set_trace
  // A cancelled step skips its remaining nodes (their successors still
  // fire, and skip in turn). relaxed: advisory.
  if (cancellation_.cancelled.load(std::memory_order_relaxed)) return;
  if ((checks & ~kCheckClosed) != 0 || item.skip_kernel) [[unlikely]] {
    execute_checked(item, checks);
    return;
  }
  // The common path: a kernel to call; no deadline, statistics or sample.
  if (may_be_interrupted(checks) && interrupted(item, checks, "before")) return;
  end_node(item, checks, 0, call_in_pool<kMarked>(item));
}

template void RunState::execute_node<false>(const NodeItem& item) noexcept;

void RunState::execute_all() noexcept {
  // Between kernels the marks are read by nothing: set once, they spare
  // each node a save and a restore of two thread-locals.
  const ThreadPool::Impl::KernelMarks marks(control_.pool, control_.in_pool_arena);
  for (const NodeItem& item : plan_.nodes) execute_node<true>(item);
}

void RunState::execute_checked(const NodeItem& item, uint8_t checks) noexcept {
  // The node's index, for the cost samples and the statistics (not on the
  // common path).
  auto index = [&] { return static_cast<int32_t>(&item - plan_.nodes.data()); };
  if (may_be_interrupted(checks) && interrupted(item, checks, "before")) return;
  const int64_t start_ns = (checks & kCheckTrace) != 0 ? trace_now() : 0;
  Status s;
  if (!item.skip_kernel) {
    if ((checks & kCheckMeasure) != 0) {
      const uint64_t start = cycle_count();
      s = call_in_pool<false>(item);
      plan_.costs->record(index(), cycle_count() - start);
    } else {
      s = call_in_pool<false>(item);
    }
  }
  end_node(item, checks, start_ns, s);
}

bool RunState::execute_async(int32_t i, AsyncNotify notify, void* arg) noexcept {
  const NodeItem& item = plan_.nodes[static_cast<std::size_t>(i)];
  AsyncSlot& a = async_[static_cast<std::size_t>(i)];
  a.started = false;
  const uint8_t checks = checks_.load(std::memory_order_acquire);  // pairs with set_trace
  if (cancellation_.cancelled.load(std::memory_order_relaxed)) return false;  // as execute()
  if (may_be_interrupted(checks) && interrupted(item, checks, "before")) return false;
  a.checks = checks;
  a.start_ns = (checks & kCheckTrace) != 0 ? trace_now() : 0;
  a.started = true;
  a.status = Status::ok();
  a.done.store(false, std::memory_order_relaxed);  // published by compute_async's call
  a.ctx.emplace(make_context(item));
  a.notify = notify;
  a.arg = arg;
  a.index = i;
  // The first call wins; the status reaches finish_async through notify's
  // task submission.
  static constexpr auto end = [](AsyncSlot* slot, Status s) {
    if (slot->done.exchange(true, std::memory_order_acq_rel)) return;
    slot->status = std::move(s);
    slot->notify(slot->arg, slot->index);
  };
  // Once done has run, the slot and the context belong to finish_async:
  // nothing here touches them after compute_async.
  const ThreadPool::Impl::KernelMarks marks(control_.pool, control_.in_pool_arena);
  AsyncOpKernel* kernel = item.kernel->as_async();
  try {
    // Moved in (the kernel keeps it); a throw ends the slot directly.
    kernel->compute_async(*a.ctx, [slot = &a](Status s) { end(slot, std::move(s)); });
  } catch (...) {
    end(&a, thrown_status());
  }
  return true;
}

void RunState::finish_async(int32_t i) noexcept {
  AsyncSlot& a = async_[static_cast<std::size_t>(i)];
  if (!a.started) return;  // skipped: execute_async recorded why
  a.started = false;
  a.ctx.reset();
  const NodeItem& item = plan_.nodes[static_cast<std::size_t>(i)];
  Status s = std::move(a.status);
  if (s.is_ok()) s = check_outputs(item);
  end_node(item, a.checks, a.start_ns, s);
}

void RunState::take_fetches(std::span<Tensor> out) {
  for (std::size_t f = 0; f < plan_.fetch_slots.size(); ++f) {
    Tensor& slot = slots_[static_cast<std::size_t>(plan_.fetch_slots[f])];
    if (plan_.fetch_moves[f] != 0) {
      out[f] = std::move(slot);
    } else {
      out[f] = slot;
    }
  }
}

void RunState::finish() {
  for (Tensor& t : slots_) {
    if (t.is_initialized()) t = Tensor();
  }
  listener_ = nullptr;
  // The step's samples may move a node across its class boundary.
  if (measure_ && plan_.costs->dirty()) plan_.costs->update(plan_);
  if (traced_) {
    traced_ = false;
    // Tracing leaves per-node entries behind; the next step starts clean.
    for (std::size_t i = 0; i < stats_.size(); ++i) {
      stats_[i] = NodeExecStats{};
      stat_state_[i].store(0, std::memory_order_relaxed);  // relaxed: the step is over
    }
  }
  checks_.store(0, std::memory_order_relaxed);
}

void RunState::collect_stats(RunMetadata& metadata) const {
  metadata.cpu_isa = cpu_isa_name(cpu_isa());
  for (const NodeExecStats& s : stats_) {
    if (!s.node.empty()) metadata.step_stats.push_back(s);
  }
}

void RunState::collect_new_stats(RunMetadata& metadata) {
  if (stat_state_ == nullptr) return;
  metadata.cpu_isa = cpu_isa_name(cpu_isa());
  for (std::size_t i = 0; i < stats_.size(); ++i) {
    uint8_t expected = 1;  // acquire: pairs with the writer's release
    if (stat_state_[i].compare_exchange_strong(expected, 2, std::memory_order_acquire)) {
      metadata.step_stats.push_back(stats_[i]);
    }
  }
}

}  // namespace graphrun::sched
