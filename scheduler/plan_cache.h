// PlanCache: signature key -> compiled plan and its pool of flow-graph
// instances. Bounded: past capacity the least recently used entry is dropped
// (runs and callables still holding it keep it alive).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "scheduler/flow_graph.h"
#include "scheduler/plan.h"
#include "scheduler/striped.h"

namespace graphrun::sched {

// A plan with its instances. Destroy inside the session arena (instances
// are flow graphs).
struct PlanEntry {
  std::shared_ptr<const Plan> plan;
  InstancePool pool;
  std::atomic<uint64_t> last_used{0};  // relaxed: an LRU hint only
};

// Thread safety: thread-safe. Hits take one stripe of a shared lock.
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  std::shared_ptr<PlanEntry> find(const std::string& key);
  // Inserts (or returns the entry another thread inserted first) and evicts
  // past capacity. Evicted entries are returned through `evicted` so the
  // caller destroys them in the arena.
  std::shared_ptr<PlanEntry> insert(const std::string& key, std::shared_ptr<const Plan> plan,
                                    std::vector<std::shared_ptr<PlanEntry>>* evicted);
  std::size_t size() const;
  std::vector<std::shared_ptr<PlanEntry>> take_all();

 private:
  std::size_t capacity_;
  // The LRU epoch: advanced by inserts only; a hit stamps its entry with
  // the current epoch, writing only when the stamp changes (hits on a hot
  // entry then share its cache line read-only).
  std::atomic<uint64_t> clock_{0};  // relaxed: LRU ordering hint
  mutable StripedSharedMutex mu_;
  std::unordered_map<std::string, std::shared_ptr<PlanEntry>> entries_;
};

}  // namespace graphrun::sched
