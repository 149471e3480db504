#include "scheduler/flow_graph.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

namespace graphrun::sched {

using tbb::flow::continue_msg;

namespace {
std::atomic<int64_t> g_live_instances{0};  // relaxed: a statistic for tests

// How long run_waiting spins (testing the lent helpers, or yielding)
// before it sleeps on its condition variable: a message already on its way
// ends a Recv within microseconds, and a sleeping thread costs a futex
// wake-up (5-20 us on a VM) plus the progress thread's polling period on
// top. After a wait that outlasted the spin by less than the spin's
// ceiling, the next spins cover twice that wait: two ranks answering each
// other would otherwise stay in step with the sleeper's delays (each wait
// longer than the spin because the peer slept through its own; measured:
// 14% of a ping-pong's round trips at 140 us instead of 1.7).
constexpr auto kWaitSpin = std::chrono::microseconds(50);
constexpr auto kMaxWaitSpin = std::chrono::milliseconds(1);

// Sets a thread-local `slot` to `value` for a scope, then restores what it
// held (a nested step sets its own).
template <typename T>
class ScopedSet {
 public:
  ScopedSet(T& slot, T value) : slot_(slot), saved_(std::exchange(slot, value)) {}
  ScopedSet(const ScopedSet&) = delete;
  ScopedSet& operator=(const ScopedSet&) = delete;
  ~ScopedSet() { slot_ = saved_; }

 private:
  T& slot_;
  T saved_;
};
}  // namespace

// The asynchronous kernels of a run_waiting that have finished, not yet
// ended on the waiting thread; and the helpers they lent it. Kept by the
// instance from step to step (its vectors keep their capacity).
struct FlowInstance::Waiting final : internal::WaitSink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> nodes;  // guarded by mu
  // Ended on the waiting thread itself (a kernel that finished as it
  // started, or while the thread polled its helper): no lock, no wake-up,
  // no atomic.
  std::vector<int32_t> own;                  // the waiting thread's only
  std::atomic<int32_t> count{0};             // nodes.size(), read without the lock
  std::vector<WaitHelper*> helpers;          // the waiting thread's only
  std::vector<int32_t> ended;                // the waiting thread's only
  std::chrono::nanoseconds spin{kWaitSpin};  // the waiting thread's only

  // The Waiting whose thread this is, while it runs run_waiting.
  static constinit thread_local Waiting* mine;

  void lend(WaitHelper& helper) override { helpers.push_back(&helper); }

  static void notify(void* self, int32_t i) {
    auto* f = static_cast<Waiting*>(self);
    if (mine == f) {
      f->own.push_back(i);
      return;
    }
    // Under the lock to the end: once it is released, the waiter may go.
    const std::lock_guard lock(f->mu);
    f->nodes.push_back(i);
    f->count.fetch_add(1, std::memory_order_release);
    f->cv.notify_one();
  }
  void poll_helpers() {
    for (std::size_t k = 0; k < helpers.size();) {
      if (helpers[k]->poll()) {
        helpers[k] = helpers.back();
        helpers.pop_back();
      } else {
        ++k;
      }
    }
  }
  void release_helpers() {
    for (WaitHelper* h : helpers) h->release();
    helpers.clear();
  }
  // Waits for at least one and moves them all into `out`: a while testing
  // the lent helpers (or yielding the core), then asleep, the helpers
  // released. Every helper is polled at least once, however late the
  // thread gets here.
  void take(std::vector<int32_t>& out) {
    // The clock is read every kPollsPerClock polls (a poll of a message
    // is a few tens of nanoseconds, a clock read about as much), the first
    // time to start the spin's window.
    constexpr unsigned kPollsPerClock = 8;
    using Clock = std::chrono::steady_clock;
    Clock::time_point spin_from{};
    bool slept = false;
    // Past kWaitSpin (a spin lengthened by a previous wait) the thread
    // yields between polls: a peer process waiting for this core to
    // answer must not wait for the spin to end.
    bool yielding = false;
    auto none = [this] { return own.empty() && count.load(std::memory_order_acquire) == 0; };
    for (unsigned polls = 1; none(); ++polls) {
      if (helpers.empty()) {
        std::this_thread::yield();
      } else {
        poll_helpers();
        if (yielding) std::this_thread::yield();
      }
      if (!none()) break;
      if (polls % kPollsPerClock != 0) continue;
      const auto now = Clock::now();
      if (spin_from == Clock::time_point{}) {
        spin_from = now;
      } else if (now - spin_from >= spin) {
        release_helpers();
        slept = true;
        break;
      } else {
        yielding = now - spin_from >= kWaitSpin;
      }
    }
    // `out` is empty; what ended elsewhere waits for the next take().
    if (!own.empty()) {
      out.swap(own);
      return;
    }
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [this] { return !nodes.empty(); });
      out.swap(nodes);
      count.fetch_sub(static_cast<int32_t>(out.size()), std::memory_order_relaxed);
    }
    if (slept) {
      const auto waited = Clock::now() - spin_from;
      spin = 2 * waited <= kMaxWaitSpin ? std::max<std::chrono::nanoseconds>(kWaitSpin, 2 * waited)
                                        : std::chrono::nanoseconds(kWaitSpin);
    }
  }
};

constinit thread_local FlowInstance::Waiting* FlowInstance::Waiting::mine = nullptr;

int64_t FlowInstance::live_count() { return g_live_instances.load(std::memory_order_relaxed); }

FlowInstance::FlowInstance(const Plan& plan, const KernelRuntime& runtime, const Policy& policy)
    : state_(plan, runtime), epoch_(policy.epoch), run_inline_(policy.run_inline || policy.serial) {
  g_live_instances.fetch_add(1, std::memory_order_relaxed);
  if (run_inline_) {
    // run() / start_roots() / put_feed() call the bodies themselves.
    if (!plan.partial) return;
    const std::size_t n = plan.nodes.size();
    pending_.resize(n);
    ready_.reserve(n);
    std::vector<std::vector<int32_t>> sinks(n);
    for (std::size_t k = 0; k < plan.fetch_producers.size(); ++k) {
      const int32_t p = plan.fetch_producers[k];
      if (p >= 0) sinks[static_cast<std::size_t>(p)].push_back(static_cast<int32_t>(k));
    }
    const auto n_fetches = static_cast<int32_t>(plan.fetch_producers.size());
    for (std::size_t t = 0; t < plan.target_nodes.size(); ++t) {
      sinks[static_cast<std::size_t>(plan.target_nodes[t])].push_back(n_fetches +
                                                                      static_cast<int32_t>(t));
    }
    for (const std::vector<int32_t>& of_node : sinks) {
      inline_sink_begin_.push_back(static_cast<int32_t>(inline_sinks_.size()));
      inline_sinks_.insert(inline_sinks_.end(), of_node.begin(), of_node.end());
    }
    inline_sink_begin_.push_back(static_cast<int32_t>(inline_sinks_.size()));
    return;
  }
  const std::size_t n = plan.nodes.size();
  RunState* state = &state_;
  std::size_t n_light = 0;
  std::size_t n_tasks = 0;  // default-policy nodes: two per asynchronous one
  for (std::size_t i = 0; i < n; ++i) {
    if (plan.nodes[i].async) {
      n_tasks += 2;
    } else if (policy.lightweight[i] != 0) {
      ++n_light;
    } else {
      ++n_tasks;
    }
  }
  nodes_.reserve(n_tasks);
  light_nodes_.reserve(n_light);
  internal::reserve_maybe_huge(senders_, n);
  internal::reserve_maybe_huge(receivers_, n);
  internal::reserve_maybe_huge(bodies_, n);
  auto add_node = [&](auto body, bool lightweight) {
    if (lightweight) {
      LightNode& node = light_nodes_.emplace_back(graph_, body);
      senders_.push_back(&node);
      receivers_.push_back(&node);
      bodies_.push_back(node.body_address());
    } else {
      Node& node = nodes_.emplace_back(graph_, body);
      senders_.push_back(&node);
      receivers_.push_back(&node);
      bodies_.push_back(node.body_address());
    }
  };
  for (std::size_t i = 0; i < n; ++i) {
    const NodeItem& item = plan.nodes[i];
    const auto index = static_cast<int32_t>(i);
    if (item.async) {
      const bool leaf = !plan.partial && item.succ_begin == item.succ_end;
      if (leaf) ++num_leaves_;
      if (finishers_.empty()) finishers_.assign(n, nullptr);
      Node& start = nodes_.emplace_back(graph_, AsyncStartBody{this, index});
      Node& finisher = nodes_.emplace_back(graph_, AsyncFinishBody{this, index, leaf});
      finishers_[i] = &finisher;
      senders_.push_back(&finisher);  // successors and sinks follow the end
      receivers_.push_back(&start);
      bodies_.push_back(start.body_address());
      continue;
    }
    if (!plan.partial && item.succ_begin == item.succ_end) {
      ++num_leaves_;
      add_node(LeafBody{this, &item}, policy.lightweight[i] != 0);
    } else {
      add_node(Body{state, &item}, policy.lightweight[i] != 0);
    }
  }
  state_.set_prefetch(bodies_.data());
  for (std::size_t i = 0; i < n; ++i) {
    const NodeItem& item = plan.nodes[i];
    const bool reads_feed = plan.partial && plan.node_feed_inputs[i] > 0;
    if (item.num_preds == 0 && !reads_feed) roots_.push_back(receivers_[i]);
    for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
      tbb::flow::make_edge(
          *senders_[i],
          *receivers_[static_cast<std::size_t>(plan.successors[static_cast<std::size_t>(k)])]);
    }
  }
  if (!plan.partial) return;
  // A partial run's feeds arrive later: each has an entry node whose put
  // releases the feed's readers.
  for (const std::vector<int32_t>& readers : plan.feed_readers) {
    Entry& entry = entries_.emplace_back(graph_);
    for (int32_t reader : readers)
      tbb::flow::make_edge(entry, *receivers_[static_cast<std::size_t>(reader)]);
  }
  // Sinks signal a fetch's value or a target's completion. Registered after
  // every other edge, each is its producer's last successor, so the
  // producer's task bypasses into the sink and a helping waiter returns
  // right after it, while the producer's other successors wait in the task
  // pool (reference/onetbb-mechanics.md §2.1).
  // A sink keeps the default policy when its producer has other successors:
  // a lightweight one would run inside the producer's successor loop, not as
  // the bypassed task the wait returns after. (Successors of a fetched or
  // targeted node are never lightweight in a partial plan: see
  // choose_policies in plan.cc.) A sink that is its producer's only
  // successor has nothing to race with: it runs inline (no task, no worker
  // woken), and the wait returns when the producer's task ends.
  std::vector<int> sinks_per_producer(n, 0);
  for (const int32_t p : plan.fetch_producers) {
    if (p >= 0) ++sinks_per_producer[static_cast<std::size_t>(p)];
  }
  for (const int32_t t : plan.target_nodes) ++sinks_per_producer[static_cast<std::size_t>(t)];
  auto sole_successor = [&](int32_t producer) {
    const NodeItem& item = plan.nodes[static_cast<std::size_t>(producer)];
    return item.succ_end == item.succ_begin &&
           sinks_per_producer[static_cast<std::size_t>(producer)] == 1;
  };
  auto add_sink = [&](int k, tbb::flow::sender<continue_msg>& producer, bool light) {
    auto body = [state, k](const continue_msg&) {
      state->sink_fired(k);
      return continue_msg();
    };
    if (light) {
      tbb::flow::make_edge(producer, light_sinks_.emplace_back(graph_, body));
    } else {
      tbb::flow::make_edge(producer, sinks_.emplace_back(graph_, body));
    }
  };
  for (std::size_t k = 0; k < plan.fetch_producers.size(); ++k) {
    const int32_t p = plan.fetch_producers[k];
    if (p >= 0) {
      add_sink(static_cast<int>(k), *senders_[static_cast<std::size_t>(p)], sole_successor(p));
    } else {
      // A fed fetch: its entry is put by the caller; keep the default sink.
      add_sink(static_cast<int>(k), entries_[static_cast<std::size_t>(plan.fetch_feeds[k])], false);
    }
  }
  const auto n_fetches = static_cast<int>(plan.fetch_producers.size());
  for (std::size_t t = 0; t < plan.target_nodes.size(); ++t) {
    const int32_t p = plan.target_nodes[t];
    add_sink(n_fetches + static_cast<int>(t), *senders_[static_cast<std::size_t>(p)],
             sole_successor(p));
  }
}

FlowInstance::~FlowInstance() {
  graph_.wait_for_all();
  g_live_instances.fetch_sub(1, std::memory_order_relaxed);
}

void FlowInstance::async_done(void* instance, int32_t index) {
  auto* self = static_cast<FlowInstance*>(instance);
  tbb::flow::graph& graph = self->graph_;
  self->finishers_[static_cast<std::size_t>(index)]->try_put(continue_msg());
  graph.release_wait();
}

void FlowInstance::put_roots() {
  // Last first: a task put from outside the graph's tasks waits in the
  // thread's LIFO deque, so the plan's first root runs first, in the order
  // the plan was laid out in (build_plan).
  for (auto it = roots_.rbegin(); it != roots_.rend(); ++it) (*it)->try_put(continue_msg());
}

void FlowInstance::run() {
  if (run_inline_) {
    // Plan order is topological: each node's inputs are ready.
    state_.execute_all();
    return;
  }
  completion_ = nullptr;  // a blocking run waits for the graph instead
  put_roots();
  graph_.wait_for_all();
}

void FlowInstance::run_waiting() {
  const Plan& plan = state_.plan();
  const std::size_t n = plan.nodes.size();
  // Any ready node runs (or starts) before the thread waits: kernels that
  // finish only together all get started.
  pending_.resize(n);
  ready_.clear();
  for (std::size_t i = n; i-- > 0;) {
    pending_[i] = plan.nodes[i].num_preds;
    if (pending_[i] == 0) ready_.push_back(static_cast<int32_t>(i));
  }
  if (waiting_ == nullptr) waiting_ = std::make_unique<Waiting>();
  Waiting& finished = *waiting_;
  const ScopedSet<Waiting*> mine(Waiting::mine, &finished);
  std::vector<int32_t>& ended = finished.ended;
  int32_t outstanding = 0;
  for (;;) {
    while (!ready_.empty()) {
      const int32_t i = ready_.back();
      ready_.pop_back();
      if (!plan.nodes[static_cast<std::size_t>(i)].async) {
        state_.execute(i);
        release_successors(i);
        continue;
      }
      ++outstanding;
      // Only the asynchronous kernel's start sees the sink: a nested step
      // in another node's kernel must not lend work to this thread.
      const ScopedSet<internal::WaitSink*> lending(internal::current_wait_sink(), &finished);
      if (!state_.execute_async(i, &Waiting::notify, &finished)) {
        Waiting::notify(&finished, i);  // skipped: ends now
      }
    }
    if (outstanding == 0) {
      finished.release_helpers();  // none left when every kernel is done
      return;
    }
    finished.take(ended);
    for (const int32_t j : ended) {
      state_.finish_async(j);
      --outstanding;
      release_successors(j);
    }
    ended.clear();
  }
}

void FlowInstance::start(Completion done, void* arg) {
  GRAPHRUN_DCHECK(num_leaves_ > 0);
  completion_ = done;
  completion_arg_ = arg;
  pending_leaves_.store(num_leaves_, std::memory_order_relaxed);  // published by the try_puts
  put_roots();
}

void FlowInstance::start_roots() {
  const Plan& plan = state_.plan();
  if (run_inline_) {
    for (std::size_t i = 0; i < plan.nodes.size(); ++i) {
      pending_[i] = plan.nodes[i].num_preds + plan.node_feed_inputs[i];
      if (pending_[i] == 0) ready_.push_back(static_cast<int32_t>(i));
    }
    run_ready();
    return;
  }
  put_roots();
}

void FlowInstance::put_feed(int f) {
  const Plan& plan = state_.plan();
  if (run_inline_) {
    for (std::size_t k = 0; k < plan.fetch_feeds.size(); ++k) {
      if (plan.fetch_feeds[k] == f) state_.sink_fired(static_cast<int>(k));  // a fed fetch
    }
    for (const int32_t reader : plan.feed_readers[static_cast<std::size_t>(f)]) {
      if (--pending_[static_cast<std::size_t>(reader)] == 0) ready_.push_back(reader);
    }
    run_ready();
    return;
  }
  entries_[static_cast<std::size_t>(f)].try_put(continue_msg());
}

void FlowInstance::run_ready() {
  while (!ready_.empty()) {
    const int32_t i = ready_.back();
    ready_.pop_back();
    state_.execute(i);
    const auto u = static_cast<std::size_t>(i);
    for (int32_t k = inline_sink_begin_[u]; k < inline_sink_begin_[u + 1]; ++k) {
      state_.sink_fired(inline_sinks_[static_cast<std::size_t>(k)]);
    }
    release_successors(i);
  }
}

void FlowInstance::release_successors(int32_t i) {
  const Plan& plan = state_.plan();
  const NodeItem& item = plan.nodes[static_cast<std::size_t>(i)];
  for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
    const int32_t s = plan.successors[static_cast<std::size_t>(k)];
    if (--pending_[static_cast<std::size_t>(s)] == 0) ready_.push_back(s);
  }
}

std::unique_ptr<FlowInstance> InstancePool::take_from(Stripe& s) {
  for (std::atomic<FlowInstance*>& slot : s.idle) {
    // The load spares an empty slot's locked exchange.
    if (slot.load(std::memory_order_relaxed) == nullptr) continue;
    if (FlowInstance* inst = slot.exchange(nullptr, std::memory_order_acquire)) {
      return std::unique_ptr<FlowInstance>(inst);
    }
  }
  return nullptr;
}

std::unique_ptr<FlowInstance> InstancePool::take() {
  const std::size_t mine = this_thread_stripe();
  if (std::unique_ptr<FlowInstance> inst = take_from(stripes_[mine])) return inst;
  // Building one costs far more than looking at the other stripes.
  for (std::size_t i = 1; i < kStripes; ++i) {
    if (std::unique_ptr<FlowInstance> inst = take_from(stripes_[(mine + i) % kStripes])) {
      return inst;
    }
  }
  return nullptr;
}

std::unique_ptr<FlowInstance> InstancePool::give_back(std::unique_ptr<FlowInstance> instance,
                                                      uint64_t epoch) {
  if (instance->epoch() != epoch) return instance;
  Stripe& s = stripes_[this_thread_stripe()];
  for (std::atomic<FlowInstance*>& slot : s.idle) {
    FlowInstance* empty = nullptr;
    if (slot.load(std::memory_order_relaxed) == nullptr &&
        slot.compare_exchange_strong(empty, instance.get(), std::memory_order_release,
                                     std::memory_order_relaxed)) {
      static_cast<void>(instance.release());  // the slot owns it now
      return nullptr;
    }
  }
  return instance;  // the stripe is full
}

void InstancePool::clear() {
  for (Stripe& s : stripes_) {
    for (std::atomic<FlowInstance*>& slot : s.idle) {
      const std::unique_ptr<FlowInstance> doomed(slot.exchange(nullptr, std::memory_order_acquire));
    }
  }
}

}  // namespace graphrun::sched
