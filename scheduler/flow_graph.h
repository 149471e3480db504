// FlowInstance: a Plan mapped onto a tbb::flow::graph, one continue_node per
// plan node (tbb::flow::lightweight for the plan's lightweight nodes, which
// run inline without a task), edges for data and control dependencies. A
// Plan::run_inline plan (or a Policy::serial one) gets no flow-graph nodes:
// the calling thread runs its nodes itself, tracking readiness with
// per-node counts.
// Building one costs far more than running a small one, so instances are
// pooled per plan (InstancePool) and reused; each owns the RunState its node
// bodies write to.
#pragma once

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_group.h>

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <vector>

#include "scheduler/fixed_store.h"
#include "scheduler/plan.h"
#include "scheduler/run_state.h"
#include "scheduler/striped.h"

namespace graphrun::sched {

// Thread safety: not thread-safe; one step at a time (the pool hands it to
// one run). Build, run and destroy it inside the session's arena: a flow
// graph belongs to the arena current at its construction.
class FlowInstance {
 public:
  // Built for one policy of the plan's cost model (plan.costs->current()).
  FlowInstance(const Plan& plan, const KernelRuntime& runtime, const Policy& policy);
  FlowInstance(const FlowInstance&) = delete;
  FlowInstance& operator=(const FlowInstance&) = delete;
  ~FlowInstance();

  RunState& state() { return state_; }
  // The policy epoch it was built for, and whether that policy runs every
  // node inline (no flow-graph nodes: Policy::run_inline or serial).
  uint64_t epoch() const { return epoch_; }
  bool run_inline() const { return run_inline_; }
  // Triggers the roots and waits, helping, until every node has run; for a
  // Plan::run_inline plan (no flow-graph nodes), runs the nodes in order on
  // the calling thread, which need not be inside the arena (a serial
  // policy's step calls it inside the arena: its kernels split work).
  void run();

  // Asynchronous full runs (a plan with nodes, neither run_inline nor
  // partial): triggers the roots and returns at once; `done(arg)` runs
  // once, on the thread that finished the step's last node, from inside
  // that node's body: it must not wait for the graph nor reuse the
  // instance. A task of its own then calls wait_quiet() (which returns as
  // soon as that body's task has ended) before the instance is reused or
  // destroyed. Call inside the arena.
  using Completion = void (*)(void*);
  void start(Completion done, void* arg);

  // Full plans whose model waits_inline(): runs every ready node on the
  // calling thread (starting the asynchronous kernels among them) and,
  // when none is ready, waits here for an asynchronous kernel to finish
  // (a short yield loop, then a condition variable). Only for a thread
  // outside every arena: it may wait. Returns when every node has run.
  void run_waiting();

  // Partial runs (plans with Plan::partial): trigger the roots that need no
  // feed without waiting; put feed `f`'s entry node (its readers may then
  // run); wait until the graph is quiet. For a run_inline plan, start_roots
  // and put_feed run every node that becomes ready before they return, on
  // the calling thread (which need not be inside the arena).
  void start_roots();
  void put_feed(int f);
  void wait_quiet() {
    if (!run_inline_) graph_.wait_for_all();
  }

  // Instances alive in the process (leak tests).
  static int64_t live_count();

 private:
  using Msg = tbb::flow::continue_msg;
  // A continue_node that tells where its body lives (oneTBB allocates it
  // apart from the node), for RunState's prefetch.
  template <typename ContinueNode>
  class PlanNode final : public ContinueNode {
   public:
    using ContinueNode::ContinueNode;
    const void* body_address() const { return this->my_body; }
  };
  using Node = PlanNode<tbb::flow::continue_node<Msg>>;
  using LightNode = PlanNode<tbb::flow::continue_node<Msg, tbb::flow::lightweight>>;
  using Entry = tbb::flow::broadcast_node<Msg>;
  // Every node's body, whatever its policy.
  struct Body {
    RunState* state;
    const NodeItem* item;  // the plan's entry: no index to look up
    Msg operator()(const Msg&) const {
      state->execute(*item);
      return Msg();
    }
  };
  // A node with no successor (full plans): reports its end to start()'s
  // completion. Every plan node runs exactly once per step, skipped or not,
  // and each is an ancestor of a leaf: the last leaf to end ends the step.
  struct LeafBody {
    FlowInstance* instance;
    const NodeItem* item;
    Msg operator()(const Msg&) const {
      instance->state_.execute(*item);
      instance->leaf_done();
      return Msg();
    }
  };
  void leaf_done() {
    // acq_rel: the last leaf sees every other leaf's writes (their slots).
    if (completion_ != nullptr && pending_leaves_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      completion_(completion_arg_);
    }
  }
  // An asynchronous node (NodeItem::async) is two flow-graph nodes: the
  // start counts its predecessors and starts the kernel under a reserved
  // wait (the worker moves on); the finisher, put by async_done from the
  // thread the kernel finished on, ends the node on a thread of the arena
  // and releases its successors (docs/distributed.md).
  struct AsyncStartBody {
    FlowInstance* instance;
    int32_t index;
    Msg operator()(const Msg&) const {
      instance->graph_.reserve_wait();
      if (!instance->state_.execute_async(index, &FlowInstance::async_done, instance)) {
        async_done(instance, index);  // skipped: end it now
      }
      return Msg();
    }
  };
  struct AsyncFinishBody {
    FlowInstance* instance;
    int32_t index;
    bool leaf;
    Msg operator()(const Msg&) const {
      instance->state_.finish_async(index);
      if (leaf) instance->leaf_done();
      return Msg();
    }
  };
  // Any thread: submits the finisher's task into the graph's arena, then
  // drops the start's reserved wait (the task holds the graph's wait until
  // it ends). Touches nothing of the instance afterwards.
  static void async_done(void* instance, int32_t index);
  // Puts the roots, so that one thread runs the nodes in plan order.
  void put_roots();
  // Inline partial runs: runs ready_ (and what they make ready) to the end.
  void run_ready();
  // Inline runs: node i has ended; its successors with nothing more to
  // wait for (pending_) join ready_.
  void release_successors(int32_t i);

  RunState state_;
  uint64_t epoch_;
  bool run_inline_;
  // Asynchronous full runs: leaves still running, and what the last calls.
  int32_t num_leaves_ = 0;
  std::atomic<int32_t> pending_leaves_{0};
  Completion completion_ = nullptr;
  void* completion_arg_ = nullptr;
  // Inline partial runs: per node, predecessors and feeds still missing
  // (run_waiting: asynchronous predecessors not yet ended);
  // per node, its sinks (fetch k, or fetches + t for target t), as ranges
  // into inline_sinks_; nodes ready to run.
  std::vector<int32_t> pending_;
  // run_waiting: what the waiting thread waits on (made at its first step).
  struct Waiting;
  std::unique_ptr<Waiting> waiting_;
  std::vector<int32_t> inline_sink_begin_;
  std::vector<int32_t> inline_sinks_;
  std::vector<int32_t> ready_;
  // Isolated: cancelling another graph never reaches this one.
  tbb::task_group_context context_{tbb::task_group_context::isolated};
  tbb::flow::graph graph_{context_};
  FixedStore<Node> nodes_;  // default-policy plan nodes
  // Per plan node, its finisher when asynchronous (else null).
  std::vector<Node*> finishers_;
  FixedStore<LightNode> light_nodes_;  // lightweight plan nodes
  // Per plan node, its body's address: what RunState prefetches ahead.
  std::vector<const void*> bodies_;
  // Per plan node, whichever of the two it is.
  std::vector<tbb::flow::sender<Msg>*> senders_;
  std::vector<tbb::flow::receiver<Msg>*> receivers_;
  std::vector<tbb::flow::receiver<Msg>*> roots_;  // in plan order
  std::deque<Entry> entries_;                     // per feed (partial plans)
  std::deque<Node> sinks_;                        // per fetch, then per target (partial plans)
  // Sinks that are their producer's only successor: nothing to bypass.
  std::deque<LightNode> light_sinks_;
};

// Idle instances of one plan, kept per thread stripe (scheduler/striped.h)
// so concurrent runs of one plan do not contend on one cache line. Each
// stripe's slots are atomic pointers: a step takes and gives back its
// instance with one atomic exchange each, no lock.
// Thread safety: thread-safe.
class InstancePool {
 public:
  InstancePool() = default;
  InstancePool(const InstancePool&) = delete;
  InstancePool& operator=(const InstancePool&) = delete;
  ~InstancePool() { clear(); }

  static constexpr std::size_t kMaxIdlePerStripe = 2;
  // Idle instances kept at most; more are destroyed when given back.
  static constexpr std::size_t kMaxIdle = kStripes * kMaxIdlePerStripe;

  // An idle instance (this thread's stripe first), or nullptr when the
  // caller must build one. It may be of an older policy epoch: see
  // take_instance().
  std::unique_ptr<FlowInstance> take();
  // Keeps `instance` for reuse, or hands it back when this thread's stripe
  // is full or it was built for another epoch than `epoch`: the caller
  // destroys it (inside the arena).
  [[nodiscard]] std::unique_ptr<FlowInstance> give_back(std::unique_ptr<FlowInstance> instance,
                                                        uint64_t epoch);
  // Destroys the idle instances (call inside the arena).
  void clear();

 private:
  struct alignas(64) Stripe {
    // Owning pointers (null: an empty slot). acquire/release on the
    // exchanges: a taker sees every write of the step that gave it back.
    std::array<std::atomic<FlowInstance*>, kMaxIdlePerStripe> idle{};
  };
  std::unique_ptr<FlowInstance> take_from(Stripe& s);
  std::array<Stripe, kStripes> stripes_;
};

// An idle instance of `pool` built for the plan's current policy, or a new
// one. `in_arena(fn)` runs fn inside the arena the pool's instances belong
// to: building one and destroying one of an older epoch happen there.
template <typename InArena>
std::unique_ptr<FlowInstance> take_instance(InstancePool& pool, const Plan& plan,
                                            const KernelRuntime& runtime, InArena&& in_arena) {
  std::unique_ptr<FlowInstance> inst = pool.take();
  if (inst != nullptr && inst->epoch() != plan.costs->epoch()) in_arena([&] { inst.reset(); });
  if (inst == nullptr) {
    const Policy policy = plan.costs->current();
    in_arena([&] { inst = std::make_unique<FlowInstance>(plan, runtime, policy); });
  }
  return inst;
}

}  // namespace graphrun::sched
