// FlowInstance: a Plan mapped onto a tbb::flow::graph, one continue_node per
// plan node, edges for data and control dependencies, one start node feeding
// the roots. Building one costs far more than running a small one, so
// instances are pooled per plan (InstancePool) and reused; each owns the
// RunState its node bodies write to.
#pragma once

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/spin_mutex.h>
#include <oneapi/tbb/task_group.h>

#include <deque>
#include <memory>
#include <vector>

#include "scheduler/plan.h"
#include "scheduler/run_state.h"

namespace graphrun::sched {

// Thread safety: not thread-safe; one step at a time (the pool hands it to
// one run). Build, run and destroy it inside the session's arena: a flow
// graph belongs to the arena current at its construction.
class FlowInstance {
 public:
  FlowInstance(const Plan& plan, const KernelRuntime& runtime);
  FlowInstance(const FlowInstance&) = delete;
  FlowInstance& operator=(const FlowInstance&) = delete;
  ~FlowInstance();

  RunState& state() { return state_; }
  // Triggers the roots and waits, helping, until every node has run.
  void run();

 private:
  using Node = tbb::flow::continue_node<tbb::flow::continue_msg>;
  RunState state_;
  // Isolated: cancelling another graph never reaches this one.
  tbb::task_group_context context_{tbb::task_group_context::isolated};
  tbb::flow::graph graph_{context_};
  std::deque<Node> nodes_;
  std::vector<Node*> roots_;
};

// Idle instances of one plan. Thread safety: thread-safe.
class InstancePool {
 public:
  // An idle instance, or nullptr when the caller must build one.
  std::unique_ptr<FlowInstance> take();
  void give_back(std::unique_ptr<FlowInstance> instance);
  // Destroys the idle instances (call inside the arena).
  void clear();

 private:
  tbb::spin_mutex mu_;
  std::vector<std::unique_ptr<FlowInstance>> idle_;
};

}  // namespace graphrun::sched
