// PlanCache: signature key -> compiled plan and its pool of flow-graph
// instances. Bounded: past capacity the least recently used entry is dropped
// (runs, callables and partial runs still using it keep it alive).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "scheduler/flow_graph.h"
#include "scheduler/plan.h"
#include "scheduler/striped.h"

namespace graphrun::sched {

// A plan with its instances. Destroy inside the session arena (instances
// are flow graphs).
struct PlanEntry : std::enable_shared_from_this<PlanEntry> {
  std::shared_ptr<const Plan> plan;
  InstancePool pool;                   // built in the pool's arena (blocking steps, partial runs)
  InstancePool async_pool;             // built in its asynchronous arena (AsyncRun)
  std::atomic<uint64_t> last_used{0};  // relaxed: an LRU hint only
  // Leases (runs between find and return) on this entry, per thread stripe:
  // a run pins its plan without touching a count other threads write.
  StripedCounter leases;
  // A plan with fusions: its unfused twin (Plan::unfused), which traced runs
  // use, compiled at the first of them and destroyed with this entry.
  std::mutex unfused_mu;
  std::shared_ptr<PlanEntry> unfused;  // guarded by unfused_mu
};

// A run's hold on a cache entry: the entry stays alive, even if evicted,
// until the lease ends. Holders beyond one call take share() instead.
// Thread safety: not thread-safe; one thread uses a lease.
class PlanLease {
 public:
  PlanLease() = default;
  explicit PlanLease(PlanEntry* entry) : entry_(entry), stripe_(entry->leases.add()) {}
  PlanLease(PlanLease&& other) noexcept
      : entry_(std::exchange(other.entry_, nullptr)), stripe_(other.stripe_) {}
  PlanLease& operator=(PlanLease&& other) noexcept {
    if (this != &other) {
      end();
      entry_ = std::exchange(other.entry_, nullptr);
      stripe_ = other.stripe_;
    }
    return *this;
  }
  ~PlanLease() { end(); }

  PlanEntry& operator*() const { return *entry_; }
  PlanEntry* operator->() const { return entry_; }
  explicit operator bool() const { return entry_ != nullptr; }
  // An owning reference for holders that outlive the call (callables,
  // partial runs).
  std::shared_ptr<PlanEntry> share() const { return entry_->shared_from_this(); }

 private:
  void end() {
    if (entry_ != nullptr) entry_->leases.remove(stripe_);
  }
  PlanEntry* entry_ = nullptr;
  std::size_t stripe_ = 0;
};

// Thread safety: thread-safe. Hits take one stripe of a shared lock.
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // A lease on the entry of `key`, or an empty lease.
  PlanLease find(const std::string& key);
  // Inserts (or leases the entry another thread inserted first) and evicts
  // past capacity. Evicted entries no longer leased are returned through
  // `evicted` so the caller destroys them in the arena; leased ones wait
  // for a later insert (or take_all).
  PlanLease insert(const std::string& key, std::shared_ptr<const Plan> plan,
                   std::vector<std::shared_ptr<PlanEntry>>* evicted);
  std::size_t size() const;
  // Every entry, evicted ones still leased included (the session's end).
  std::vector<std::shared_ptr<PlanEntry>> take_all();

 private:
  std::size_t capacity_;
  // The LRU epoch: advanced by inserts only; a hit stamps its entry with
  // the current epoch, writing only when the stamp changes (hits on a hot
  // entry then share its cache line read-only).
  std::atomic<uint64_t> clock_{0};  // relaxed: LRU ordering hint
  mutable StripedSharedMutex mu_;
  std::unordered_map<std::string, std::shared_ptr<PlanEntry>> entries_;  // guarded by mu_
  // Evicted but leased when evicted: no new lease can reach them.
  std::vector<std::shared_ptr<PlanEntry>> retired_;  // guarded by mu_
};

}  // namespace graphrun::sched
