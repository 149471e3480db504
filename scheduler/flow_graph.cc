#include "scheduler/flow_graph.h"

namespace graphrun::sched {

using tbb::flow::continue_msg;

namespace {
std::atomic<int64_t> g_live_instances{0};  // relaxed: a statistic for tests
}  // namespace

int64_t FlowInstance::live_count() { return g_live_instances.load(std::memory_order_relaxed); }

FlowInstance::FlowInstance(const Plan& plan, const KernelRuntime& runtime) : state_(plan, runtime) {
  g_live_instances.fetch_add(1, std::memory_order_relaxed);
  const std::size_t n = plan.nodes.size();
  RunState* state = &state_;
  senders_.reserve(n);
  receivers_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Body body{state, static_cast<int32_t>(i)};
    if (plan.nodes[i].lightweight) {
      LightNode& node = light_nodes_.emplace_back(graph_, body);
      senders_.push_back(&node);
      receivers_.push_back(&node);
    } else {
      Node& node = nodes_.emplace_back(graph_, body);
      senders_.push_back(&node);
      receivers_.push_back(&node);
    }
  }
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
  // Sinks keep the default policy: a lightweight one would run inside its
  // producer's successor loop, not as the bypassed task the wait returns
  // after. (Successors of a fetched or targeted node are never lightweight
  // in a partial plan: see choose_policies in plan.cc.)
  auto add_sink = [&](int k, tbb::flow::sender<continue_msg>& producer) {
    Node& sink = sinks_.emplace_back(graph_, [state, k](const continue_msg&) {
      state->sink_fired(k);
      return continue_msg();
    });
    tbb::flow::make_edge(producer, sink);
  };
  for (std::size_t k = 0; k < plan.fetch_producers.size(); ++k) {
    const int32_t p = plan.fetch_producers[k];
    if (p >= 0) {
      add_sink(static_cast<int>(k), *senders_[static_cast<std::size_t>(p)]);
    } else {
      add_sink(static_cast<int>(k), entries_[static_cast<std::size_t>(plan.fetch_feeds[k])]);
    }
  }
  const auto n_fetches = static_cast<int>(plan.fetch_producers.size());
  for (std::size_t t = 0; t < plan.target_nodes.size(); ++t) {
    add_sink(n_fetches + static_cast<int>(t),
             *senders_[static_cast<std::size_t>(plan.target_nodes[t])]);
  }
}

FlowInstance::~FlowInstance() {
  graph_.wait_for_all();
  g_live_instances.fetch_sub(1, std::memory_order_relaxed);
}

void FlowInstance::run() {
  for (tbb::flow::receiver<continue_msg>* root : roots_) root->try_put(continue_msg());
  graph_.wait_for_all();
}

void FlowInstance::start_roots() {
  for (tbb::flow::receiver<continue_msg>* root : roots_) root->try_put(continue_msg());
}

void FlowInstance::put_feed(int f) {
  entries_[static_cast<std::size_t>(f)].try_put(continue_msg());
}

std::unique_ptr<FlowInstance> InstancePool::take() {
  tbb::spin_mutex::scoped_lock lock(mu_);
  if (idle_.empty()) return nullptr;
  std::unique_ptr<FlowInstance> inst = std::move(idle_.back());
  idle_.pop_back();
  return inst;
}

std::unique_ptr<FlowInstance> InstancePool::give_back(std::unique_ptr<FlowInstance> instance) {
  tbb::spin_mutex::scoped_lock lock(mu_);
  if (idle_.size() >= kMaxIdle) return instance;
  idle_.push_back(std::move(instance));
  return nullptr;
}

void InstancePool::clear() {
  std::vector<std::unique_ptr<FlowInstance>> doomed;
  {
    tbb::spin_mutex::scoped_lock lock(mu_);
    doomed.swap(idle_);
  }
}

}  // namespace graphrun::sched
