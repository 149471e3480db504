#include "scheduler/cost_model.h"

#include <algorithm>

#include "scheduler/plan.h"

namespace graphrun::sched {

namespace {

// Whether no two expensive nodes of `plan` could run at once, and the cheap
// ones are few (Policy::serial). An expensive node's depth is the number of
// expensive nodes on its longest path from a root, itself included: two
// nodes of one depth are independent, and if every depth is taken once,
// the node of depth d has the one of depth d - 1 among its ancestors, so
// they form one chain.
bool expensive_nodes_form_a_chain(const Plan& plan, std::span<const uint8_t> cheap) {
  const std::size_t n = plan.nodes.size();
  const auto expensive =
      static_cast<std::size_t>(std::count(cheap.begin(), cheap.end(), uint8_t{0}));
  if (expensive == 0 || n - expensive > kSerialCheapSlack + kSerialCheapPerExpensive * expensive)
    return false;
  std::vector<int32_t> depth(n, 0);  // before a node: the most among its predecessors
  std::vector<char> taken(expensive + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const NodeItem& item = plan.nodes[i];
    if (item.async) return false;  // it finishes later: the flow graph waits for it
    if (cheap[i] == 0) {
      const int32_t d = ++depth[i];
      if (taken[static_cast<std::size_t>(d)] != 0) return false;
      taken[static_cast<std::size_t>(d)] = 1;
    }
    for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
      const auto s = static_cast<std::size_t>(plan.successors[static_cast<std::size_t>(k)]);
      depth[s] = std::max(depth[s], depth[i]);
    }
  }
  return true;
}

}  // namespace

// Lightweight flags in plan (topological) order: `run` is the length of the
// longest chain of lightweight nodes ending at a node, 0 for a
// default-policy node.
Policy derive_policy(const Plan& plan, std::span<const uint8_t> cheap, bool allow_serial) {
  const std::size_t n = plan.nodes.size();
  Policy p;
  p.lightweight.assign(n, 0);
  std::vector<char> keep_default(n, 0);
  if (plan.partial) {
    // A fetched or targeted node's sink must be its last successor to run
    // (the caller's wait returns right after it): its other successors get
    // tasks of their own, which wait in the pool, instead of running inline
    // before the sink.
    auto after = [&](int32_t producer) {
      const NodeItem& item = plan.nodes[static_cast<std::size_t>(producer)];
      for (int32_t k = item.succ_begin; k < item.succ_end; ++k)
        keep_default[static_cast<std::size_t>(plan.successors[static_cast<std::size_t>(k)])] = 1;
    };
    for (int32_t producer : plan.fetch_producers) {
      if (producer >= 0) after(producer);
    }
    for (int32_t producer : plan.target_nodes) after(producer);
  }
  std::vector<int32_t> run_in(n, 0);  // longest lightweight run among predecessors
  for (std::size_t i = 0; i < n; ++i) {
    const NodeItem& item = plan.nodes[i];
    const int32_t run = run_in[i] + 1;
    const bool light = cheap[i] != 0 && keep_default[i] == 0 && run <= kMaxLightweightRun;
    p.lightweight[i] = light ? 1 : 0;
    const int32_t out = light ? run : 0;
    for (int32_t k = item.succ_begin; k < item.succ_end; ++k) {
      const auto s = static_cast<std::size_t>(plan.successors[static_cast<std::size_t>(k)]);
      run_in[s] = std::max(run_in[s], out);
    }
  }
  // Inline steps have no nesting (a loop calls the bodies), so neither the
  // run bound nor the partial-run sink order applies: every node cheap is
  // enough.
  p.run_inline = n > 0 && std::all_of(cheap.begin(), cheap.end(), [](uint8_t c) { return c != 0; });
  if (allow_serial && !p.run_inline && !plan.partial)
    p.serial = expensive_nodes_form_a_chain(plan, cheap);
  return p;
}

CostModel::CostModel(const Plan& plan, bool inline_nodes, uint64_t expensive_cycles)
    : learns_(!plan.partial && inline_nodes),
      inline_nodes_(inline_nodes),
      expensive_cycles_(expensive_cycles),
      cheap_cycles_(expensive_cycles / 2),
      streak_(new std::atomic<uint8_t>[plan.nodes.size()]),
      cheap_(new std::atomic<uint8_t>[plan.nodes.size()]) {
  std::vector<uint8_t> cheap(plan.nodes.size());
  waits_inline_ = inline_nodes && plan.has_async && !plan.partial;
  for (std::size_t i = 0; i < plan.nodes.size(); ++i) {
    const NodeItem& item = plan.nodes[i];
    // An asynchronous kernel is never cheap: it needs the flow graph to
    // finish later (and its measured time would be its start only).
    cheap[i] = inline_nodes && !item.async && (item.skip_kernel || item.kernel->is_cheap()) ? 1 : 0;
    if (!item.async && cheap[i] == 0) waits_inline_ = false;
    streak_[i].store(0, std::memory_order_relaxed);
    cheap_[i].store(cheap[i], std::memory_order_relaxed);
  }
  policy_ = derive_policy(plan, cheap, inline_nodes);
  publish(policy_);
}

Policy CostModel::current() const {
  const std::lock_guard lock(mu_);
  return policy_;
}

void CostModel::update(const Plan& plan) {
  const std::lock_guard lock(mu_);
  if (!dirty_.exchange(false, std::memory_order_relaxed)) return;  // another step did it
  const std::size_t n = plan.nodes.size();
  std::vector<uint8_t> cheap(n);
  for (std::size_t i = 0; i < n; ++i) {
    const bool was = cheap_[i].load(std::memory_order_relaxed) != 0;
    bool now = was;
    const uint8_t packed = streak_[i].load(std::memory_order_relaxed);
    if ((packed & kStreakMask) >= kConfirm) {
      now = !was;
      streak_[i].store(packed & static_cast<uint8_t>(~kStreakMask), std::memory_order_relaxed);
    }
    if (plan.nodes[i].skip_kernel) now = true;
    if (plan.nodes[i].async) now = false;
    cheap[i] = now ? 1 : 0;
    cheap_[i].store(cheap[i], std::memory_order_relaxed);
  }
  Policy next = derive_policy(plan, cheap, inline_nodes_);
  if (next.run_inline == policy_.run_inline && next.serial == policy_.serial &&
      next.lightweight == policy_.lightweight)
    return;
  next.epoch = policy_.epoch + 1;
  policy_ = std::move(next);
  publish(policy_);
}

}  // namespace graphrun::sched
