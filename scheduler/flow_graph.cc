#include "scheduler/flow_graph.h"

namespace graphrun::sched {

using tbb::flow::continue_msg;

FlowInstance::FlowInstance(const Plan& plan, const KernelRuntime& runtime) : state_(plan, runtime) {
  const std::size_t n = plan.nodes.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto index = static_cast<int32_t>(i);
    RunState* state = &state_;
    nodes_.emplace_back(graph_, [state, index](const continue_msg&) {
      state->execute(index);
      return continue_msg();
    });
  }
  for (std::size_t i = 0; i < n; ++i) {
    const NodeItem& item = plan.nodes[i];
    if (item.num_preds == 0) roots_.push_back(&nodes_[i]);
    for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
      tbb::flow::make_edge(
          nodes_[i],
          nodes_[static_cast<std::size_t>(plan.successors[static_cast<std::size_t>(k)])]);
    }
  }
}

FlowInstance::~FlowInstance() { graph_.wait_for_all(); }

void FlowInstance::run() {
  for (Node* root : roots_) root->try_put(continue_msg());
  graph_.wait_for_all();
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
