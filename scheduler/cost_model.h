// CostModel: what a plan learns about its kernels' cost, and the execution
// policy it derives from it. A cheap node (its kernel measured below a few
// thousand cycles, or a NoOp) runs inline on the thread that completed its
// inputs; an expensive one gets a task of its own. A plan of cheap nodes
// only runs without a flow graph: the caller calls its nodes in plan order.
// So does, inside the pool's arena, a plan whose expensive nodes form one
// chain (no two of them could run at once: nothing to gain from tasks, and
// the caller, not a worker, then runs the chain while the other threads
// take the pieces of its kernels' parallel_for).
//
// Measuring: a step's RunState counts each kernel's cycles on the first
// kLearnSteps steps of every instance and on every kSampleEvery-th step
// after them. A node's first kLearnSteps samples classify it by the fastest
// of them (noise only slows a kernel down); after that, when kConfirm
// samples in a row fall on the other side of its class boundary (with
// hysteresis), the step's end derives a new policy and bumps the epoch:
// instances built under an older epoch are dropped as they come back, and
// new ones are built under the current policy.
//
// Before any measurement a node is cheap when its kernel says so
// (OpKernel::is_cheap: the built-in ops' estimate from their shapes, or
// CallAttrs::cheap), expensive otherwise. Partial-run plans keep that
// initial policy (a partial run's instance lives for one run), and so do
// sessions with SessionOptions::inline_cheap_nodes off (every node a task).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#else
#include <chrono>
#endif

namespace graphrun::sched {

struct Plan;

// A node becomes expensive when its samples rise above the plan's
// threshold (SessionOptions::inline_below_cycles, kDefaultInlineCycles by
// default) and cheap again when they fall below half of it (TF inlines
// kernels below about 5000-8000 cycles; the gap keeps a node near the
// boundary from flapping).
inline constexpr uint64_t kDefaultInlineCycles = 8000;
// Measured steps: the first kLearnSteps of an instance, then one in
// kSampleEvery.
inline constexpr uint32_t kLearnSteps = 3;
inline constexpr uint32_t kSampleEvery = 16;

// A cheap, monotonic-enough cycle count (the TSC on x86).
inline uint64_t cycle_count() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// How a plan's nodes run under one epoch of its cost model.
struct Policy {
  uint64_t epoch = 0;
  // Every node cheap: no flow graph, the caller runs the nodes itself.
  bool run_inline = false;
  // Not run_inline, but the expensive nodes form one chain (each has a
  // different number of expensive nodes on its longest path from a root)
  // and there are few cheap ones (kSerialCheapSlack): no flow graph either;
  // the step runs the nodes in plan order inside the arena, so that their
  // intra-op loops have the pool. Never for partial runs, asynchronous
  // kernels, or a model with inlining off.
  bool serial = false;
  // Per plan node: a tbb::flow::lightweight node (runs inside its
  // predecessor's body, no task); bounded runs, see kMaxLightweightRun.
  std::vector<uint8_t> lightweight;
};

// A serial plan may hold at most this many cheap nodes plus
// kSerialCheapPerExpensive per expensive node: the cheap nodes that could
// have run beside the chain run one after another.
inline constexpr std::size_t kSerialCheapSlack = 64;
inline constexpr std::size_t kSerialCheapPerExpensive = 4;

// The policy for per-node classes `cheap` (1 = cheap); `allow_serial`
// false never makes a serial policy.
Policy derive_policy(const Plan& plan, std::span<const uint8_t> cheap, bool allow_serial = true);

// Thread safety: thread-safe. record() races benignly (relaxed, a lost
// sample is harmless); update() and current() take a mutex.
class CostModel {
 public:
  // Initial classes from the kernels' own estimates. With `inline_nodes`
  // false every node is expensive for good (each gets a task).
  // `expensive_cycles`: the threshold (> 0).
  CostModel(const Plan& plan, bool inline_nodes, uint64_t expensive_cycles = kDefaultInlineCycles);

  // The current epoch and its run_inline flag, packed: read per step.
  uint64_t epoch() const { return word_.load(std::memory_order_acquire) >> 1; }
  bool run_inline() const { return (word_.load(std::memory_order_acquire) & 1) != 0; }
  // A copy of the current policy (for building an instance).
  Policy current() const;
  // Whether this plan learns at all (partial-run plans do not).
  bool learns() const { return learns_; }
  // A full plan with asynchronous kernels whose other nodes are all cheap
  // by their kernels' own estimate (inlining on): a blocking caller outside
  // every arena runs it on its own thread, waiting there for the
  // asynchronous kernels (FlowInstance::run_waiting).
  bool waits_inline() const { return waits_inline_; }

  // One measured execution of node `i`'s kernel.
  //
  // A node's first kLearnSteps samples decide its class at once, by the
  // fastest of them: cold caches, first-touch page faults and interrupts
  // only ever slow a kernel down, so one fast sample clears a node that
  // starts expensive, and a node that starts cheap turns expensive only if
  // all of them are slow. The decision waits for the last of them, so a
  // plan's nodes settle in one update rather than a few at a time (each
  // new policy builds new instances, a flow graph for a large plan). From
  // then on a node moves after kConfirm samples in a row on the other side.
  void record(int32_t i, uint64_t cycles) noexcept {
    const bool cheap = cheap_[i].load(std::memory_order_relaxed) != 0;
    const uint8_t old = streak_[i].load(std::memory_order_relaxed);
    const auto seen = static_cast<uint8_t>(old >> kSeenShift);
    auto streak = static_cast<uint8_t>(old & kStreakMask);
    const bool other_side = cheap ? cycles > expensive_cycles_ : cycles < cheap_cycles_;
    if (other_side) {
      const bool learning_fast = !cheap && seen < kLearnSteps;
      streak = learning_fast ? kConfirm : static_cast<uint8_t>(std::min<int>(streak + 1, kConfirm));
    } else if (cheap || seen >= kLearnSteps) {
      streak = 0;  // a slow sample of an expensive node while learning says nothing
    }
    const auto now_seen = static_cast<uint8_t>(seen < kLearnSteps ? seen + 1 : seen);
    const auto next = static_cast<uint8_t>((now_seen << kSeenShift) | streak);
    if (next != old) streak_[i].store(next, std::memory_order_relaxed);
    if (streak >= kConfirm && now_seen >= kLearnSteps)
      dirty_.store(true, std::memory_order_relaxed);
  }
  // Some node crossed its class boundary since the last update().
  bool dirty() const { return dirty_.load(std::memory_order_relaxed); }
  // Moves the nodes with a confirmed streak to their other class and
  // derives the policy again (a new epoch if it changed).
  void update(const Plan& plan);

  // Samples in a row past the boundary that move a node to the other class.
  static constexpr uint8_t kConfirm = 3;
  // streak_ packs, per node, the samples seen (up to kLearnSteps) above
  // kSeenShift and the streak below it.
  static constexpr int kSeenShift = 4;
  static constexpr uint8_t kStreakMask = (1U << kSeenShift) - 1;
  static_assert(kConfirm <= kStreakMask && kLearnSteps < 16);
  // The class boundaries: expensive above the first, cheap below the second.
  uint64_t expensive_cycles() const { return expensive_cycles_; }
  uint64_t cheap_cycles() const { return cheap_cycles_; }
  // A node's current class.
  bool is_cheap(int32_t i) const { return cheap_[i].load(std::memory_order_relaxed) != 0; }

 private:
  void publish(const Policy& p) {
    word_.store((p.epoch << 1) | (p.run_inline ? 1 : 0), std::memory_order_release);
  }

  bool learns_ = false;
  bool waits_inline_ = false;
  bool inline_nodes_;
  uint64_t expensive_cycles_;
  uint64_t cheap_cycles_;
  // Per node: samples seen while learning, and consecutive samples on the
  // other side of its class boundary (packed: kSeenShift).
  std::unique_ptr<std::atomic<uint8_t>[]> streak_;
  std::unique_ptr<std::atomic<uint8_t>[]> cheap_;  // per node, the current policy's class
  std::atomic<bool> dirty_{false};
  std::atomic<uint64_t> word_{0};  // epoch << 1 | run_inline
  mutable std::mutex mu_;
  Policy policy_;  // guarded by mu_
};

}  // namespace graphrun::sched
