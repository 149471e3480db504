#include "scheduler/plan_cache.h"

#include <mutex>

namespace graphrun::sched {

PlanLease PlanCache::find(const std::string& key) {
  const StripedSharedLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return PlanLease();
  const uint64_t now = clock_.load(std::memory_order_relaxed);
  if (it->second->last_used.load(std::memory_order_relaxed) != now) {
    it->second->last_used.store(now, std::memory_order_relaxed);
  }
  // Leased under the lock: an evictor (exclusive) sees the lease.
  return PlanLease(it->second.get());
}

PlanLease PlanCache::insert(const std::string& key, std::shared_ptr<const Plan> plan,
                            std::vector<std::shared_ptr<PlanEntry>>* evicted) {
  std::unique_lock lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) return PlanLease(it->second.get());  // another thread won the race
  auto entry = std::make_shared<PlanEntry>();
  entry->plan = std::move(plan);
  entry->last_used.store(clock_.fetch_add(1, std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
  while (entries_.size() >= capacity_) {
    auto victim = entries_.begin();
    for (auto e = entries_.begin(); e != entries_.end(); ++e) {
      if (e->second->last_used.load(std::memory_order_relaxed) <
          victim->second->last_used.load(std::memory_order_relaxed)) {
        victim = e;
      }
    }
    retired_.push_back(std::move(victim->second));
    entries_.erase(victim);
  }
  // Retired entries nobody leases any more go. Unreachable, their lease
  // counts only fall: a zero sum stays zero.
  std::erase_if(retired_, [&](std::shared_ptr<PlanEntry>& e) {
    if (e->leases.sum() != 0) return false;
    evicted->push_back(std::move(e));
    return true;
  });
  PlanLease lease(entry.get());
  entries_.emplace(key, std::move(entry));
  return lease;
}

std::size_t PlanCache::size() const {
  const StripedSharedLock lock(mu_);
  return entries_.size();
}

std::vector<std::shared_ptr<PlanEntry>> PlanCache::take_all() {
  std::unique_lock lock(mu_);
  std::vector<std::shared_ptr<PlanEntry>> all;
  for (auto& [key, entry] : entries_) all.push_back(std::move(entry));
  entries_.clear();
  for (std::shared_ptr<PlanEntry>& e : retired_) all.push_back(std::move(e));
  retired_.clear();
  return all;
}

}  // namespace graphrun::sched
